#!/usr/bin/env python3
"""squeezekv side by side with llama.cpp, in one run, on the same GGUF files, the same token ids,
the same thread count, rounds interleaved (ours, then llama.cpp, per round and file), medians.

llama.cpp is a measuring instrument here, installed by the user in a throw-away environment and
never in CI: the Python package llama-cpp-python from PyPI (its quantizer makes the test files and
its API runs the fallback timing loop and the perplexity), and optionally llama.cpp's own
llama-bench built from that package's source (vendor/llama.cpp), which is what llama.cpp users run:

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install llama-cpp-python gguf numpy
    /tmp/peers/bin/python bench/compare_llamacpp.py --threads 2                 # the default model
    /tmp/peers/bin/python bench/compare_llamacpp.py --threads 1,2,4,8           # at each thread count in turn
    /tmp/peers/bin/python bench/compare_llamacpp.py --types --llama-bench PATH   # every quant preset
    /tmp/peers/bin/python bench/compare_llamacpp.py --depth 8192 --gen 64 --prompt 0 \\
        --ours-kv "--kv-policy squeeze --kv-budget 512"                          # eviction vs full cache

--types quantizes the default model to each preset with llama.cpp's quantizer (allow_requantize:
the source is the Q4_1 file) into --types-dir, then measures both engines on each file and, with
--ppl TEXT, the perplexity of each engine on the same windows of TEXT (--ppl-kv-types f16,q8_0,q4_0:
with each KV row type, both engines alike).
"""
import argparse
import ctypes
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

PRESETS = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K",
           "IQ4_NL", "IQ4_XS", "Q2_K-pure"]  # -pure: every tensor in the type (the Q2_K preset writes none)


def bench_token(i, vocab):
    """The fixed input sequence of `squeezekv bench` (tools/bench/bench.cc)."""
    return i % vocab if vocab <= 300 else 100 + (i * 7919) % (vocab - 200)


def quantize_presets(src, out_dir, presets):
    import llama_cpp as l

    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.basename(src).split(".")[0]
    files = {}
    for p in presets:
        out = os.path.join(out_dir, f"{stem}.{p}.gguf")
        if not os.path.exists(out):
            prm = l.llama_model_quantize_default_params()
            prm.ftype = getattr(l, "LLAMA_FTYPE_MOSTLY_" + p.removesuffix("-pure"))
            prm.allow_requantize = True
            prm.pure = p.endswith("-pure")
            rc = l.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(prm))
            if rc != 0:
                raise SystemExit(f"llama_model_quantize {p}: error {rc}")
        files[p] = out
    return files


