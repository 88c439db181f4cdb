"""``gpuwarden analyze``: analyse telemetry in InfluxDB, or a real straggler trace from a file.

gpuwarden analyze run --config analytics.toml --start 2026-01-05T00:00:00Z --end ...
gpuwarden analyze run --config analytics.toml --every 60s      # periodic, until stopped
gpuwarden analyze stragglers --whatif-trace trace.parquet [--json]
gpuwarden analyze stragglers --minibatch-csv job_1_norm.csv [--json]
gpuwarden analyze train --start ... --end ... --out risk.pkl     # the failure predictor
gpuwarden analyze evaluate --model risk.pkl --start ... --end ... --report DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.analytics.config import AnalyticsConfig, load_config
from gpuwarden.analytics.importers import (
    TraceFormatError,
    cite,
    optype_slowdowns,
    read_minibatch_csv,
    read_whatif_trace,
)
from gpuwarden.analytics.runner import Analysis, analyse, executor_from_config, stderr_progress
from gpuwarden.analytics.silence import Confirmed
from gpuwarden.analytics.stragglers import Straggler, detect
from gpuwarden.analytics.whatif import job_slowdown
from gpuwarden.core.cli import UsageError, add_common, config_path, configure_logging
from gpuwarden.core.config import ConfigError, check_secrets
from gpuwarden.core.errors import GpuwardenError
from gpuwarden.core.metrics import Metric
from gpuwarden.core.signals import stop_event
from gpuwarden.core.timeparse import duration_arg, parse_when

log = logging.getLogger("gpuwarden.analyze")
NS = 1_000_000_000


def _stragglers(args: argparse.Namespace) -> int:
    path = args.whatif_trace or args.minibatch_csv
    context: dict[str, Any] = {}
    try:
        if args.whatif_trace:
            timings, ctx = read_whatif_trace(path)
            context = {k: v for k, v in ctx.items() if k not in ("per_op", "ops")}
            fmt = "whatif"
        else:
            timings, fmt = read_minibatch_csv(path), "minibatch"
        source = cite(path)
    except (TraceFormatError, OSError) as exc:
        print(f"gpuwarden analyze: {exc}", file=sys.stderr)
        return 2
    found: list[Straggler] = detect(timings)
    items = []
    for s in found:
        item = s.to_json()
        if fmt == "whatif" and s.kind == "stage" and s.stage is not None:
            item["compute_op_slowdown"] = optype_slowdowns(ctx["per_op"], s.stage)
        items.append(item)
    whatif = None
    if fmt == "whatif":
        try:
            whatif = job_slowdown(ctx["ops"])
        except ValueError as exc:
            print(f"gpuwarden analyze: {path}: {exc}", file=sys.stderr)
            return 2
    if args.json:
        doc: dict[str, Any] = {"input": str(path), "format": fmt, "source": source}
        if whatif is not None:
            doc["job_slowdown"] = round(whatif.job_slowdown, 4)
            doc["whatif"] = {
                "steps": whatif.steps,
                "actual_step_s": round(whatif.actual_s, 4),
                "ideal_step_s": round(whatif.ideal_s, 4),
                "method": "1F1B replay per step; every forward and backward at its step's mean",
            }
        doc.update(context=context, findings=items)
        print(json.dumps(doc, indent=2))
    else:
        print(f"input: {path} ({fmt}); source: {source}")
        if whatif is not None:
            print(
                f"job slowdown {whatif.job_slowdown:.3f} (simulated step {whatif.actual_s:.3f} s "
                f"as traced, {whatif.ideal_s:.3f} s with every compute at its step's mean)"
            )
        if not found:
            print("no persistent straggler")
        for s, item in zip(found, items, strict=True):
            line = f"  {s.kind:<7} {s.describe()}"
            if "compute_op_slowdown" in item:
                ops = ", ".join(f"{k} {v}x" for k, v in item["compute_op_slowdown"].items())
                line += f"; compute ops: {ops}"
            print(line)
    return 0


def _summary(a: Analysis) -> list[str]:
    lines = [
        f"window {a.start_ns} .. {a.end_ns} ({(a.end_ns - a.start_ns) / NS:.0f} s), "
        f"executor {a.executor}, {a.timings_s.get('total', 0):.1f} s"
    ]
    for j in a.jobs:
        if j.mfu is not None:
            line = f"  job {j.job}: MFU {j.mfu.mfu:.1%}"
            if j.mfu.hfu is not None:
                line += f", HFU {j.mfu.hfu:.1%}"
            line += f" ({j.mfu.tokens_per_s:,.0f} tokens/s), goodput {j.mfu.goodput:.1%}"
            if j.shape is not None:
                line += f"; {j.shape.gpu_model} ({j.gpu_model_from or 'job'})"
            if j.estimate is not None:
                line += f"; GPM tensor activity {j.estimate:.1%}"
            lines.append(line)
            if j.mfu.flops is not None and j.mfu.flops.assumed:
                lines.append(f"  job {j.job}: FLOPs per token assume: {j.mfu.flops.assumed}")
            if j.mismatch_limit is not None:
                lines.append(
                    f"  job {j.job}: MFU MISMATCH with the GPUs' tensor activity (beyond "
                    f"{j.mismatch_limit:.2f}x): is its reported shape right?"
                )
        elif j.estimate is not None:
            lines.append(f"  job {j.job}: MFU ESTIMATE from GPM tensor activity {j.estimate:.1%}")
        for p in j.problems:
            lines.append(f"  job {j.job}: {p}")
        if j.hang is not None:
            lines.append(f"  job {j.job}: HUNG, {j.hang.describe()}")
        for s in j.stragglers:
            cause = a.attributions.get((j.job, s.worker or ""), ("",))[0]
            lines.append(f"    {s.describe()}" + (f"; cause {cause}" if cause else ""))
    if a.unplaced:
        shown = ", ".join(a.unplaced[:5]) + (", ..." if len(a.unplaced) > 5 else "")
        lines.append(f"  topology lacks {len(a.unplaced)} node(s), each its own switch: {shown}")
    for sw in a.switches[:5]:
        if sw.hot:
            lines.append(f"  HOT switch {sw.switch}: score {sw.score:.3f}, {sw.hot_s:.0f} s hot")
    if a.info_gpus:
        lines.append(f"  GPU configuration: {a.info_gpus} GPUs, {len(a.drift)} node(s) drifted")
    for d in a.drift[:10]:
        lines.append(f"    DRIFT {d.node}: {d.describe()}")
    for m in a.job_mix[:10]:
        lines.append(f"    MIXED job {m.job}: {m.describe()}")
    return lines


def _write(
    cfg: AnalyticsConfig, a: Analysis, extra: tuple[list[Any], list[Any]] = ([], [])
) -> tuple[int, int]:
    """Write the analysis' points and findings (and ``extra``: the risk scorer's) back."""
    from gpuwarden.analytics.emit import findings, points
    from gpuwarden.core.poster import FindingPoster
    from gpuwarden.core.store.sink import InfluxSink, SinkConfig

    found = findings(a) + list(extra[1])
    pts = points(a, found) + list(extra[0])
    if cfg["analysis"]["write_back"]:
        db = cfg.reader_kwargs()
        sink = InfluxSink(
            SinkConfig(
                url=db["url"],
                database=db["database"],
                retention_policy=db["retention_policy"] or "",
                username=db["username"] or "",
                password=db["password"] or "",
                token=db["token"] or "",
                spool_dir=cfg["analysis"]["spool_dir"],
            )
        )
        sink.write_points(pts)
        if not sink.close(timeout_s=60):
            log.warning(
                "results not all written yet; they wait in %s", cfg["analysis"]["spool_dir"]
            )
    url = cfg["findings"]["url"]
    if url and found:
        f = cfg["findings"]
        poster = FindingPoster(
            url,
            f["token_file"],
            secret_file=f["hmac_secret_file"],
            identity=f["identity"],
            ca_file=f["ca_file"],
            cert_file=f["cert_file"],
            key_file=f["key_file"],
        )
        for f in found:
            poster.post(f)
        poster.close(timeout_s=30)
    return len(found), len(pts)


def _config(args: argparse.Namespace) -> AnalyticsConfig | None:
    """The configuration, its secret files checked now (:func:`core.config.check_secrets`).
    The InfluxDB ones are skipped only where this host never reads them: remote Dask workers
    that read them on their own machines (``credentials = "workers"``) and no write-back."""
    try:
        cfg = load_config(args.config)
        remote = bool(cfg["dask"]["scheduler"]) and not getattr(args, "local", False)
        skip: tuple[str, ...] = ()
        if remote and cfg["dask"]["credentials"] == "workers" and not cfg["analysis"]["write_back"]:
            skip = ("influxdb.password_file", "influxdb.token_file")
        check_secrets(cfg.sections, skip)
        return cfg
    except ConfigError as exc:
        print(f"gpuwarden analyze: {exc}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if cfg is None:
        return 2
    if args.no_write:
        cfg = AnalyticsConfig(
            {**cfg.sections, "analysis": {**cfg["analysis"], "write_back": False}}
        )
    window = float(cfg["analysis"]["window_s"])
    model = None
    if cfg["predictor"]["model"]:
        from gpuwarden.analytics.predict.model import ModelError, RiskModel

        try:
            model = RiskModel.load(cfg["predictor"]["model"])
        except ModelError as exc:
            print(f"gpuwarden analyze: {exc}", file=sys.stderr)
            return 2
    executor = executor_from_config(cfg, local=args.local)
    print(f"executor: {executor.describe()}", flush=True)
    stop = stop_event(signal.SIGTERM) if args.every else threading.Event()
    failing = ""
    confirmed = Confirmed()  # a silence is named once two analyses running see it
    counts = ServiceCounts()
    metrics = None
    if args.every and cfg["analysis"]["metrics_listen"]:
        from gpuwarden.core.metrics import serve_metrics

        metrics = serve_metrics(cfg["analysis"]["metrics_listen"], counts.metrics)
    try:
        while True:
            tick = time.time()
            end = parse_when(args.end) if args.end else time.time_ns()
            start = parse_when(args.start) if args.start else end - int(window * NS)
            try:
                a = analyse(cfg, start, end, executor, progress=stderr_progress)
                if args.every:
                    a.silent = confirmed(a.silent)
                extra = _risk(cfg, model, start, end, executor) if model else ([], [])
                n_found, n_points = _write(cfg, a, extra)
            except Exception as exc:  # a service outlives its database (and one bad analysis)
                why = f"{type(exc).__name__}: {exc}"
                if not args.every:
                    if isinstance(exc, GpuwardenError):
                        print(f"gpuwarden analyze: {exc}", file=sys.stderr)
                        return 1
                    raise
                if why != failing:  # said once per kind of failure, not every period
                    log.error("analysis of the window ending %s failed (%s); trying again "
                              "every %.0f s", time.strftime("%H:%M:%S", time.localtime(end / NS)),
                              why, args.every)  # fmt: skip
                failing = why
                counts.ran(time.time() - tick, ok=False)
                print(f"analysis failed: {why}", flush=True)
            else:
                counts.ran(time.time() - tick, ok=True, findings=n_found, points=n_points)
                if failing:
                    log.warning("analysis works again")
                    failing = ""
                for line in _summary(a):
                    print(line, flush=True)
                print(f"findings={n_found} points={n_points}", flush=True)
            if not args.every:
                return 0
            if stop.wait(max(0.0, args.every - (time.time() - tick))):
                return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if metrics is not None:
            metrics.shutdown()
        executor.close()


@dataclass
class ServiceCounts:
    """What the analyze service's ``/metrics`` shows (``--every``)."""

    runs: int = 0
    failures: int = 0
    findings: int = 0
    points: int = 0
    last_duration_s: float = 0.0
    last_success_s: float = 0.0

    def ran(self, duration_s: float, *, ok: bool, findings: int = 0, points: int = 0) -> None:
        self.runs += 1
        self.last_duration_s = duration_s
        if ok:
            self.findings += findings
            self.points += points
            self.last_success_s = time.time()
        else:
            self.failures += 1

    def metrics(self) -> list[Metric]:
        return [
            Metric.one("gpuwarden_analyze_runs_total", "analyses run", self.runs, "counter"),
            Metric.one("gpuwarden_analyze_run_failures_total", "analyses that failed",
                       self.failures, "counter"),
            Metric.one("gpuwarden_analyze_findings_total", "findings emitted", self.findings,
                       "counter"),
            Metric.one("gpuwarden_analyze_points_written_total",
                       "derived points written back", self.points, "counter"),
            Metric.one("gpuwarden_analyze_last_run_duration_seconds",
                       "how long the last analysis took", self.last_duration_s),
            Metric.one("gpuwarden_analyze_last_success_timestamp_seconds",
                       "when the last analysis succeeded (Unix time; 0: none yet)",
                       self.last_success_s),
        ]  # fmt: skip


