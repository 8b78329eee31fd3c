#!/usr/bin/env python3
"""The Python package on the GPU (issue 29): TinyStories-656K on CUDA in the exact mode against the
CPU (greedy text, prompt logits), the Python h2o against the built-in h2o on CUDA (positions every
step), q8_0 rows, then model.generate against `squeezekv generate` on the 8B shape (dummy bf16
weights), alternated, median of 3.
    PYTHONPATH=out/dev/python python3 python_cuda.py SHARED_MODELS CLI"""
import re
import statistics
import subprocess
import sys
import time

import numpy as np

import squeezekv

models, cli = sys.argv[1], sys.argv[2]
tiny = f"{models}/tinystories-656k"
cpu = squeezekv.load(tiny, threads=4, decode_activations="f32")
gpu = squeezekv.load(tiny, device="cuda", device_weights="f32", decode_activations="f32")
print("device:", gpu.device_description())
prompt = "Once upon a time, there was a little girl named Lily. She loved to play"
a = cpu.generate(prompt, max_tokens=48, temperature=0).text
b = gpu.generate(prompt, max_tokens=48, temperature=0).text
print("greedy text equal (exact mode):", a == b, repr(b[:80]))
ids = cpu.tokenize(prompt * 12)
la = cpu.sequence(squeezekv.KVConfig(type="f32")).prefill(ids, all_logits=True)
lb = gpu.sequence(squeezekv.KVConfig(type="f32")).prefill(ids, all_logits=True)
print(f"prompt logits [{la.shape}] max |cpu - cuda| / scale: {np.abs(la - lb).max() / np.abs(la).max():.2e}")


class PyH2O(squeezekv.ScorePolicy):
    calls = 0

    def score(self, layer, positions, mass, keys=None):
        PyH2O.calls += 1
        return mass


for t in ["f16"]:  # (q8_0 rows on CUDA need a head dim that is a multiple of 64; TinyStories-656K has 16)
    s1 = gpu.sequence(squeezekv.KVConfig(policy="h2o", budget=24, type=t))
    s2 = gpu.sequence(squeezekv.KVConfig(policy=PyH2O(), budget=24, type=t))
    s1.prefill(ids[:60]); s2.prefill(ids[:60])
    same, n = True, 0
    for tok in ids[60:110]:
        l1 = s1.decode(tok); l2 = s2.decode(tok)
        same &= bool(np.array_equal(l1, l2))
        for layer in range(gpu.config.n_layers):
            for g in range(gpu.config.n_kv_heads):
                same &= bool(np.array_equal(s1.kv_positions(layer, g), s2.kv_positions(layer, g)))
        n += 1
    print(f"CUDA {t} rows: Python h2o == built-in h2o (logits and positions, {n} steps): {same}; score() calls {PyH2O.calls}")

cfg = "bench/configs/llama-3.1-8b.json"
big = squeezekv.load(dummy=cfg, device="cuda")
text = "The quick brown fox jumps over the lazy dog. " * 4
big.generate(text, max_tokens=16, temperature=0)
py, cl = [], []
for _ in range(3):
    r = big.generate(text, max_tokens=128, temperature=0)
    py.append(len(r.tokens) / r.generate_seconds)
    err = subprocess.run([cli, "generate", "--dummy", cfg, "--device", "cuda", "-p", text, "-n", "128", "--temp", "0"],
                         capture_output=True, text=True).stderr
    m = re.search(r"generated: (\d+) tokens, ([\d.]+) tokens/s", err)
    cl.append(float(m.group(2)) if m else float("nan"))
    print(f"  python {py[-1]:.1f} ({len(r.tokens)} tokens) | cli {cl[-1]:.1f} ({m.group(1) if m else err[-200:]})")
print(f"8B dummy bf16, 1 sequence, 128 greedy tokens, median of 3: python {statistics.median(py):.1f} tok/s, "
      f"cli {statistics.median(cl):.1f}, ratio {statistics.median(py) / statistics.median(cl):.3f}")
