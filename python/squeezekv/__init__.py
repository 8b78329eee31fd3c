"""squeezekv: LLM inference whose KV cache stays inside a fixed memory budget.

    import squeezekv
    model = squeezekv.load()                       # the default model (SmolLM2-135M-Instruct)
    kv = squeezekv.KVConfig(policy="squeeze", budget=256)
    print(model.generate("The capital of France is", max_tokens=8, temperature=0, kv=kv).text)

docs/python.md describes the whole API.
"""
from . import _core
from ._core import Error, FormatError, MemoryLimitError
from . import eval
from .kv import KVConfig, ScorePolicy
from .model import (GenerationResult, LayerStats, Model, ModelConfig, Sequence, default_model_path, load)

__version__ = "0.1.0"


def kv_policies() -> list[str]:
    """The built-in policy names (``custom`` is the one a ScorePolicy runs as)."""
    return list(_core.kv_policies())


__all__ = ["load", "Model", "ModelConfig", "Sequence", "GenerationResult", "LayerStats", "KVConfig", "ScorePolicy",
           "Error", "FormatError", "MemoryLimitError", "eval", "kv_policies", "default_model_path", "__version__"]