def _risk(
    cfg: AnalyticsConfig, model: Any, start: int, end: int, executor: Any
) -> tuple[list[Any], list[Any]]:
    """Failure risk of every GPU that reported in the window, at its end."""
    from gpuwarden.analytics.predict.scoring import score
    from gpuwarden.core.store.reader import InfluxReader

    reader = InfluxReader(**cfg.reader_kwargs())
    try:
        nodes = reader.tag_values("gpu", "node", "power_w", start, end)
    finally:
        reader.close()
    from gpuwarden.analytics.predict.model import ModelError

    if not nodes:
        log.warning("failure risk not scored: no GPU reported power_w in the window")
        return [], []
    try:
        scored = score(cfg, model, end, executor, cluster=cfg["analysis"]["cluster"], nodes=nodes)
    except ModelError as exc:  # a model that does not fit the data must not stop the analysis
        log.error("failure risk not scored: %s", exc)
        return [], []
    print(
        f"failure risk: {scored.frame.height} GPUs scored, {len(scored.findings)} above the "
        "threshold",
        flush=True,
    )
    return scored.points, scored.findings


def _predict(args: argparse.Namespace) -> int:
    from gpuwarden.analytics.predict.cli import run as predict_run
    from gpuwarden.analytics.predict.model import ModelError

    cfg = _config(args)
    if cfg is None:
        return 2
    executor = executor_from_config(cfg, local=args.local)
    try:
        return predict_run(args, cfg, executor)
    except (ModelError, ValueError) as exc:
        print(f"gpuwarden analyze: {exc}", file=sys.stderr)
        return 2
    finally:
        executor.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpuwarden analyze",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(ap, config_help="analytics TOML (default: built-in defaults)")
    sub = ap.add_subparsers(dest="command", required=True)
    st = sub.add_parser("stragglers", help="find stragglers in a real trace file")
    src = st.add_mutually_exclusive_group(required=True)
    src.add_argument("--whatif-trace", type=Path, help="StragglerAnalysis parquet (ByteDance)")
    src.add_argument("--minibatch-csv", type=Path, help="Alibaba mini-batch-time CSV")
    st.add_argument("--json", action="store_true")
    run = sub.add_parser("run", help="analyse a window of telemetry in InfluxDB")
    add_common(run, sub=True, config_help="analytics TOML (default: built-in defaults)")
    run.add_argument("--start", help="ISO time (default: end - analysis.window_s)")
    run.add_argument("--end", help="ISO time or 'now' (default: now)")
    run.add_argument("--every", type=duration_arg, help="run periodically, e.g. 60s")
    run.add_argument("--local", action="store_true", help="single process, no Dask")
    run.add_argument("--no-write", action="store_true", help="print only; write nothing back")
    from gpuwarden.analytics.predict.cli import add_commands

    add_commands(sub)
    args = ap.parse_args(argv)
    configure_logging(args)
    try:
        args.config = config_path(args)
    except UsageError as exc:
        print(f"gpuwarden analyze: {exc}", file=sys.stderr)
        return 2
    if args.command == "stragglers":
        return _stragglers(args)
    if args.command in ("train", "evaluate"):
        return _predict(args)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
