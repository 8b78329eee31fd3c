"""The evaluation harness: perplexity under eviction and synthetic retrieval, the numbers
``squeezekv eval ppl|retrieval`` prints, returned as the dict its ``--json`` writes."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence, Union

from .kv import KVConfig, as_config
from ._checks import _check_int
from .model import Model

_TASKS = ("passkey", "niah-multikey", "niah-multivalue", "qa")


def _run(model: Model, decode_activations: str) -> dict:
    if not isinstance(model, Model):
        raise TypeError(f"model: expected a squeezekv.Model, got {type(model).__name__}")
    if decode_activations not in ("int8", "f32"):
        raise ValueError(f"decode_activations: expected 'int8' or 'f32', got {decode_activations!r}")
    run = dict(model._run)
    run["decode_activations"] = decode_activations
    return run


def perplexity(model: Model, text: Union[str, os.PathLike], ctx: int = 1024, prefix: int = 512, windows: int = 1,
               kv: Optional[KVConfig] = None, decode_activations: str = "f32") -> dict:
    """Prefills ``prefix`` tokens of each window of ``ctx`` tokens of the file ``text``, then feeds the
    rest one token a step (eviction active every step) and scores every continuation token.
    Returns the record ``squeezekv eval ppl --json`` writes (``ppl``, ``window_ppl``, ``kept_bytes``,
    ...). ``decode_activations="f32"`` as the CLI's eval."""
    run = _run(model, decode_activations)
    if not Path(text).is_file():
        raise FileNotFoundError(f"text: file '{text}' does not exist")
    kv = as_config(kv)
    rec = model._m.perplexity(run, kv._native(), os.fspath(text), _check_int("ctx", ctx, 2),
                              _check_int("prefix", prefix, 1), _check_int("windows", windows, 1))
    return json.loads(rec)


def retrieval(model: Model, task: str = "passkey", ctx: int = 1024,
              depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0), samples: int = 4, seed: int = 1,
              haystack: Union[str, os.PathLike, None] = None, max_answer_tokens: int = 24,
              question_aware: bool = False, kv: Optional[KVConfig] = None, decode_activations: str = "f32",
              trace_needles: bool = False) -> dict:
    """Needles at depths in a haystack (filler sentences, or the text file ``haystack``), the question
    after the compressed context, greedy answers, exact match. Returns the record
    ``squeezekv eval retrieval --json`` writes (``accuracy``, ``by_depth``, ``samples``, ...).
    ``trace_needles``: each sample also carries ``needle_trace``, per layer and kv head
    ``[held, tokens, rank]`` of the answer's tokens in the needles (``--trace-needles``)."""
    if not isinstance(trace_needles, bool):
        raise TypeError(f"trace_needles: expected True or False, got {trace_needles!r}")
    run = _run(model, decode_activations)
    if task not in _TASKS:
        raise ValueError(f"task: expected one of {', '.join(_TASKS)}, got {task!r}")
    if isinstance(depths, (str, bytes)) or not all(isinstance(d, (int, float)) and not isinstance(d, bool) for d in depths):
        raise TypeError("depths: expected a sequence of numbers in [0, 1]")
    hs = ""
    if haystack is not None:
        if not Path(haystack).is_file():
            raise FileNotFoundError(f"haystack: file '{haystack}' does not exist")
        hs = os.fspath(haystack)
    kv = as_config(kv)
    rec = model._m.retrieval(run, kv._native(), task, _check_int("ctx", ctx, 1),
                             [float(d) for d in depths], _check_int("samples", samples, 1), _check_int("seed", seed, 0),
                             hs, _check_int("max_answer_tokens", max_answer_tokens, 1), bool(question_aware), trace_needles)
    return json.loads(rec)
