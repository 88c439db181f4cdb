"""Per-GPU features from telemetry, and the failure events that label them.

Reading is a thin layer (:func:`read_node_group`: InfluxDB aggregates per time bucket, done by
the server); everything after it is pure polars on those frames (:func:`events_from`,
:func:`features_from`), so tests and the Dask tasks run the same code.

Features of GPU ``g`` on node ``n`` at bucket ``t`` use only buckets at or before ``t``. Their
windows are counted in buckets (``step_s``, 60 s by default): 30 and 10 buckets (30 and 10
minutes at the default; the names say so), 1,440 for the XID history (a day). A model trained
at another ``step_s`` (the live loop's compressed time) sees the same shapes, proportionally:

* growth over the last 30 and 10 minutes of correctable ECC errors, row remaps, PCIe
  replays and NVLink CRC/replay/recovery errors (counter increases, resets counted from 0);
* temperature level, its rise over 30 minutes, and its distance from the node's median GPU;
  power against the node's median; the share of the last 30 minutes spent thermally or
  hardware-slowed (clock-event reason bits);
* the node's InfiniBand symbol errors and link recoveries over 30 minutes (all its ports);
* non-fatal XIDs on the GPU in the last 24 hours;
* the node's own failure history in the data read (:mod:`analytics.predict.history`).

Failures (the label rules, ``[predictor]`` in the configuration): an XID in the fatal list,
new double-bit ECC errors, a link going down, a fatal NVSwitch SXid, a GPU the agent found
lost or with a failed row remap (from NVML, for nodes whose kernel log it cannot read), a node
that stops reporting. GPU failures belong to ``node/gpu``; link, NVSwitch and node failures to
the node and so to each of its GPUs.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from gpuwarden.analytics.counters import increases
from gpuwarden.analytics.predict.history import FaultEvent, history_frame
from gpuwarden.core.store.reader import InfluxReader

GPU_AGG = {
    "sbe": "max:ecc_sbe_volatile_total",
    "dbe": "max:ecc_dbe_volatile_total",
    "remap": "max:remapped_rows_correctable_total",
    "pcie_replay": "max:pcie_replay_total",
    "temp": "mean:gpu_temp_c",
    "power": "mean:power_w",
    "reasons": "last:clock_event_reasons_code",
}
NVLINK_AGG = {
    "crc": "max:crc_flit_errors_total",
    "replay": "max:replay_errors_total",
    "recovery": "max:recovery_errors_total",
}
IB_AGG = {
    "symbol": "max:symbol_error_total",
    "link_recovery": "max:link_error_recovery_total",
    "downed": "max:link_downed_total",
}
#: ``gpu_event`` kinds the agent raises from NVML, each a GPU failure: the GPU fell off the
#: bus (NVML_ERROR_GPU_IS_LOST), or a row remap failed (the GPU needs a reset and an RMA check)
GONE_EVENTS = ("gpu_lost", "row_remap_failure")
#: clock-event reason bits that mean the GPU was slowed by heat or hardware protection
SLOWDOWN_BITS = 0x8 | 0x20 | 0x40

FEATURES = (
    "sbe_30m",
    "sbe_10m",
    "remap_30m",
    "pcie_replay_30m",
    "nvlink_crc_30m",
    "nvlink_replay_30m",
    "nvlink_recovery_30m",
    "temp",
    "temp_rise_30m",
    "temp_vs_node",
    "power_vs_node",
    "slowed_share_30m",
    "ib_symbol_30m",
    "ib_recovery_30m",
    "xid_nonfatal_24h",
    "node_failures",
    "node_days_since_failure",
    "error_growth_30m",
)
#: error counts: more never means less risk (a monotonic constraint for the trees, so a rare
#: failure mode seen a few times in training is not unlearned where the data thins out)
ERROR_FEATURES = (
    "sbe_30m",
    "sbe_10m",
    "remap_30m",
    "pcie_replay_30m",
    "nvlink_crc_30m",
    "nvlink_replay_30m",
    "nvlink_recovery_30m",
    "ib_symbol_30m",
    "ib_recovery_30m",
    "error_growth_30m",
)
MONOTONE = dict.fromkeys(ERROR_FEATURES, 1)


def add_derived(frame: pl.DataFrame) -> pl.DataFrame:
    """``error_growth_30m``: every error counter's 30-minute growth on one log scale, summed --
    "something on this GPU or its links is degrading", whichever counter shows it."""
    parts = [pl.col(c).fill_null(0).log1p() for c in ERROR_FEATURES if c != "error_growth_30m"]
    return frame.with_columns(pl.sum_horizontal(parts).alias("error_growth_30m"))


@dataclass(frozen=True)
class Buckets:
    """What one read of a node group returns: per-bucket aggregates, the XID rows, the
    fatal SXid rows, and the GPU events the agent raises from NVML alone (a node whose agent
    cannot read the kernel log still has its failures labelled)."""

    gpu: pl.DataFrame  # time, node, gpu, GPU_AGG columns
    nvlink: pl.DataFrame  # time, node, gpu, NVLINK_AGG increases summed over links
    ib: pl.DataFrame  # time, node, IB_AGG increases summed over ports
    xid: pl.DataFrame  # time, node, gpu, xid_code
    sxid: pl.DataFrame  # time, node, sxid_code: the fatal NVSwitch errors
    gone: pl.DataFrame  # time, node, gpu, event: the agent's gpu_lost / row_remap_failure


def _ns(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.col("time").dt.epoch("ns").alias("t_ns"))


def _summed_increases(
    df: pl.DataFrame, keys: list[str], per: list[str], names: list[str]
) -> pl.DataFrame:
    if df.is_empty():
        schema: dict[str, pl.DataType] = {"time": pl.Datetime("ns", "UTC")}
        schema |= {p: pl.String() for p in per} | {n: pl.Float64() for n in names}
        return pl.DataFrame(schema=schema)
    inc = increases(df, keys, names)
    return (
        inc.group_by(["time", *per])
        .agg(pl.col(f"{n}_inc").fill_null(0.0).sum().alias(n) for n in names)
        .sort(["time", *per])
    )


def read_node_group(
    reader: InfluxReader, nodes: Sequence[str], start_ns: int, end_ns: int, step_s: int
) -> Buckets:
    """Per-``step_s`` aggregates of the GPUs, NVLinks and HCAs of ``nodes``, and their XIDs."""
    where = {"node": list(nodes)}

    def agg(measurement: str, fields: dict[str, str], tags: list[str]) -> pl.DataFrame:
        return reader.aggregate(
            measurement, fields, start_ns, end_ns, every_s=step_s, group_tags=tags, where=where
        )

    gpu = agg("gpu", GPU_AGG, ["node", "gpu"])
    nvl = agg("gpu_nvlink", NVLINK_AGG, ["node", "gpu", "link"])
    ib = agg("ib_port", IB_AGG, ["node", "hca", "port"])
    xid = reader.read(
        "gpu_event", start_ns, end_ns, fields=["xid_code"], tags=["node", "gpu"], where=where
    )
    # a separate read: InfluxQL returns only rows where a selected field is set, and these
    # events carry no xid_code
    gone = reader.read(
        "gpu_event", start_ns, end_ns, fields=["fatal_active"], tags=["node", "gpu", "event"],
        where={**where, "event": list(GONE_EVENTS)},
    )  # fmt: skip
    sxid = reader.read(
        "nvswitch_event", start_ns, end_ns, fields=["sxid_code", "fatal_active"], tags=["node"],
        where=where,
    )  # fmt: skip
    return Buckets(
        gpu,
        _summed_increases(nvl, ["node", "gpu", "link"], ["node", "gpu"], list(NVLINK_AGG)),
        _summed_increases(ib, ["node", "hca", "port"], ["node"], list(IB_AGG)),
        xid.drop_nulls("xid_code").select("time", "node", "gpu", "xid_code"),
        sxid.filter(pl.col("fatal_active").fill_null(False)).select("time", "node", "sxid_code"),
        gone.select("time", "node", "gpu", "event"),
    )


def subject(node: str, gpu: str | None) -> str:
    return f"{node}/{gpu}" if gpu else node


def events_from(
    b: Buckets, fatal_xids: Collection[int], step_s: int, node_silent_buckets: int = 3
) -> list[FaultEvent]:
    """Failure events (and non-fatal XIDs as history) found in one node group's buckets."""
    out: list[FaultEvent] = []
    for row in b.xid.iter_rows(named=True):
        t = row["time"].timestamp()
        code = int(row["xid_code"])
        fatal = code in fatal_xids
        out.append(FaultEvent(subject(row["node"], row["gpu"]), t, None, fatal, f"xid {code}"))
    dbe = increases(b.gpu, ["node", "gpu"], ["dbe"]).filter(pl.col("dbe_inc") > 0)
    for row in dbe.iter_rows(named=True):
        out.append(
            FaultEvent(subject(row["node"], row["gpu"]), row["time"].timestamp(), None, True, "dbe")
        )
    for row in b.ib.filter(pl.col("downed") > 0).iter_rows(named=True):
        out.append(FaultEvent(row["node"], row["time"].timestamp(), None, True, "link_down"))
    for row in b.sxid.iter_rows(named=True):  # the node's NVLink is down: a node failure
        t = row["time"].timestamp()
        out.append(FaultEvent(row["node"], t, None, True, "nvswitch_sxid"))
    for row in b.gone.iter_rows(named=True):
        t, where = row["time"].timestamp(), subject(row["node"], row["gpu"])
        out.append(FaultEvent(where, t, None, True, str(row["event"])))
    silent: list[tuple[str, float, float]] = []
    per_node = b.gpu.group_by("node").agg(pl.col("time").unique().sort())
    for node, times in per_node.iter_rows():
        ts = np.array([t.timestamp() for t in times])
        for i in np.nonzero(np.diff(ts) > node_silent_buckets * step_s)[0]:
            silent.append((node, float(ts[i] + step_s), float(ts[i + 1])))
    # a silence most nodes share at once is the data path (InfluxDB, the network), not nodes
    starts = [s for _, s, _ in silent]
    for node, a, z in silent:
        if sum(abs(s - a) <= step_s for s in starts) <= per_node.height / 2:
            out.append(FaultEvent(node, a, z, True, "node_down"))
    return out


