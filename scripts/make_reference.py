#!/usr/bin/env python3
"""Writes the reference files the C++ tests compare against (tests/ref/), from independent
implementations: Hugging Face transformers (logits) and tokenizers (token ids).

Run once after a change of reference; CI only reads the files it wrote.
    python3 -m venv .venv && .venv/bin/pip install torch transformers gguf tokenizers numpy
    .venv/bin/python scripts/make_reference.py --shared ../shared --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import json
import os
import random

import numpy as np

PROMPTS = [
    "Once upon a time, there was a little dog named Max.",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "Lily and Tom went to the park. They saw a big tree and",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
]


def corpus(shared):
    fixed = [
        "", " ", "  ", "\n", "\n\n\n", "\t", " \t \n ", "a", "Hello world", "Hello  world", " leading space",
        "trailing space ", "multiple   spaces   here", "tabs\tand\ttabs", "new\nlines\r\nand\rreturns",
        "12345", "3.14159", "1,000,000", "2024-11-29", "x=42;y=0x1F", "phone: +1 (555) 123-4567",
        "café", "naïve résumé", "Straße", "Ελληνικά", "русский текст", "日本語のテキスト", "中文字符",
        "한국어", "עברית", "العربية", "हिन्दी", "emoji 😀😃😄", "👍🏽 thumbs", "👨‍👩‍👧‍👦 family", "🏳️‍🌈",
        "def f(x):\n    return x * 2\n", "int main() { return 0; }", "for (int i = 0; i < n; ++i) {}",
        "<html><body>hi</body></html>", "{\"key\": [1, 2, 3]}", "SELECT * FROM t WHERE a='b';",
        "don't won't I'm you're he'll we've they'd", "DON'T WON'T I'M", "'s 's 'S",
        "a\u00a0b", "zero\u200bwidth", "e\u0301", "Ω≈ç√∫", "¡Hola! ¿Qué tal?", "…—–“”‘’",
        "$100 & 50% off #deal @user", "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?", "     ", "\u3000full width",
        "mixed123numbers456", "CamelCaseIdentifier", "snake_case_identifier", "UPPER lower MiXeD",
        "Once upon a time", "The end.", "a b c d e f g", "aaaaaaaaaaaaaaaaaaaaaaaa", "ab" * 40,
    ]
    rng = random.Random(1234)
    pieces = fixed[1:] + ["the", " cat", "Lily", " 7", "99", " ", "\n", "!", "é", "😀", "  ", "word"]
    out = list(fixed)
    while len(out) < 160:
        out.append("".join(rng.choice(pieces) for _ in range(rng.randint(2, 8))))
    with open(os.path.join(shared, "data/austen/prideprejudice.txt"), encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    for i in range(60):
        out.append(lines[500 + i * 37])
    return out


def smollm2_tokenizer(gguf_path):
    from gguf import GGUFReader
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken

    r = GGUFReader(gguf_path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    # SmolLM2's published tokenizer.json: every digit alone, then GPT-2's byte-level split
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == 3])
    return tok


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def with_split_pretokenizer(tok, pattern, ignore_merges):
    """The same vocabulary and merges behind Llama-3's / Qwen2's pre-tokenizer (a Split on the
    published pattern, then byte-level without its own regex), as their tokenizer.json files do."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    spec = json.loads(tok.to_str())
    model = spec["model"]
    out = Tokenizer(models.BPE(vocab=model["vocab"], merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                                                               for m in model["merges"]], ignore_merges=ignore_merges))
    out.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return out


def write_tokenizer_ref(path, tok, texts):
    rows = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False, indent=0)
    print("wrote", path, len(rows), "strings")


