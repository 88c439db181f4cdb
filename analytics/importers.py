"""Readers for real straggler traces, turned into :func:`analytics.stragglers.detect` input.

* **StragglerAnalysis parquet** (ByteDance-Seed/StragglerAnalysis, "Understanding Stragglers in
  Large Model Training Using What-if Analysis"): one row per operation with ``dp_rank, stage,
  rank, step, optype, start_ts, duration``. A rank's time for a step is the sum of its
  *compute* operations (``forward-compute``, ``backward-compute``): communication operations
  include the time spent waiting for the slow peer, so they would blame the victim.
* **Alibaba mini-batch-time CSV** (alibaba/clusterdata, cluster-trace-gpu-v2020): one row per
  worker and iteration with ``worker, gpu, time, batch_time_norm``; the normalised batch time
  is unitless, which is fine, since stragglers are found from ratios.

Each reader raises :class:`TraceFormatError` with the file name and what is missing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import polars as pl

from gpuwarden.analytics.errors import AnalyticsError

COMPUTE_OPS = ("forward-compute", "backward-compute")
_WHATIF_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "mb_id", "duration")
_MINIBATCH_COLUMNS = ("worker", "time", "batch_time_norm")

# The published files this project was checked against, recognised by content so the output
# can cite them. Any other file in the same format works; it is just not cited by name.
_ALIBABA = "alibaba/clusterdata cluster-trace-gpu-v2020/mini-batch-time @ 7a6c496e (CC-BY-4.0)"
KNOWN_SOURCES = {
    "85a995b326999923": "ByteDance-Seed/StragglerAnalysis @ 8efcd7f3, trace-ST (Apache-2.0)",
    "6f555e44ababa68c": f"{_ALIBABA}, job_1_norm.csv",
    "c1945786e809ec0c": f"{_ALIBABA}, job_2_norm.csv",
    "47057a62829a1fbe": f"{_ALIBABA}, job_3_norm.csv",
    "eccd5b23e4480e58": f"{_ALIBABA}, job_4_norm.csv",
}


class TraceFormatError(AnalyticsError, ValueError):
    """A straggler trace is unreadable or lacks what the reader needs."""


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def cite(path: str | Path) -> str:
    """Where the file comes from, if it is one of the published files we know."""
    digest = file_digest(path)
    if digest in KNOWN_SOURCES:
        return f"REAL trace: {KNOWN_SOURCES[digest]}"
    return f"user-supplied file {Path(path).name} (sha256 prefix {digest})"


def _require(df: pl.DataFrame, columns: tuple[str, ...], path: str | Path) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{path}: missing columns {missing}; has {df.columns}")


def read_whatif_trace(path: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Per (rank, step) compute time with ``dp_rank`` and ``stage``; and per-optype context."""
    try:
        ops = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise TraceFormatError(f"{path}: not a readable parquet file: {exc}") from None
    _require(ops, _WHATIF_COLUMNS, path)
    ops = ops.with_columns(pl.col("optype").cast(pl.String))
    compute = ops.filter(pl.col("optype").is_in(COMPUTE_OPS))
    if compute.is_empty():
        raise TraceFormatError(f"{path}: no {COMPUTE_OPS} operations to time ranks by")
    timings = (
        compute.group_by("rank", "step")
        .agg(
            pl.col("duration").cast(pl.Float64).sum().alias("time_s"),
            pl.col("dp_rank").first().cast(pl.Int64),
            pl.col("stage").first().cast(pl.Int64),
        )
        .rename({"rank": "worker"})
        .sort("step", "worker")
    )
    per_op = compute.group_by("stage", "optype").agg(pl.col("duration").cast(pl.Float64).sum())
    context = {
        "ranks": int(timings["worker"].n_unique()),
        "steps": int(timings["step"].n_unique()),
        "stages": int(timings["stage"].n_unique()),
        "dp_size": int(timings["dp_rank"].n_unique()),
        "per_op": per_op,
        "ops": ops,
    }
    return timings, context


def optype_slowdowns(per_op: pl.DataFrame, stage: int) -> dict[str, float]:
    """For one stage, each compute operation's total time over the median of the other
    stages' (which operation makes the stage slow)."""
    others = (
        per_op.filter(pl.col("stage") != stage)
        .group_by("optype")
        .agg(pl.col("duration").median().alias("peer"))
    )
    mine = per_op.filter(pl.col("stage") == stage).join(others, on="optype")
    mine = mine.filter(pl.col("peer") > 0).with_columns(
        (pl.col("duration") / pl.col("peer")).alias("ratio")
    )
    return {
        str(r["optype"]): round(float(r["ratio"]), 3)
        for r in mine.sort("ratio", descending=True).iter_rows(named=True)
    }


def read_minibatch_csv(path: str | Path) -> pl.DataFrame:
    """Per (worker, iteration) normalised batch time."""
    try:
        df = pl.read_csv(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise TraceFormatError(f"{path}: not a readable CSV file: {exc}") from None
    _require(df, _MINIBATCH_COLUMNS, path)
    return df.select(
        pl.col("worker").cast(pl.String),
        pl.col("time").cast(pl.Int64).alias("step"),
        pl.col("batch_time_norm").cast(pl.Float64).alias("time_s"),
    )
