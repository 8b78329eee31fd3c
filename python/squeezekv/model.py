"""Models, sequences and generation: the package's main API over the C++ engine."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence as Seq, Union

import numpy as np

from . import _core
from ._checks import _check_int, _check_real
from .kv import KVConfig, as_config

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The model ``load()`` takes when given none, searched as the CLI searches: ``$SQUEEZEKV_MODEL``,
    ``./models/...``, then the folders above this package (a build tree or a checkout)."""
    env = os.environ.get("SQUEEZEKV_MODEL")
    if env:
        return env
    if Path(DEFAULT_MODEL).exists():
        return DEFAULT_MODEL
    for d in Path(__file__).resolve().parents:
        if (d / DEFAULT_MODEL).exists():
            return str(d / DEFAULT_MODEL)
    raise FileNotFoundError(f"load: no path given and the default model was not found ({DEFAULT_MODEL}); "
                            "run scripts/fetch-default-model in a squeezekv checkout or pass path=")


@dataclass(frozen=True)
class ModelConfig:
    """A loaded model's hyper-parameters."""
    arch: str
    name: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    norm_eps: float
    rope_theta: float
    kv_bytes_per_token_f16: int


@dataclass(frozen=True)
class LayerStats:
    """One layer's KV accounting after the last step (the CLI's --kv-stats row)."""
    layer: int
    tokens_seen: int
    tokens_kept: int
    budget: int
    capacity: int
    concentration: float
    kept_bytes: int
    full_bytes: int
    compression_ratio: float


@dataclass
class GenerationResult:
    """What ``Model.generate`` returns."""
    text: str
    tokens: list[int]
    prompt_tokens: int
    prompt_seconds: float
    generate_seconds: float
    stop_reason: str  # "eos", "stop", "length"
    kv_stats: list[LayerStats] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.generate_seconds if self.generate_seconds > 0 else 0.0

    @property
    def kept_bytes(self) -> int:
        return sum(s.kept_bytes for s in self.kv_stats)


def _stats(rows: list[dict]) -> list[LayerStats]:
    return [LayerStats(**r) for r in rows]


def _result(d: dict) -> GenerationResult:
    return GenerationResult(text=d["text"].decode("utf-8", "replace"), tokens=list(d["tokens"]),
                            prompt_tokens=d["prompt_tokens"], prompt_seconds=d["prompt_seconds"],
                            generate_seconds=d["generate_seconds"], stop_reason=d["stop_reason"],
                            kv_stats=_stats(d.get("kv_stats", [])))


def _size(name: str, v: Union[int, str, None]) -> int:
    """Bytes from an int or a size such as "4G" (as the CLI's --max-memory takes)."""
    if v is None:
        return 0
    if isinstance(v, bool):
        raise TypeError(f"{name}: expected bytes (int) or a size such as '4G', got bool")
    if isinstance(v, (int, np.integer)):
        if v < 0:
            raise ValueError(f"{name}: must be >= 0, got {v}")
        return int(v)
    if isinstance(v, str):
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
        t = v.strip().upper().removesuffix("B").removesuffix("I")
        mult = units.get(t[-1:], 1) if t else 1
        num = t[:-1] if t[-1:] in units else t
        try:
            n = float(num)
        except ValueError:
            raise ValueError(f"{name}: '{v}' is not a size (expected bytes or e.g. 512M, 4G)") from None
        if not n > 0:
            raise ValueError(f"{name}: must be positive, got '{v}'")
        return int(n * mult)
    raise TypeError(f"{name}: expected bytes (int) or a size such as '4G', got {type(v).__name__}")


def _ids(name: str, ids: object) -> list[int]:
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"{name}: expected a 1-D array of int token ids, got {ids.dtype} of shape {ids.shape}")
        return ids.tolist()
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{name}: expected a sequence of int token ids, got {type(ids).__name__}")
    out = list(ids)
    for t in out:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{name}: expected int token ids, got {type(t).__name__}")
    return [int(t) for t in out]


