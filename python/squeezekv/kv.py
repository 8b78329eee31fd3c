"""KV cache settings (KVConfig) and eviction policies written in Python (ScorePolicy)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Union

import numpy as np

from . import _core
from ._checks import _check_int, _check_real


class ScorePolicy:
    """An eviction rule whose score function is written in Python.

    Subclass it and define ``score``; pass an instance as ``KVConfig(policy=...)``. At the end of a
    step, each layer that holds more rows than its budget calls ``score`` once: higher scores are
    kept. The first ``sinks`` tokens and the recent window are always kept (as h2o keeps them);
    of the other rows the highest scores survive (ties to the older position).

    ``score(layer, positions, mass, keys=None)`` receives copies, valid after the call:

    - ``positions``: int32 ``[G, n]``, the absolute position of every held row of each kv head
      (a head-adaptive layer's empty slots hold 2**31 - 1);
    - ``mass``: float32 ``[G, n]``, the attention each row has received so far, summed over the
      steps and averaged over the kv head's query heads (h2o's score);
    - ``keys``: float32 ``[G, n, D]`` (after RoPE) when the class sets ``wants_keys = True``,
      else None;

    and returns ``[G, n]`` finite scores. An exception raised by ``score`` fails the step with a
    ``squeezekv.Error``; the sequence should then be discarded.

    The engine steps a model's sequences on one thread, so ``score`` is never called for two of them
    at once.
    """

    wants_keys: bool = False

    def score(self, layer: int, positions: np.ndarray, mass: np.ndarray,
              keys: Optional[np.ndarray] = None) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError("ScorePolicy.score: a subclass defines it")


_NAMES = {"policy", "type", "type_k", "type_v", "squeeze_metric", "squeeze_alloc", "head_alloc", "layer_alloc",
          "squeeze_resolve"}
_INTS = {"budget", "sinks", "recent", "recent_f16", "snapkv_window", "ctx"}
_REALS = {"pyramid_beta", "squeeze_strength", "squeeze_p"}
_BOOLS = {"squeeze_cap"}


@dataclass(frozen=True)
class KVConfig:
    """How one sequence's KV cache is held: the CLI's ``--kv-*`` flags, one field each.

    ``None`` leaves the engine's default (``squeezekv generate --help`` lists them). ``policy`` is a
    name (``squeezekv.kv_policies()``) or a ``ScorePolicy`` instance. ``ctx`` is the most tokens
    the sequence may see (the CLI's ``--ctx``; default the model's context, at most 16384).
    """

    policy: Union[str, ScorePolicy] = "full"
    budget: Optional[int] = None
    type: Optional[str] = None
    type_k: Optional[str] = None
    type_v: Optional[str] = None
    recent_f16: Optional[int] = None
    sinks: Optional[int] = None
    recent: Optional[int] = None
    snapkv_window: Optional[int] = None
    pyramid_beta: Optional[float] = None
    squeeze_strength: Optional[float] = None
    squeeze_metric: Optional[str] = None
    squeeze_alloc: Optional[str] = None
    squeeze_p: Optional[float] = None
    head_alloc: Optional[str] = None
    layer_alloc: Optional[str] = None
    squeeze_cap: Optional[bool] = None
    squeeze_resolve: Optional[str] = None
    ctx: Optional[int] = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if f.name == "policy":
                if not isinstance(v, (str, ScorePolicy)):
                    raise TypeError(f"KVConfig.policy: expected a policy name or a ScorePolicy, got {type(v).__name__}")
                if isinstance(v, ScorePolicy) and type(v).score is ScorePolicy.score:
                    raise TypeError(f"KVConfig.policy: {type(v).__name__} does not define score()")
            elif f.name in _NAMES and not isinstance(v, str):
                raise TypeError(f"KVConfig.{f.name}: expected a str, got {type(v).__name__}")
            elif f.name in _INTS:
                _check_int(f"KVConfig.{f.name}", v)
            elif f.name in _REALS:
                _check_real(f"KVConfig.{f.name}", v)
            elif f.name in _BOOLS and not isinstance(v, bool):
                raise TypeError(f"KVConfig.{f.name}: expected a bool, got {type(v).__name__}")
        if self.ctx is not None and self.ctx < 1:
            raise ValueError(f"KVConfig.ctx: must be at least 1, got {self.ctx}")

    def _native(self) -> "_core.CacheConfig":
        """The engine's config (validated there: a ValueError naming the flag)."""
        options: dict[str, str] = {}
        scorer = None
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or f.name == "ctx":
                continue
            if f.name == "policy" and isinstance(v, ScorePolicy):
                scorer = v
                options["policy"] = "custom"
                continue
            if isinstance(v, bool):
                v = "on" if v else "off"
            elif isinstance(v, float):
                v = repr(v)
            options[f.name] = str(v)
        try:
            return _core.CacheConfig(options, scorer, self.ctx or 0)
        except _core.Error as e:
            raise type(e)(f"KVConfig: {e}") from None


def as_config(kv: Union[KVConfig, None]) -> KVConfig:
    if kv is None:
        return KVConfig()
    if not isinstance(kv, KVConfig):
        raise TypeError(f"kv: expected a squeezekv.KVConfig, got {type(kv).__name__}")
    return kv
