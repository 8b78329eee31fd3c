"""The Python package against the engine's other front doors: greedy text equal to
`squeezekv generate`, logits equal to the C++ session's (the transformers reference that
model_test checks) and to a step-by-step run, eval numbers equal to `squeezekv eval`, a Python h2o
that keeps exactly what the built-in h2o keeps, and a clear exception for every wrong argument."""
import json
from pathlib import Path
import math

import numpy as np
import pytest

import squeezekv
from conftest import EMMA, REF, cli

PROMPT = "The capital of France is"
SQUEEZE = squeezekv.KVConfig(policy="squeeze", budget=32)


def cli_text(*args: str) -> str:
    out = cli("generate", "-t", "2", "--temp", "0", *args).stdout
    return out.removesuffix("\n")


# ---- generation ---------------------------------------------------------------------------------

def test_greedy_text_equals_the_cli(model):
    r = model.generate(PROMPT, max_tokens=24, temperature=0)
    assert PROMPT + r.text == cli_text("-p", PROMPT, "-n", "24")
    assert r.stop_reason in ("length", "eos")
    assert r.prompt_tokens == len(model.tokenize(PROMPT))
    assert len(r.tokens) == 24 or r.stop_reason == "eos"


def test_greedy_text_with_a_policy_equals_the_cli(model):
    prompt = EMMA.read_text()[:3000]
    r = model.generate(prompt, max_tokens=16, temperature=0, kv=SQUEEZE)
    expected = cli_text("-p", prompt, "-n", "16", "--kv-policy", "squeeze", "--kv-budget", "32")
    assert prompt + r.text == expected
    assert all(s.tokens_kept <= s.budget for s in r.kv_stats)
    assert sum(s.budget for s in r.kv_stats) == 32 * model.config.n_layers  # the coordinator's total


def test_sampled_text_equals_the_cli_for_the_same_seed(model):
    r = model.generate(PROMPT, max_tokens=16, temperature=0.9, seed=7)
    assert PROMPT + r.text == cli("generate", "-t", "2", "-p", PROMPT, "-n", "16", "--temp", "0.9", "--seed", "7").stdout.removesuffix("\n")


def test_chat_equals_the_cli(model):
    r = model.chat([{"role": "user", "content": "Write one sentence about the sea."}], max_tokens=20, temperature=0)
    assert r.text == cli_text("--chat", "-p", "Write one sentence about the sea.", "-n", "20")


def test_stream_gives_the_generated_text_in_pieces(model):
    pieces = list(model.stream(PROMPT, max_tokens=12, temperature=0))
    assert len(pieces) > 1
    assert "".join(pieces) == model.generate(PROMPT, max_tokens=12, temperature=0).text


def test_stop_strings_end_the_text(model):
    full = model.generate(PROMPT, max_tokens=24, temperature=0).text
    stop = full[6:10]
    r = model.generate(PROMPT, max_tokens=24, temperature=0, stop=stop)
    assert r.stop_reason == "stop" and r.text == full[:full.index(stop)]


def test_generate_batch_equals_one_at_a_time(model):
    prompts = [PROMPT, "Once upon a time", "def fibonacci(n):"]
    kvs = [squeezekv.KVConfig(), squeezekv.KVConfig(policy="h2o", budget=8), squeezekv.KVConfig(policy="window", budget=8)]
    batch = model.generate_batch(prompts, max_tokens=12, temperature=0, kv=kvs)
    for p, k, b in zip(prompts, kvs, batch):
        assert b.text == model.generate(p, max_tokens=12, temperature=0, kv=k).text


