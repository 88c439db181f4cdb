"""``gpuwarden analyze train`` and ``evaluate``: the failure predictor from InfluxDB history.

    gpuwarden analyze train --start 2026-10-01T00:00:00Z --end 2026-11-01T00:00:00Z \\
        --out /var/lib/gpuwarden/risk.pkl
    gpuwarden analyze evaluate --model /var/lib/gpuwarden/risk.pkl \\
        --start 2026-11-01T00:00:00Z --end 2026-11-08T00:00:00Z --report /tmp/risk-report
"""

from __future__ import annotations

import argparse
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from gpuwarden.analytics.config import AnalyticsConfig
from gpuwarden.analytics.predict.dataset import Dataset, build
from gpuwarden.analytics.predict.evaluate import EventReport, choose_threshold, event_report, plots
from gpuwarden.analytics.predict.history import FaultEvent
from gpuwarden.analytics.predict.metrics import pr_auc, random_pr_auc
from gpuwarden.analytics.predict.model import RiskModel, fit, out_of_fold
from gpuwarden.analytics.predict.telemetry import FEATURES, MONOTONE
from gpuwarden.analytics.runner import DaskExecutor, LocalExecutor, stderr_progress
from gpuwarden.core.cli import add_common
from gpuwarden.core.timeparse import parse_when


def label_events(cfg: AnalyticsConfig, events: Sequence[FaultEvent]) -> list[FaultEvent]:
    """The configured label rules applied to what the data holds."""
    p = cfg["predictor"]
    off = {
        k
        for k, on in (
            ("dbe", p["label_dbe"]),
            ("link_down", p["label_link_down"]),
            ("node_down", p["label_node_down"]),
            ("nvswitch_sxid", p["label_nvswitch_sxid"]),
            ("gpu_lost", p["label_gpu_lost"]),
            ("row_remap_failure", p["label_row_remap_failure"]),
        )
        if not on
    }
    return [e for e in events if not (e.failure and e.kind in off)]


def dataset(
    cfg: AnalyticsConfig, start_ns: int, end_ns: int, executor: LocalExecutor | DaskExecutor
) -> Dataset:
    p = cfg["predictor"]
    ds = build(
        cfg,
        start_ns,
        end_ns,
        executor,
        horizons_s=[float(h) for h in {*p["horizons_s"], p["horizon_s"]}],
        fatal_xids=set(p["fatal_xids"]),
        step_s=int(p["step_s"]),
        down_s=float(p["down_s"]),
        nodes_per_task=int(p["nodes_per_task"]),
        progress=stderr_progress,
    )
    return Dataset(ds.frame, label_events(cfg, ds.events), ds.start_ns, ds.end_ns)


#: candidate parameters for the telemetry model, judged by alerts (not by row PR-AUC)
TELEMETRY_GRID: tuple[dict[str, object], ...] = (
    {"max_leaf_nodes": 15, "max_iter": 200, "class_weight": "balanced"},
    {"max_leaf_nodes": 15, "max_iter": 200, "class_weight": None},
    {"max_leaf_nodes": 31, "max_iter": 300, "class_weight": "balanced"},
)


