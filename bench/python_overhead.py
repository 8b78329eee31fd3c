#!/usr/bin/env python3
"""The Python package's cost over the CLI (issue 29): `model.generate` against `squeezekv generate`
on the same model, prompt, threads and settings, alternated, median of N runs each; then what a
ScorePolicy written in Python costs per decode token against the built-in h2o it reimplements.

    PYTHONPATH=build/python python3 bench/python_overhead.py --cli build/squeezekv [--runs 5]
"""
import argparse
import re
import statistics
import subprocess
import time

import numpy as np

import squeezekv

PROMPT = "The history of the Roman Empire"  # 128 greedy tokens without an end of text


def cli_rate(cli: str, model: str, threads: int, n: int) -> float:
    err = subprocess.run([cli, "generate", "-m", model, "-t", str(threads), "-p", PROMPT, "-n", str(n), "--temp", "0"],
                         capture_output=True, text=True, check=True).stderr
    return float(re.search(r"generated: \d+ tokens, ([\d.]+) tokens/s", err).group(1))


class PyH2O(squeezekv.ScorePolicy):
    calls = 0

    def score(self, layer, positions, mass, keys=None):
        PyH2O.calls += 1
        return mass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    model_path = a.model or squeezekv.default_model_path()
    m = squeezekv.load(model_path, threads=a.threads)
    m.generate(PROMPT, max_tokens=8, temperature=0)  # warm
    py, cli = [], []
    for _ in range(a.runs):
        r = m.generate(PROMPT, max_tokens=a.tokens, temperature=0)
        assert len(r.tokens) == a.tokens, r.stop_reason
        py.append(r.tokens_per_second)
        cli.append(cli_rate(a.cli, model_path, a.threads, a.tokens))
    mp, mc = statistics.median(py), statistics.median(cli)
    print(f"model: {model_path}, {a.threads} threads, {a.tokens} tokens, greedy, median of {a.runs} (alternated)")
    print(f"generate tok/s: python {mp:.1f} ({', '.join(f'{x:.1f}' for x in py)}) | "
          f"cli {mc:.1f} ({', '.join(f'{x:.1f}' for x in cli)}) | python/cli {mp / mc:.3f}")

    # a Python score() in decode: every layer over budget at every step; built-in and Python runs alternated
    ids = m.tokenize(PROMPT * 80)[:400]
    steps = 128
    per: dict[str, list[float]] = {"h2o": [], "python": []}
    calls = 0
    for _ in range(a.runs):
        for name, policy in [("h2o", "h2o"), ("python", PyH2O())]:
            seq = m.sequence(squeezekv.KVConfig(policy=policy, budget=128))
            seq.prefill(ids)
            c0 = PyH2O.calls
            t0 = time.perf_counter()
            for t in ids[:steps]:
                seq.decode(t)
            per[name].append((time.perf_counter() - t0) / steps * 1e3)
            calls = (PyH2O.calls - c0) / steps if name == "python" else calls
            seq.close()
    base, pyt = statistics.median(per["h2o"]), statistics.median(per["python"])
    print(f"decode ms/token after 400 prompt tokens, budget 128, {steps} steps, median of {a.runs} (alternated): "
          f"built-in h2o {base:.3f} ({', '.join(f'{x:.2f}' for x in per['h2o'])}), "
          f"Python ScorePolicy {pyt:.3f} ({', '.join(f'{x:.2f}' for x in per['python'])}); "
          f"+{pyt - base:.3f} ms a token over {calls:.0f} score() calls a token ({1e3 * (pyt - base) / max(calls, 1):.1f} us a call)")


if __name__ == "__main__":
    main()