class Sequence:
    """One sequence on a model, stepped by hand: its own KV cache (``KVConfig``) and position.

    ``prefill`` and ``decode`` return the logits as a new float32 array (a copy of V floats, 0.2 MB
    for SmolLM2, made so that it stays valid after the next step). Not thread-safe; sequences of
    one model share its engine, which runs one call at a time.
    """

    def __init__(self, model: "Model", native: "_core.Sequence", kv: Optional[KVConfig]):
        self._model = model
        self._seq = native
        self.kv = kv

    def prefill(self, ids: Seq[int], all_logits: bool = False) -> np.ndarray:
        """Runs prompt tokens (in chunks of the model's ``prefill_chunk``); returns the last row's
        logits [V], or every row's [n, V] with ``all_logits``."""
        return self._seq.prefill(_ids("Sequence.prefill", ids), bool(all_logits))

    def decode(self, token: int) -> np.ndarray:
        """Runs one token; returns its logits [V]."""
        return self._seq.decode(_check_int("Sequence.decode: token", token))

    @property
    def position(self) -> int:
        return self._seq.position

    @property
    def max_tokens(self) -> int:
        return self._seq.max_tokens

    def kv_stats(self) -> list[LayerStats]:
        """Per layer: tokens seen and kept, budget, concentration, bytes."""
        return _stats(self._seq.kv_stats())

    def kv_positions(self, layer: int, kv_head: int) -> np.ndarray:
        """The absolute positions one layer's kv head holds now, ascending (int32)."""
        return self._seq.kv_positions(_check_int("layer", layer), _check_int("kv_head", kv_head))

    @property
    def tokens(self) -> list[int]:
        """The token ids this sequence has run (what a saved cache covers)."""
        return list(self._seq.tokens)

    def save(self, path: Union[str, os.PathLike, None] = None) -> bytes:
        """The sequence's KV cache as saved bytes (docs/kv_file.md: rows as held, compressed; the
        policies' state; the tokens), also written to ``path`` when given. ``Model.load_sequence``
        restores it; the restored sequence continues exactly as this one would."""
        data = self._seq.save()
        if path is not None:
            tmp = Path(os.fspath(path) + ".tmp")
            try:
                tmp.write_bytes(data)
                tmp.replace(path)
            except OSError as e:
                raise OSError(f"Sequence.save: cannot write '{path}': {e.strerror}") from None
        return data

    def copy(self) -> "Sequence":
        """A deep copy that continues exactly as this one would."""
        return Sequence(self._model, self._seq.copy(), self.kv)

    def close(self) -> None:
        """Frees the sequence's caches (also done when it is garbage-collected)."""
        self._seq.close()


