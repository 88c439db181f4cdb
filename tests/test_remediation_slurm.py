"""Issue 7, must-show 1: remediation against a REAL Slurm (slurmctld + 4 slurmd on loopback).

The job is a stand-in (SIMULATED work: it sleeps per step) speaking the real checkpoint protocol;
the finding's numbers are SIMULATED; the daemons, drains and requeues are real.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.adapters.slurm import SlurmAdapter
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import Action, ActionKind, Adapter, AdapterError
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from testbed.slurm import LocalSlurm, slurm_available
from tests.remediation_util import RecordingAdapter, passed_check, poll, risk

pytestmark = pytest.mark.skipif(not slurm_available(), reason="scripts/bootstrap.sh installs Slurm")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    # gpu02 is the lightest node, so the first job lands there without being pinned to it
    with LocalSlurm(tmp_path_factory.mktemp("slurm"), weights={"gpu02": 1, "gpu01": 5}) as s:
        yield s


def submit_job(slurm: LocalSlurm, tmp: Path, *, requeue: bool = True) -> str:
    script = tmp / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"exec {sys.executable} -m testbed.jobs.sim_job --state-dir {tmp}/state "
        f"--checkpoint-dir {tmp}/ckpt --step-s 0.1\n"
    )
    flag = "--requeue" if requeue else "--no-requeue"
    out = slurm.run(
        "sbatch", "--parsable", flag, "--exclusive", "-N1", "-o", f"{tmp}/%j.out", str(script)
    )
    return out.strip().split(";")[0]


def job_where(slurm: LocalSlurm, job: str) -> tuple[str, str]:
    line = slurm.run("squeue", "-h", "-j", job, "-o", "%T %N").split()
    return (line[0], line[1]) if len(line) == 2 else (line[0] if line else "", "")


def running_on(slurm: LocalSlurm, job: str, not_on: str = "") -> str | None:
    state, node = job_where(slurm, job)
    return node if state == "RUNNING" and node != not_on else None


def progress(tmp: Path) -> list[list[str]]:
    path = tmp / "state" / "progress.log"
    return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []


def test_failure_risk_checkpoints_drains_and_requeues_elsewhere(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    job = submit_job(slurm, tmp_path)
    poll(lambda: job_where(slurm, job) == ("RUNNING", "gpu02"), 30, "job running on gpu02")
    poll(lambda: len(progress(tmp_path)) > 5, 30, "a few steps done")

    adapter = SlurmAdapter(
        conf=str(slurm.conf), checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_timeout_s=30
    )
    notes = RecordingAdapter("webhook")
    audit = AuditLog(tmp_path / "audit.jsonl")
    settings = EngineSettings(dry_run=False, max_nodes_out=2, max_fraction_out=0.5)
    engine = Engine(
        load_policies(DEFAULT_POLICIES), {"slurm": adapter, "webhook": notes}, audit, settings
    )
    finding = risk("gpu02")
    decision = engine.submit(finding)
    assert decision.verdict == "act"
    assert [a.kind for a in decision.actions] == ["notify", "checkpoint", "drain", "requeue"]
    assert engine.wait(120)

    node = adapter.node("gpu02")
    assert "DRAIN" in node["state_flags"]
    assert node["reason"].startswith("gpuwarden: gpu02 GPU 3: 93% risk")
    where = poll(
        lambda: running_on(slurm, job, not_on="gpu02"), 90, "the requeued job running elsewhere"
    )
    assert where in ("gpu01", "gpu03", "gpu04")

    # the audit log tells the whole story, in order, with timings
    actions = [r for r in read_records(audit.path) if r["event"] == "action"]
    assert [(r["action"], r["outcome"]) for r in actions] == [
        ("notify", "ok"),
        ("checkpoint", "ok"),
        ("drain", "ok"),
        ("requeue", "ok"),
    ]
    assert all(r["finding_id"] == finding.id and r["since_finding_s"] >= 0 for r in actions)
    checkpoint = actions[1]
    ack_step = checkpoint["details"]["acks"][job]["step"]
    assert actions[3]["details"]["requeued"] == [job]

    # resumed from the checkpoint: the first step run elsewhere is the one after the ack
    poll(lambda: any(r[1] == where and r[2] == "start" for r in progress(tmp_path)), 60, "restart")
    restart = next(r for r in progress(tmp_path) if r[1] == where and r[2] == "start")
    assert int(restart[3]) == ack_step + 1
    assert json.loads((tmp_path / "state" / f"{job}.ckpt").read_text())["node"] == "gpu02"

    # undo: an operator puts gpu02 back; only nodes gpuwarden took out may be undone unforced
    with pytest.raises(KeyError):
        engine.undo("gpu03")
    engine.undo("gpu02", by="test")
    assert engine.wait(60)
    assert not {"DRAIN"} & set(adapter.node("gpu02")["state_flags"])
    engine.close()
    slurm.run("scancel", job)


def test_requeue_refused_for_a_job_that_forbids_it(slurm: LocalSlurm, tmp_path: Path) -> None:
    job = submit_job(slurm, tmp_path, requeue=False)
    node = poll(lambda: running_on(slurm, job), 30, "job running")
    adapter = SlurmAdapter(conf=str(slurm.conf))
    outcome = adapter.perform(Action(ActionKind.REQUEUE, "slurm", node=node, finding_id="f"))
    assert outcome.status == "failed"
    assert outcome.details["not_requeueable"] == [job]
    assert job_where(slurm, job) == ("RUNNING", node)  # left running, not killed
    slurm.run("scancel", job)


def test_unknown_node_and_broken_slurm_are_clear_errors(slurm: LocalSlurm) -> None:
    adapter = SlurmAdapter(conf=str(slurm.conf))
    with pytest.raises(AdapterError, match="no node 'gpu99'"):
        adapter.perform(Action(ActionKind.DRAIN, "slurm", node="gpu99", reason="x"))
    broken = SlurmAdapter(conf="/nonexistent/slurm.conf")
    with pytest.raises(AdapterError, match=r"slurm\.conf does not exist"):
        broken.inventory()


def test_checkpoint_by_signal_reaches_the_job(slurm: LocalSlurm, tmp_path: Path) -> None:
    """``checkpoint_signal = "USR1"``: scancel --full signals the batch step (the script
    ``exec``s the trainer, so Python's handler gets it and the job survives)."""
    job = submit_job(slurm, tmp_path)
    node = poll(lambda: running_on(slurm, job), 30, "job running")
    poll(lambda: len(progress(tmp_path)) > 2, 30, "a few steps done")
    adapter = SlurmAdapter(conf=str(slurm.conf), checkpoint_signal="USR1")
    outcome = adapter.perform(Action(ActionKind.CHECKPOINT, "slurm", node=node, finding_id="f"))
    assert outcome.status == "ok" and "signalled" in outcome.message
    poll(lambda: any(r[2] == "checkpoint" for r in progress(tmp_path)), 30, "the job's checkpoint")
    assert running_on(slurm, job) == node  # alive
    slurm.run("scancel", job)


def live_engine(adapter: SlurmAdapter, audit: AuditLog, max_nodes_out: int) -> Engine:
    settings = EngineSettings(dry_run=False, max_nodes_out=max_nodes_out, max_fraction_out=1.0,
                              predicted_kinds=(), cooldown_s=0.0)  # fmt: skip
    adapters: dict[str, Adapter] = {"slurm": adapter, "webhook": RecordingAdapter("webhook")}
    return Engine(load_policies(DEFAULT_POLICIES), adapters, audit, settings)


def xid_on(node: str, summary: str) -> Finding:
    """A CONSTRUCTED fatal XID about ``node``, as its agent sends it."""
    return Finding(kind="gpu_xid", subject={"cluster": "test", "node": node, "gpu": "0"},
                   severity=Severity.CRITICAL, time_ns=time.time_ns(), evidence={"xid": 79},
                   summary=summary, source="agent")  # fmt: skip


def test_a_node_an_administrator_drained_stays_theirs(slurm: LocalSlurm, tmp_path: Path) -> None:
    """Found in review: a fault on a node an administrator had drained ("DO NOT RESUME")
    "drained" it again, answered OK ("already draining"), and the engine counted the node as
    one it took out: the node's agent's next passing check resumed it. Now the drain says the
    node was out already by someone else, and nothing of gpuwarden's puts it back."""
    adapter = SlurmAdapter(conf=str(slurm.conf))
    admin = "admin: swapping the HGX baseboard, DO NOT RESUME"
    slurm.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN", f"Reason={admin}")
    audit = AuditLog(tmp_path / "audit.jsonl")
    engine = live_engine(adapter, audit, max_nodes_out=4)
    try:
        assert engine.submit(xid_on("gpu03", "XID 79 (CONSTRUCTED)")).verdict == "act"
        assert engine.wait(60)
        (drain,) = [r for r in read_records(audit.path)
                    if r["event"] == "action" and r["action"] == "drain"]  # fmt: skip
        assert drain["outcome"] == "ok" and drain["details"]["already_out"] == admin
        back = passed_check("gpu03")
        assert engine.submit(back).verdict == "not_ours"
        assert engine.wait(60)
        with pytest.raises(KeyError):  # nor is it gpuwarden's to undo unforced
            engine.undo("gpu03")
        node = adapter.node("gpu03")
        assert "DRAIN" in node["state_flags"] and node["reason"] == admin
    finally:
        engine.close()
        slurm.run("scontrol", "update", "NodeName=gpu03", "State=RESUME")


def test_a_summary_cannot_make_a_drained_node_a_hot_spare(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    """Found in review: a drain's reason is ``gpuwarden: <the finding's summary> [id]``, and
    any reason starting ``gpuwarden: hot spare`` counted as a spare, which the blast-radius
    guard does not count as out: a sender whose summary began "hot spare" drained past
    ``max_nodes_out``. Spares are matched on the whole reason now."""
    adapter = SlurmAdapter(conf=str(slurm.conf))
    engine = live_engine(adapter, AuditLog(tmp_path / "audit.jsonl"), max_nodes_out=1)
    try:
        verdicts = []
        for node in ("gpu03", "gpu04"):
            f = xid_on(node, "hot spare? no: XID 79 (CONSTRUCTED)")
            verdicts.append(engine.submit(f).verdict)
            assert engine.wait(60)
        assert verdicts == ["act", "blast_radius"]
        assert adapter.inventory().spares == frozenset()
        assert "DRAIN" not in adapter.node("gpu04")["state_flags"]
    finally:
        engine.close()
        for node in ("gpu03", "gpu04"):
            slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def test_a_node_an_administrator_set_down_stays_theirs_and_stays_out(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    """Found in review: only a DRAIN counted as someone else's; a node an administrator set
    DOWN ("bad DIMM, DO NOT RESUME") was drained over, its reason replaced by gpuwarden's, and
    resumed on its next passing check. Now it is theirs: drained as well (so it does not come
    back by itself when slurmd answers), with their reason kept."""
    adapter = SlurmAdapter(conf=str(slurm.conf))
    admin = "admin: bad DIMM, DO NOT RESUME"
    slurm.run("scontrol", "update", "NodeName=gpu03", "State=DOWN", f"Reason={admin}")
    engine = live_engine(adapter, AuditLog(tmp_path / "audit.jsonl"), max_nodes_out=4)
    try:
        assert engine.submit(xid_on("gpu03", "XID 79 (CONSTRUCTED)")).verdict == "act"
        assert engine.wait(60)
        assert engine.submit(passed_check("gpu03")).verdict == "not_ours"
        assert engine.wait(60)
        node = adapter.node("gpu03")
        assert node["reason"] == admin and "DRAIN" in node["state_flags"]
    finally:
        engine.close()
        slurm.run("scontrol", "update", "NodeName=gpu03", "State=RESUME")


def test_a_node_taken_over_while_out_is_let_go(slurm: LocalSlurm, tmp_path: Path) -> None:
    """Found in review: gpuwarden drained gpu03, an administrator then drained it again with
    a reason of their own ("DO NOT RESUME"), and gpuwarden's return on the next passing check
    resumed it. Now the return finds it taken over, leaves it to them and lets go of it."""
    adapter = SlurmAdapter(conf=str(slurm.conf))
    engine = live_engine(adapter, AuditLog(tmp_path / "audit.jsonl"), max_nodes_out=4)
    try:
        assert engine.submit(xid_on("gpu03", "XID 79 (CONSTRUCTED)")).verdict == "act"
        assert engine.wait(60)
        admin = "admin: reseating the HCA, DO NOT RESUME"
        slurm.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN", f"Reason={admin}")
        assert engine.submit(passed_check("gpu03")).verdict in ("act", "unchecked")
        assert engine.wait(60)
        node = adapter.node("gpu03")
        assert node["reason"] == admin and "DRAIN" in node["state_flags"]
        assert "gpu03" not in engine.memory.taken_out  # theirs now
    finally:
        engine.close()
        slurm.run("scontrol", "update", "NodeName=gpu03", "State=RESUME")


def test_the_node_checks_drain_is_gpuwardens_and_a_faulty_spare_leaves_the_pool(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    """Found in review: deploy/slurm/healthcheck.sh drains with ``gpuwarden check: ...``, which
    the engine read as someone else's (its node-check failures then counted for no lemon and
    no outcome); and a hot spare with a fault of its own kept its spare reason, stayed outside
    the blast radius and was put back in service by the next requeue."""
    adapter = SlurmAdapter(conf=str(slurm.conf))
    engine = live_engine(adapter, AuditLog(tmp_path / "audit.jsonl"), max_nodes_out=4)
    try:
        slurm.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN",
                  "Reason=gpuwarden check: disk: /tmp: read-only")  # fmt: skip
        # a fault's drain recorded as intent only (a crash): not taken for done on the
        # check's drain, so that it is redone and the reason becomes the fault's
        drain = Action(ActionKind.DRAIN, "slurm", node="gpu03", reason="gpuwarden: XID 79")
        assert adapter.reconcile(drain, {}) is None
        assert engine.submit(xid_on("gpu03", "XID 79 (CONSTRUCTED)")).verdict == "act"
        assert engine.wait(60)
        assert "gpu03" in engine.memory.taken_out
        # the fault's reason now (found by a review, 2026-11-28): with the check's reason kept,
        # healthcheck.sh resumed the node on its next pass, XID and all, past the return rule
        assert adapter.node("gpu03")["reason"].startswith("gpuwarden: XID 79")
        adapter.hold_spare("gpu04")
        assert adapter.inventory().spares == frozenset({"gpu04"})
        assert engine.submit(xid_on("gpu04", "XID 79 (CONSTRUCTED)")).verdict == "act"
        assert engine.wait(60)
        assert adapter.inventory().spares == frozenset()
        assert adapter.node("gpu04")["reason"].startswith("gpuwarden: XID 79")
    finally:
        engine.close()
        for node in ("gpu03", "gpu04"):
            slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def test_without_a_checkpoint_path_the_step_is_skipped_and_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found in review (as a new operator): the sample's empty ``checkpoint_dir`` and
    ``checkpoint_signal`` made every prediction's checkpoint step fail (the critical
    "action failed" alert each time), with nothing said at start. Now it is skipped, as on
    Kubernetes, and the engine says so when it starts. No Slurm is asked (a bad conf path)."""
    from gpuwarden.remediation.config import load_config
    from gpuwarden.remediation.model import Status

    adapter = SlurmAdapter(conf=str(tmp_path / "no-slurm.conf"))
    ask = Action(ActionKind.CHECKPOINT, "slurm", "gpu01", reason="CONSTRUCTED", finding_id="f1")
    assert adapter.perform(ask).status is Status.SKIPPED
    interval = Action(ActionKind.CHECKPOINT_INTERVAL, "slurm", "", job="77",
                      params={"interval_s": 600}, finding_id="f2")  # fmt: skip
    assert adapter.perform(interval).status is Status.SKIPPED
    with caplog.at_level("WARNING", logger="gpuwarden"):
        load_config(None, environ={})
    said = [r.getMessage() for r in caplog.records if "checkpoint steps of" in r.getMessage()]
    assert said and "predicted-gpu-failure" in said[0] and "are skipped" in said[0], caplog.text
