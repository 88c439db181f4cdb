"""The backtest: a MODEL of what the engine would have done over a SIMULATED day.
``gpuwarden backtest`` (the main job is the live loop, ``gpuwarden demo``: :mod:`demo.run`).

It is not the product closing its own loop: the fatal findings and the repaired nodes come
from the scenario's ground truth, the job is a stand-in that sleeps, failure risk is scored in
one batch over the day, and work saved is an accounting model (:mod:`demo.accounting`) over
that day. What it shows is how the engine's decisions play out over a whole simulated day in
a few minutes, against a real Slurm; the live loop shows the product doing it for real.

1. starts a real ``influxd`` and a real 16-node Slurm (slurmctld + 16 slurmd) on loopback;
2. loads the failure predictor trained on eight SIMULATED days (``demo/train_model.py`` is
   the recipe; ``--retrain`` runs it);
3. replays the SIMULATED ``demo-day`` scenario (16 nodes x 8 GPUs, a 13B job on 12 nodes,
   faults drawn from the REAL StepFun process compressed 150x, a slow GPU, a congested ToR)
   through the agent's sink into InfluxDB;
4. runs the analytics (MFU, goodput, stragglers, congestion) and the predictor over it;
5. runs the remediation engine, live, against the local Slurm, where a stand-in job of the
   13B run holds 12 nodes: real checkpoint requests, drains, requeues and resumes (the day
   is replayed in minutes, so the engine's clock is the scenario's); and again in dry-run
   against the Kubernetes fake, to show what it would do there;
6. compares the work lost with and without proactive remediation on the same trace;
7. exports the dashboards and writes an HTML report with plots, then a terminal summary whose
   last line is ``work_saved_pct=<x>`` (of the model). Everything it started is stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import polars as pl

from demo.accounting import Comparison, Move, Stop, compare
from demo.report import write_report
from demo.train_model import MODEL, parse_seeds, train_model
from gpuwarden.analytics.config import AnalyticsConfig, load_config, with_overrides
from gpuwarden.analytics.emit import findings as analysis_findings
from gpuwarden.analytics.emit import points as analysis_points
from gpuwarden.analytics.predict.cli import dataset
from gpuwarden.analytics.predict.evaluate import alert_starts
from gpuwarden.analytics.predict.model import RiskModel
from gpuwarden.analytics.runner import Analysis, LocalExecutor, analyse
from gpuwarden.analytics.topology import write_topology
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.dashboards.cli import export as export_dashboards
from gpuwarden.dashboards.config import load_config as dashboards_config
from gpuwarden.remediation.adapters.kubernetes import KubernetesAdapter
from gpuwarden.remediation.adapters.slurm import SlurmAdapter
from gpuwarden.remediation.adapters.webhook import WebhookAdapter
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.cli import action_point
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import Action, Adapter, Outcome
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from gpuwarden.simulation.cli import stream_scenario
from gpuwarden.simulation.generator import ScenarioGenerator
from gpuwarden.simulation.spec import ScenarioSpec, load_spec
from testbed.influxd import LocalInfluxd
from testbed.k8s import FakeKubernetes
from testbed.slurm import LocalSlurm

DAY_NS = 86_400 * 10**9
SCENARIO = "demo-day"
STEPS = 9
ENGINE_KINDS = ("straggler", "link_congested", "config_drift", "job_config_mixed")
"""The analytics findings the demo hands to the engine (risk and fatal ones come apart)."""
_t0 = time.monotonic()


def say(step: int, msg: str) -> None:
    print(f"[{time.monotonic() - _t0:6.1f}s] [{step}/{STEPS}] {msg}", flush=True)


# -- 4. analytics and predictions -------------------------------------------------------------


def run_analytics(
    cfg: AnalyticsConfig, spec: ScenarioSpec, windows: int
) -> tuple[list[Analysis], list[Finding]]:
    out = InfluxSink(SinkConfig(url=cfg["influxdb"]["url"], database=cfg["influxdb"]["database"],
                                spool_dir=cfg["analysis"]["spool_dir"]))  # fmt: skip
    analyses, found = [], []
    step = spec.duration_s * 10**9 // windows
    for w in range(windows):
        a = analyse(cfg, spec.start_ns + w * step, spec.start_ns + (w + 1) * step, LocalExecutor())
        f = analysis_findings(a)
        out.write_points(analysis_points(a, f))
        analyses.append(a)
        found += f
    out.close(timeout_s=120)
    return analyses, found


def risk_alerts(
    cfg: AnalyticsConfig, model: RiskModel, spec: ScenarioSpec, cluster: str
) -> tuple[pl.DataFrame, list[Finding]]:
    """Score every GPU every minute of the day; an alert is a crossing of the model's
    threshold (re-armed after the horizon, as the engine's cooldown would treat it)."""
    ds = dataset(cfg, spec.start_ns, spec.start_ns + spec.duration_s * 10**9, LocalExecutor())
    frame = ds.frame.filter(~pl.col("down"))
    frame = frame.with_columns(pl.Series("risk", model.predict(frame)))
    step = float(cfg["predictor"]["step_s"])
    alerts = alert_starts(frame, "risk", model.meta.threshold, step, rearm_s=model.meta.horizon_s)
    risk_at = {(n, g, t): r for n, g, t, r in frame.select("node", "gpu", "t", "risk").iter_rows()}
    out = []
    for node, gpu, t in alerts.iter_rows():
        p = float(risk_at[(node, gpu, t)])
        out.append(Finding(
            kind="failure_risk", subject={"cluster": cluster, "node": node, "gpu": str(gpu)},
            severity=Severity.WARNING, time_ns=int(t * 1e9), probability=p,
            evidence={"threshold": model.meta.threshold, "horizon_s": model.meta.horizon_s},
            summary=f"{node} GPU {gpu}: {p:.0%} risk of a hardware failure within "
                    f"{model.meta.horizon_s / 60:.0f} min (SIMULATED)",
            source="analytics"))  # fmt: skip
    return frame.select("node", "gpu", "t", "risk"), out


def ground_truth_findings(gen: ScenarioGenerator, cluster: str) -> list[Finding]:
    """What the agents would post on their own: a fatal XID at its onset (the fast path), and
    a node back in service when its fault is repaired (``node_healthy`` with a passing node
    check). Both SIMULATED, from the scenario's ground truth: the backtest replays a day of
    telemetry with no node to run an agent or a check on (the live loop runs both)."""
    out = []
    for f in gen.faults:
        node = gen.node_names[f.node]
        t0 = gen.spec.start_ns
        if f.fatal and f.xid:
            out.append(Finding(
                kind="gpu_xid", subject={"cluster": cluster, "node": node, "gpu": str(f.gpu)},
                severity=Severity.CRITICAL, time_ns=t0 + int(f.onset_s * 1e9), confidence=1.0,
                evidence={"xid": f.xid}, summary=f"XID {f.xid} on {node} GPU {f.gpu} (SIMULATED)",
                source="agent"))  # fmt: skip
        if f.fatal and f.end_s < gen.spec.duration_s:
            # no node hardware runs in the backtest, so no real check can: the repaired node
            # is said to pass it at its repair time (the live loop runs the real one)
            done = t0 + int(f.end_s * 1e9)
            out.append(Finding(
                kind="node_healthy", subject={"cluster": cluster, "node": node},
                severity=Severity.INFO, time_ns=done,
                evidence={"check": "pass", "checked_ns": done},
                summary=f"{node} repaired, node check passed (SIMULATED)",
                source="operator"))  # fmt: skip
    return out


# -- 5. the engine ----------------------------------------------------------------------------


def submit_job(slurm: LocalSlurm, work: Path, nodes: int) -> str:
    script = work / "llm-13b.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"exec {sys.executable} -m testbed.jobs.sim_job --state-dir {work}/job "
        f"--checkpoint-dir {work}/ckpt --step-s 0.2\n"
    )
    out = slurm.run("sbatch", "--parsable", "--requeue", "--exclusive", "-J", "llm-13b",
                    f"-N{nodes}", "-o", f"{work}/job-%j.out", str(script))  # fmt: skip
    return out.strip()


