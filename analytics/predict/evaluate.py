"""Event-level evaluation: alerts against failures, lead times, baselines and plots.

Row-level PR-AUC says how well risk is ranked; an operator cares about alerts. An *alert* is
the first bucket a GPU's risk is at or above the threshold after being below it. An alert is
right when its GPU, or its GPU's node, fails within the horizon after it (precision). A failure
is caught when an alert on its GPU (or, for a link or node failure, on any GPU of the node)
fired within the horizon before it (recall); the lead time is how long before. Failures with no
telemetry precursor (XID 79: the GPU falls off the bus; a node that simply stops) are reported
apart: they can be detected, not predicted.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from gpuwarden.analytics.predict.history import FaultEvent

SUDDEN = ("xid 79", "node_down")


@dataclass
class EventReport:
    threshold: float
    horizon_s: float
    alerts: int
    true_alerts: int
    caught: int
    failures: int
    leads_s: list[float] = field(default_factory=list)
    sudden_failures: int = 0
    sudden_caught: int = 0

    @property
    def precision(self) -> float:
        return self.true_alerts / self.alerts if self.alerts else float("nan")

    @property
    def recall(self) -> float:
        return self.caught / self.failures if self.failures else float("nan")

    @property
    def median_lead_s(self) -> float:
        return statistics.median(self.leads_s) if self.leads_s else float("nan")


def with_previous(frame: pl.DataFrame, score: str, step_s: float) -> pl.DataFrame:
    """Sorted per GPU, with the previous bucket's score and whether a gap precedes the row:
    computed once, then :func:`alert_starts` is a filter for any threshold."""
    f = frame.select("node", "gpu", "t", score).sort("node", "gpu", "t")
    return f.with_columns(
        pl.col(score).shift(1).over("node", "gpu").fill_null(-np.inf).alias("_prev"),
        (
            (pl.col("t") - pl.col("t").shift(1).over("node", "gpu")).fill_null(np.inf) > 2 * step_s
        ).alias("_gap"),
    )


def alert_starts(
    frame: pl.DataFrame, score: str, threshold: float, step_s: float, rearm_s: float = 0.0
) -> pl.DataFrame:
    """node, gpu, t of every alert: risk crossing the threshold (or resuming after a gap), at
    least ``rearm_s`` after the GPU's previous alert -- a risk that hovers at the threshold
    is one alert, as the remediation engine's per-subject cooldown would treat it."""
    f = frame if "_prev" in frame.columns else with_previous(frame, score, step_s)
    above = pl.col(score) >= threshold
    cross = f.filter(above & ((pl.col("_prev") < threshold) | pl.col("_gap"))).select(
        "node", "gpu", "t"
    )
    if rearm_s <= 0 or cross.is_empty():
        return cross
    keep = []
    last: dict[tuple[str, str], float] = {}
    for node, gpu, t in cross.iter_rows():
        if t - last.get((node, gpu), -np.inf) >= rearm_s:
            keep.append((node, gpu, t))
            last[(node, gpu)] = t
    return pl.DataFrame(keep, schema=cross.schema, orient="row")


def coverage(frame: pl.DataFrame) -> dict[str, np.ndarray]:
    """Sorted times at which each GPU (``node/gpu``) and each node had a scored row."""
    out: dict[str, np.ndarray] = {}
    for (node, gpu), g in frame.select("node", "gpu", "t").group_by(["node", "gpu"]):
        out[f"{node}/{gpu}"] = np.sort(g["t"].to_numpy())
    for (node,), g in frame.select("node", "t").group_by(["node"]):
        out[str(node)] = np.unique(g["t"].to_numpy())
    return out


def first_failures(events: Sequence[FaultEvent], merge_s: float = 600.0) -> list[FaultEvent]:
    """One failure per subject and incident: events within ``merge_s`` of an earlier one on
    the same subject (a DBE and its XID 48; repeated link flaps) are the same failure."""
    out: list[FaultEvent] = []
    last: dict[str, float] = {}
    for e in sorted((e for e in events if e.failure), key=lambda e: e.start_s):
        if e.start_s - last.get(e.subject, -np.inf) > merge_s:
            out.append(e)
        last[e.subject] = e.start_s
    return out


