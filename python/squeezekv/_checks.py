"""Argument checks shared by the package's modules: a wrong type is a TypeError, a value out of
range a ValueError, each naming the argument."""
from __future__ import annotations

from typing import Optional

import numpy as np


def _check_int(name: str, v: object, low: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if low is not None and v < low:
        raise ValueError(f"{name}: must be >= {low}, got {v}")
    return int(v)


def _check_real(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a number, got {type(v).__name__}")
    return float(v)