def ours(exe, model, threads, p, n, depth, kv_args):
    """One round of `squeezekv bench`: {test: tok/s} plus the file's KV bytes at the end."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [exe, "bench", "-m", model, "-t", str(threads), "-p", str(p), "-n", str(n), "-d", str(depth), "-r", "1",
               "--json", f.name] + kv_args
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        rep = json.load(open(f.name))
    out = {}
    for t in rep["tests"]:
        out[t["test"]] = (t["median"], t["kv_kept_bytes"])
    return out


def llamacpp_bench(binary, model, threads, p, n, depth):
    cmd = [binary, "-m", model, "-t", str(threads), "-p", str(p), "-n", str(n), "-d", str(depth), "-r", "1", "-o", "json"]
    rep = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    out = {}
    for t in rep:
        out["pp" if t["n_prompt"] > 0 else "tg"] = (t["avg_ts"], None)
    return out


class LlamaPy:
    """The fallback timing loop through llama-cpp-python: the same tests as `squeezekv bench`."""

    def __init__(self):
        self.cache = {}

    def run(self, model, threads, p, n, depth):
        from llama_cpp import Llama

        key = (model, threads, p, n, depth)
        if key not in self.cache:
            self.cache = {key: Llama(model_path=model, n_ctx=depth + max(p, n) + 8, n_threads=threads,
                                     n_threads_batch=threads, n_batch=512, verbose=False)}
        llm = self.cache[key]
        v = llm.n_vocab()
        out = {}
        for kind, count in (("pp", p), ("tg", n)):
            if count == 0:
                continue
            llm.reset()
            if depth:
                llm.eval([bench_token(i, v) for i in range(depth)])
            toks = [bench_token(depth + i, v) for i in range(count)]
            t0 = time.perf_counter()
            if kind == "pp":
                llm.eval(toks)
            else:
                for t in toks:
                    llm.eval([t])
            out[kind] = (count / (time.perf_counter() - t0), None)
        return out


# KV row types by name: GGML's type numbers (llama-cpp-python's type_k / type_v)
GGML_KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 8}


def ppl_ours(exe, model, text, threads, ctx, windows, act, kv_type="f16"):
    r = subprocess.run([exe, "eval", "ppl", "-m", model, "--text", text, "--ctx", str(ctx), "--prefix", str(ctx // 2),
                        "--windows", str(windows), "-t", str(threads), "--decode-activations", act, "--kv-type", kv_type],
                       check=True, capture_output=True, text=True).stdout
    return float(r.split("ppl=")[1].split()[0])


def ppl_llamacpp(model, text, threads, ctx, windows, kv_type="f16"):
    """The same windows as `squeezekv eval ppl --prefix ctx/2`: each window of ctx tokens from the
    start of the text, tokens ctx/2 .. ctx-1 scored, each predicted from all tokens before it.
    kv_type: the cache's K and V type (-ctk/-ctv), with flash attention on (llama.cpp needs it for
    quantized V)."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, n_batch=ctx,
                logits_all=True, verbose=False, type_k=GGML_KV_TYPES[kv_type], type_v=GGML_KV_TYPES[kv_type],
                flash_attn=True)
    ids = llm.tokenize(open(text, "rb").read(), add_bos=False, special=False)
    total, count = 0.0, 0
    for w in range(windows):
        win = ids[w * ctx:(w + 1) * ctx]
        llm.reset()
        llm.eval(win[:-1])
        logits = np.asarray(llm.scores[:ctx - 1], dtype=np.float64)
        for i in range(ctx // 2, ctx):
            row = logits[i - 1]
            m = row.max()
            total += math.log(np.exp(row - m).sum()) + m - row[win[i]]
            count += 1
    return math.exp(total / count)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--squeezekv", default="build/squeezekv",
                    help="the binary to measure (an installed copy, so a rebuild cannot pull it away mid-run)")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (default: llama-cpp-python's API)")
    ap.add_argument("--threads", default="2", help="thread counts, a comma list: every file at each, in every round")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ours-kv", default="", help="extra flags for squeezekv only (e.g. a KV policy)")
    ap.add_argument("--types", action="store_true", help="every quantization preset of the default model")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--types-dir", default="models/types")
    ap.add_argument("--ppl", help="text file: perplexity of both engines per file (with --types)")
    ap.add_argument("--ppl-ctx", type=int, default=512)
    ap.add_argument("--ppl-windows", type=int, default=4)
    ap.add_argument("--ppl-kv-types", default="f16",
                    help="KV row types of the perplexity runs, both engines alike (e.g. f16,q8_0,q4_0; "
                         "llama.cpp's -ctk/-ctv)")
    ap.add_argument("--json", help="write every number to FILE")
    a = ap.parse_args()
    try:
        threads = [int(t) for t in a.threads.split(",")]
        if not threads or min(threads) < 1:
            raise ValueError
    except ValueError:
        sys.exit(f"--threads: expected positive integers separated by commas, got '{a.threads}'")

    files = {os.path.basename(a.model): a.model}
    if a.types:
        files = quantize_presets(a.model, a.types_dir, a.presets.split(","))
    kv_args = shlex.split(a.ours_kv)
    peer = LlamaPy()
    peer_name = "llama-bench" if a.llama_bench else "llama-cpp-python"
    print(f"machine: {platform.processor() or platform.machine()} ({cpu_name()}), {os.cpu_count()} cores; "
          f"threads={','.join(map(str, threads))}; pp{a.prompt} tg{a.gen} @ d{a.depth}; {a.rounds} rounds interleaved (median); "
          f"peer: {peer_name}; squeezekv flags: {' '.join(kv_args) or '(defaults)'}", flush=True)
    # one entry a file and thread count (named by the file alone where there is one count)
    runs = {(name if len(threads) == 1 else f"{name} -t {t}"): (path, t) for name, path in files.items() for t in threads}
    results = {key: {"ours": {"pp": [], "tg": []}, "llama.cpp": {"pp": [], "tg": []}, "kv": None, "threads": t}
               for key, (_, t) in runs.items()}
    for r in range(a.rounds):
        for key, (path, t) in runs.items():
            o = ours(a.squeezekv, path, t, a.prompt, a.gen, a.depth, kv_args)
            if a.llama_bench:
                l = llamacpp_bench(a.llama_bench, path, t, a.prompt, a.gen, a.depth)
            else:
                l = peer.run(path, t, a.prompt, a.gen, a.depth)
            for k in ("pp", "tg"):
                if k in o:
                    results[key]["ours"][k].append(o[k][0])
                    results[key]["kv"] = o[k][1]
                if k in l:
                    results[key]["llama.cpp"][k].append(l[k][0])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)

    def med(v):
        return statistics.median(v) if v else float("nan")

    def save():
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "results": results}, f, indent=1)

    save()
    kinds = [k for k, n in (("pp", a.prompt), ("tg", a.gen)) if n > 0]
    head = "| file | threads |" + "".join(f" squeezekv {k}{a.prompt if k == 'pp' else a.gen} | llama.cpp | ratio |" for k in kinds)
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for name, res in results.items():
        row = f"| {name.split(' -t ')[0]} | {res['threads']} |"
        for k in kinds:
            o, l = med(res["ours"][k]), med(res["llama.cpp"][k])
            row += f" {o:.1f} | {l:.1f} | {o / l:.2f}x |"
        print(row, flush=True)
    if a.ppl:
        print(f"\nperplexity of {os.path.basename(a.ppl)}: {a.ppl_windows} windows of {a.ppl_ctx} tokens, the second half "
              f"of each scored")
        kv_types = a.ppl_kv_types.split(",")
        for t in kv_types:
            if t not in GGML_KV_TYPES:
                sys.exit(f"--ppl-kv-types: unknown type '{t}' (expected some of: {', '.join(GGML_KV_TYPES)})")
        print("| file | KV type | squeezekv (f32 decode) | squeezekv (int8 decode) | llama.cpp | ratio f32 / llama.cpp |")
        print("|---|---|---|---|---|---|")
        for name, path in files.items():  # at the first thread count
            res = results[name if len(threads) == 1 else f"{name} -t {threads[0]}"]
            for t in kv_types:
                sfx = "" if t == "f16" else "_" + t
                res["ppl_ours_f32" + sfx] = ppl_ours(a.squeezekv, path, a.ppl, threads[0], a.ppl_ctx, a.ppl_windows, "f32", t)
                res["ppl_ours_int8" + sfx] = ppl_ours(a.squeezekv, path, a.ppl, threads[0], a.ppl_ctx, a.ppl_windows, "int8", t)
                res["ppl_llamacpp" + sfx] = ppl_llamacpp(path, a.ppl, threads[0], a.ppl_ctx, a.ppl_windows, t)
                save()
                print(f"| {name} | {t} | {res['ppl_ours_f32' + sfx]:.3f} | {res['ppl_ours_int8' + sfx]:.3f} | "
                      f"{res['ppl_llamacpp' + sfx]:.3f} | {res['ppl_ours_f32' + sfx] / res['ppl_llamacpp' + sfx]:.4f} |", flush=True)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