class Model:
    """A loaded model and the engine that runs it. Use ``squeezekv.load``.

    Thread safety: methods may be called from several threads; the engine runs one call at a time
    (the GIL is released meanwhile), so threads take turns rather than run at once.
    """

    def __init__(self, native: "_core.Model", decode_activations: str, run: dict):
        self._m = native
        self._run = run
        self.decode_activations = decode_activations
        c = native.config
        self.config = ModelConfig(**c)

    # text
    def tokenize(self, text: str, add_bos: Optional[bool] = None, special: bool = True) -> list[int]:
        """Token ids of ``text``; BOS first as the model adds it (``add_bos`` overrides)."""
        if not isinstance(text, str):
            raise TypeError(f"tokenize: expected str, got {type(text).__name__}")
        return self._m.tokenize(text, add_bos, bool(special))

    def detokenize(self, ids: Seq[int]) -> str:
        """Text of token ids (control tokens skipped; bytes that are not UTF-8 become U+FFFD)."""
        return self._m.detokenize(_ids("detokenize", ids)).decode("utf-8", "replace")

    @property
    def bos(self) -> int:
        return self._m.bos

    @property
    def eos(self) -> int:
        return self._m.eos

    @property
    def chat_template(self) -> str:
        return self._m.chat_template

    def apply_chat_template(self, messages: list[dict]) -> str:
        """The prompt text of chat messages ({"role", "content"}), ending where the assistant speaks."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise TypeError("messages: expected a non-empty list of {'role', 'content'} dicts")
        pairs = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
                raise TypeError(f"messages[{i}]: expected a dict with str 'role' and 'content'")
            if msg["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"messages[{i}].role: expected system, user or assistant, got '{msg['role']}'")
            pairs.append((msg["role"], msg["content"]))
        return self._m.render_chat(pairs)

    # sequences and generation
    def sequence(self, kv: Optional[KVConfig] = None) -> Sequence:
        """A new sequence with its own KV cache."""
        kv = as_config(kv)
        return Sequence(self, self._m.sequence(kv._native()), kv)

    def load_sequence(self, saved: Union[bytes, str, os.PathLike]) -> Sequence:
        """A sequence restored from a saved cache (``Sequence.save``'s bytes, or a file written by it
        or by ``squeezekv generate --save-kv``), with the KV settings it was saved with."""
        if isinstance(saved, (bytes, bytearray)):
            data, source = bytes(saved), "bytes"
        elif isinstance(saved, (str, os.PathLike)):
            if not Path(saved).is_file():
                raise FileNotFoundError(f"load_sequence: file '{saved}' does not exist")
            data, source = Path(saved).read_bytes(), os.fspath(saved)
        else:
            raise TypeError(f"load_sequence: expected bytes or a path, got {type(saved).__name__}")
        native = self._m.load_sequence(data, source)
        return Sequence(self, native, None)  # (its settings are the saved ones)

    def _prompt(self, prompt: Union[str, Seq[int]]) -> list[int]:
        if isinstance(prompt, str):
            ids = self._m.tokenize(prompt, None, True)
            if not ids:
                if self.bos < 0:
                    raise ValueError("prompt: empty, and the model has no BOS token to start from")
                ids = [self.bos]
            return ids
        ids = _ids("prompt", prompt)
        if not ids:
            raise ValueError("prompt: no token ids given")
        return ids

    def _gen_options(self, max_tokens, temperature, top_k, top_p, min_p, seed, stop) -> dict:
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        elif not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise TypeError("stop: expected a str or a list of str")
        return {"max_tokens": _check_int("max_tokens", max_tokens, 0), "temperature": _check_real("temperature", temperature),
                "top_k": _check_int("top_k", top_k), "top_p": _check_real("top_p", top_p),
                "min_p": _check_real("min_p", min_p), "seed": _check_int("seed", seed, 0), "stop": list(stop)}

    def generate(self, prompt: Union[str, Seq[int]], max_tokens: int = 128, temperature: float = 0.8,
                 top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, seed: int = 0,
                 stop: Union[str, list[str], None] = None, kv: Optional[KVConfig] = None) -> GenerationResult:
        """Generates from a prompt (text, or token ids) with the CLI's sampling defaults
        (``temperature=0``: greedy); the same text as ``squeezekv generate`` for the same settings."""
        run = self._m.run(self._prompt(prompt), self._gen_options(max_tokens, temperature, top_k, top_p, min_p, seed, stop),
                          as_config(kv)._native())
        run.run()
        return _result(run.result())

    def stream(self, prompt: Union[str, Seq[int]], max_tokens: int = 128, temperature: float = 0.8,
               top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, seed: int = 0,
               stop: Union[str, list[str], None] = None, kv: Optional[KVConfig] = None) -> Iterator[str]:
        """``generate`` as text pieces (whole UTF-8 characters) as they are produced."""
        run = self._m.run(self._prompt(prompt), self._gen_options(max_tokens, temperature, top_k, top_p, min_p, seed, stop),
                          as_config(kv)._native())
        while True:
            piece = run.step()
            if not piece and run.done:
                return
            if piece:
                yield piece.decode("utf-8", "replace")

    def chat(self, messages: list[dict], stream: bool = False, **kwargs) -> Union[GenerationResult, Iterator[str]]:
        """``generate`` (or ``stream``) on messages rendered with the model's chat template."""
        text = self.apply_chat_template(messages)
        return self.stream(text, **kwargs) if stream else self.generate(text, **kwargs)

    def generate_batch(self, prompts: list[Union[str, Seq[int]]], max_tokens: int = 128, temperature: float = 0.8,
                       top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, seed: int = 0,
                       stop: Union[str, list[str], None] = None,
                       kv: Union[KVConfig, list[KVConfig], None] = None) -> list[GenerationResult]:
        """Many prompts at once (the engine's scheduler: batched decode steps, each prompt with its own
        cache; ``kv`` one config for all, or one each). Results in the order given."""
        if not isinstance(prompts, (list, tuple)):
            raise TypeError("prompts: expected a list of prompts")
        kvs = kv if isinstance(kv, (list, tuple)) else [kv] * len(prompts)
        if len(kvs) != len(prompts):
            raise ValueError(f"kv: {len(kvs)} configs for {len(prompts)} prompts")
        native = [as_config(k)._native() for k in kvs]
        res = self._m.generate_many([self._prompt(p) for p in prompts],
                                    self._gen_options(max_tokens, temperature, top_k, top_p, min_p, seed, stop), native)
        return [_result(r) for r in res]

    def decode_batch(self, sequences: list[Sequence], tokens: Seq[int]) -> np.ndarray:
        """One decode step of several of this model's sequences together (at most ``max_batch``):
        the weights are read once for all of them. Returns logits [n, V] in the order given; each
        row is what that sequence's own ``decode`` gives on the CPU (bit for bit), on a GPU within
        bf16's rounding of it unless loaded with ``batch_invariant=True``."""
        if not isinstance(sequences, (list, tuple)) or not all(isinstance(q, Sequence) for q in sequences):
            raise TypeError("decode_batch: expected a list of squeezekv.Sequence")
        for q in sequences:
            if q._model is not self:
                raise ValueError("decode_batch: a sequence belongs to another model")
        return self._m.decode_batch([q._seq for q in sequences], _ids("decode_batch: tokens", tokens))

    def device_description(self) -> str:
        return self._m.device_description()

    @property
    def weight_bytes(self) -> int:
        return self._m.weight_bytes()

    def close(self) -> None:
        """Frees the weights and the engine; the model's sequences then raise on use."""
        self._m.close()

    @property
    def closed(self) -> bool:
        return self._m.closed

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: Union[str, os.PathLike, None] = None, device: str = "cpu", threads: int = 0, *,
         tokenizer: Union[str, os.PathLike, None] = None, dummy: Union[str, os.PathLike, None] = None,
         dummy_type: str = "BF16",
         decode_activations: str = "int8", prefill_chunk: int = 512, max_batch: int = 16,
         max_memory: Union[int, str, None] = None, kv_memory: Union[int, str, float, None] = None,
         device_weights: str = "native", cuda_graphs: bool = True, batch_invariant: bool = False) -> Model:
    """Loads a model: a GGUF file, a Hugging Face directory, or a llama2.c checkpoint (with
    ``tokenizer``); ``dummy``: random weights of a config.json's shape instead (``dummy_type``:
    BF16 or a llama.cpp preset such as ``"Q4_K_M"``, as ``--dummy-type``). ``path=None``:
    the default model, found as the CLI finds it. ``threads=0``: one thread per physical core. The other options are
    the CLI's flags of the same names; ``decode_activations="int8"`` as ``squeezekv generate``."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not _core.device_available("cuda"):
        raise ValueError("device 'cuda': this build of squeezekv has no CUDA backend")
    if decode_activations not in ("int8", "f32"):
        raise ValueError(f"decode_activations: expected 'int8' or 'f32', got {decode_activations!r}")
    if device_weights not in ("native", "bf16", "f32"):
        raise ValueError(f"device_weights: expected 'native', 'bf16' or 'f32', got {device_weights!r}")
    run: dict = {"device": device, "threads": _check_int("threads", threads, 0),
                 "prefill_chunk": _check_int("prefill_chunk", prefill_chunk, 1),
                 "decode_activations": decode_activations, "device_weights": device_weights,
                 "cuda_graphs": bool(cuda_graphs), "batch_invariant": bool(batch_invariant)}
    if threads == 0:
        run["threads"] = os.cpu_count() or 1
    mem = _size("max_memory", max_memory)
    run["max_memory"] = mem
    if isinstance(kv_memory, float) and not isinstance(kv_memory, bool):
        if not 0.0 < kv_memory <= 1.0:
            raise ValueError(f"kv_memory: a share of the free memory must be in (0, 1], got {kv_memory}")
        run["kv_memory_fraction"] = kv_memory
    else:
        run["kv_memory"] = _size("kv_memory", kv_memory)
    max_batch = _check_int("max_batch", max_batch, 1)
    if dummy is not None:
        if path is not None:
            raise ValueError("load: give either path or dummy, not both")
        if not Path(dummy).is_file():
            raise FileNotFoundError(f"dummy: config file '{dummy}' does not exist")
        if not isinstance(dummy_type, str):
            raise TypeError(f"dummy_type: expected a preset name (str), got {type(dummy_type).__name__}")
        native = _core.Model.dummy(os.fspath(dummy), 1, mem, run, max_batch, dummy_type)
    else:
        p = default_model_path() if path is None else os.fspath(path)
        if not Path(p).exists():
            raise FileNotFoundError(f"path: model '{p}' does not exist")
        tok = "" if tokenizer is None else os.fspath(tokenizer)
        if tok and not Path(tok).is_file():
            raise FileNotFoundError(f"tokenizer: file '{tok}' does not exist")
        native = _core.Model.load(p, tok, mem, run, max_batch)
    return Model(native, decode_activations, run)
