"""Checkpoint cadence on a REAL PyTorch job (torchrun, gloo, CPU: ``testbed/jobs/train_job.py``):
the job reports what its saves cost, analytics advises an interval from that (REAL influxd), and
an interval request through the checkpoint protocol changes the job's cadence while it keeps
running. The hook's handling of bad requests is checked without torch."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from gpuwarden.analytics.cadence import (
    fleet_failure_rate,
    optimal_interval_s,
    stepfun_rate_per_node_s,
)
from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.emit import findings, points
from gpuwarden.analytics.runner import Analysis, LocalExecutor, analyse
from gpuwarden.collector.jobside.checkpoint_hook import CheckpointRequests
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.checkpoint import (
    interval_ack_path,
    interval_path,
    interval_request,
    write_json_atomic,
)
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.reader import InfluxReader
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.remediation.adapters.slurm import SlurmAdapter
from gpuwarden.remediation.adapters.webhook import WebhookAdapter
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import Action, Outcome
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from testbed.influxd import free_port
from tests.remediation_util import poll
from tests.torchrun_util import step_events as _events
from tests.torchrun_util import torchrun_argv

S = 1_000_000_000


def test_the_hook_applies_an_interval_once_and_ignores_bad_ones(tmp_path: Path) -> None:
    hook = CheckpointRequests(job="j1", directory=tmp_path, signals=())
    assert hook.interval_request() is None
    write_json_atomic(interval_path(tmp_path, "j1"), interval_request("r1", 600, "advice"))
    assert hook.interval_request() == ("r1", 600.0)
    hook.interval_applied("r1", 600.0)
    assert hook.interval_request() is None  # applied: not again
    ack = json.loads(interval_ack_path(tmp_path, "j1").read_text())
    assert ack == {"request_id": "r1", "interval_s": 600.0, "job": "j1"}
    for bad in (0, -5, "600", True, None):
        data = {"request_id": f"bad-{bad}", "interval_s": bad}
        write_json_atomic(interval_path(tmp_path, "j1"), data)
        assert hook.interval_request() is None, bad
    (tmp_path / "j1.interval").write_text("{half a req")
    assert hook.interval_request() is None
    with pytest.raises(ValueError):
        interval_request("r2", 0, "advice")


torch = pytest.importorskip("torch", reason="scripts/bootstrap.sh installs the CPU build of torch")


def test_a_real_job_reports_its_saves_is_advised_and_takes_a_new_interval(
    influxd, influx_db, tmp_path: Path
) -> None:
    """The whole lever on a real job: its saves reach InfluxDB, analytics advises, the engine's
    ``checkpoint-cadence`` policy asks through the Slurm adapter's request files, the job
    answers and checkpoints at the advised interval; then a shorter interval, asked by hand,
    visibly changes how often it saves, and the job keeps running throughout."""
    steplog, requests = tmp_path / "steps.jsonl", tmp_path / "requests"
    requests.mkdir()
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "SLURM_JOB_ID": "cad-1",
        "GPUWARDEN_CLUSTER": "test",
        "GPUWARDEN_NODE": "host-0",
        "GPUWARDEN_REPORTER_URL": influxd.url,
        "GPUWARDEN_REPORTER_DATABASE": influx_db,
        "GW_STEP_S": "0.2",
        "GW_CKPT_EVERY_S": "2",
        "GW_CKPT_DIR": str(tmp_path / "ckpt"),
        "GW_REQUEST_DIR": str(requests),
        "GW_STEPLOG": str(steplog),
    }
    port = free_port()
    argv = torchrun_argv("testbed.jobs.train_job", port)
    out = (tmp_path / "torchrun.log").open("w")
    proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    t_start = time.time_ns()
    cfg = with_overrides(
        load_config(environ={}),
        influxdb={"url": influxd.url, "database": influx_db},
        analysis={"spool_dir": str(tmp_path / "aspool")},
        cadence={"min_gain": 0.0},
    )

    def events(kind: str, at_least: int = 1) -> list[dict] | None:
        assert proc.poll() is None, (tmp_path / "torchrun.log").read_text()[-3000:]
        found = [e for e in _events(steplog) if e["event"] == kind]
        return found if len(found) >= at_least else None

    def advised() -> Analysis | None:
        x = analyse(cfg, t_start, time.time_ns() + S, LocalExecutor())
        return x if x.advice else None

    adapter = SlurmAdapter(checkpoint_dir=str(requests), checkpoint_timeout_s=60)
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": adapter, "webhook": WebhookAdapter()},
        AuditLog(tmp_path / "audit.jsonl"),
        EngineSettings(dry_run=False, approval=()),
    )
    try:
        before = poll(lambda: events("save", 3), 180, "three saves at 2 s", every_s=0.5)
        a = poll(advised, 30, "the job's checkpoint points in InfluxDB", every_s=1.0)
        (f,) = [f for f in findings(a) if f.kind == "checkpoint_advice"]
        assert engine.submit(f).verdict == "act"
        assert engine.wait(90)
        (applied,) = poll(lambda: events("interval"), 30, "the job to take the advice")
        n = len(events("save", 0) or [])
        write_json_atomic(interval_path(requests, "cad-1"), interval_request("r1", 0.6, "test"))
        acked = interval_ack_path(requests, "cad-1")
        ack = poll(
            lambda: d if (d := json.loads(acked.read_text())).get("request_id") == "r1" else None,
            60,
            "the job to apply the interval",
            every_s=0.2,
        )
        after = poll(lambda: events("save", n + 4), 60, "four saves at 0.6 s", every_s=0.2)
        assert proc.poll() is None  # the job kept running
        steps_now = max(e["step"] for e in _events(steplog) if e["event"] == "step")
    finally:
        engine.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    (advice,) = a.advice
    assert advice.job == "cad-1" and advice.nodes == 1
    assert advice.current_s == 2.0  # its reported interval
    assert 0 < advice.cost_s < 5  # a torch.save of a tiny model: well under a second, typically
    assert advice.history_weight == 0.0  # no faults in this database: the StepFun prior
    # Young/Daly from its own save time and the prior MTBF of one node (about 240 days)
    assert advice.advised_s == max(60.0, optimal_interval_s(advice.cost_s, advice.mtbf_s))
    assert advice.mtbf_s == pytest.approx(1 / stepfun_rate_per_node_s())
    assert f.subject == {"cluster": "test", "job": "cad-1"}
    assert f.evidence["current_interval_s"] == 2.0
    assert applied["every_s"] == f.evidence["advised_interval_s"] == round(advice.advised_s, 1)
    for p in points(a, [f]):
        if p.measurement == "checkpoint_advice":
            assert check_point(p.measurement, p.tags, p.fields) == []
    records = [r for r in read_records(tmp_path / "audit.jsonl") if r.get("event") == "action"]
    assert [(r["action"], r["outcome"]) for r in records] == [
        ("notify", "ok"),
        ("checkpoint_interval", "ok"),
    ]
    assert ack["interval_s"] == 0.6 and ack["job"] == "cad-1"
    gap = [y["step"] - x["step"] for x, y in itertools.pairwise(before)]
    new_gap = [y["step"] - x["step"] for x, y in itertools.pairwise(after[n:])]
    # 0.2 s steps: about 10 steps between saves at 2 s, about 3 at 0.6 s
    assert min(gap) >= 8 and max(new_gap) <= 5, (gap, new_gap)
    assert steps_now >= after[-1]["step"]


def test_a_job_that_does_not_take_interval_requests_is_only_notified(tmp_path: Path) -> None:
    adapter = SlurmAdapter(checkpoint_dir=str(tmp_path), checkpoint_timeout_s=0.5)
    notes: list[Action] = []

    class Notes(WebhookAdapter):
        def perform(self, action: Action) -> Outcome:
            notes.append(action)
            return super().perform(action)

    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": adapter, "webhook": Notes()},
        AuditLog(tmp_path / "audit.jsonl"),
        EngineSettings(dry_run=False, approval=()),
    )
    advice = Finding(
        kind="checkpoint_advice",
        subject={"cluster": "test", "job": "4242"},
        severity=Severity.INFO,
        time_ns=time.time_ns(),
        evidence={"advised_interval_s": 1500.0, "current_interval_s": 3600.0},
        summary="job 4242: checkpoint every 25 min instead of 60 min",
        source="analytics",
    )
    assert engine.submit(advice).verdict == "act"
    assert engine.wait(30)
    engine.close()
    records = [r for r in read_records(tmp_path / "audit.jsonl") if r.get("event") == "action"]
    assert [(r["action"], r["outcome"]) for r in records] == [
        ("notify", "ok"),
        ("checkpoint_interval", "timeout"),
    ]
    assert "may not support interval requests" in records[-1]["message"]
    assert json.loads((tmp_path / "4242.interval").read_text())["interval_s"] == 1500.0
    assert [a.job for a in notes] == ["4242"]


@pytest.mark.influxdb
def test_the_fleet_rate_leaves_out_faults_a_risk_finding_warned_of(influxd, influx_db, tmp_path):
    """Three faults in the store's findings (REAL influxd, CONSTRUCTED findings): node-a's
    first was named by a failure_risk finding 30 min before, node-a's second (after its merge
    window) and node-b's were not; node-c's warning preceded nothing."""
    t0 = time.time_ns() - 10 * 3600 * S
    out = []

    def finding(kind: str, node: str, severity: Severity, at_s: int) -> None:
        f = Finding(kind=kind, subject={"cluster": "t", "node": node}, severity=severity,
                    time_ns=t0 + at_s * S, source="test")  # fmt: skip
        tags, fields = f.to_point()
        out.append(Point("finding", tags, fields, f.time_ns))  # type: ignore[arg-type]

    finding("failure_risk", "node-a", Severity.WARNING, 3600)
    finding("gpu_xid", "node-a", Severity.CRITICAL, 5400)
    finding("gpu_lost", "node-a", Severity.CRITICAL, 5460)  # the same fault (merge_s)
    finding("gpu_xid", "node-a", Severity.CRITICAL, 20_000)
    finding("gpu_xid", "node-b", Severity.CRITICAL, 9000)
    finding("failure_risk", "node-c", Severity.WARNING, 9000)
    for node in ("node-a", "node-b", "node-c", "node-d"):
        out.append(Point("agent", {"cluster": "t", "node": node}, {"points_count": 10}, t0))
    sink = InfluxSink(SinkConfig(url=influxd.url, database=influx_db,
                                 spool_dir=str(tmp_path / "spool")))  # fmt: skip
    sink.write_points(out)
    assert sink.close(timeout_s=60)
    cfg = with_overrides(load_config(environ={}), cadence={"discount_announced": True})
    reader = InfluxReader(influxd.url, influx_db)
    rate = fleet_failure_rate(reader, t0, t0 + 10 * 3600 * S, cfg["cadence"])
    assert (rate.faults, rate.announced) == (3, 1)
    assert rate.exposure_node_s == pytest.approx(4 * 10 * 3600)
    assert rate.unannounced().per_node_s == pytest.approx(rate.per_node_s * (1 - 1 / (3 + 5)))
    plain = with_overrides(load_config(environ={}), cadence={"discount_announced": False})
    assert fleet_failure_rate(reader, t0, t0 + 10 * 3600 * S, plain["cadence"]).announced == 0
