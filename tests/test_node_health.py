"""Issue 26: node health beyond GPU telemetry, and a node's return to service.

* episodes (one finding per burst, a count, a recovery window) -- CONSTRUCTED event times;
* the engine's return check: a node gpuwarden took out returns only on a passing node check
  newer than its removal (``check``), a check command the engine runs (``command``), or an
  operator (``approval``); an operator's undo always may;
* policies limited to a group of nodes: name pattern, Slurm partition and feature (REAL Slurm),
  Kubernetes label (the API fake);
* the agent's health gate runs the node check before it calls a node healthy;
* REAL Slurm: ``HealthCheckProgram`` runs ``deploy/slurm/healthcheck.sh`` (``gpuwarden check``)
  and a failing probe drains the node with the probe's reason; a node the engine drained comes
  back only after ``gpuwarden check --report`` passes on it.

The GPU faults are not simulated here at all: the probe that fails is the disk probe, on a
path that does not exist (a missing shared filesystem), which is real on this machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.collector.check import Result, check_finding
from gpuwarden.collector.episodes import Episodes
from gpuwarden.collector.health import HealthGate
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.cli import main as remediate
from gpuwarden.remediation.clock import SYSTEM, Clock
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import NodeFacts
from gpuwarden.remediation.policy import DEFAULT_POLICIES, Policy, PolicyError, load_policies
from testbed.influxd import LocalInfluxd, free_port
from testbed.k8s import FakeKubernetes
from testbed.slurm import LocalSlurm, slurm_available
from tests.remediation_util import HandClock, RecordingAdapter, poll

ROOT = Path(__file__).resolve().parent.parent
S = 1_000_000_000
NODES = {"gpu01": "a", "gpu02": "a", "gpu03": "a", "gpu04": "a"}
needs_slurm = pytest.mark.skipif(
    not slurm_available(), reason="scripts/bootstrap.sh installs Slurm"
)


# -- episodes -------------------------------------------------------------------------------


def test_an_episode_warns_once_at_its_threshold_and_again_only_after_recovery() -> None:
    ep = Episodes(threshold=3, window_s=60, recovery_s=30)
    assert ep.event("p", 0) is None and ep.event("p", 10 * S) is None
    said = ep.event("p", 20 * S)
    assert said is not None and said.count == 3 and len(said.recent) == 3
    assert ep.event("p", 40 * S) is None  # still the same burst: counted, not said
    assert ep.open["p"].count == 4
    assert ep.event("p", 71 * S) is None  # 31 s quiet closed it; this opens a new one
    assert ep.open["p"].count == 1
    # events spread wider than the window never reach the threshold
    slow = Episodes(threshold=3, window_s=60, recovery_s=1000)
    assert [slow.event("q", t * S) for t in (0, 50, 100, 150)] == [None] * 4
    # a recovery line ends the episode at once
    one = Episodes(threshold=1, recovery_s=300)
    assert one.event("nfs", 0) is not None and one.event("nfs", S) is None
    assert one.recovered("nfs") is not None
    assert one.event("nfs", 2 * S) is not None
    with pytest.raises(ValueError):
        Episodes(threshold=0)


# -- the engine's return check ----------------------------------------------------------------


def _engine(
    tmp: Path, clock: HandClock | None = None, **settings: object
) -> tuple[Engine, RecordingAdapter]:
    sched = RecordingAdapter("slurm", NODES)
    base = {"dry_run": False, "max_nodes_out": 4, "max_fraction_out": 1.0}
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": sched, "webhook": RecordingAdapter("webhook")},
        AuditLog(tmp / "audit.jsonl"),
        EngineSettings(**(base | settings)),  # type: ignore[arg-type]
        clock=SYSTEM if clock is None else Clock(wall=clock.wall, mono=clock.mono),
    )
    return engine, sched


def _xid(node: str) -> Finding:
    return Finding(kind="gpu_xid", subject={"cluster": "c", "node": node, "gpu": "0"},
                   severity=Severity.CRITICAL, time_ns=time.time_ns(), evidence={"xid": 79},
                   summary="XID 79")  # fmt: skip


def _checked(node: str, ok: bool, at_ns: int) -> Finding:
    status = "pass" if ok else "fail"
    return check_finding("c", node, [Result("disk", status, "/scratch")], at_ns)


def test_a_node_returns_only_on_a_passing_check_newer_than_its_removal(tmp_path: Path) -> None:
    engine, sched = _engine(tmp_path)
    before = time.time_ns() - 60 * S  # a check from before the node was taken out
    engine.submit(_xid("gpu01"))
    assert engine.wait(10) and "gpu01" in sched.out
    quiet = Finding(kind="node_healthy", subject={"cluster": "c", "node": "gpu01"},
                    severity=Severity.INFO, time_ns=time.time_ns(), summary="quiet")  # fmt: skip
    d = engine.submit(quiet)  # quiet is not proof
    assert d.verdict == "unchecked" and "passing node check" in d.why
    assert [a.kind for a in d.actions] == []  # the ladder is only uncordon: nothing runs
    old = engine.submit(_checked("gpu01", True, before))
    assert old.verdict == "unchecked" and "older than its removal" in old.why
    failed = engine.submit(_checked("gpu01", False, time.time_ns()))
    assert failed.policy == "node-check-failed"
    assert engine.wait(10) and "gpu01" in sched.out
    passed = engine.submit(_checked("gpu01", True, time.time_ns() + S))
    assert passed.verdict == "act", passed.why
    assert engine.wait(10) and "gpu01" not in sched.out
    engine.close()


def test_return_by_approval_and_by_the_operators_undo(tmp_path: Path) -> None:
    engine, sched = _engine(tmp_path, return_requires="approval")
    engine.submit(_xid("gpu02"))
    assert engine.wait(10) and "gpu02" in sched.out
    d = engine.submit(_checked("gpu02", True, time.time_ns() + S))
    assert d.verdict == "approval"  # a passing check is not enough here: an operator decides
    assert engine.approve(d.plan_id, by="test").verdict == "act"
    assert engine.wait(10) and "gpu02" not in sched.out
    engine.close()
    checked, sched = _engine(tmp_path / "undo")
    checked.submit(_xid("gpu03"))
    assert checked.wait(10) and "gpu03" in sched.out
    assert checked.undo("gpu03", by="test").verdict == "act"  # an operator always may
    assert checked.wait(10) and "gpu03" not in sched.out
    checked.close()


def test_return_by_a_check_command_the_engine_runs(tmp_path: Path) -> None:
    flag = tmp_path / "repaired"
    command = ("sh", "-c", f'echo "checking {{node}}"; test -e {flag} || {{ echo "disk: FAIL"; '
               "exit 1; }")  # fmt: skip
    clock = HandClock(wall=time.time())
    engine, sched = _engine(
        tmp_path, clock, return_requires="command", return_check_command=command
    )
    engine.submit(_xid("gpu04"))
    assert engine.wait(10) and "gpu04" in sched.out
    quiet = Finding(kind="node_healthy", subject={"cluster": "c", "node": "gpu04"},
                    severity=Severity.INFO, time_ns=time.time_ns(), summary="q")  # fmt: skip
    assert engine.submit(quiet).verdict == "act"
    assert engine.wait(10) and "gpu04" in sched.out  # the command failed: still out
    flag.touch()
    again = Finding(kind="node_healthy", subject={"cluster": "c", "node": "gpu04"},
                    severity=Severity.INFO, time_ns=time.time_ns() + 400 * S,
                    summary="q2")  # fmt: skip
    # a return that failed is not tried again within the cooldown (a node's key sending
    # node_healthy 60 times a minute held a thread each for the check: tests/security/
    # test_one_key_bounded.py); after it, the next node_healthy returns the repaired node
    assert engine.submit(again).verdict == "cooldown"
    clock.advance(engine.settings.cooldown_s + 1)
    again = Finding(kind="node_healthy", subject={"cluster": "c", "node": "gpu04"},
                    severity=Severity.INFO, time_ns=time.time_ns() + 800 * S,
                    summary="q3")  # fmt: skip
    assert engine.submit(again).verdict == "act"
    assert engine.wait(10) and "gpu04" not in sched.out
    engine.close()
    uncordons = [r for r in read_records(tmp_path / "audit.jsonl")
                 if r["event"] == "action" and r["action"] == "uncordon"]  # fmt: skip
    assert [r["outcome"] for r in uncordons] == ["failed", "ok"]
    assert "return check failed (exit 1): checking gpu04 | disk: FAIL" in uncordons[0]["message"]


def test_the_return_requirement_is_validated(tmp_path: Path) -> None:
    from gpuwarden.core.config import ConfigError
    from gpuwarden.remediation.config import load_config

    bad = tmp_path / "r.toml"
    bad.write_text('[engine]\nreturn_requires = "hope"\n')
    with pytest.raises(ConfigError, match="return_requires"):
        load_config(bad)
    bad.write_text('[engine]\nreturn_requires = "command"\n')
    with pytest.raises(ConfigError, match="return_check_command"):
        load_config(bad)


# -- policies per node group ---------------------------------------------------------------


def _fatal(nodes: dict[str, object], name: str = "h100-only") -> Policy:
    return Policy.from_mapping({"name": name, "kinds": ["gpu_xid"], "min_severity": "critical",
                                "nodes": nodes, "actions": ["notify", "cordon"]})  # fmt: skip


def test_a_policy_selects_nodes_by_name_partition_feature_and_label() -> None:
    facts = {
        "gpu-h100-01": NodeFacts(frozenset({"h100"}), frozenset({"nvswitch", "ib"}),
                                 {"nvidia.com/gpu.product": "H100"}),
        "gpu-a100-01": NodeFacts(frozenset({"a100"}), frozenset({"ib"}), {}),
    }  # fmt: skip
    asked: list[str] = []

    def look(node: str) -> NodeFacts | None:
        asked.append(node)
        return facts.get(node)

    def hit(policy: Policy, node: str) -> bool:
        return policy.matches(_xid(node), look)

    assert hit(_fatal({"name": ["gpu-h100-*"]}), "gpu-h100-01")
    assert not hit(_fatal({"name": ["gpu-h100-*"]}), "gpu-a100-01")
    assert asked == []  # a name pattern needs nothing from the scheduler
    assert hit(_fatal({"partition": ["h100", "h200"]}), "gpu-h100-01")
    assert not hit(_fatal({"partition": ["h100"]}), "gpu-a100-01")
    assert hit(_fatal({"feature": ["nvswitch"], "partition": "h100"}), "gpu-h100-01")
    assert not hit(_fatal({"feature": ["nvswitch"]}), "gpu-a100-01")
    assert hit(_fatal({"label": {"nvidia.com/gpu.product": "H100"}}), "gpu-h100-01")
    assert not hit(_fatal({"label": {"nvidia.com/gpu.product": "H200"}}), "gpu-h100-01")
    # facts that cannot be read: the policy does not apply, the next one decides
    assert not hit(_fatal({"partition": ["h100"]}), "unknown-node")
    with pytest.raises(PolicyError, match="unknown keys"):
        _fatal({"rack": ["r1"]})
    with pytest.raises(PolicyError, match="list of strings"):
        _fatal({"partition": [1]})
    round_trip = _fatal({"name": ["n*"], "label": {"a": "b"}})
    assert Policy.from_mapping(round_trip.to_mapping()) == round_trip


def test_kubernetes_labels_choose_the_policy(tmp_path: Path) -> None:
    from gpuwarden.remediation.adapters.kubernetes import KubernetesAdapter

    fake = FakeKubernetes(token="k").start()
    try:
        fake.add_node("h100-node", labels={"nvidia.com/gpu.product": "H100"})
        fake.add_node("a100-node", labels={"nvidia.com/gpu.product": "A100"})
        (tmp_path / "tok").write_text("k")
        k8s = KubernetesAdapter(api_url=fake.url, token_file=str(tmp_path / "tok"))
        policies = [_fatal({"label": {"nvidia.com/gpu.product": "H100"}}),
                    *load_policies(DEFAULT_POLICIES)]  # fmt: skip
        engine = Engine(policies, {"kubernetes": k8s, "webhook": RecordingAdapter("webhook")},
                        AuditLog(tmp_path / "audit.jsonl"),
                        EngineSettings(node_adapter="kubernetes", checkpoint_adapter="kubernetes",
                                       max_nodes_out=4, max_fraction_out=1.0))  # fmt: skip
        assert engine.submit(_xid("h100-node")).policy == "h100-only"
        assert engine.submit(_xid("a100-node")).policy == "fatal-gpu-event"
        engine.close()
    finally:
        fake.stop()


# -- the agent checks before it calls a node healthy ---------------------------------------------


def test_the_health_gate_runs_the_check_before_it_says_healthy() -> None:
    said: list[Finding] = []
    results = [[Result("disk", "fail", "/scratch: no answer within 10 s")],
               [Result("disk", "pass", "/scratch 0.01 s")]]  # fmt: skip
    gate = HealthGate("c", "n1", said.append, healthy_after_s=20,
                      check=lambda now: check_finding("c", "n1", results.pop(0), now))  # fmt: skip

    def cycle(t: int) -> None:
        gate.cycle(t * S, [])
        for c in gate.checks:
            c.join(10)

    for t in (0, 10, 20):
        cycle(t)
    assert [f.kind for f in said] == ["node_check_failed"]
    gate.observe(said[-1])  # the agent passes its own findings back: the stretch restarts
    for t in (30, 40, 50):
        cycle(t)
    assert [f.kind for f in said] == ["node_check_failed", "node_healthy"]
    healthy = said[-1]
    assert healthy.evidence["check"] == "pass" and healthy.evidence["checked_ns"] == 50 * S
    assert healthy.severity is Severity.INFO and said[0].severity is Severity.CRITICAL
    assert {f.source for f in said} == {"agent"}
    assert "disk: /scratch: no answer" in said[0].summary


# -- REAL Slurm ------------------------------------------------------------------------------


def _shim(tmp: Path, slurm: LocalSlurm, configs: Path, report: bool) -> Path:
    """The HealthCheckProgram: the production script, with this checkout's ``gpuwarden`` and
    the test cluster's SLURM_CONF on its PATH and environment."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    gw = bindir / "gpuwarden"
    gw.write_text(f'#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m gpuwarden "$@"\n')
    gw.chmod(0o755)
    program = tmp / "healthcheck"
    program.write_text(
        "#!/bin/sh\n"
        f'export PATH="{bindir}:$PATH" SLURM_CONF="{slurm.conf}"\n'
        f'export GPUWARDEN_CHECK_CONFIG="{configs}/agent-$SLURMD_NODENAME.toml"\n'
        f"export GPUWARDEN_CHECK_REPORT={int(report)}\n"
        f"exec sh {ROOT}/deploy/slurm/healthcheck.sh\n"
    )
    program.chmod(0o755)
    return program


