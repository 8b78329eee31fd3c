#!/usr/bin/env python3
"""Side by side in one run: squeezekv_bench and llama.cpp (through the llama-cpp-python package
from PyPI, installed by the user: pip install llama-cpp-python) on the same GGUF file, the same
token ids, the same thread count: prefill P tokens, then N one-token decode steps; median of runs.

    python3 bench/compare_llamacpp.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import time


def ours(bench, model, threads, n_prompt, n_gen, runs, act):
    out = subprocess.run([bench, model, str(threads), str(n_prompt), str(n_gen), str(runs), act], check=True,
                         capture_output=True, text=True).stdout
    pp = float(re.search(r"prompt_tok_s_median=([\d.]+)", out).group(1))
    tg = float(re.search(r"gen_tok_s_median=([\d.]+)", out).group(1))
    return pp, tg


def llamacpp(model, threads, n_prompt, n_gen, runs):
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=n_prompt + n_gen + 8, n_threads=threads, n_threads_batch=threads,
                n_batch=max(n_prompt, 32), verbose=False)
    vocab = llm.n_vocab()
    prompt = [100 + (i * 7919) % (vocab - 200) for i in range(n_prompt)]
    cont = [100 + (i * 104729) % (vocab - 200) for i in range(n_gen)]
    pps, tgs = [], []
    for r in range(runs + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        for tok in cont:
            llm.eval([tok])
        t2 = time.perf_counter()
        if r:  # the first run warms up
            pps.append(n_prompt / (t1 - t0))
            tgs.append(n_gen / (t2 - t1))
    return statistics.median(pps), statistics.median(tgs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--bench", default="build/squeezekv_bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decode-activations", default="int8,f32",
                    help="squeezekv decode arithmetic(s) to run, comma-separated (int8 is what llama.cpp does)")
    a = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; threads={a.threads}; "
          f"prompt={a.prompt} gen={a.gen} runs={a.runs} (median)")
    runs = [(f"squeezekv ({act} decode)", lambda act=act: ours(a.bench, a.model, a.threads, a.prompt, a.gen, a.runs, act))
            for act in a.decode_activations.split(",")]
    runs.append(("llama.cpp", lambda: llamacpp(a.model, a.threads, a.prompt, a.gen, a.runs)))
    for name, fn in runs:
        try:
            pp, tg = fn()
            print(f"{name:26s} prompt {pp:8.1f} tok/s   generation {tg:7.1f} tok/s")
        except ImportError:
            print(f"{name:26s} not installed (pip install llama-cpp-python)")


if __name__ == "__main__":
    main()