#: feature windows, in buckets of step_s
LONG, SHORT, XID_HISTORY = 30, 10, 1440


def features_from(b: Buckets, events: Sequence[FaultEvent], step_s: int = 60) -> pl.DataFrame:
    """One row per GPU and bucket: :data:`FEATURES`, plus ``node``, ``gpu``, ``t`` (s)."""
    if b.gpu.is_empty():
        return pl.DataFrame()
    g = increases(b.gpu, ["node", "gpu"], ["sbe", "remap", "pcie_replay"])
    g = g.join(b.nvlink, on=["time", "node", "gpu"], how="left")
    g = g.join(b.ib, on=["time", "node"], how="left").fill_null(0.0)
    slowed = ((pl.col("reasons").cast(pl.Int64) & SLOWDOWN_BITS) > 0).cast(pl.Float64)
    keys = ["node", "gpu"]

    long, short = f"{LONG * step_s}s", f"{SHORT * step_s}s"

    def roll(col: str | pl.Expr, window: str, how: str = "sum") -> pl.Expr:
        e = pl.col(col) if isinstance(col, str) else col
        fn = e.rolling_sum_by if how == "sum" else e.rolling_mean_by
        return fn("time", window_size=window).over(keys)

    g = g.sort([*keys, "time"]).with_columns(
        roll("sbe_inc", long).alias("sbe_30m"),
        roll("sbe_inc", short).alias("sbe_10m"),
        roll("remap_inc", long).alias("remap_30m"),
        roll("pcie_replay_inc", long).alias("pcie_replay_30m"),
        roll("crc", long).alias("nvlink_crc_30m"),
        roll("replay", long).alias("nvlink_replay_30m"),
        roll("recovery", long).alias("nvlink_recovery_30m"),
        (pl.col("temp") - roll("temp", long, "mean")).alias("temp_rise_30m"),
        roll(slowed, long, "mean").alias("slowed_share_30m"),
        roll("symbol", long).alias("ib_symbol_30m"),
        roll("link_recovery", long).alias("ib_recovery_30m"),
    )
    g = g.with_columns(
        (pl.col("temp") - pl.col("temp").median().over(["node", "time"])).alias("temp_vs_node"),
        (pl.col("power") - pl.col("power").median().over(["node", "time"])).alias("power_vs_node"),
    )
    g = _xid_history(g, events, XID_HISTORY * step_s)
    g = g.with_columns(pl.col("time").dt.epoch("ns").truediv(1e9).alias("t"))
    hist = _node_history(g, events)
    g = add_derived(g.join(hist, on=["node", "t"], how="left"))
    return g.select("node", "gpu", "time", "t", *FEATURES).fill_nan(None)