def _agent_config(
    configs: Path, node: str, disk: str, engine_url: str = "", influx: tuple[str, str] = ("", "")
) -> None:
    configs.mkdir(exist_ok=True)
    url, db = influx
    db = db or "gpuwarden"
    url = url or f"http://127.0.0.1:{free_port()}"  # nobody there: the results are spooled
    fast = ""
    if engine_url:
        fast = (f'remediation_url = "{engine_url}"\n'
                f'remediation_token_file = "{configs}/token"\n')  # fmt: skip
    (configs / f"agent-{node}.toml").write_text(
        f'[agent]\ncluster = "c"\nnode = "{node}"\nsysfs = "{configs}/sys"\n{fast}'
        f'[check]\nprobes = ["gpu_count", "disk"]\ndisk_paths = ["{disk}"]\n'
        f'disk_timeout_s = 10.0\noptional = ["gpu_count"]\n'  # no GPU on this machine
        f'[sink]\nurl = "{url}"\ndatabase = "{db}"\n'
        f'spool_dir = "{configs}/spool-{node}"\n'
    )


def _reason(slurm: LocalSlurm, node: str) -> str:
    return slurm.run("sinfo", "-h", "-n", node, "-N", "-o", "%T|%E").strip()


@needs_slurm
def test_slurm_healthcheckprogram_drains_a_failing_node_with_the_probes_reason(
    tmp_path: Path,
) -> None:
    configs = tmp_path / "configs"
    _agent_config(configs, "gpu01", str(tmp_path))
    _agent_config(configs, "gpu02", "/nonexistent/shared-fs")  # the shared filesystem is gone
    slurm = LocalSlurm(tmp_path / "slurm", ["gpu01", "gpu02"])
    slurm.extra = [f"HealthCheckProgram={_shim(tmp_path, slurm, configs, report=False)}",
                   "HealthCheckInterval=2", "HealthCheckNodeState=ANY"]  # fmt: skip
    with slurm:
        drained: str = poll(lambda: (s := _reason(slurm, "gpu02")).startswith("drain") and s,
                            60, "slurmd's health check to drain gpu02")  # fmt: skip
        assert "gpuwarden check: disk: /nonexistent/shared-fs: FileNotFoundError" in drained
        time.sleep(5)  # two more health-check rounds
        assert _reason(slurm, "gpu01").split("|")[0] == "idle"


