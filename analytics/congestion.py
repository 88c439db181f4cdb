"""Fabric congestion from InfiniBand/RoCE port counters, ranked by switch.

Per port and time bucket, from the raw counters (:mod:`analytics.counters`: resets and 32-bit
saturation handled):

* ``xmit_util_ratio`` / ``rcv_util_ratio``: throughput over the link rate;
* ``xmit_wait_ratio``: share of the link's bandwidth lost waiting for credits. NVIDIA's
  ibdiagnet manual ("Congestion assessment on InfiniBand links") gives the conversion: on
  Quantum switches and current HCAs ``port_xmit_wait`` counts one tick per 8 bytes that could
  not be sent, so lost bits/s = rate x 8 B x 8; older Switch-IB counts 32 B per lane
  (``xmit_wait_bytes_per_tick`` in the configuration);
* ``cnp_per_s`` (CNPs sent and handled), ``ecn_marked_per_s`` and the ECN-marked share of the
  packets received; ``symbol_errors_per_s``.

A port's congestion score is the larger of its xmit_wait ratio and its ECN-marked share: both
are fractions of its traffic that met congestion. A switch's score per bucket is the median
over the ports of the hosts under it (one bad cable does not make a switch hot; a congested
switch slows all its ports). A switch is *hot* when its score stays at or above
``hot_score`` for at least ``min_hot_s``; switches are ranked by mean score over the window.
Without a topology every node is its own group, so hot hosts are still found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gpuwarden.analytics.counters import IB32_MAX, rates
from gpuwarden.analytics.scalars import num

PORT_KEYS = ("node", "hca", "port")
RATE_COUNTERS = (
    "port_xmit_data_bytes_total",
    "port_rcv_data_bytes_total",
    "port_rcv_packets_total",
    "port_xmit_wait_total",
    "np_cnp_sent_total",
    "rp_cnp_handled_total",
    "np_ecn_marked_roce_packets_total",
    "symbol_error_total",
    "link_error_recovery_total",
    "link_downed_total",
)
# Legacy PortCounters are 32 bits; the data counters count 4-byte words (x4 in the catalogue).
CEILINGS = {
    "port_xmit_data_bytes_total": 4 * IB32_MAX,
    "port_rcv_data_bytes_total": 4 * IB32_MAX,
    "port_rcv_packets_total": IB32_MAX,
    "port_xmit_wait_total": IB32_MAX,
    "symbol_error_total": 2**16 - 1,
    "link_error_recovery_total": 2**8 - 1,
    "link_downed_total": 2**8 - 1,
}


@dataclass(frozen=True)
class CongestionConfig:
    xmit_wait_bytes_per_tick: float = 8.0
    hot_score: float = 0.02
    """A switch bucket is hot at or above this share of traffic meeting congestion."""
    min_hot_s: float = 300.0
    """... for at least this long in the window."""


@dataclass
class SwitchReport:
    switch: str
    score: float
    hot_s: float
    peak_score: float
    nodes: list[str]
    hot: bool
    first_hot_ns: int | None = None
    last_hot_ns: int | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)


def port_rates(ib: pl.DataFrame, cfg: CongestionConfig) -> pl.DataFrame:
    """Per port and sample: the catalogue's ``congestion`` fields (``score_ratio`` included)."""
    present = [c for c in RATE_COUNTERS if c in ib.columns]
    keys = [k for k in PORT_KEYS if k in ib.columns]
    df = rates(ib, keys, present, ceilings={c: CEILINGS[c] for c in present if c in CEILINGS})

    def per_s(name: str) -> pl.Expr:
        col = f"{name}_per_s"
        return pl.col(col) if col in df.columns else pl.lit(None, pl.Float64)

    link_bps = pl.col("rate_gbps") * 1e9 if "rate_gbps" in df.columns else pl.lit(None)
    link_bps = pl.when(link_bps > 0).then(link_bps).otherwise(None)
    ecn_share = per_s("np_ecn_marked_roce_packets_total") / pl.when(
        per_s("port_rcv_packets_total") > 0
    ).then(per_s("port_rcv_packets_total"))
    out = df.with_columns(
        (per_s("port_xmit_data_bytes_total") * 8 / link_bps).clip(0, 1).alias("xmit_util_ratio"),
        (per_s("port_rcv_data_bytes_total") * 8 / link_bps).clip(0, 1).alias("rcv_util_ratio"),
        (per_s("port_xmit_wait_total") * cfg.xmit_wait_bytes_per_tick * 8 / link_bps)
        .clip(0, 1)
        .alias("xmit_wait_ratio"),
        (
            per_s("np_cnp_sent_total").fill_null(0) + per_s("rp_cnp_handled_total").fill_null(0)
        ).alias("cnp_per_s"),
        per_s("np_ecn_marked_roce_packets_total").alias("ecn_marked_per_s"),
        ecn_share.clip(0, 1).alias("ecn_marked_share"),
        per_s("symbol_error_total").alias("symbol_errors_per_s"),
        per_s("link_error_recovery_total").alias("link_recoveries_per_s"),
        per_s("link_downed_total").alias("link_downed_per_s"),
    )
    return out.with_columns(
        pl.max_horizontal(
            pl.col("xmit_wait_ratio").fill_null(0), pl.col("ecn_marked_share").fill_null(0)
        ).alias("score_ratio")
    ).filter(pl.col("dt_s").is_not_null())


