"""Online scoring: the latest failure risk of every GPU and node, as ``failure_risk`` points,
and a ``failure_risk`` finding for each GPU whose risk reaches the operating threshold.

A finding carries its evidence: the risk, the horizon, the model's version, and the features
that drove it -- for each feature, how far the risk falls when that one feature is set back to
its median over the GPUs scored now (a one-at-a-time attribution; cheap, and in the units an
operator can check on the node dashboard).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import polars as pl

from gpuwarden.analytics.config import AnalyticsConfig
from gpuwarden.analytics.emit import SOURCE
from gpuwarden.analytics.predict.dataset import group_task
from gpuwarden.analytics.predict.model import RiskModel
from gpuwarden.analytics.runner import DaskExecutor, LocalExecutor
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point

#: history needed before the scored bucket: the longest feature window (30 min) plus margin
#: buckets read back before the one scored: the features' longest window (30) and a margin;
#: 45 minutes at the default step_s = 60
LOOKBACK_STEPS = 45


@dataclass(frozen=True)
class Scored:
    frame: pl.DataFrame  # node, gpu, t, FEATURES, risk (the latest bucket of each GPU)
    points: list[Point]
    findings: list[Finding]


def drivers(
    model: RiskModel, row: pl.DataFrame, reference: pl.DataFrame, top: int = 3
) -> list[tuple[str, float, float]]:
    """(feature, value, risk drop) of the ``top`` features whose median lowers risk most."""
    base = float(model.predict(row)[0])
    out = []
    for f in model.meta.features:
        median = reference[f].median()
        if median is None or row[f][0] == median:
            continue
        alt = row.with_columns(pl.lit(median, dtype=pl.Float64).alias(f))
        out.append((f, float(row[f][0]), base - float(model.predict(alt)[0])))
    out.sort(key=lambda x: -x[2])
    return [d for d in out[:top] if d[2] > 0]


def score(
    cfg: AnalyticsConfig,
    model: RiskModel,
    end_ns: int,
    executor: LocalExecutor | DaskExecutor,
    *,
    cluster: str,
    nodes: Collection[str],
    threshold: float | None = None,
) -> Scored:
    """Score the bucket that ends at ``end_ns`` for every GPU of ``nodes``."""
    p = cfg["predictor"]
    step = int(p["step_s"])
    thr = threshold if threshold is not None else (p["risk_threshold"] or model.meta.threshold)
    start = end_ns - LOOKBACK_STEPS * step * 10**9
    per = int(p["nodes_per_task"])
    ordered = sorted(nodes)
    groups = [ordered[i : i + per] for i in range(0, len(ordered), per)]
    calls = [
        (group_task, (cfg.reader_kwargs(), g, start, end_ns, step, list(p["fatal_xids"])))
        for g in groups
    ]
    parts = [f for f, _ in executor.run(calls, "risk") if not f.is_empty()]
    if not parts:
        return Scored(pl.DataFrame(), [], [])
    frame = pl.concat(parts)
    latest = frame.filter(pl.col("t") == pl.col("t").max().over("node", "gpu"))
    latest = latest.with_columns(pl.Series("risk", model.predict(latest)))
    horizon = f"{int(model.meta.horizon_s)}s"
    points: list[Point] = []
    t_ns = int(float(latest["t"].max()) * 1e9)
    version = model.meta.version or "unversioned"
    for row in latest.iter_rows(named=True):
        tags = {"cluster": cluster, "node": row["node"], "gpu": row["gpu"], "horizon": horizon}
        fields = {
            "probability_ratio": row["risk"],
            "threshold_ratio": thr,
            "alert_active": bool(row["risk"] >= thr),
            "model_version": version,
        }
        points.append(Point("failure_risk", {k: v for k, v in tags.items() if v}, fields, t_ns))
    for (node,), g in latest.group_by(["node"]):
        tags = {"cluster": cluster, "node": str(node), "horizon": horizon}
        risk = float(g["risk"].max())
        fields = {
            "probability_ratio": risk,
            "threshold_ratio": thr,
            "alert_active": risk >= thr,
            "model_version": version,
        }
        points.append(Point("failure_risk", {k: v for k, v in tags.items() if v}, fields, t_ns))
    findings = []
    for i in np.nonzero(latest["risk"].to_numpy() >= thr)[0]:
        row = latest[int(i)]
        r = row.row(0, named=True)
        why = drivers(model, row, latest)
        evidence = {
            "probability": round(r["risk"], 4),
            "horizon_s": model.meta.horizon_s,
            "threshold": thr,
            "model_version": version,
            "drivers": [{"feature": f, "value": v, "risk_drop": round(d, 4)} for f, v, d in why],
        }
        names = ", ".join(f for f, _, _ in why) or "the model's features"
        findings.append(
            Finding(
                kind="failure_risk",
                subject={"cluster": cluster, "node": r["node"], "gpu": r["gpu"]},
                severity=Severity.WARNING,
                time_ns=t_ns,
                evidence=evidence,
                probability=float(r["risk"]),
                summary=(
                    f"{r['node']} GPU {r['gpu']}: {r['risk']:.0%} risk of a hardware failure "
                    f"within {model.meta.horizon_s / 60:.0f} min (driven by {names})"
                ),
                source=SOURCE,
            )
        )
    return Scored(latest, points, findings)