def train(
    cfg: AnalyticsConfig, datasets: Sequence[Dataset], version: str = ""
) -> tuple[RiskModel, EventReport | None]:
    """For each candidate in :data:`TELEMETRY_GRID`: out-of-fold scores of the whole training
    period (each time block scored by a model that did not see it), the lowest threshold whose
    alerts reach ``min_precision`` there, and the recall it buys. The best candidate (recall,
    then precision, then lead time) is fitted on everything with its threshold. Alerts, not
    row rankings, are what an operator lives with, so they decide."""
    p = cfg["predictor"]
    horizon = float(p["horizon_s"])
    label = f"y_{int(horizon)}s"
    step = float(p["step_s"])
    frame = pl.concat([d.frame for d in datasets]).filter(~pl.col("down"))
    events = [e for d in datasets for e in d.events]
    best: tuple[tuple[float, float, float], dict[str, object], float, EventReport, float] | None
    best = None
    for params in TELEMETRY_GRID:
        oof = out_of_fold(
            frame, FEATURES, label, horizon_s=horizon, params=params, monotone=MONOTONE
        )
        thr = choose_threshold(oof, events, "risk", horizon, step, p["min_precision"])
        r = event_report(oof, events, "risk", thr, horizon, step)
        precision = 0.0 if np.isnan(r.precision) else r.precision
        recall = 0.0 if np.isnan(r.recall) else r.recall
        lead = 0.0 if np.isnan(r.median_lead_s) else r.median_lead_s
        key = (recall if precision >= p["min_precision"] else 0.0, precision, lead)
        auc = pr_auc(oof[label].to_numpy().astype(int), oof["risk"].to_numpy())
        if best is None or key > best[0]:
            best = (key, params, thr, r, auc)
    assert best is not None
    _, params, threshold, report, auc = best
    model = fit(
        frame,
        FEATURES,
        label,
        horizon_s=horizon,
        params=params,
        monotone=MONOTONE,
        version=version,
        threshold=threshold,
    )
    model.meta.notes = f"parameters {params}; threshold from out-of-fold alerts"
    model.meta.metrics.update(
        oof_pr_auc=auc,
        oof_precision=report.precision,
        oof_recall=report.recall,
        oof_median_lead_s=report.median_lead_s,
    )
    return model, report


@dataclass
class Evaluation:
    rows: int
    positives: int
    pr_auc: dict[str, float]
    events: dict[str, EventReport]


def baselines(frame: pl.DataFrame) -> dict[str, np.ndarray]:
    """What peers do: fixed thresholds on the same signals (any ECC/remap/NVLink/IB error
    growth in 30 minutes, or a GPU at 85 C); and "the node has failed before"."""
    fixed = (
        (pl.col("sbe_30m") > 0)
        | (pl.col("remap_30m") > 0)
        | (pl.col("nvlink_crc_30m") > 0)
        | (pl.col("ib_symbol_30m") > 0)
        | (pl.col("temp") >= 85)
    )
    return {
        "fixed thresholds": frame.select(fixed.cast(pl.Float64)).to_series().to_numpy(),
        "has failed before": (frame["node_failures"] > 0).cast(pl.Float64).to_numpy(),
    }


def evaluate(cfg: AnalyticsConfig, model: RiskModel, datasets: Sequence[Dataset]) -> Evaluation:
    p = cfg["predictor"]
    label = model.meta.label
    frame = pl.concat([d.frame for d in datasets]).filter(~pl.col("down"))
    events = [e for d in datasets for e in d.events]
    frame = frame.with_columns(pl.Series("risk", model.predict(frame)))
    y = frame[label].to_numpy().astype(int)
    scores = {"model": frame["risk"].to_numpy(), **baselines(frame)}
    aucs = {k: pr_auc(y, v) for k, v in scores.items()}
    aucs["random"] = random_pr_auc(y)
    step = float(p["step_s"])
    thr = p["risk_threshold"] or model.meta.threshold
    reports = {"model": event_report(frame, events, "risk", thr, model.meta.horizon_s, step)}
    for name, s in baselines(frame).items():
        f = frame.with_columns(pl.Series("b", s))
        reports[name] = event_report(f, events, "b", 0.5, model.meta.horizon_s, step)
    return Evaluation(frame.height, int(y.sum()), aucs, reports)


