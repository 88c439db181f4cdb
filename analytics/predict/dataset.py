"""Training and evaluation data from InfluxDB history: node groups read and turned into
features in parallel (one task per group on the analytics executor, Dask by default), then
labelled with the failures found across all of them."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import polars as pl

from gpuwarden.analytics.config import AnalyticsConfig
from gpuwarden.analytics.predict.history import FaultEvent
from gpuwarden.analytics.predict.telemetry import events_from, features_from, label, read_node_group
from gpuwarden.analytics.runner import DaskExecutor, LocalExecutor, Progress
from gpuwarden.core.store.reader import InfluxReader


@dataclass(frozen=True)
class Dataset:
    frame: pl.DataFrame  # node, gpu, time, t, FEATURES, fails_at, down, y_<h>s
    events: list[FaultEvent]
    start_ns: int
    end_ns: int


def group_task(
    reader_kwargs: dict[str, object],
    nodes: list[str],
    start_ns: int,
    end_ns: int,
    step_s: int,
    fatal_xids: list[int],
) -> tuple[pl.DataFrame, list[FaultEvent]]:
    """One node group: read, find its failures, compute its features (runs on a worker)."""
    reader = InfluxReader(**reader_kwargs)  # type: ignore[arg-type]
    try:
        b = read_node_group(reader, nodes, start_ns, end_ns, step_s)
    finally:
        reader.close()
    events = events_from(b, set(fatal_xids), step_s)
    return features_from(b, events, step_s), events


def build(
    cfg: AnalyticsConfig,
    start_ns: int,
    end_ns: int,
    executor: LocalExecutor | DaskExecutor,
    *,
    horizons_s: Sequence[float],
    fatal_xids: Collection[int],
    step_s: int = 60,
    down_s: float = 86400.0,
    nodes_per_task: int = 16,
    progress: Progress | None = None,
) -> Dataset:
    reader = InfluxReader(**cfg.reader_kwargs())
    try:
        nodes = reader.tag_values("gpu", "node", "power_w", start_ns, end_ns)
    finally:
        reader.close()
    groups = [nodes[i : i + nodes_per_task] for i in range(0, len(nodes), nodes_per_task)]
    calls = [
        (group_task, (cfg.reader_kwargs(), g, start_ns, end_ns, step_s, sorted(fatal_xids)))
        for g in groups
    ]
    parts = executor.run(calls, "features", progress)
    frames = [f for f, _ in parts if not f.is_empty()]
    events = [e for _, evs in parts for e in evs]
    frame = pl.concat(frames) if frames else pl.DataFrame()
    if not frame.is_empty():
        frame = label(frame, events, horizons_s, down_s)
    return Dataset(frame, events, start_ns, end_ns)