@pytest.fixture
def slurm_engine(tmp_path: Path) -> Iterator[tuple[LocalSlurm, str, Path]]:
    """REAL Slurm (two nodes) and ``gpuwarden remediate serve`` acting on it."""
    with LocalSlurm(tmp_path / "slurm", ["gpu01", "gpu02"]) as slurm:
        port = free_port()
        (tmp_path / "token").write_text("t0ken\n")
        config = tmp_path / "remediation.toml"
        config.write_text(
            f'[engine]\nlisten = "127.0.0.1:{port}"\ntoken_file = "{tmp_path}/token"\n'
            f'audit_log = "{tmp_path}/audit.jsonl"\ndry_run = false\nnotify_adapter = "webhook"\n'
            'node_adapter = "slurm"\ncheckpoint_adapter = "slurm"\ntick_s = 1.0\n'
            "[guards]\nmax_nodes_out = 2\nmax_fraction_out = 1.0\n"
            f'[slurm]\nconf = "{slurm.conf}"\n'
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(config), "serve"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            poll(lambda: remediate(["--config", str(config), "pending"]) == 0, 30, "the engine")
            yield slurm, f"http://127.0.0.1:{port}/v1/findings", tmp_path
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


@needs_slurm
def test_a_node_the_engine_drained_comes_back_only_after_a_passing_check(
    slurm_engine: tuple[LocalSlurm, str, Path], influxd: LocalInfluxd, influx_db: str
) -> None:
    slurm, url, tmp = slurm_engine
    configs = tmp / "configs"
    configs.mkdir()
    (configs / "token").write_text("t0ken\n")

    def check(disk: str) -> subprocess.CompletedProcess[str]:
        _agent_config(configs, "gpu02", disk, url, (influxd.url, influx_db))
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", "check", "--config",
             str(configs / "agent-gpu02.toml"), "--report"],
            cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip

    def audit(event: str) -> list[dict]:
        path = tmp / "audit.jsonl"
        return [r for r in read_records(path) if r["event"] == event] if path.exists() else []

    # the shared filesystem is gone: the check fails, and the engine drains the node itself
    failed = check("/nonexistent/shared-fs")
    assert failed.returncode == 1 and "node_check_failed posted" in failed.stderr
    poll(lambda: _reason(slurm, "gpu02").startswith("drain"), 30, "the engine's drain")
    assert "node check failed: disk" in _reason(slurm, "gpu02")
    # still broken: another failing check is not a way back
    assert check("/nonexistent/shared-fs").returncode == 1
    time.sleep(2)
    assert _reason(slurm, "gpu02").startswith("drain")
    # repaired: the check passes, its node_healthy carries the pass, the engine resumes it
    ok = check(str(tmp))
    assert ok.returncode == 0 and "node_healthy posted" in ok.stderr, ok.stderr
    poll(lambda: _reason(slurm, "gpu02").split("|")[0] == "idle", 30, "gpu02 resumed")
    decisions = {(r["node"], r["verdict"], r["policy"]) for r in audit("decision")}
    assert ("gpu02", "act", "node-check-failed") in decisions
    assert ("gpu02", "act", "healthy-again") in decisions
    resumed = [r for r in audit("action") if r["action"] == "uncordon"]
    assert [(r["node"], r["outcome"]) for r in resumed] == [("gpu02", "ok")]
    # every run's results are in InfluxDB, one point per probe
    rows = json.loads(
        influxd.query(
            "SELECT passed_active, detail FROM node_check GROUP BY probe, status", influx_db
        )
    )
    series = {(s["tags"]["probe"], s["tags"]["status"]): len(s["values"])
              for s in rows["results"][0]["series"]}  # fmt: skip
    assert series == {("disk", "fail"): 2, ("disk", "pass"): 1, ("gpu_count", "unavailable"): 3}


@needs_slurm
def test_slurm_features_and_partitions_choose_the_policy(tmp_path: Path) -> None:
    from gpuwarden.remediation.adapters.slurm import SlurmAdapter

    nodes = ["gpu01", "gpu02"]
    with LocalSlurm(tmp_path / "slurm", nodes, features={"gpu01": ["h100", "nvswitch"]}) as slurm:
        adapter = SlurmAdapter(conf=str(slurm.conf))
        facts = adapter.node_facts("gpu01")
        assert facts.features == {"h100", "nvswitch"} and facts.partitions == {"gpu"}
        assert adapter.node_facts("gpu02").features == frozenset()
        policies = [_fatal({"feature": ["nvswitch"], "partition": ["gpu"]}),
                    *load_policies(DEFAULT_POLICIES)]  # fmt: skip
        engine = Engine(policies, {"slurm": adapter, "webhook": RecordingAdapter("webhook")},
                        AuditLog(tmp_path / "audit.jsonl"),
                        EngineSettings(max_nodes_out=4, max_fraction_out=1.0))  # fmt: skip
        assert engine.submit(_xid("gpu01")).policy == "h100-only"
        assert engine.submit(_xid("gpu02")).policy == "fatal-gpu-event"
        engine.close()
