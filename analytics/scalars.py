"""Polars aggregates (``Series.mean()``, ``.max()``, ...) as plain numbers."""

from __future__ import annotations


def num(value: object, default: float = 0.0) -> float:
    """The aggregate as a float; null (an empty or all-null series) gives ``default``."""
    if isinstance(value, int | float):
        return float(value)
    return default