def write_logits_ref(path, model, ids_list, last_n):
    import torch
    out = []
    for ids in ids_list:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
        keep = logits[-last_n:] if last_n else logits
        out.append({"ids": ids, "first_row": int(len(ids) - len(keep)), "rows": len(keep),
                    "logits_file": None, "logits": keep.astype(np.float32)})
    meta = []
    blob = bytearray()
    for o in out:
        meta.append({"ids": o["ids"], "first_row": o["first_row"], "rows": o["rows"], "offset": len(blob) // 4})
        blob += o["logits"].tobytes()
    with open(path + ".bin", "wb") as f:
        f.write(blob)
    with open(path + ".json", "w") as f:
        json.dump({"vocab": int(out[0]["logits"].shape[1]), "cases": meta}, f)
    print("wrote", path, len(out), "cases")


# Block layouts as (block bytes, byte offsets of the f16 scale fields); src/core/quant.h.
QUANT_LAYOUTS = {
    "Q8_0": (34, [0]), "Q4_0": (18, [0]), "Q4_1": (20, [0, 2]), "Q5_0": (22, [0]), "Q5_1": (24, [0, 2]),
    "Q2_K": (84, [80, 82]), "Q3_K": (110, [108]), "Q4_K": (144, [0, 2]), "Q5_K": (176, [0, 2]),
    "Q6_K": (210, [208]), "IQ4_NL": (18, [0]), "IQ4_XS": (136, [0]),
}


def write_quant_ref(path, real_dir=None):
    """Random blocks of every supported type and their dequantization by gguf-py; with real_dir,
    also the first rows of real tensors of each type from the GGUF files there (any file whose
    tensors have that type: llama.cpp's quantizer writes them, scripts/quantize_types.py)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader
    from gguf.quants import dequantize

    rng = np.random.default_rng(7)
    meta, blob = [], bytearray()

    def add(name, raw, qt, source):
        vals = dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
        meta.append({"type": name, "source": source, "raw_offset": len(blob), "raw_bytes": int(raw.size),
                     "n": int(vals.size)})
        blob.extend(raw.tobytes())
        meta[-1]["val_offset"] = len(blob)
        blob.extend(vals.tobytes())

    for name, (bb, scales) in QUANT_LAYOUTS.items():
        nb = 8
        raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
        for off in scales:
            raw[:, off:off + 2] = rng.uniform(-0.1, 0.1, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        add(name, raw, Q[name], "random")
    if real_dir:
        found = set()
        for fname in sorted(os.listdir(real_dir)):
            if not fname.endswith(".gguf"):
                continue
            for t in GGUFReader(os.path.join(real_dir, fname)).tensors:
                name = t.tensor_type.name
                if name in QUANT_LAYOUTS and name not in found and t.data.ndim == 2:
                    found.add(name)
                    rows = np.ascontiguousarray(t.data[:2]).view(np.uint8)  # the first 2 rows
                    add(name, rows, t.tensor_type, f"{fname}:{t.name}")
        missing = set(QUANT_LAYOUTS) - found
        if missing:
            raise SystemExit(f"no real tensor of type(s) {sorted(missing)} in {real_dir}")
    f16 = rng.standard_normal(512).astype(np.float16)
    f16[:4] = [0.0, -0.0, 65504.0, 6e-8]
    meta.append({"type": "F16", "source": "random", "raw_offset": len(blob), "raw_bytes": 1024, "n": 512})
    blob += f16.tobytes()
    meta[-1]["val_offset"] = len(blob)
    blob += f16.astype(np.float32).tobytes()
    bf = rng.standard_normal(512).astype(np.float32)
    bf_raw = (bf.view(np.uint32) >> 16).astype(np.uint16)
    meta.append({"type": "BF16", "source": "random", "raw_offset": len(blob), "raw_bytes": 1024, "n": 512})
    blob += bf_raw.tobytes()
    meta[-1]["val_offset"] = len(blob)
    blob += (bf_raw.astype(np.uint32) << 16).view(np.float32).tobytes()
    with open(path + ".bin", "wb") as f:
        f.write(blob)
    with open(path + ".json", "w") as f:
        json.dump(meta, f)
    print("wrote", path)


def write_tiny_models(out, shared):
    """Two tiny random-weight models that cover what the shipped test models do not: qwen2 (q/k/v
    bias) stored as BF16, and a Llama-3-style rope_scaling model stored as F16 in shards with an
    index. TinyStories' tokenizer files are reused; logits come from transformers."""
    import shutil
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    ts_dir = os.path.join(shared, "models/tinystories-656k")
    tok = Tokenizer.from_file(os.path.join(ts_dir, "tokenizer.json"))
    ids = [tok.encode(p).ids for p in PROMPTS[:2]]
    common = dict(vocab_size=2048, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    specs = [
        ("tiny_qwen2", Qwen2ForCausalLM, Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=False),
         torch.bfloat16, None),
        ("tiny_llama3", LlamaForCausalLM,
         LlamaConfig(**common, rope_theta=500000.0, tie_word_embeddings=True,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
         torch.float16, "100KB"),
    ]
    for name, cls, cfg, dtype, shard in specs:
        torch.manual_seed(11)
        model = cls(cfg).eval()
        with torch.no_grad():  # larger weights than the default init, so the logits carry signal
            for p in model.parameters():
                p.mul_(2.0)
            if hasattr(model.model.layers[0].self_attn.q_proj, "bias") and model.model.layers[0].self_attn.q_proj.bias is not None:
                for layer in model.model.layers:
                    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                        proj.bias.normal_(0.0, 0.2)
        model = model.to(dtype)
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        kw = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(d, safe_serialization=True, **kw)
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(os.path.join(ts_dir, f), d)
        # reload in f32: casting the live model back would keep its rope buffer rounded to dtype
        ref = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        write_logits_ref(os.path.join(out, "logits_" + name), ref, ids, 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--gguf", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/ref")
    ap.add_argument("--real-quant-dir", help="GGUF files of every quantization type (scripts/quantize_types.py)")
    ap.add_argument("--only-quant", action="store_true", help="write tests/ref/quant.* only (needs gguf, numpy)")
    a = ap.parse_args()
    if a.only_quant:
        write_quant_ref(os.path.join(a.out, "quant"), a.real_quant_dir)
        return
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    os.makedirs(a.out, exist_ok=True)
    write_quant_ref(os.path.join(a.out, "quant"), a.real_quant_dir)
    write_tiny_models(a.out, a.shared)
    texts = corpus(a.shared)
    ts_dir = os.path.join(a.shared, "models/tinystories-656k")
    ts_tok = Tokenizer.from_file(os.path.join(ts_dir, "tokenizer.json"))
    sm_tok = smollm2_tokenizer(a.gguf)
    write_tokenizer_ref(os.path.join(a.out, "tokenizer_tinystories.json"), ts_tok, texts)
    write_tokenizer_ref(os.path.join(a.out, "tokenizer_smollm2.json"), sm_tok, texts)
    write_tokenizer_ref(os.path.join(a.out, "tokenizer_llama3_pre.json"),
                        with_split_pretokenizer(sm_tok, LLAMA3_PATTERN, True), texts)
    write_tokenizer_ref(os.path.join(a.out, "tokenizer_qwen2_pre.json"),
                        with_split_pretokenizer(sm_tok, QWEN2_PATTERN, False), texts)

    ts = AutoModelForCausalLM.from_pretrained(ts_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ts_ids = [ts_tok.encode(p).ids for p in PROMPTS]  # with BOS, as the model was trained
    write_logits_ref(os.path.join(a.out, "logits_tinystories"), ts, ts_ids, 0)

    gdir, gname = os.path.split(os.path.abspath(a.gguf))
    sm = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, torch_dtype=torch.float32,
                                              attn_implementation="eager").eval()
    sm_ids = [sm_tok.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    write_logits_ref(os.path.join(a.out, "logits_smollm2"), sm, sm_ids, 4)


if __name__ == "__main__":
    main()
