#!/usr/bin/env python3
"""Writes a set of malformed model inputs, one per way a file can be wrong, for the valgrind check
(tests/valgrind_test.sh): each starts from a tiny valid file made by make_fuzz_seeds.py and breaks
one thing. Standard library only.
  python3 scripts/make_malformed.py OUTDIR
Each case is OUTDIR/<name>/ holding `args` (the CLI arguments after `generate`, one per line; the
string @ stands for the case's directory) and the files those arguments name.
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fuzz_seeds as seeds  # noqa: E402

SEP = b"\n#--file--#\n"


def gguf_cases():
    good = seeds.tiny_gguf("q8_0")
    n_tensors, n_kv = struct.unpack_from("<QQ", good, 8)
    # where the metadata ends and the tensor infos begin: walk the key/values
    def skip_kv(buf, at):
        klen = struct.unpack_from("<Q", buf, at)[0]
        at += 8 + klen
        kind = struct.unpack_from("<I", buf, at)[0]
        at += 4
        def skip_value(kind, at):
            if kind == seeds.GGUF_STR:
                return at + 8 + struct.unpack_from("<Q", buf, at)[0]
            if kind == seeds.GGUF_ARR:
                elem, n = struct.unpack_from("<IQ", buf, at)
                at += 12
                for _ in range(n):
                    at = skip_value(elem, at)
                return at
            return at + {seeds.GGUF_U32: 4, seeds.GGUF_I32: 4, seeds.GGUF_F32: 4, seeds.GGUF_BOOL: 1}[kind]
        return skip_value(kind, at)
    at = 24
    kv_at = []
    for _ in range(n_kv):
        kv_at.append(at)
        at = skip_kv(good, at)
    infos = at
    name_len = struct.unpack_from("<Q", good, infos)[0]
    dims_at = infos + 8 + name_len + 4  # the first tensor's first dimension
    n_dims = struct.unpack_from("<I", good, infos + 8 + name_len)[0]
    off_at = dims_at + 8 * n_dims + 4   # its data offset
    def patch(buf, at, fmt, value):
        b = bytearray(buf)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)
    cases = {
        "gguf_truncated_header": good[:20],
        "gguf_truncated_metadata": good[:kv_at[len(kv_at) // 2] + 5],
        "gguf_truncated_tensor_data": good[:len(good) - 100],
        "gguf_bad_magic": b"GGUX" + good[4:],
        "gguf_bad_version": patch(good, 4, "<I", 99),
        "gguf_tensor_count_huge": patch(good, 8, "<Q", 1 << 60),
        "gguf_kv_count_huge": patch(good, 16, "<Q", (1 << 62) + 3),
        "gguf_key_length_huge": patch(good, 24, "<Q", 1 << 40),
        "gguf_dimension_huge": patch(good, dims_at, "<Q", 1 << 50),
        "gguf_offset_past_end": patch(good, off_at, "<Q", 1 << 40),
        "gguf_wrong_type": patch(good, kv_at[0] + 8 + len("general.architecture"), "<I", seeds.GGUF_U32),
        "gguf_bad_utf8_token": good.replace("<|im_end|>".encode(), b"<|im\xff\xfe\xfdd|>", 1),
        "gguf_missing_tensor": good.replace(b"blk.0.attn_q.weight", b"blk.0.attn_x.weight", 1),
        "gguf_unknown_tensor_type": patch(good, dims_at + 8 * n_dims, "<I", 77),
    }
    return {k: {"model.gguf": v, "args": ["-m", "@/model.gguf", "-p", "hi", "-n", "2"]} for k, v in cases.items()}


def hf_cases():
    config_b, tok_b, st = seeds.tiny_hf().split(SEP)
    config, tok = json.loads(config_b), json.loads(tok_b)
    hlen = struct.unpack_from("<Q", st, 0)[0]
    header = json.loads(st[8:8 + hlen])
    blob = st[8 + hlen:]
    def st_with(h, data=blob, pad=True):
        hb = json.dumps(h).encode()
        if pad:
            hb += b" " * (-len(hb) % 8)
        return struct.pack("<Q", len(hb)) + hb + data
    def case(cfg=None, tk=None, model=None):
        return {"config.json": cfg if cfg is not None else json.dumps(config).encode(),
                "tokenizer.json": tk if tk is not None else json.dumps(tok).encode(),
                "model.safetensors": model if model is not None else st,
                "args": ["-m", "@", "-p", "hi", "-n", "2"]}
    first = next(iter(header))
    def h_with(**change):
        h = json.loads(json.dumps(header))
        h[first].update(change)
        return h
    missing = {k: v for k, v in header.items() if "q_proj" not in k}
    wrong_types = dict(config, hidden_size="sixteen")
    huge = dict(config, num_hidden_layers=10 ** 12)
    tok_bad_id = json.loads(json.dumps(tok))
    tok_bad_id["added_tokens"][0]["id"] = -7
    return {
        "hf_config_bad_json": case(cfg=b'{"model_type": "llama", "hidden_size": 16,'),
        "hf_config_wrong_types": case(cfg=json.dumps(wrong_types).encode()),
        "hf_config_huge_count": case(cfg=json.dumps(huge).encode()),
        "hf_tokenizer_bad_json": case(tk=b'{"model": {"type": "BPE", "vocab": {"a": 0}'),
        "hf_tokenizer_bad_utf8": case(tk=json.dumps(tok).encode().replace(b"<|im_end|>", b"<|im\xff\xfe|>", 1)),
        "hf_tokenizer_negative_id": case(tk=json.dumps(tok_bad_id).encode()),
        "hf_safetensors_truncated": case(model=st[:len(st) // 2]),
        "hf_safetensors_header_length_huge": case(model=struct.pack("<Q", 1 << 50) + st[8:]),
        "hf_safetensors_header_bad_json": case(model=struct.pack("<Q", 16) + b'{"a": [1, 2,    ' + blob),
        "hf_safetensors_offsets_past_end": case(model=st_with(h_with(data_offsets=[0, len(blob) + 4096]))),
        "hf_safetensors_shape_mismatch": case(model=st_with(h_with(shape=[3, 3]))),
        "hf_safetensors_shape_huge": case(model=st_with(h_with(shape=[1 << 40, 1 << 40]))),
        "hf_safetensors_wrong_dtype": case(model=st_with(h_with(dtype="Q9"))),
        "hf_missing_tensor": case(model=st_with(missing)),
    }


def llama2c_cases():
    ckpt, tok = seeds.tiny_llama2c(), seeds.tiny_llama2c_tokenizer()
    def case(c=ckpt, t=tok):
        return {"model.bin": c, "tok.bin": t, "args": ["-m", "@/model.bin", "--tokenizer", "@/tok.bin", "-p", "ab", "-n", "2"]}
    def header(**change):
        fields = list(struct.unpack_from("<7i", ckpt, 0))
        names = ["dim", "hidden", "layers", "heads", "kv_heads", "vocab", "seq"]
        for k, v in change.items():
            fields[names.index(k)] = v
        return struct.pack("<7i", *fields) + ckpt[28:]
    return {
        "llama2c_truncated": case(c=ckpt[:len(ckpt) // 2]),
        "llama2c_negative_dim": case(c=header(dim=-8)),
        "llama2c_huge_vocab": case(c=header(vocab=1 << 30)),
        "llama2c_heads_not_dividing": case(c=header(kv_heads=3)),
        "llama2c_tokenizer_truncated": case(t=tok[:len(tok) - 3]),
        "llama2c_tokenizer_length_huge": case(t=tok[:4] + struct.pack("<fi", 0.0, 1 << 30) + tok[12:]),
        "llama2c_tokenizer_bad_utf8": case(t=tok.replace(b"ab", b"\xff\xfe", 1)),
    }


def config_cases():
    good = json.loads(seeds.tiny_hf().split(SEP)[0])
    return {
        "dummy_config_bad_json": {"config.json": b'{"hidden_size": 64', "args": ["--dummy", "@/config.json", "-p", "hi", "-n", "1"]},
        "dummy_config_heads_not_dividing": {"config.json": json.dumps(dict(good, num_key_value_heads=3)).encode(),
                                            "args": ["--dummy", "@/config.json", "-p", "hi", "-n", "1"]},
    }


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_malformed.py OUTDIR")
    out = sys.argv[1]
    cases = {}
    for make in (gguf_cases, hf_cases, llama2c_cases, config_cases):
        cases.update(make())
    for name, files in cases.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        for fname, data in files.items():
            if fname == "args":
                with open(os.path.join(d, "args"), "w") as f:
                    f.write("\n".join(files["args"]) + "\n")
            else:
                with open(os.path.join(d, fname), "wb") as f:
                    f.write(data)
    print("wrote %d malformed cases under %s" % (len(cases), out))


if __name__ == "__main__":
    main()