def _xid_history(g: pl.DataFrame, events: Sequence[FaultEvent], window_s: float) -> pl.DataFrame:
    rows = [(e.subject, e.start_s) for e in events if not e.failure and e.kind.startswith("xid")]
    if not rows:
        return g.with_columns(pl.lit(0.0).alias("xid_nonfatal_24h"))
    counts = []
    by: dict[str, list[float]] = {}
    for s, t in rows:
        by.setdefault(s, []).append(t)
    t_all = g["time"].dt.epoch("ns").to_numpy() / 1e9
    subjects = (g["node"] + "/" + g["gpu"]).to_list()
    for s, t in zip(subjects, t_all, strict=True):
        xs = by.get(s)
        if not xs:
            counts.append(0.0)
            continue
        arr = np.asarray(sorted(xs))
        counts.append(float(np.searchsorted(arr, t, "right") - np.searchsorted(arr, t - window_s)))
    return g.with_columns(pl.Series("xid_nonfatal_24h", counts, dtype=pl.Float64))


def _node_history(g: pl.DataFrame, events: Sequence[FaultEvent]) -> pl.DataFrame:
    """Failures of the node (any of its GPUs, its links, itself) before each bucket."""
    node_events = [
        FaultEvent(e.subject.split("/", 1)[0], e.start_s, e.end_s, e.failure, e.kind)
        for e in events
    ]
    times = np.sort(g["t"].unique().to_numpy())
    nodes = sorted(g["node"].unique().to_list())
    h = history_frame(node_events, nodes, times)
    return h.select(
        pl.col("subject").alias("node"),
        "t",
        pl.col("failures_total").alias("node_failures"),
        pl.col("days_since_failure").alias("node_days_since_failure"),
    )