def test_decode_batch_equals_each_sequence_alone(model):
    """One engine step for several sequences (each with its own cache) gives each its lone logits."""
    kvs = [squeezekv.KVConfig(), squeezekv.KVConfig(policy="h2o", budget=16), squeezekv.KVConfig(policy="squeeze", budget=24)]
    prompts = [model.tokenize(p) for p in ["Once upon a time, in a land", "The quick brown fox jumps over the lazy dog " * 3, PROMPT]]
    together = [model.sequence(k) for k in kvs]
    alone = [model.sequence(k) for k in kvs]
    nxt = []
    for s, a, p in zip(together, alone, prompts):
        l = s.prefill(p)
        a.prefill(p)
        nxt.append(int(l.argmax()))
    for _ in range(6):
        batch = model.decode_batch(together, nxt)
        assert batch.shape == (3, model.config.vocab_size)
        for i, a in enumerate(alone):
            np.testing.assert_array_equal(batch[i], a.decode(nxt[i]))
        nxt = [int(r.argmax()) for r in batch]
    with pytest.raises(squeezekv.Error, match="listed twice"):
        model.decode_batch([together[0], together[0]], [1, 2])
    with pytest.raises(squeezekv.Error, match="3 sequences but 2 tokens"):
        model.decode_batch(together, [1, 2])


def test_tokenize_and_detokenize(model):
    ids = model.tokenize(PROMPT)
    assert model.detokenize(ids) == PROMPT
    assert model.tokenize(PROMPT, add_bos=False) == ids  # SmolLM2 adds no BOS
    assert model.config.vocab_size == 49152 and model.config.n_layers == 30


# ---- the low-level sequence ---------------------------------------------------------------------

def test_logits_equal_the_transformers_reference():
    """What model_test checks of the C++ session (f32 rows, f32 activations: within 1e-3)."""
    meta = json.loads((REF / "logits_smollm2.json").read_text())
    ref = np.fromfile(REF / "logits_smollm2.bin", dtype=np.float32)
    V = meta["vocab"]
    with squeezekv.load(threads=2, decode_activations="f32") as m:
        for case in meta["cases"]:
            seq = m.sequence(squeezekv.KVConfig(type="f32"))
            got = seq.prefill(case["ids"], all_logits=True)
            assert got.shape == (len(case["ids"]), V) and got.dtype == np.float32
            want = ref[case["offset"]:case["offset"] + case["rows"] * V].reshape(case["rows"], V)
            rows = got[case["first_row"]:case["first_row"] + case["rows"]]
            assert np.abs(rows - want).max() <= 1e-3 * max(1.0, np.abs(want).max())


def test_prefill_then_decode_equals_prefill_of_all(model_f32):
    ids = model_f32.tokenize(EMMA.read_text()[:400])[:40]
    a = model_f32.sequence(squeezekv.KVConfig(type="f32"))
    whole = a.prefill(ids, all_logits=True)
    b = model_f32.sequence(squeezekv.KVConfig(type="f32"))
    last = b.prefill(ids[:20])
    np.testing.assert_allclose(last, whole[19], atol=1e-3)
    for i in range(20, 40):
        np.testing.assert_allclose(b.decode(ids[i]), whole[i], atol=1e-3)  # one row against a chunk: f32 sums in another order
    assert b.position == 40


def test_kv_stats_and_positions(model):
    ids = model.tokenize(EMMA.read_text()[:2000])[:300]
    seq = model.sequence(squeezekv.KVConfig(policy="h2o", budget=64, sinks=4, recent=16))
    seq.prefill(ids)
    stats = seq.kv_stats()
    assert len(stats) == model.config.n_layers
    for s in stats:
        assert s.tokens_seen == 300 and s.tokens_kept == 64 and s.budget == 64
        assert s.kept_bytes == 64 * model.config.n_kv_heads * model.config.head_dim * 2 * 2
        assert s.full_bytes == 300 * model.config.n_kv_heads * model.config.head_dim * 2 * 2
    pos = seq.kv_positions(3, 1)
    assert pos.dtype == np.int32 and len(pos) == 64
    assert list(pos[:4]) == [0, 1, 2, 3] and list(pos[-16:]) == list(range(284, 300))  # sinks, recent window
    c = seq.copy()
    t = ids[5]
    np.testing.assert_array_equal(seq.decode(t), c.decode(t))


def test_the_engine_default_ctx_and_a_full_context(model):
    seq = model.sequence(squeezekv.KVConfig(ctx=8))
    seq.prefill([1, 2, 3, 4, 5, 6, 7, 8])
    with pytest.raises(squeezekv.Error, match="full"):
        seq.decode(9)
    r = model.generate(PROMPT, max_tokens=50, temperature=0, kv=squeezekv.KVConfig(ctx=12))
    assert r.stop_reason == "length" and len(r.tokens) == 12 - r.prompt_tokens + 1


