#!/usr/bin/env python3
"""Long greedy generation under a small KV budget: how often each policy falls into a loop.

A user sees a compressed cache fail first as repetition. For each of N prompts cut from Emma
(~2,000 tokens each, evenly spaced through the novel), `squeezekv generate` continues the text
for --n tokens greedily under each policy at --budget tokens per layer, and this script reports
the share of distinct word 4-grams in the continuation (1: no 4-gram repeats; the full cache's
own figure is the reference) per prompt, with the mean and median over prompts.
The same check on one prompt is the unit test KvPolicy.SqueezeOnLongAustenPrompt.

  python3 bench/generation_loops.py --budget 128 --threads 2 [--prompts 8] [--policies ...]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def distinct4(text):
    words = text.split()
    grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
    return len(set(grams)) / len(grams) if grams else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default=os.path.join(ROOT, "build", "squeezekv"))
    ap.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data", "austen", "emma.txt"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--chars", type=int, default=8400, help="characters per prompt (~2,000 tokens of Emma)")
    ap.add_argument("--n", type=int, default=200, help="tokens to generate")
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--policies", nargs="+",
                    default=["full", "window", "h2o", "squeeze", "squeeze:--squeeze-resolve:prompt"],
                    help="a policy, or policy:flag:value:... for extra flags")
    a = ap.parse_args()
    text = open(a.text, encoding="utf-8").read()
    if len(text) < a.prompts * a.chars:
        sys.exit(f"generation_loops: --text {a.text} holds {len(text)} characters, fewer than "
                 f"--prompts x --chars = {a.prompts * a.chars}")
    step = (len(text) - a.chars) // a.prompts
    table = {p: [] for p in a.policies}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.prompts):
            off = step * i + step // 2
            prompt = text[off:off + a.chars]
            path = os.path.join(tmp, "prompt.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(prompt)
            for p in a.policies:
                name, *flags = p.split(":")
                cmd = [a.engine, "generate", "-f", path, "-n", str(a.n), "--temp", "0", "-t", str(a.threads),
                       "--kv-policy", name] + flags
                if name != "full":
                    cmd += ["--kv-budget", str(a.budget)]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"generation_loops: {' '.join(cmd)} failed: {r.stderr.strip()}")
                if not r.stdout.startswith(prompt):
                    sys.exit("generation_loops: the engine's output does not start with the prompt")
                table[p].append(distinct4(r.stdout[len(prompt):]))
            print(f"prompt {i} (offset {off}): " + ", ".join(f"{p} {table[p][-1]:.3f}" for p in a.policies),
                  flush=True)
    print(f"\ndistinct word 4-grams of {a.n} greedy tokens after ~{a.chars} characters of "
          f"{os.path.basename(a.text)}, budget {a.budget}, {a.prompts} prompts")
    print("| policy | mean | median | min | prompts below the full cache |")
    print("|---|---:|---:|---:|---:|")
    full = table.get("full")
    for p, v in table.items():
        below = "" if full is None or p == "full" else str(sum(x < f for x, f in zip(v, full)))
        print(f"| {p.replace(':', ' ')} | {statistics.mean(v):.3f} | {statistics.median(v):.3f} | {min(v):.3f} | {below} |")


if __name__ == "__main__":
    main()