def switch_series(ports: pl.DataFrame, switch_of: Mapping[str, str]) -> pl.DataFrame:
    """Per switch and bucket: the median port score (``time, switch, score, ports``)."""
    topo = pl.DataFrame(
        {"node": list(switch_of), "switch": list(switch_of.values())},
        schema={"node": pl.String, "switch": pl.String},
    )
    df = ports.join(topo, on="node", how="left").with_columns(
        pl.col("switch").fill_null(pl.col("node"))
    )
    return (
        df.group_by("switch", "time")
        .agg(pl.col("score_ratio").median().alias("score"), pl.len().alias("ports"))
        .sort("switch", "time")
    )


def rank_switches(
    series: pl.DataFrame, switch_of: Mapping[str, str], nodes: list[str], cfg: CongestionConfig
) -> list[SwitchReport]:
    """Switches by mean score, each marked hot or not (see the module docstring)."""
    if series.is_empty():
        return []
    t = pl.col("time")
    if series.schema["time"] != pl.Int64:
        t = t.dt.epoch("ns")
    series = series.with_columns(t.alias("time_ns")).sort("switch", "time_ns")
    bucket_s = series.group_by("switch").agg(
        (pl.col("time_ns").diff().median() / 1e9).alias("bucket_s")
    )
    agg = (
        series.join(bucket_s, on="switch")
        .group_by("switch")
        .agg(
            pl.col("score").mean().alias("mean"),
            pl.col("score").max().alias("peak"),
            ((pl.col("score") >= cfg.hot_score).sum() * pl.col("bucket_s").first()).alias("hot_s"),
            pl.col("time_ns").filter(pl.col("score") >= cfg.hot_score).min().alias("first_hot"),
            pl.col("time_ns").filter(pl.col("score") >= cfg.hot_score).max().alias("last_hot"),
        )
        .sort("mean", descending=True)
    )
    reports = []
    for row in agg.iter_rows(named=True):
        sw = row["switch"]
        under = sorted(n for n in nodes if switch_of.get(n, n) == sw)
        hot_s = float(row["hot_s"] or 0.0)
        reports.append(
            SwitchReport(
                switch=sw,
                score=float(row["mean"] or 0.0),
                hot_s=hot_s,
                peak_score=float(row["peak"] or 0.0),
                nodes=under,
                hot=hot_s >= cfg.min_hot_s,
                first_hot_ns=row["first_hot"],
                last_hot_ns=row["last_hot"],
            )
        )
    return reports


def job_impact(
    series: pl.DataFrame, switch: str, job_walls: pl.DataFrame, bucket_s: float
) -> dict[str, float] | None:
    """How a job's step time moved with a switch's score: mean wall while the switch was hot
    against while it was not, and their Pearson correlation per bucket.

    ``job_walls`` has ``time_ns, wall_s`` (one row per executed step)."""
    sw = series.filter(pl.col("switch") == switch)
    if sw.is_empty() or job_walls.is_empty():
        return None
    t = pl.col("time")
    if sw.schema["time"] != pl.Int64:
        t = t.dt.epoch("ns")
    b = int(bucket_s * 1e9)
    sw = sw.with_columns((t // b).alias("bucket")).group_by("bucket").agg(pl.col("score").mean())
    jw = (
        job_walls.with_columns((pl.col("time_ns") // b).alias("bucket"))
        .group_by("bucket")
        .agg(pl.col("wall_s").mean())
    )
    both = sw.join(jw, on="bucket").drop_nulls()
    if both.height < 3:
        return None
    corr = both.select(pl.corr("score", "wall_s")).item()
    hot = both.filter(pl.col("score") >= num(both["score"].quantile(0.75)))
    cold = both.filter(pl.col("score") < num(both["score"].quantile(0.25)) + 1e-12)
    out = {"correlation": num(corr) if corr is not None and math.isfinite(corr) else 0.0}
    if hot.height and cold.height:
        cold_wall = num(cold["wall_s"].mean())
        if cold_wall > 0:
            out["slowdown_while_hot"] = float(hot["wall_s"].mean() or 0.0) / cold_wall  # type: ignore[arg-type]
    return out