# ---- policies in Python -------------------------------------------------------------------------

class PyH2O(squeezekv.ScorePolicy):
    """h2o's rule in Python: the accumulated attention is the score."""
    def __init__(self):
        self.calls = 0

    def score(self, layer, positions, mass, keys=None):
        self.calls += 1
        assert keys is None and positions.shape == mass.shape and positions.dtype == np.int32
        return mass


@pytest.mark.parametrize("head_alloc", ["uniform", "adaptive"])
def test_python_h2o_keeps_what_the_built_in_h2o_keeps(model_f32, head_alloc):
    m = model_f32
    ids = m.tokenize(EMMA.read_text()[:5000])[:560]
    py = PyH2O()
    a = m.sequence(squeezekv.KVConfig(policy="h2o", budget=48, head_alloc=head_alloc))
    b = m.sequence(squeezekv.KVConfig(policy=py, budget=48, head_alloc=head_alloc))
    np.testing.assert_array_equal(a.prefill(ids[:500]), b.prefill(ids[:500]))
    for t in ids[500:]:
        np.testing.assert_array_equal(a.decode(t), b.decode(t))
        for layer in range(m.config.n_layers):
            for g in range(m.config.n_kv_heads):
                np.testing.assert_array_equal(a.kv_positions(layer, g), b.kv_positions(layer, g))
    assert py.calls == m.config.n_layers * 61  # the prompt's end and each of the 60 steps, every layer over budget


def test_a_python_policy_changes_what_is_kept(model):
    class Oldest(squeezekv.ScorePolicy):
        wants_keys = True

        def score(self, layer, positions, mass, keys=None):
            assert keys is not None and keys.shape == positions.shape + (model.config.head_dim,)
            return -positions.astype(np.float32)  # keep the oldest beyond the sinks and recent window

    seq = model.sequence(squeezekv.KVConfig(policy=Oldest(), budget=32, sinks=4, recent=8))
    seq.prefill(list(range(100, 300)))
    assert list(seq.kv_positions(0, 0)) == list(range(0, 24)) + list(range(192, 200))
    assert seq.kv_stats()[0].budget == 32


def test_errors_inside_a_python_policy_raise(model):
    class Raises(squeezekv.ScorePolicy):
        def score(self, layer, positions, mass, keys=None):
            raise RuntimeError("no scores today")

    class WrongShape(squeezekv.ScorePolicy):
        def score(self, layer, positions, mass, keys=None):
            return mass[:, :-1]

    class NotFinite(squeezekv.ScorePolicy):
        def score(self, layer, positions, mass, keys=None):
            return np.full(mass.shape, np.nan, dtype=np.float32)

    for policy, message in [(Raises(), "no scores today"), (WrongShape(), "expected scores of shape"),
                            (NotFinite(), "not finite")]:
        seq = model.sequence(squeezekv.KVConfig(policy=policy, budget=16))
        with pytest.raises(squeezekv.Error, match=message):
            seq.prefill(list(range(100, 150)))


# ---- evaluation ---------------------------------------------------------------------------------

def test_perplexity_equals_the_cli(model_f32, tmp_path):
    kv = squeezekv.KVConfig(policy="squeeze", budget=64)
    r = squeezekv.eval.perplexity(model_f32, EMMA, ctx=256, prefix=128, windows=1, kv=kv)
    out = tmp_path / "ppl.json"
    cli("eval", "ppl", "-t", "2", "--text", str(EMMA), "--ctx", "256", "--prefix", "128", "--windows", "1",
        "--kv-policy", "squeeze", "--kv-budget", "64", "--json", str(out))
    rec = json.loads(out.read_text())
    assert r["ppl"] == rec["ppl"] and r["kept_bytes"] == rec["kept_bytes"] and r["tokens"] == rec["tokens"]
    assert 5 < r["ppl"] < 100 and math.isfinite(r["ppl"])


