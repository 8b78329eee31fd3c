#!/usr/bin/env python3
"""Retrieval accuracy of squeezekv's policies next to NVIDIA kvpress's presses, on the same prompts.

squeezekv runs `eval retrieval` for each policy and writes every sample's token ids (--json); this
script then runs Hugging Face transformers on the same GGUF (transformers dequantizes it) and the
same token ids, compressing the prefilled prompt with the matching kvpress press, and decodes the
answer greedily from the compressed cache. Pairs compared:
  full   <-> no press
  window <-> StreamingLLMPress (sinks 4)
  snapkv <-> SnapKVPress (window 32, kernel 5)
  kvzip  <-> KVzipPress (layerwise: one ratio per layer, as squeezekv's per-layer budget)
  kvzip-adaptive <-> KVzipPress (squeezekv's kvzip with --kv-head-alloc adaptive: one ranking
           over a layer's heads, as kvpress's layerwise pruning)
A budget fraction f keeps f x prompt tokens per layer: kvpress's compression_ratio is 1 - f.

A measuring instrument, never run in CI. Set up a throw-away environment first:
  python3 -m venv /tmp/kvp && /tmp/kvp/bin/pip install kvpress gguf
  /tmp/kvp/bin/python bench/compare_kvpress.py --ctx 2048 --fraction 0.2 --samples 4
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

PAIRS = {"full": None, "window": "StreamingLLMPress", "snapkv": "SnapKVPress", "kvzip": "KVzipPress", "kvzip-adaptive": "KVzipPress"}
# squeezekv's flags for a label that is not a policy name
VARIANTS = {"kvzip-adaptive": ["--kv-policy", "kvzip", "--kv-head-alloc", "adaptive"]}


def run_squeezekv(args, policy, out):
    budget = 0 if policy == "full" else int(round(args.fraction * args.ctx))
    cmd = [args.squeezekv, "eval", "retrieval", "-m", args.model, "--task", "passkey", "--ctx", str(args.ctx),
           "--depths", *[str(d) for d in args.depths], "--samples", str(args.samples), "--seed", str(args.seed),
           *VARIANTS.get(policy, ["--kv-policy", policy]), "--kv-budget", str(budget), "-t", str(args.threads), "--json", out]
    if args.question_aware:
        cmd.append("--question-aware")
    if args.haystack:
        cmd += ["--haystack", args.haystack]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"compare_kvpress: {' '.join(cmd)} failed:\n{done.stderr}")
    with open(out) as f:
        return json.loads(f.readline())


def make_press(name, ratio, layerwise):
    import kvpress
    if name == "StreamingLLMPress":
        return kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4)
    if name == "SnapKVPress":
        return kvpress.SnapKVPress(compression_ratio=ratio, window_size=32, kernel_size=5)
    if name == "KVzipPress":
        return kvpress.KVzipPress(compression_ratio=ratio, layerwise=layerwise)
    raise ValueError(name)


def hf_answer(model, tok, press, prompt_ids, continue_ids, max_new, eos):
    import torch
    from transformers import DynamicCache
    cache = DynamicCache()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        if press is None:
            model(input_ids=ids, past_key_values=cache)
        else:
            with press(model):
                model(input_ids=ids, past_key_values=cache)
        out = []
        pos = len(prompt_ids)
        step = list(continue_ids)
        for _ in range(max_new):
            pos_ids = torch.arange(pos, pos + len(step)).unsqueeze(0)
            logits = model(input_ids=torch.tensor([step]), past_key_values=cache, position_ids=pos_ids).logits
            pos += len(step)
            nxt = int(logits[0, -1].argmax())
            if nxt in eos:
                break
            out.append(nxt)
            text = tok.decode(out)
            if "\n" in text:
                break
            step = [nxt]
    return tok.decode(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--squeezekv", default="build/squeezekv")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    ap.add_argument("--samples", type=int, default=4, help="samples per depth")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--question-aware", action="store_true")
    ap.add_argument("--haystack", help="a text file as the haystack (real prose) instead of the filler sentences")
    ap.add_argument("--policies", default="full,window,snapkv,kvzip", help="comma-separated: " + ", ".join(PAIRS))
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--out", help="write the comparison as JSON")
    ap.add_argument("--kvzip-global", action="store_true",
                    help="KVzipPress with kvpress's default (one ratio over all layers and heads) instead of per layer")
    args = ap.parse_args()
    for p in args.policies.split(","):
        if p not in PAIRS:
            ap.error(f"--policies: unknown '{p}' (expected some of {', '.join(PAIRS)})")

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import logging
    logging.getLogger("kvpress").setLevel(logging.ERROR)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    d, f = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    # KVzipPress reads the tokenizer from the model's name_or_path: give it a saved copy
    tokdir = tempfile.mkdtemp(prefix="kvp_tok_")
    tok.save_pretrained(tokdir)
    model.config._name_or_path = tokdir
    model.config.name_or_path = tokdir
    eos = {t for t in [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")] if t is not None}

    rows = []
    for policy in args.policies.split(","):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as t:
            path = t.name
        t0 = time.time()
        rec = run_squeezekv(args, policy, path)
        sq_s = time.time() - t0
        os.unlink(path)
        samples = rec["samples"]
        press_name = PAIRS[policy]
        ratio = 0.0
        hits, agree = 0, 0
        t0 = time.time()
        detail = []
        for s in samples:
            n_prompt = len(s["prompt_ids"])
            ratio = 0.0 if press_name is None else max(0.0, 1.0 - rec["budget"] / n_prompt)
            press = None if press_name is None else make_press(press_name, ratio, not args.kvzip_global)
            ans = hf_answer(model, tok, press, s["prompt_ids"], s["continue_ids"], args.answer_tokens, eos)
            numbers = re.findall(r"\d+", ans)  # as squeezekv's answer_matches: whole digit runs
            ok = bool(s["expected"]) and all(e in numbers for e in s["expected"])
            hits += ok
            agree += ok == s["correct"]
            detail.append({"depth": s["depth"], "expected": s["expected"], "squeezekv": s["answer"], "squeezekv_correct": s["correct"],
                           "kvpress": ans, "kvpress_correct": ok})
        n = len(samples)
        row = {"policy": policy, "press": (press_name or "none") + (" (global)" if args.kvzip_global and press_name == "KVzipPress" else ""), "ctx": args.ctx, "fraction": args.fraction,
               "question_aware": args.question_aware, "haystack": args.haystack or "filler", "samples": n, "squeezekv_accuracy": rec["accuracy"],
               "kvpress_accuracy": hits / n, "same_outcome": agree / n, "squeezekv_seconds": sq_s,
               "kvpress_seconds": time.time() - t0, "compression_ratio": ratio, "detail": detail}
        rows.append(row)
        print(f"{policy:7s} vs {row['press']:18s} squeezekv {rec['accuracy']:.2f}  kvpress {hits / n:.2f}  "
              f"same outcome {agree}/{n}", flush=True)
    if args.out:
        with open(args.out, "w") as o:
            json.dump({"model": args.model, "rows": rows}, o, indent=1)


if __name__ == "__main__":
    sys.exit(main())