def run_engine(
    findings: list[Finding], adapters: dict[str, Adapter], settings: EngineSettings,
    audit: Path, sink: InfluxSink | None, settle: Callable[[], None] | None = None,
) -> Engine:  # fmt: skip
    """Feed the findings in time order, the engine's clock set to each finding's time;
    ``settle`` runs after each (the live run waits there for the requeued job to run again,
    as it would have long before the next finding on a real day)."""
    now = [0.0]

    def on_action(action: Action, outcome: Outcome, record: dict[str, Any]) -> None:
        if sink is not None:
            sink.write_points([action_point(action, outcome, record)])

    policies = load_policies(DEFAULT_POLICIES)
    engine = Engine(
        policies, adapters, AuditLog(audit), settings, clock=lambda: now[0], on_action=on_action
    )
    for f in sorted(findings, key=lambda f: f.time_ns):
        now[0] = f.time_ns / 1e9
        engine.tick()
        engine.submit(f)
        engine.wait(300)
        if settle is not None:
            settle()
    engine.close()
    return engine


# -- 6. accounting ----------------------------------------------------------------------------


def job_stops(gen: ScenarioGenerator) -> list[Stop]:
    plan = gen.jobs[0]
    runs = [r for r in plan.runs if not r.hung]
    stops = []
    for run, nxt in itertools.pairwise(runs):
        hits = [
            f
            for f in gen.faults
            if f.fatal and f.node in run.nodes and abs(f.onset_s - run.end_s) < 1e-6
        ]
        node = gen.node_names[hits[0].node] if hits else ""
        cause = hits[0].type if hits else ""
        stops.append(Stop(run.end_s, node, nxt.start_s, run.start_s, cause))
    return stops