def test_retrieval_equals_the_cli(model_f32, tmp_path):
    r = squeezekv.eval.retrieval(model_f32, ctx=256, depths=[0.5], samples=2, kv=squeezekv.KVConfig(policy="h2o", budget=96),
                                 trace_needles=True)
    out = tmp_path / "ret.json"
    cli("eval", "retrieval", "-t", "2", "--ctx", "256", "--depths", "0.5", "--samples", "2", "--kv-policy", "h2o",
        "--kv-budget", "96", "--trace-needles", "--json", str(out))
    rec = json.loads(out.read_text())
    assert r["accuracy"] == rec["accuracy"]
    assert [s["answer"] for s in r["samples"]] == [s["answer"] for s in rec["samples"]]
    # the needle trace: per layer and kv head [held, tokens, rank], the same as the CLI's
    cfg = model_f32.config
    for s, c in zip(r["samples"], rec["samples"]):
        assert s["needle_trace"] == c["needle_trace"]
        assert len(s["needle_trace"]) == cfg.n_layers
        for layer in s["needle_trace"]:
            assert len(layer) == cfg.n_kv_heads
            for held, tokens, rank in layer:
                assert 0 <= held <= tokens and tokens >= 1 and (rank == -1 or 0 <= rank <= 1)


# ---- dummy weights ------------------------------------------------------------------------------

SMALL_LLAMA = Path(__file__).resolve().parents[2] / "bench" / "configs" / "small-llama.json"


def test_dummy_presets_decode_the_same_tokens_for_a_seed():
    # BF16 and two quantized presets (Q4_K_M mixes Q4_K, Q6_K and, on rows of 704, Q5_0 and Q8_0)
    for preset in ("BF16", "Q4_K_M", "Q8_0"):
        runs = []
        for _ in range(2):
            m = squeezekv.load(dummy=SMALL_LLAMA, dummy_type=preset, threads=2)
            runs.append(m.generate([5, 6, 7, 8], max_tokens=6, temperature=0.0).tokens)
            m.close()
        assert runs[0] and runs[0] == runs[1], preset


# ---- wrong arguments ----------------------------------------------------------------------------