def event_report(
    frame: pl.DataFrame,
    events: Sequence[FaultEvent],
    score: str,
    threshold: float,
    horizon_s: float,
    step_s: float,
    covered: dict[str, np.ndarray] | None = None,
) -> EventReport:
    """A failure counts only if its GPU (or node) was in service -- had scored rows -- in the
    horizon before it: one that fails again while already out is not a new miss. ``covered``
    (:func:`coverage` of the full frame) is passed when ``frame`` is already cut down, as
    :func:`choose_threshold` does."""
    alerts = alert_starts(frame, score, threshold, step_s, rearm_s=horizon_s)
    by_gpu: dict[str, np.ndarray] = {}
    by_node: dict[str, np.ndarray] = {}
    for (node, gpu), g in alerts.group_by(["node", "gpu"]):
        by_gpu[f"{node}/{gpu}"] = np.sort(g["t"].to_numpy())
    for (node,), g in alerts.group_by(["node"]):
        by_node[str(node)] = np.sort(g["t"].to_numpy())
    fails = first_failures(events)
    seen = covered if covered is not None else coverage(frame)
    report = EventReport(threshold, horizon_s, alerts.height, 0, 0, 0)
    fail_times: dict[str, list[float]] = {}
    for e in fails:
        node_level = "/" not in e.subject
        fail_times.setdefault(e.subject, []).append(e.start_s)
        rows = seen.get(e.subject, np.empty(0))
        if not ((rows >= e.start_s - horizon_s) & (rows < e.start_s)).any():
            continue  # not in service before it: nothing could have been predicted
        pool = by_node.get(e.subject) if node_level else by_gpu.get(e.subject)
        if pool is None:
            pool = np.empty(0)
        inside = pool[(pool >= e.start_s - horizon_s) & (pool <= e.start_s)]
        hit = len(inside) > 0
        if e.kind in SUDDEN:
            report.sudden_failures += 1
            report.sudden_caught += int(hit)
            continue
        report.failures += 1
        if hit:
            report.caught += 1
            report.leads_s.append(float(e.start_s - inside[0]))
    for row in alerts.iter_rows(named=True):
        t = row["t"]
        times = fail_times.get(f"{row['node']}/{row['gpu']}", []) + fail_times.get(row["node"], [])
        if any(t < f <= t + horizon_s for f in times):
            report.true_alerts += 1
    return report


def choose_threshold(
    frame: pl.DataFrame,
    events: Sequence[FaultEvent],
    score: str,
    horizon_s: float,
    step_s: float,
    min_precision: float = 0.9,
) -> float:
    """The lowest threshold whose alerts on this (training) data reach ``min_precision``:
    the most recall the precision target allows. Never chosen on test data."""
    values = frame[score].to_numpy()
    candidates = np.unique(np.quantile(values, np.linspace(0.9, 0.99999, 120)))
    prepared = with_previous(frame, score, step_s)
    prepared = prepared.filter(pl.col(score) >= candidates[0])
    covered = coverage(frame)
    for thr in candidates:
        r = event_report(prepared, events, score, float(thr), horizon_s, step_s, covered)
        if r.alerts and r.precision >= min_precision:
            return float(thr)
    return float(candidates[-1])


def plots(
    y: np.ndarray,
    scores: dict[str, np.ndarray],
    leads_s: Sequence[float],
    out: Path,
    label: str,
) -> list[Path]:
    """PR curves of the model and baselines, and the lead-time histogram, as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import precision_recall_curve

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    for name, s in scores.items():
        p, r, _ = precision_recall_curve(y.astype(int), s)
        ax.plot(r, p, label=name, lw=1.2)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title(f"Precision-recall ({label})", fontsize=9)
    ax.legend(fontsize=8)
    pr = out / "pr_curve.png"
    fig.tight_layout()
    fig.savefig(pr)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.hist([x / 60 for x in leads_s], bins=20, color="tab:blue")
    ax.set_xlabel("lead time (minutes before the failure)")
    ax.set_ylabel("failures")
    ax.set_title(f"Lead time of the first alert ({label})", fontsize=9)
    lead = out / "lead_time.png"
    fig.tight_layout()
    fig.savefig(lead)
    plt.close(fig)
    return [pr, lead]
