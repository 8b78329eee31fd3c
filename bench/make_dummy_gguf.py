"""A GGUF file of a Hugging Face config's shape with random weights, for peers that cannot read
our `--dummy CONFIG` (llama.cpp's llama-bench and llama-batched-bench on a GPU machine that
downloads nothing). Same tensor shapes as `squeezekv --dummy`: by default every matrix BF16, the
norms F32 (`--type F16`: every matrix F16, the same values rounded to f16).

`--type PRESET` writes random blocks of a quantized preset instead (as `squeezekv --dummy-type`
does, src/model/dummy.cc): each matrix in the type llama.cpp's quantizer gives it for that preset
(its llama_tensor_get_type: output.weight, and token_embd.weight where tied, Q6_K unless Q8_0; in
the _M presets attn_v and ffn_down Q6_K on the "more bits" layers; a 70B-shaped llama (80 layers,
grouped kv heads) its other attn_v in Q5_K; K types on columns that are not whole 256-blocks fall
back to Q5_0/Q5_1/Q8_0), each block's bytes random and its f16 scales set so that scale x quant
reaches about 0.035. For shapes whose BF16 source does not fit the GPU machine's disk (70B: 141
GB), where llama-quantize cannot run; speed does not depend on the values.

The weights are views into one pool of random values (or blocks) per type at random offsets, so
writing an 8B shape needs a few hundred MB of memory, not 16 GB. The
vocabulary is a SentencePiece-style list (<unk>, <s>, </s>, the 256 byte tokens, then "t<id>")
that llama.cpp loads; the bench tools feed token ids, never text. RoPE scaling is left out (the
speed of a step does not depend on it).

Needs numpy and gguf-py (`pip install gguf`, or the gguf-py folder of a llama.cpp checkout on
PYTHONPATH): a measuring instrument, never a dependency of squeezekv.
  python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-8b.json /tmp/llama-8b-bf16.gguf
  python3 bench/make_dummy_gguf.py bench/configs/llama-3.1-70b.json /tmp/llama-70b.Q4_K_M.gguf --type Q4_K_M
"""
import argparse
import json
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_dummy_gguf.py: needs gguf-py (pip install gguf, or PYTHONPATH=<llama.cpp>/gguf-py)")


# (block bytes, values a block, [(offset of an f16 field, its value for a = 1)]): the scales as
# core/quant.cc random_blocks sets them, so that scale x quant reaches about a
BLOCKS = {
    "Q8_0": (34, 32, [(0, 1 / 127)]),
    "Q4_0": (18, 32, [(0, 1 / 8)]),
    "Q4_1": (20, 32, [(0, 1 / 8), (2, -1.0)]),
    "Q5_0": (22, 32, [(0, 1 / 16)]),
    "Q5_1": (24, 32, [(0, 1 / 16), (2, -1.0)]),
    "Q4_K": (144, 256, [(0, 1 / 945), (2, 1 / 63)]),
    "Q5_K": (176, 256, [(0, 1 / 1953), (2, 1 / 63)]),
    "Q6_K": (210, 256, [(208, 1 / 4096)]),
}
# preset -> (the matrices' base type, whether attn_v and ffn_down mix as llama.cpp's _M presets do)
PRESETS = {"BF16": ("BF16", False), "F16": ("F16", False), "Q8_0": ("Q8_0", False), "Q6_K": ("Q6_K", False), "Q5_K_M": ("Q5_K", True),
           "Q4_K_M": ("Q4_K", True), "Q5_1": ("Q5_1", False), "Q5_0": ("Q5_0", False), "Q4_1": ("Q4_1", False),
           "Q4_0": ("Q4_0", False)}