def engine_moves(audit: Path, start_s: float, job_nodes: set[str]) -> list[Move]:
    """Proactive moves: drains (ok, live) of job nodes that a failure-risk finding led to. A
    drain after a fatal XID is the reactive response: the job had already stopped."""
    records = list(read_records(audit))
    kind = {r["finding_id"]: r["kind"] for r in records if r.get("event") == "finding"}
    return [
        Move(float(r["t"]) - start_s, str(r["node"]), str(r.get("reason", "")))
        for r in records
        if r.get("event") == "action"
        and r.get("action") == "drain"
        and r.get("outcome") == "ok"
        and r.get("node") in job_nodes
        and kind.get(r.get("finding_id")) == "failure_risk"
    ]


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpuwarden backtest", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--seed", type=int, default=11, help="scenario seed (default 11: see docs/BACKTEST.md)"
    )
    ap.add_argument(
        "--retrain", default="", help="train the predictor on these predictor-day seeds (1-8)"
    )
    ap.add_argument("--windows", type=int, default=8, help="analytics windows over the day")
    ap.add_argument("--out", default="demo-report", help="report folder")
    ap.add_argument("--workdir", default=None, help="keep data here (default: a temp dir)")
    args = ap.parse_args(argv)
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = load_spec(SCENARIO)
    gen = ScenarioGenerator(spec, args.seed)
    names = gen.node_names
    with ExitStack() as stack:
        work = Path(args.workdir or stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        say(1, f"starting influxd and a {len(names)}-node Slurm (slurmctld + slurmd) on loopback")
        influx = stack.enter_context(LocalInfluxd(work / "influxd"))
        weights = {n: i + 1 for i, n in enumerate(names)}  # the job lands on the first nodes
        slurm = stack.enter_context(LocalSlurm(work / "slurm", names, weights=weights))
        influx.create_database("gpuwarden")
        topology = work / "topology.csv"  # which ToR switch each node hangs off
        write_topology(dict(zip(names, gen.switch_of, strict=True)), topology)
        cfg = with_overrides(load_config(environ={}),
                             influxdb={"url": influx.url, "database": "gpuwarden"},
                             analysis={"spool_dir": str(work / "aspool"),
                                       "topology": str(topology)})  # fmt: skip

        if args.retrain:
            seeds = parse_seeds(args.retrain)
            say(2, f"training the failure predictor on SIMULATED predictor-day seeds {seeds}")
            model = train_model(cfg, influx, work, seeds)
        else:
            model = RiskModel.load(MODEL)
            say(2, f"failure predictor: {MODEL.name} ({model.meta.version}; --retrain to redo)")

        say(3, f"replaying SIMULATED {SCENARIO} (seed {args.seed}) through the sink into InfluxDB")
        stats = stream_scenario(SCENARIO, args.seed, influx.url, "gpuwarden", work / "spool")
        cluster = "sim"
        say(4, "analytics (MFU, goodput, stragglers, congestion) and risk scoring over the day")
        analyses, found = run_analytics(cfg, spec, args.windows)
        risk_frame, risk = risk_alerts(cfg, model, spec, cluster)
        truth = ground_truth_findings(gen, cluster)

        say(5, "remediation engine, LIVE against the local Slurm (real drains and requeues)")
        job = submit_job(slurm, work, spec.jobs[0].nodes)

        def settle() -> None:
            """Until the stand-in job runs (a requeued job waits cred_expire, 10 s here)."""
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if slurm.run("squeue", "-h", "-j", job, "-o", "%T").strip() == "RUNNING":
                    return
                time.sleep(0.5)
            raise RuntimeError(f"the stand-in job {job} did not run again: {slurm.logs()}")

        settle()
        slurm_adapter = SlurmAdapter(
            conf=str(slurm.conf), checkpoint_dir=str(work / "ckpt"), checkpoint_timeout_s=30
        )
        sink = InfluxSink(
            SinkConfig(url=influx.url, database="gpuwarden", spool_dir=str(work / "rspool"))
        )
        live = EngineSettings(
            dry_run=False, max_nodes_out=3, max_fraction_out=0.2, cooldown_s=1800, approval=()
        )
        engine_in = [
            *risk,
            *truth,
            *(f for f in found if f.kind in ENGINE_KINDS),
        ]
        run_engine(
            engine_in,
            {"slurm": slurm_adapter, "webhook": WebhookAdapter()},
            live,
            work / "audit.jsonl",
            sink,
            settle,
        )
        sink.close(timeout_s=60)
        slurm_state = slurm.run("sinfo", "-N", "-h", "-o", "%N %T %E")
        job_state = slurm.run("squeue", "-h", "-j", job, "-o", "%T %N %r")
        requeues = slurm.run("scontrol", "-o", "show", "job", job)

        say(6, "the same findings, DRY-RUN, against Kubernetes (the project's fake API server)")
        with FakeKubernetes(token="demo") as fake:
            for n in names:
                fake.add_node(n, {"gpuwarden.io/pool": "h100"})
            (work / "k8s-token").write_text("demo")
            k8s = KubernetesAdapter(api_url=fake.url, token_file=str(work / "k8s-token"))
            dry = dataclasses.replace(
                live, dry_run=True, node_adapter="kubernetes", checkpoint_adapter="kubernetes"
            )
            run_engine(
                engine_in,
                {"kubernetes": k8s, "webhook": WebhookAdapter()},
                dry,
                work / "audit-k8s.jsonl",
                None,
            )
            k8s_changed = [n for n, v in fake.nodes.items() if v["spec"].get("unschedulable")]

        say(7, "work lost with and without proactive remediation (same SIMULATED trace)")
        job_nodes = {names[n] for r in gen.jobs[0].runs for n in r.nodes}
        js = spec.jobs[0]
        comparison = compare(
            job_stops(gen),
            engine_moves(work / "audit.jsonl", spec.start_ns / 1e9, job_nodes),
            wall_s=float(spec.duration_s), gpus=js.nodes * spec.gpus_per_node,
            checkpoint_interval_s=js.checkpoint_interval_s, restart_s=js.restart_s,
            horizon_s=model.meta.horizon_s,
        )  # fmt: skip

        say(8, f"exporting the dashboards and Grafana provisioning to {out / 'grafana'}")
        export_dashboards(dashboards_config(environ={}), out / "grafana")

        say(9, f"writing the report to {out / 'index.html'}")
        audit = list(read_records(work / "audit.jsonl"))
        write_report(out, spec=spec, gen=gen, analyses=analyses, risk=risk_frame, model=model,
                     audit=audit, comparison=comparison, seed=args.seed)  # fmt: skip
        summary(stats.total, gen, risk, audit, comparison,
                slurm_state, job_state, requeues, k8s_changed, out,
                sorted({d.node for a in analyses for d in a.drift}))  # fmt: skip
    return 0


def summary(
    points: int,
    gen: ScenarioGenerator,
    risk: list[Finding],
    audit: list[dict[str, Any]],
    c: Comparison,
    slurm_state: str,
    job_state: str,
    job_show: str,
    k8s_changed: list[str],
    out: Path,
    drifted: list[str],
) -> None:
    acts = [r for r in audit if r.get("event") == "action"]

    def count(action: str) -> int:
        return sum(1 for r in acts if r["action"] == action and r["outcome"] == "ok")

    restarts = next((w.split("=")[1] for w in job_show.split() if w.startswith("Restarts=")), "?")
    fatal = [f for f in gen.faults if f.fatal]
    warned = sum(1 for f in fatal if f.onset_s > f.precursor_start_s)
    r, p = c.reactive, c.proactive
    lines = [
        "",
        "gpuwarden backtest: a MODEL of what the engine would have done over a SIMULATED day.",
        "SIMULATED: the cluster, its faults (StepFun process), the fatal and repaired-node",
        "findings (from the scenario's ground truth), the job (a stand-in that sleeps) and the",
        "work-lost accounting. REAL: InfluxDB, Slurm, the analytics and scorer (in batch), and the",
        "engine's decisions and Slurm actions.",
        f"  telemetry points replayed      {points:,}",
        f"  fatal faults injected          {len(fatal)} ({warned} with a precursor)",
        f"  failure-risk alerts            {len(risk)}",
        f"  nodes set up unlike the fleet  {', '.join(drifted) or 'none'}",
        "  engine actions (live, Slurm)   "
        + ", ".join(f"{a} {count(a)}" for a in ("checkpoint", "drain", "requeue", "uncordon")),
        f"  Slurm job llm-13b              {job_state.strip() or 'finished'}; "
        f"requeued {restarts} times",
        "  Slurm nodes at the end         "
        + ", ".join(
            f"{state} {sum(1 for ln in slurm_state.splitlines() if ln.split()[1] == state)}"
            for state in sorted({ln.split()[1] for ln in slurm_state.splitlines()})
        ),
        f"  Kubernetes (dry-run)           {len(k8s_changed)} nodes changed (must be 0)",
        f"  work lost, reactive            {c.gpu_hours(r):8.1f} GPU-h   ETTR {c.ettr(r):.3f}",
        f"  work lost, proactive           {c.gpu_hours(p):8.1f} GPU-h   ETTR {c.ettr(p):.3f}",
        f"  report                         {out / 'index.html'}",
        f"work_saved_pct={c.work_saved_pct:.1f}",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
