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

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def cli_rate(cli: str, model: str, threads: int, n: int) -> float:
    err = subprocess.run([cli, "generate", "-m", model, "-t", str(threads), "-p", PROMPT, "-n", str(n), "--temp", "0"],
                         capture_output=True, text=True, check=True).stderr
    return float(re.search(r"generated: \d+ tokens, ([\d.]+) tokens/s", err).group(1))


class PyH2O(squeezekv.ScorePolicy):
    def score(self, layer, positions, mass, keys=None):
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

    # a Python score() in decode: 30 layers over budget every step
    ids = m.tokenize(PROMPT * 20)[:400]
    steps = 64
    per = {}
    for name, policy in [("h2o (built in)", "h2o"), ("ScorePolicy (Python h2o)", PyH2O())]:
        times = []
        for _ in range(a.runs):
            seq = m.sequence(squeezekv.KVConfig(policy=policy, budget=128))
            seq.prefill(ids)
            t0 = time.perf_counter()
            for t in ids[:steps]:
                seq.decode(t)
            times.append((time.perf_counter() - t0) / steps * 1e3)
            seq.close()
        per[name] = statistics.median(times)
    base, pyt = per["h2o (built in)"], per["ScorePolicy (Python h2o)"]
    n_layers = m.config.n_layers
    print(f"decode ms/token at 400 tokens, budget 128: built-in h2o {base:.3f}, Python ScorePolicy {pyt:.3f} "
          f"(+{pyt - base:.3f} ms a token, {1e3 * (pyt - base) / n_layers:.1f} us a score() call, {n_layers} calls a token)")


if __name__ == "__main__":
    main()
