"""Increases and rates of raw hardware counters: resets and saturation handled.

The catalogue keeps counters as the hardware gives them (DESIGN.md), so every consumer needs
the same three rules, implemented once here:

* **Reset** (a driver reload, a port reset, a reboot): the value goes down. The increase over
  that interval is the new value (the counter restarted from zero), not a negative number.
* **Saturation** (legacy 32-bit InfiniBand counters stop at 2^32-1 and stay there): while a
  counter sits exactly at its ceiling the increase is unknown, so it is null, never zero. A
  value above the ceiling comes from a 64-bit counter (``counters_ext``) and is used as is.
* **The first sample** of a series has no predecessor: null.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

IB32_MAX = 2**32 - 1
"""Ceiling of a legacy 32-bit IB counter (``port_xmit_data`` counts 4-byte words, so the
catalogue's byte counters saturate at 4x this)."""


def increases(
    df: pl.DataFrame,
    keys: Sequence[str],
    counters: Sequence[str],
    *,
    time: str = "time",
    ceilings: dict[str, int] | None = None,
) -> pl.DataFrame:
    """``df`` sorted by keys and time with ``<counter>_inc`` columns and ``dt_s``.

    ``time`` must be a Datetime or integer nanoseconds. ``ceilings`` maps a counter to the
    value at which it saturates (see :data:`IB32_MAX`).
    """
    ceilings = ceilings or {}
    out = df.sort([*keys, time])
    t = pl.col(time)
    if out.schema[time] != pl.Int64:
        t = t.dt.epoch("ns")
    exprs = [(t.diff().over(list(keys)) / 1e9).alias("dt_s")]
    for c in counters:
        cur = pl.col(c).cast(pl.Float64)
        prev = cur.shift(1).over(list(keys))
        inc = pl.when(cur >= prev).then(cur - prev).otherwise(cur)  # reset: counts from zero
        if c in ceilings:
            ceiling = float(ceilings[c])
            # exactly at the ceiling twice: stuck. Above it is a 64-bit counter, and fine.
            inc = pl.when((cur == ceiling) & (prev == ceiling)).then(None).otherwise(inc)
        exprs.append(pl.when(prev.is_null()).then(None).otherwise(inc).alias(f"{c}_inc"))
    return out.with_columns(exprs)


def rates(
    df: pl.DataFrame,
    keys: Sequence[str],
    counters: Sequence[str],
    *,
    time: str = "time",
    ceilings: dict[str, int] | None = None,
) -> pl.DataFrame:
    """Like :func:`increases`, with ``<counter>_per_s`` (increase over the interval)."""
    out = increases(df, keys, counters, time=time, ceilings=ceilings)
    dt = pl.when(pl.col("dt_s") > 0).then(pl.col("dt_s")).otherwise(None)
    return out.with_columns((pl.col(f"{c}_inc") / dt).alias(f"{c}_per_s") for c in counters)
