#!/usr/bin/env python3
"""squeezekv on CUDA side by side with Hugging Face transformers at its best (bf16, static cache,
torch.compile through generate()), in one run on the GPU machine, same model config, random
weights on both (speed does not depend on the values; the GPU machine can download nothing):
decode tokens/s at each depth and prompt tokens/s at depth 0, and the ratios.

    python3 bench/compare_hf_gpu.py --squeezekv build/squeezekv --config bench/configs/llama-3.1-8b.json \\
        --depths 0,32768 --gen 64 --prompt 512 [--ours-kv "--kv-policy squeeze --kv-budget 2048"]

transformers and torch are the GPU machine's own (never installed by this project); run it there.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time


def ours(exe, config, depth, prompt, gen, reps, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [exe, "bench", "--dummy", config, "--device", "cuda", "-p", str(prompt if depth == 0 else 0), "-n", str(gen),
               "-d", str(depth), "-r", str(reps), "--json", f.name] + extra
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        rep = json.load(open(f.name))
    return {t["test"]: t for t in rep["tests"]}, rep


def hf(config, depth, prompt, gen, reps):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in json.load(open(config)).items() if k != "architectures"})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).eval()
    n = depth if depth > 0 else prompt
    ids = torch.randint(100, cfg.vocab_size - 100, (1, n), device="cuda")

    def timed(new):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, cache_implementation="static",
                           pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    timed(gen + 1)  # compiles (static cache: generate() compiles the decode step)
    pre, tot = [], []
    for _ in range(reps):
        pre.append(timed(1))
        tot.append(timed(gen + 1))
    pre.sort()
    tot.sort()
    p, t = pre[len(pre) // 2], tot[len(tot) // 2]
    del model
    torch.cuda.empty_cache()
    return {"prefill_tok_s": n / p, "decode_tok_s": gen / (t - p)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--squeezekv", default="build/squeezekv")
    ap.add_argument("--config", default="bench/configs/llama-3.1-8b.json")
    ap.add_argument("--depths", default="0,32768")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ours-kv", default="", help="extra squeezekv flags for an extra row (e.g. a KV policy)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows, out = [], {"config": a.config, "runs": []}
    for d in [int(x) for x in a.depths.split(",")]:
        o, rep = ours(a.squeezekv, a.config, d, a.prompt, a.gen, a.reps, [])
        h = None if a.skip_hf else hf(a.config, d, a.prompt, a.gen, a.reps)
        run = {"depth": d, "ours": o, "hf": h, "copy_bandwidth": rep.get("copy_bandwidth_bytes_s")}
        if a.ours_kv:
            run["ours_kv"], _ = ours(a.squeezekv, a.config, d, a.prompt, a.gen, a.reps, shlex.split(a.ours_kv))
        out["runs"].append(run)
        tg = o["tg"]["median"]
        line = f"| {d} | {tg:.1f} ({100 * o['tg']['roofline_fraction']:.0f}% roofline) |"
        line += f" {h['decode_tok_s']:.1f} | {tg / h['decode_tok_s']:.2f}x |" if h else " - | - |"
        if d == 0 and "pp" in o:
            line += f" {o['pp']['median']:.0f} |" + (f" {h['prefill_tok_s']:.0f} | {o['pp']['median'] / h['prefill_tok_s']:.2f}x |" if h else " - | - |")
        else:
            line += " - | - | - |"
        if a.ours_kv:
            line += f" {run['ours_kv']['tg']['median']:.1f} |"
        rows.append(line)
        if a.json:
            json.dump(out, open(a.json, "w"), indent=1)
    print(f"config {a.config}; decode tg{a.gen}, prompt pp{a.prompt} at depth 0; medians of {a.reps}")
    head = "| depth | squeezekv tok/s | transformers tok/s | ratio | squeezekv pp tok/s | transformers pp tok/s | ratio |"
    if a.ours_kv:
        head += f" squeezekv {a.ours_kv} tok/s |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
