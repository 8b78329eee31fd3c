#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/) with the project's own
writers: tiny but valid inputs that load, so the fuzzers start from files that reach deep into
the loaders. Standard library only.
  python3 scripts/make_fuzz_seeds.py [--out tests/fuzz/corpus]
"""
import argparse
import json
import os
import random
import struct

# GPT-2's byte-to-unicode table: every byte as one printable character (byte-level BPE vocab)
def byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_vocab():
    bc = byte_chars()
    tokens = [bc[b] for b in range(256)]
    merges = [(bc[ord("t")], bc[ord("h")]), (bc[ord("t")] + bc[ord("h")], bc[ord("e")]), (bc[ord(" ")], bc[ord("t")]),
              (bc[ord("i")], bc[ord("n")]), (bc[ord("e")], bc[ord("r")])]
    tokens += [a + b for a, b in merges]
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return tokens, merges


# ---- GGUF (v3) ----
GGUF_STR, GGUF_U32, GGUF_F32, GGUF_BOOL, GGUF_ARR, GGUF_I32 = 8, 4, 6, 7, 9, 5


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, kind, value):
    out = gguf_str(key) + struct.pack("<I", kind)
    if kind == GGUF_STR:
        out += gguf_str(value)
    elif kind == GGUF_U32:
        out += struct.pack("<I", value)
    elif kind == GGUF_I32:
        out += struct.pack("<i", value)
    elif kind == GGUF_F32:
        out += struct.pack("<f", value)
    elif kind == GGUF_BOOL:
        out += struct.pack("<B", value)
    elif kind == GGUF_ARR:
        elem, items = value
        out += struct.pack("<IQ", elem, len(items))
        for it in items:
            out += gguf_str(it) if elem == GGUF_STR else struct.pack("<i", it)
    return out


def block_rows(rows, cols, rnd, scale, quant_bytes):
    """Rows of blocks of 32 values: an f16 scale, then quant_bytes random bytes (Q8_0: 32, Q4_0: 16)."""
    out = b""
    for _ in range(rows):
        for _ in range(cols // 32):
            out += struct.pack("<e", scale) + bytes(rnd.randrange(256) for _ in range(quant_bytes))
    return out


def f32(n, rnd, scale=0.1):
    return struct.pack("<%df" % n, *[rnd.uniform(-scale, scale) for _ in range(n)])


def tiny_gguf(quant):
    rnd = random.Random(7)
    tokens, merges = tiny_vocab()
    V, E, F, H, L = len(tokens), 32, 64, 2, 1
    kvs = [gguf_kv("general.architecture", GGUF_STR, "llama"), gguf_kv("general.alignment", GGUF_U32, 32),
           gguf_kv("llama.block_count", GGUF_U32, L), gguf_kv("llama.embedding_length", GGUF_U32, E),
           gguf_kv("llama.feed_forward_length", GGUF_U32, F), gguf_kv("llama.attention.head_count", GGUF_U32, H),
           gguf_kv("llama.attention.head_count_kv", GGUF_U32, 1), gguf_kv("llama.context_length", GGUF_U32, 64),
           gguf_kv("llama.attention.layer_norm_rms_epsilon", GGUF_F32, 1e-5),
           gguf_kv("tokenizer.ggml.model", GGUF_STR, "gpt2"), gguf_kv("tokenizer.ggml.pre", GGUF_STR, "smollm"),
           gguf_kv("tokenizer.ggml.tokens", GGUF_ARR, (GGUF_STR, tokens)),
           gguf_kv("tokenizer.ggml.token_type", GGUF_ARR, (GGUF_I32, [1] * (V - 3) + [3, 3, 3])),
           gguf_kv("tokenizer.ggml.merges", GGUF_ARR, (GGUF_STR, [a + " " + b for a, b in merges])),
           gguf_kv("tokenizer.ggml.bos_token_id", GGUF_U32, V - 3), gguf_kv("tokenizer.ggml.eos_token_id", GGUF_U32, V - 3),
           gguf_kv("tokenizer.chat_template", GGUF_STR, "<|im_start|>system\nYou are tiny.<|im_end|>")]
    def mat(rows, cols, rnd):
        return block_rows(rows, cols, rnd, 0.01, 32) if quant == "q8_0" else block_rows(rows, cols, rnd, 0.02, 16)
    qtype = 8 if quant == "q8_0" else 2
    KD = E // H
    tensors = [("token_embd.weight", [E, V], qtype, mat(V, E, rnd)), ("output_norm.weight", [E], 0, f32(E, rnd, 1.0)),
               ("blk.0.attn_norm.weight", [E], 0, f32(E, rnd, 1.0)), ("blk.0.attn_q.weight", [E, E], qtype, mat(E, E, rnd)),
               ("blk.0.attn_k.weight", [E, KD], qtype, mat(KD, E, rnd)), ("blk.0.attn_v.weight", [E, KD], qtype, mat(KD, E, rnd)),
               ("blk.0.attn_output.weight", [E, E], qtype, mat(E, E, rnd)), ("blk.0.ffn_norm.weight", [E], 0, f32(E, rnd, 1.0)),
               ("blk.0.ffn_gate.weight", [E, F], qtype, mat(F, E, rnd)), ("blk.0.ffn_up.weight", [E, F], qtype, mat(F, E, rnd)),
               ("blk.0.ffn_down.weight", [F, E], 0, f32(E * F, rnd))]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    infos, data = b"", b""
    for name, dims, t, blob in tensors:
        data += b"\0" * (-len(data) % 32)
        infos += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", t, len(data))
        data += blob
    out = head + infos
    return out + b"\0" * (-len(out) % 32) + data


# ---- Hugging Face directory (config.json, tokenizer.json, model.safetensors) ----
def tiny_hf():
    rnd = random.Random(11)
    tokens, merges = tiny_vocab()
    V, E, F, H = len(tokens), 16, 32, 2
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": E, "intermediate_size": F,
              "num_attention_heads": H, "num_key_value_heads": H, "num_hidden_layers": 1, "vocab_size": V,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "bos_token_id": V - 3, "eos_token_id": V - 3, "torch_dtype": "float32"}
    tok = {"version": "1.0", "added_tokens": [{"id": V - 3 + i, "content": t, "special": True, "single_word": False,
                                               "lstrip": False, "rstrip": False, "normalized": False}
                                              for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])],
           "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                                  "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [a + " " + b for a, b in merges]},
           "decoder": {"type": "ByteLevel"}}
    names = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E],
             "model.layers.0.input_layernorm.weight": [E], "model.layers.0.post_attention_layernorm.weight": [E],
             "model.layers.0.self_attn.q_proj.weight": [E, E], "model.layers.0.self_attn.k_proj.weight": [E, E],
             "model.layers.0.self_attn.v_proj.weight": [E, E], "model.layers.0.self_attn.o_proj.weight": [E, E],
             "model.layers.0.mlp.gate_proj.weight": [F, E], "model.layers.0.mlp.up_proj.weight": [F, E],
             "model.layers.0.mlp.down_proj.weight": [E, F]}
    header, blob = {}, b""
    for name, shape in names.items():
        n = 1
        for d in shape:
            n *= d
        data = f32(n, rnd)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    st = struct.pack("<Q", len(h)) + h + blob
    sep = b"\n#--file--#\n"
    return json.dumps(config).encode() + sep + json.dumps(tok).encode() + sep + st


def tiny_hf_sharded():
    """tiny_hf() with a shard index naming model.safetensors for every tensor (the sharded layout)."""
    parts = tiny_hf().split(b"\n#--file--#\n")
    st = parts[2]
    hlen = struct.unpack_from("<Q", st, 0)[0]
    names = sorted(json.loads(st[8:8 + hlen]).keys())
    index = {"metadata": {"total_size": len(st) - 8 - hlen}, "weight_map": {n: "model.safetensors" for n in names}}
    return b"\n#--file--#\n".join(parts + [json.dumps(index).encode()])


# ---- llama2.c checkpoint + tokenizer (fuzz_llama2c: first byte 0 = checkpoint, 1 = tokenizer) ----
def tiny_llama2c():
    E, F, L, H, G, V, seq = 8, 16, 1, 2, 2, 8, 4
    D = E // H
    n = V * E + L * E + 4 * L * E * E + L * E + 3 * L * F * E + E + seq * D
    rnd = random.Random(5)
    return struct.pack("<7i", E, F, L, H, G, V, seq) + struct.pack("<%df" % n, *[rnd.uniform(-0.1, 0.1) for _ in range(n)])


def tiny_llama2c_tokenizer():
    toks = ["<unk>", "<s>", "</s>", "a", "b", " ", "ab", "<0x41>"]
    out = struct.pack("<i", max(len(t) for t in toks))
    for i, t in enumerate(toks):
        out += struct.pack("<fi", -float(i), len(t)) + t.encode()
    return out


CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
          "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}")
LLAMA3 = ("{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}{% endfor %}")


def chat_input(template, messages):
    return template.encode() + b"\0" + b"\x02".join(r.encode() + b"\x01" + c.encode() for r, c in messages)


TEXTS = ["Hello, world!", "The quick brown fox jumps over the lazy dog.", "  leading and trailing spaces  ",
         "naïve café — “quotes” ‘and’ … ellipsis", "日本語のテキストと한국어 텍스트", "emoji 🙂👍🏽 and ZWJ 👩‍👩‍👧",
         "<|im_start|>user\nhi<|im_end|>", "numbers 1234567890 3.14159 -42", "tabs\tand\nnewlines\r\n",
         "x" * 200, "mixed ASCII and Ελληνικά and العربية"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fuzz", "corpus"))
    a = ap.parse_args()
    files = {("gguf", "tiny_q8_0.gguf"): tiny_gguf("q8_0"), ("gguf", "tiny_q4_0.gguf"): tiny_gguf("q4_0"),
             ("hf", "tiny_llama"): tiny_hf(), ("hf", "tiny_llama_sharded"): tiny_hf_sharded()}
    for i, t in enumerate(TEXTS):
        files[("tokenizer", "text_%02d" % i)] = t.encode()
    files[("tokenizer", "invalid_utf8")] = b"ab\xff\xfe\xc3(\xe2\x82 end"
    requests = [
        {"model": "m", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 8, "temperature": 0},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Name a river."}]}],
         "stream": True, "stream_options": {"include_usage": True}, "stop": ["\n", "."], "seed": 3, "top_p": 0.9},
        {"prompt": "Once upon a time", "max_tokens": 16, "kv": {"policy": "squeeze", "budget": 64, "squeeze_metric": "attention_entropy"}},
        {"prompt": ["The capital of France is"], "n": 1, "top_k": 40, "min_p": 0.05, "kv": {"policy": "snapkv", "budget": 48, "snapkv_window": 8}},
        {"messages": [{"role": "user", "content": "x"}], "kv": {"policy": "h2o", "budget": 32, "sinks": 2, "recent": 8, "type": "f32"}},
    ]
    for i, r in enumerate(requests):
        files[("request", "request_%02d.json" % i)] = json.dumps(r).encode()
    files[("llama2c", "checkpoint")] = b"\x00" + tiny_llama2c()
    files[("llama2c", "tokenizer")] = b"\x01" + tiny_llama2c_tokenizer()
    files[("chat", "chatml")] = chat_input(CHATML, [("user", "Hi there"), ("assistant", "Hello!"), ("user", "A river?")])
    files[("chat", "chatml_system")] = chat_input(CHATML, [("system", "Be brief."), ("user", "naïve café 🙂")])
    files[("chat", "llama3")] = chat_input(LLAMA3, [("user", "What is 2+2?")])
    files[("chat", "plain")] = chat_input("", [("user", "plain text"), ("user", "")])
    configs = [  # Hugging Face config.json shapes: llama (tied and not), qwen2 with biases, GQA
        {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "tie_word_embeddings": True},
        {"model_type": "llama", "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 3, "num_attention_heads": 8,
         "num_key_value_heads": 8, "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
         "rope_theta": 500000.0, "head_dim": 16, "tie_word_embeddings": False,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 512}},
        {"model_type": "qwen2", "hidden_size": 96, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 6,
         "num_key_value_heads": 2, "vocab_size": 400, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
         "rope_theta": 1000000.0, "tie_word_embeddings": True},
    ]
    for i, c in enumerate(configs):
        files[("config", "config_%02d.json" % i)] = json.dumps(c, indent=1).encode()
    sweeps = [  # eval sweep configs: every task kind, per-task budgets, shards, KV options
        {"model": "m.gguf", "output": "out.jsonl", "budget_fractions": [0.1, 0.2, 0.5],
         "policies": [{"kv_policy": "h2o"}, {"kv_policy": "squeeze", "squeeze_metric": "key_cosine", "label": "sq"},
                      {"kv_policy": "snapkv", "snapkv_window": 8}],
         "tasks": [{"task": "ppl", "text": "t.txt", "ctx": [1024, 4096], "prefix_fraction": 0.5, "windows": 2},
                   {"task": "passkey", "ctx": [2048], "depths": [0, 0.5, 1], "samples": 10, "seed": 3,
                    "budget_fractions": [0.2], "question_aware": True, "prefill_chunk": 256}]},
        {"model": "m.gguf", "output": "o.jsonl", "include_full": False, "budget_fractions": [0.25],
         "done_records": ["a.jsonl"], "policies": [{"kv_policy": "window", "kv_sinks": 4}, {"kv_policy": "kvzip"}],
         "tasks": [{"task": "niah-multikey", "label": "mk", "ctx": [512], "haystack": "h.txt"},
                   {"task": "niah-multivalue", "ctx": [256, 512]}]},
    ]
    for i, c in enumerate(sweeps):
        files[("sweep", "sweep_%02d.json" % i)] = json.dumps(c, indent=1).encode()
    for (target, name), data in files.items():
        d = os.path.join(a.out, target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds under %s" % (len(files), a.out))


if __name__ == "__main__":
    main()
