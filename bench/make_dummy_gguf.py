"""A GGUF file of a Hugging Face config's shape with random BF16 weights, for peers that cannot
read our `--dummy CONFIG` (llama.cpp's llama-bench and llama-batched-bench on a GPU machine that
downloads nothing). Same tensor shapes as `squeezekv --dummy`: every matrix BF16, the norms F32.

The weights are views into one pool of random values (normal, std 0.02, rounded to BF16) at
random offsets, so writing an 8B shape needs a few hundred MB of memory, not 16 GB. The
vocabulary is a SentencePiece-style list (<unk>, <s>, </s>, the 256 byte tokens, then "t<id>")
that llama.cpp loads; the bench tools feed token ids, never text. RoPE scaling is left out (the
speed of a step does not depend on it).

Needs numpy and gguf-py (`pip install gguf`, or the gguf-py folder of a llama.cpp checkout on
PYTHONPATH): a measuring instrument, never a dependency of squeezekv.
  python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json /tmp/llama-8b-bf16.gguf
"""
import argparse
import json
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_dummy_gguf.py: needs gguf-py (pip install gguf, or PYTHONPATH=<llama.cpp>/gguf-py)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config", help="a Hugging Face config.json (bench/configs/*.json)")
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with open(a.config) as f:
        c = json.load(f)
    if c.get("model_type") not in ("llama", "mistral"):
        sys.exit(f"{a.config}: model_type {c.get('model_type')!r}: only llama-shaped configs are written")
    E, F, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    H, G, V = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"]), c["vocab_size"]
    D = c.get("head_dim", E // H)
    if V < 260:
        sys.exit(f"{a.config}: vocab_size {V}: at least 260 tokens (3 special and 256 bytes)")

    rng = np.random.default_rng(a.seed)
    pool_n = 1 << 26  # 64M values, 128 MiB of BF16
    pool = ((rng.standard_normal(pool_n, dtype=np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16)

    def matrix(rows, cols):
        n = rows * cols
        if n > pool_n:  # larger than the pool: its values repeated (one tiled copy)
            return np.resize(pool, n).reshape(rows, cols)
        at = int(rng.integers(0, pool_n - n + 1))
        return pool[at:at + n].reshape(rows, cols)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(c.get("_name", a.config.rsplit("/", 1)[-1].removesuffix(".json")))
    w.add_context_length(min(int(c.get("max_position_embeddings", 4096)), 131072))
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(G)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(float(c.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-5)))
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [f"t{i}" for i in range(259, V)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256 + \
            [gguf.TokenType.NORMAL] * (V - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    bf16 = gguf.GGMLQuantizationType.BF16
    ones = np.ones(E, dtype=np.float32)
    w.add_tensor("token_embd.weight", matrix(V, E), raw_dtype=bf16)
    for l in range(L):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", matrix(H * D, E), raw_dtype=bf16)
        w.add_tensor(p + "attn_k.weight", matrix(G * D, E), raw_dtype=bf16)
        w.add_tensor(p + "attn_v.weight", matrix(G * D, E), raw_dtype=bf16)
        w.add_tensor(p + "attn_output.weight", matrix(E, H * D), raw_dtype=bf16)
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", matrix(F, E), raw_dtype=bf16)
        w.add_tensor(p + "ffn_up.weight", matrix(F, E), raw_dtype=bf16)
        w.add_tensor(p + "ffn_down.weight", matrix(E, F), raw_dtype=bf16)
    w.add_tensor("output_norm.weight", ones)
    if not c.get("tie_word_embeddings", False):
        w.add_tensor("output.weight", matrix(V, E), raw_dtype=bf16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(f"make_dummy_gguf.py: wrote {a.out} ({L} layers, dim {E}, {H}/{G} heads, vocab {V}, BF16)")


if __name__ == "__main__":
    main()