def test_wrong_arguments_raise_and_name_the_input(model, tmp_path):
    cases = [
        (lambda: squeezekv.load(tmp_path / "missing.gguf"), FileNotFoundError, "missing.gguf"),
        (lambda: squeezekv.load(device="tpu"), ValueError, "device"),
        (lambda: squeezekv.load(threads="two"), TypeError, "threads"),
        (lambda: squeezekv.load(threads=-1), ValueError, "threads"),
        (lambda: squeezekv.load(max_memory="lots"), ValueError, "max_memory"),
        (lambda: squeezekv.load(dummy=tmp_path / "none.json"), FileNotFoundError, "dummy"),
        (lambda: squeezekv.load(dummy=SMALL_LLAMA, dummy_type="Q3"), ValueError, "--dummy-type"),
        (lambda: squeezekv.load(dummy=SMALL_LLAMA, dummy_type=4), TypeError, "dummy_type"),
        (lambda: squeezekv.load(device_weights="int4"), ValueError, "device_weights"),
        (lambda: squeezekv.KVConfig(policy="lru", budget=8)._native(), ValueError, "--kv-policy"),
        (lambda: squeezekv.KVConfig(policy=3), TypeError, "policy"),
        (lambda: squeezekv.KVConfig(budget="8"), TypeError, "budget"),
        (lambda: squeezekv.KVConfig(budget=2.5), TypeError, "budget"),
        (lambda: model.sequence(squeezekv.KVConfig(policy="h2o", budget=-4)), ValueError, "--kv-budget"),
        (lambda: model.sequence(squeezekv.KVConfig(policy="h2o")), ValueError, "--kv-budget"),
        (lambda: model.sequence(squeezekv.KVConfig(type="q3")), ValueError, "--kv-type"),
        (lambda: model.sequence(squeezekv.KVConfig(recent_f16=64)), ValueError, "--kv-recent-f16"),
        (lambda: model.sequence(squeezekv.KVConfig(type="q4_1", recent_f16=-1)), ValueError, "--kv-recent-f16"),
        (lambda: squeezekv.KVConfig(recent_f16="64"), TypeError, "recent_f16"),
        (lambda: model.sequence(squeezekv.KVConfig(policy=PyH2O())), ValueError, "budget"),
        (lambda: squeezekv.KVConfig(policy=squeezekv.ScorePolicy(), budget=8), TypeError, "score"),
        (lambda: model.sequence(kv={"policy": "h2o"}), TypeError, "KVConfig"),
        (lambda: model.generate(PROMPT, max_tokens=-1), ValueError, "max_tokens"),
        (lambda: model.generate(PROMPT, max_tokens="8"), TypeError, "max_tokens"),
        (lambda: model.generate(PROMPT, temperature=-1.0), ValueError, "temp"),
        (lambda: model.generate(PROMPT, top_p=2.0), ValueError, "top-p"),
        (lambda: model.generate(PROMPT, stop=5), TypeError, "stop"),
        (lambda: model.generate(12), TypeError, "prompt"),
        (lambda: model.generate([]), ValueError, "prompt"),
        (lambda: model.generate([model.config.vocab_size]), ValueError, "token id"),
        (lambda: model.tokenize(b"bytes"), TypeError, "tokenize"),
        (lambda: model.detokenize([-1]), ValueError, "token id"),
        (lambda: model.detokenize("abc"), TypeError, "detokenize"),
        (lambda: model.sequence().decode(1.5), TypeError, "token"),
        (lambda: model.sequence().prefill([]), ValueError, "no tokens"),
        (lambda: model.sequence().prefill([[1, 2]]), TypeError, "token ids"),
        (lambda: model.sequence().kv_positions(99, 0), ValueError, "layer 99"),
        (lambda: model.chat([{"role": "robot", "content": "hi"}]), ValueError, "role"),
        (lambda: model.chat("hi"), TypeError, "messages"),
        (lambda: squeezekv.eval.perplexity(model, tmp_path / "none.txt"), FileNotFoundError, "text"),
        (lambda: squeezekv.eval.perplexity(model, EMMA, ctx=100, prefix=200), ValueError, "prefix"),
        (lambda: squeezekv.eval.retrieval(model, task="sudoku"), ValueError, "task"),
        (lambda: squeezekv.eval.retrieval("model"), TypeError, "model"),
        (lambda: squeezekv.eval.retrieval(model, trace_needles="yes"), TypeError, "trace_needles"),
    ]
    for call, exc, text in cases:
        with pytest.raises(exc, match=text):
            call()


def test_a_sequence_after_its_model_is_closed_raises():
    m = squeezekv.load(threads=2)
    seq = m.sequence()
    seq.prefill([1, 2, 3])
    m.close()
    assert m.closed
    with pytest.raises(squeezekv.Error, match="closed"):
        seq.decode(4)
    with pytest.raises(squeezekv.Error, match="closed"):
        m.generate(PROMPT)
    seq.close()
    seq.close()  # twice is fine


def test_a_saved_sequence_continues_as_the_original(model, tmp_path):
    """Sequence.save and Model.load_sequence (docs/kv_file.md): bit-identical logits afterwards."""
    ids = model.tokenize(EMMA.read_text()[:3000])[:400]
    seq = model.sequence(squeezekv.KVConfig(policy="kvzip", budget=64))
    seq.prefill(ids)
    path = tmp_path / "doc.kv"
    data = seq.save(path)
    assert path.read_bytes() == data and seq.tokens == ids
    for saved in (data, path):
        restored = model.load_sequence(saved)
        assert restored.tokens == ids and restored.position == 400
        assert [s.budget for s in restored.kv_stats()] == [s.budget for s in seq.kv_stats()]
        fork = seq.copy()
        for t in ids[:5]:
            np.testing.assert_array_equal(restored.decode(t), fork.decode(t))
    with pytest.raises(squeezekv.FormatError, match="no SQKV magic"):
        model.load_sequence(b"not a cache")
    with pytest.raises(squeezekv.FormatError, match="truncated or damaged"):
        model.load_sequence(data[:-1])
    with pytest.raises(FileNotFoundError, match="load_sequence"):
        model.load_sequence(tmp_path / "none.kv")
    with pytest.raises(TypeError, match="load_sequence"):
        model.load_sequence(12)