def summary_lines(ev: Evaluation, label: str) -> list[str]:
    out = [f"data: {label}", f"rows: {ev.rows} GPU-buckets, {ev.positives} positive"]
    out.append("PR-AUC: " + ", ".join(f"{k} {v:.3f}" for k, v in ev.pr_auc.items()))
    for name, r in ev.events.items():
        out.append(
            f"{name}: {r.alerts} alerts, precision {r.precision:.3f}, recall {r.recall:.3f} "
            f"({r.caught}/{r.failures} failures with precursors), median lead "
            f"{r.median_lead_s / 60:.1f} min; sudden failures (XID 79, node lost) caught "
            f"{r.sudden_caught}/{r.sudden_failures}"
        )
    return out


def write_report(
    ev: Evaluation, frame_y: np.ndarray, scores: dict[str, np.ndarray], out: Path, label: str
) -> Path:
    pngs = plots(frame_y, scores, ev.events["model"].leads_s, out, label)
    lines = summary_lines(ev, label)
    body = "".join(f"<p>{html.escape(x)}</p>" for x in lines)
    imgs = "".join(f"<img src='{p.name}' style='max-width:48%'>" for p in pngs)
    page = out / "report.html"
    page.write_text(
        f"<!doctype html><meta charset=utf-8><title>gpuwarden failure predictor"
        f"</title><h1>Failure predictor evaluation</h1>{body}{imgs}\n",
        encoding="utf-8",
    )
    (out / "report.json").write_text(
        json.dumps(
            {
                "label": label,
                "rows": ev.rows,
                "positives": ev.positives,
                "pr_auc": ev.pr_auc,
                "events": {
                    k: {
                        "precision": r.precision,
                        "recall": r.recall,
                        "alerts": r.alerts,
                        "failures": r.failures,
                        "median_lead_s": r.median_lead_s,
                        "sudden_failures": r.sudden_failures,
                        "sudden_caught": r.sudden_caught,
                    }
                    for k, r in ev.events.items()
                },
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return page


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tr = sub.add_parser("train", help="train the failure predictor on InfluxDB history")
    ev = sub.add_parser("evaluate", help="evaluate a trained predictor on a later period")
    for p in (tr, ev):
        add_common(p, sub=True, config_help="analytics TOML")
        p.add_argument("--start", required=True, help="ISO time")
        p.add_argument("--end", required=True, help="ISO time or 'now'")
        p.add_argument("--local", action="store_true", help="single process, no Dask")
    tr.add_argument("--out", type=Path, required=True, help="where to save the model")
    tr.add_argument("--version", default="", help="a name for this model")
    ev.add_argument("--model", type=Path, required=True)
    ev.add_argument("--report", type=Path, help="directory for report.html, plots, JSON")
    ev.add_argument(
        "--label",
        default="data: as found in InfluxDB",
        help="say whether the data is real or simulated",
    )


def run(
    args: argparse.Namespace, cfg: AnalyticsConfig, executor: LocalExecutor | DaskExecutor
) -> int:
    start, end = parse_when(args.start), parse_when(args.end)
    ds = dataset(cfg, start, end, executor)
    if ds.frame.is_empty():
        print("gpuwarden analyze: no GPU telemetry in that window")
        return 1
    if args.command == "train":
        model, report = train(cfg, [ds], version=args.version or args.out.stem)
        model.save(args.out)
        print(
            f"saved {args.out} ({model.meta.rows} rows, {model.meta.positives} positive, "
            f"threshold {model.meta.threshold:.3f}; {model.meta.notes})"
        )
        if report is not None:
            print(
                f"validation: precision {report.precision:.3f}, recall {report.recall:.3f}, "
                f"median lead {report.median_lead_s / 60:.1f} min"
            )
        return 0
    model = RiskModel.load(args.model)
    ev = evaluate(cfg, model, [ds])
    for line in summary_lines(ev, args.label):
        print(line)
    if args.report:
        frame = ds.frame.filter(~pl.col("down"))
        scores = {"model": model.predict(frame), **baselines(frame)}
        y = frame[model.meta.label].to_numpy().astype(int)
        print(f"report: {write_report(ev, y, scores, args.report, args.label)}")
    return 0