def label(
    frame: pl.DataFrame,
    events: Sequence[FaultEvent],
    horizons_s: Sequence[float],
    down_s: float,
) -> pl.DataFrame:
    """``y_<h>s`` (a failure of this GPU or its node in ``(t, t + h]``), ``down`` (within
    ``down_s`` after one, or inside a known outage) and ``fails_at`` (the next failure)."""
    fails: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.failure:
            end = max(e.end_s or e.start_s, e.start_s) + down_s
            fails.setdefault(e.subject, []).append((e.start_s, end))
    t = frame["t"].to_numpy()
    nxt = np.full(len(t), np.inf)
    down = np.zeros(len(t), dtype=bool)
    gpu_subj = (frame["node"] + "/" + frame["gpu"]).to_numpy()
    node_subj = frame["node"].to_numpy()
    for subj_col in (gpu_subj, node_subj):
        for s in np.unique(subj_col):
            spans = fails.get(str(s))
            if not spans:
                continue
            rows = subj_col == s
            starts = np.array(sorted(a for a, _ in spans))
            idx = np.searchsorted(starts, t[rows], side="right")
            padded = np.append(starts, np.inf)
            nxt[rows] = np.minimum(nxt[rows], padded[idx])
            for a, b in spans:
                down[rows] |= (t[rows] >= a) & (t[rows] < b)
    out = frame.with_columns(pl.Series("fails_at", nxt), pl.Series("down", down))
    return out.with_columns(
        ((pl.col("fails_at") - pl.col("t") <= h) & (pl.col("fails_at") > pl.col("t"))).alias(
            f"y_{int(h)}s"
        )
        for h in horizons_s
    )