def more_bits(i, n):
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def preset_type(preset, name, layer, n_layers, cols, tied, is_70b):
    """The type llama.cpp's quantizer gives matrix `name` (without "blk.N.") under `preset`."""
    base, k_mix = PRESETS[preset]
    t = base
    if t in ("BF16", "F16"):
        return t
    if (name == "output.weight" or (tied and name == "token_embd.weight")) and t != "Q8_0":
        t = "Q6_K"
    if k_mix and name in ("attn_v.weight", "ffn_down.weight") and more_bits(layer, n_layers):
        t = "Q6_K"
    if is_70b and name == "attn_v.weight" and t == "Q4_K":
        t = "Q5_K"  # 8 heads share attn_v: llama.cpp gives the 70B's more bits
    if cols % 256 != 0:
        t = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}.get(t, t)
    if cols % 32 != 0:
        t = "BF16"
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config", help="a Hugging Face config.json (bench/configs/*.json)")
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--type", default="BF16", choices=list(PRESETS), help="the weights' preset (default BF16)")
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
    is_70b = L == 80 and G != H  # as llama-quantize infers LLM_TYPE_70B (every file here is arch "llama")
    tied = bool(c.get("tie_word_embeddings", False))

    rng = np.random.default_rng(a.seed)
    pool_n = 1 << 26  # 64M values, 128 MiB of BF16
    pool = ((rng.standard_normal(pool_n, dtype=np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16)
    amp = 0.02 * np.sqrt(3.0)  # the uniform BF16 weights' bound in squeezekv --dummy
    block_pools = {}  # type -> [blocks][block bytes] uint8
    f16_pool = []

    def pool_f16():
        """The BF16 pool's values as f16 bits (made once, on first use)."""
        if not f16_pool:
            f16_pool.append((pool.astype(np.uint32) << 16).view(np.float32).astype(np.float16).view(np.uint16))
        return f16_pool[0]

    def blocks(t):
        if t not in block_pools:
            bb, _, fields = BLOCKS[t]
            n = (1 << 28) // BLOCKS[t][1]  # 256M values' worth: every matrix of a 70B but the two vocabulary ones
            b = rng.integers(0, 256, size=(n, bb), dtype=np.uint8)
            for off, v in fields:
                b[:, off:off + 2] = np.frombuffer(np.float16(v * amp).tobytes(), dtype=np.uint8)
            if t == "Q8_0":
                q = b[:, 2:]
                q[q == 0x80] = 0x81  # |q| <= 127
            block_pools[t] = b
        return block_pools[t]

    def matrix(name, layer, rows, cols):
        """(array, its GGML type) for matrix `name` of `rows` x `cols`."""
        t = preset_type(a.type, name, layer, L, cols, tied, is_70b)
        if t in ("BF16", "F16"):
            src = pool if t == "BF16" else pool_f16()
            n = rows * cols
            if n > pool_n:  # larger than the pool: its values repeated (one tiled copy)
                return np.resize(src, n).reshape(rows, cols), getattr(gguf.GGMLQuantizationType, t)
            at = int(rng.integers(0, pool_n - n + 1))
            return src[at:at + n].reshape(rows, cols), getattr(gguf.GGMLQuantizationType, t)
        bb, bv, _ = BLOCKS[t]
        pb = blocks(t)
        nb = rows * cols // bv
        if nb > pb.shape[0]:
            m = np.resize(pb, (nb, bb))
        else:
            at = int(rng.integers(0, pb.shape[0] - nb + 1))
            m = pb[at:at + nb]
        return m.reshape(rows, cols // bv * bb), getattr(gguf.GGMLQuantizationType, t)

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
    w.add_file_type(getattr(gguf.LlamaFileType, "MOSTLY_" + a.type))
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

    ones = np.ones(E, dtype=np.float32)
    counts = {}

    def add(name, layer, rows, cols):
        arr, t = matrix(name.split(".", 2)[-1] if layer >= 0 else name, layer, rows, cols)
        counts[t.name] = counts.get(t.name, 0) + 1
        w.add_tensor(name, arr, raw_dtype=t)

    add("token_embd.weight", -1, V, E)
    for l in range(L):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", ones)
        add(p + "attn_q.weight", l, H * D, E)
        add(p + "attn_k.weight", l, G * D, E)
        add(p + "attn_v.weight", l, G * D, E)
        add(p + "attn_output.weight", l, E, H * D)
        w.add_tensor(p + "ffn_norm.weight", ones)
        add(p + "ffn_gate.weight", l, F, E)
        add(p + "ffn_up.weight", l, F, E)
        add(p + "ffn_down.weight", l, E, F)
    w.add_tensor("output_norm.weight", ones)
    if not tied:
        add("output.weight", -1, V, E)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    mix = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"make_dummy_gguf.py: wrote {a.out} ({L} layers, dim {E}, {H}/{G} heads, vocab {V}, {a.type}: matrices {mix})")


if __name__ == "__main__":
    main()
