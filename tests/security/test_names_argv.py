"""Issue 38, names are data: a node name never becomes an option of the program an argv
template runs (ssh's ``-oProxyCommand=...`` runs a command as the engine's user).

The engine is the real ``gpuwarden remediate serve`` (bearer + HMAC) with the elastic adapter
as node adapter and a real ``/usr/bin/ssh`` in ``stop_command``; the return check runs in an
in-process engine on the testbed's recording scheduler. Every finding is CONSTRUCTED."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from gpuwarden.core.config import ConfigError
from gpuwarden.core.finding import Finding, FindingError, Severity
from gpuwarden.remediation.audit import AuditLog
from gpuwarden.remediation.config import load_config
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from tests.remediation_util import RecordingAdapter
from tests.security.names_engine import DRAIN_ON_XID, ServedEngine, xid_finding

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")


def hostile(tmp: Path) -> str:
    """CONSTRUCTED: a node 'name' that ssh would read as an option running a command."""
    return f"-oProxyCommand=touch {tmp}/pwned"


def elastic(tmp: Path, stop_command: str) -> str:
    return (
        'node_adapter = "elastic"\ncheckpoint_adapter = "elastic"\n'
        f'[elastic]\nstop_command = "{stop_command}"\nstop_timeout_s = 20.0\n{DRAIN_ON_XID}'
    )


def test_ssh_without_double_dash_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """The template the docs used to show (``ssh {node} ...``): the engine refuses to start,
    saying how to fix it; before, it started and ssh ran the finding's ProxyCommand."""
    engine = ServedEngine(
        tmp_path, extra=elastic(tmp_path, "ssh -o BatchMode=yes {node} systemctl stop trainer")
    )
    try:
        if engine.ready():  # the code before issue 38: it serves; the attack goes through
            engine.post("/v1/findings", xid_finding(hostile(tmp_path)))
            engine.post("/v1/findings", xid_finding("nodeA"))
            engine.action_done(node="nodeA")  # one worker: the hostile plan ran first
    finally:
        engine.stop()
    assert not (tmp_path / "pwned").exists(), "ssh ran the node name's ProxyCommand"
    assert engine.proc.returncode != 0
    assert "put '--' before {node} for ssh" in engine.output()


def test_a_hostile_node_is_refused_and_the_real_one_still_acted_on(tmp_path: Path) -> None:
    """With ``ssh -- {node}``: the hostile finding is a 400 and never audited; a real node's
    finding still reaches ssh, as one argument after ``--``."""
    stop = f"ssh -o BatchMode=yes -o ConnectTimeout=2 -- {{node}} touch {tmp_path}/remote"
    engine = ServedEngine(tmp_path, extra=elastic(tmp_path, stop))
    try:
        assert engine.ready(), engine.output()
        status, reply = engine.post("/v1/findings", xid_finding(hostile(tmp_path)))
        assert status == 400, reply
        assert "not a finding: subject node: not a node name" in reply["error"]
        assert engine.post("/v1/findings", xid_finding("nodeA.invalid"))[0] == 202
        acted = engine.action_done(node="nodeA.invalid")
    finally:
        engine.stop()
    assert not (tmp_path / "pwned").exists()
    assert [f["subject"]["node"] for f in engine.records("finding")] == ["nodeA.invalid"]
    assert acted["action"] == "drain" and acted["outcome"] == "failed"  # no such host: honest
    assert "ssh -o BatchMode=yes -o ConnectTimeout=2 -- nodeA.invalid" in acted["message"]


def test_the_return_check_never_runs_a_hostile_node(tmp_path: Path) -> None:
    """``return_check_command = ["ssh", "{node}", "true"]`` is refused at config load; and a
    hostile node cannot get as far as the return check (its findings are refused)."""
    config = tmp_path / "remediation.toml"
    config.write_text(
        '[engine]\nreturn_requires = "command"\nreturn_check_command = ["ssh", "{node}", "true"]\n'
    )
    refused = []
    try:
        load_config(config)
    except ConfigError as exc:
        refused.append(str(exc))

    node = hostile(tmp_path)
    sched = RecordingAdapter("slurm", {"gpu01": "gpu", "gpu02": "gpu"})
    settings = EngineSettings(
        dry_run=False, max_nodes_out=4, max_fraction_out=1.0, cooldown_s=0,
        return_requires="command", return_check_command=("ssh", "{node}", "true"),
    )  # fmt: skip
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": sched, "webhook": RecordingAdapter("webhook")},
        AuditLog(tmp_path / "audit.jsonl"),
        settings,
    )
    try:
        for kind, severity in (("gpu_xid", Severity.CRITICAL), ("node_healthy", Severity.INFO)):
            finding = Finding(kind, {"node": node}, severity, time.time_ns(), summary="CONSTRUCTED")
            engine.submit(finding)
            assert engine.wait(60)
    except FindingError as exc:
        refused.append(str(exc))
    finally:
        engine.close()
    assert not (tmp_path / "pwned").exists(), "the return check ran the node's ProxyCommand"
    assert len(refused) == 2, refused
    assert "put '--' before {node} for ssh" in refused[0]
    assert "not a node name" in refused[1]
