"""Issue 39: the engine's journal. Nothing lost, nothing done twice, through a full disk, a
restart and a power cut; one engine per audit log.

The full disk is real: a size-limited tmpfs this test mounts (root, as CI runs), filled to
ENOSPC by a filler file. Findings are CONSTRUCTED; the scheduler is the in-memory
:class:`testbed.scheduler.RecordingAdapter`, which counts every call that changes a node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.audit import (
    AuditLog,
    AuditLogBusyError,
    read_records,
    replay,
)
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import Action, ActionKind, Outcome, Status
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from gpuwarden.remediation.server import Endpoint
from testbed.scheduler import RecordingAdapter
from tests.full_disk import fill

TOKEN = "t0ken"
NODES = {f"gpu{i:02d}": "p" for i in range(1, 11)}


def xid(node: str, t_ns: int | None = None, summary: str = "") -> Finding:
    """A CONSTRUCTED fatal XID 79 from the agent's fast path."""
    return Finding(
        kind="gpu_xid",
        subject={"cluster": "c", "node": node, "gpu": "0"},
        severity=Severity.CRITICAL,
        time_ns=time.time_ns() if t_ns is None else t_ns,
        evidence={"xid": 79},
        summary=summary or f"{node} GPU 0: XID 79 (fallen off the bus)",
        source="agent",
    )


def engine_on(audit: Path, adapter: RecordingAdapter, **kw: object) -> Engine:
    s = EngineSettings(dry_run=False, max_nodes_out=5, max_fraction_out=1.0, **kw)  # type: ignore[arg-type]
    return Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": adapter, "webhook": RecordingAdapter("webhook")},
        AuditLog(audit),
        s,
    )


def post(endpoint: Endpoint, finding: Finding) -> int:
    body = json.dumps(finding.to_json()).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Length": str(len(body))}
    status, _ = endpoint.handle("POST", "/v1/findings", headers, lambda n: body[:n])
    return int(status)


def drains(adapter: RecordingAdapter) -> list[str]:
    return [a.node for a in adapter.calls if a.kind in (ActionKind.DRAIN, ActionKind.CORDON)]


def test_a_finding_a_full_disk_refused_is_decided_when_sent_again(small_disk: Path) -> None:
    """Before: the finding was marked seen before its audit record, so the retry once space
    returned got 409 duplicate and the node was never drained."""
    adapter = RecordingAdapter("slurm", NODES)
    engine = engine_on(small_disk / "audit.jsonl", adapter)
    endpoint = Endpoint(engine, TOKEN)
    findings = [xid(n) for n in ("gpu01", "gpu02", "gpu03")]
    filler = fill(small_disk)
    assert [post(endpoint, f) for f in findings] == [503, 503, 503]
    assert drains(adapter) == []  # nothing decided, nothing done
    filler.unlink()
    assert [post(endpoint, f) for f in findings] == [202, 202, 202]
    assert [post(endpoint, f) for f in findings] == [409, 409, 409]  # now they are duplicates
    assert engine.wait(30)
    assert sorted(drains(adapter)) == ["gpu01", "gpu02", "gpu03"]  # each once
    decided = [r for r in read_records(engine.audit.path) if r["event"] == "decision"]
    assert [r["verdict"] for r in decided].count("act") == 3
    engine.close()


class FillsTheDisk(RecordingAdapter):
    """Drains the node, then the disk fills before the engine can record it: the action's
    record must wait for space, not vanish inside the worker thread."""

    def __init__(self, disk: Path) -> None:
        super().__init__("slurm", NODES)
        self.disk = disk
        self.filler: Path | None = None

    def perform(self, action: Action) -> Outcome:
        outcome = super().perform(action)
        if action.kind is ActionKind.DRAIN and self.filler is None:
            self.filler = fill(self.disk)
        return outcome


def test_an_action_done_while_the_disk_fills_is_recorded_once_space_returns(
    small_disk: Path,
) -> None:
    adapter = FillsTheDisk(small_disk)
    engine = engine_on(small_disk / "audit.jsonl", adapter)
    # each action record carries the summary: at 4.5 KB it needs a page the full disk lacks
    # (tmpfs gives a file whole pages, so a short record could still fit in the last one)
    finding = xid("gpu04", summary="XID 79 " + "x" * 4000)  # (at most 4,096 characters)
    assert engine.submit(finding).verdict == "act"
    deadline = time.monotonic() + 60
    while adapter.filler is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert adapter.filler is not None
    assert not engine.wait(1.0)  # the plan waits for its record
    adapter.filler.unlink()
    assert engine.wait(60)
    actions = [r for r in read_records(engine.audit.path) if r["event"] == "action"]
    drained = [r for r in actions if r["action"] == "drain"]
    assert len(drained) == 1 and drained[0]["outcome"] == "ok"
    assert drains(adapter) == ["gpu04"]
    # and the plan went on after it: the requeue ran and was recorded too
    assert [r["action"] for r in actions if r["action"] != "notify"] == ["drain", "requeue"]
    engine.close()


def test_an_unfinished_plan_resumes_after_a_restart_without_repeating(tmp_path: Path) -> None:
    """The log of an engine killed after its drain's intent and before its record (the drain
    took effect): the next engine records the drain from the scheduler's state and goes on."""
    adapter = RecordingAdapter("slurm", NODES)
    audit = tmp_path / "audit.jsonl"
    first = engine_on(audit, adapter)
    finding = xid("gpu05")
    first.submit(finding)
    assert first.wait(30)
    first.close()
    records = list(read_records(audit))
    # cut the log back to just after the drain's intent, as a SIGKILL there leaves it
    cut = next(
        i for i, r in enumerate(records) if r["event"] == "intent" and r["action"] == "drain"
    )
    audit.write_text("".join(json.dumps(r) + "\n" for r in records[: cut + 1]))
    drained_before = drains(adapter)
    assert drained_before == ["gpu05"]

    class Reconciles(RecordingAdapter):
        def observe(self, action: Action) -> dict[str, object]:
            return {}

        def reconcile(self, action: Action, before: object) -> Outcome | None:
            if action.kind is ActionKind.DRAIN and action.node in self.out:
                return Outcome(Status.OK, f"{action.node} is out")
            return None

    world = Reconciles("slurm", NODES)
    world.out = set(adapter.out)  # the scheduler's real state: gpu05 is out
    second = engine_on(audit, world)
    assert [d.plan_id for d in second.resume()] == [finding.id]
    assert second.wait(30)
    assert second.submit(finding).verdict == "duplicate"
    assert drains(world) == []  # reconciled, not done again
    assert [a.kind for a in world.calls] == [ActionKind.REQUEUE]  # the rest of the ladder
    after = [r for r in read_records(audit) if r["event"] == "action"]
    drain = [r for r in after if r["action"] == "drain"]
    assert len(drain) == 1 and drain[0]["resumed"] == "reconciled"
    second.close()


def test_a_waiting_plan_survives_a_restart_and_expires(tmp_path: Path) -> None:
    """Before: waiting plans lived in memory only, and a plan the blast radius held days ago
    still ran when room freed up."""
    adapter = RecordingAdapter("slurm", NODES)
    adapter.out = {"gpu01", "gpu02"}  # someone else's drains fill the blast radius
    audit = tmp_path / "audit.jsonl"
    now = [time.time()]
    s = EngineSettings(dry_run=False, max_nodes_out=2, max_fraction_out=1.0,
                       pending_expire_s=3600.0)  # fmt: skip
    policies = load_policies(DEFAULT_POLICIES)
    adapters = {"slurm": adapter, "webhook": RecordingAdapter("webhook")}
    first = Engine(policies, adapters, AuditLog(audit), s, clock=lambda: now[0])
    finding = xid("gpu06")
    assert first.submit(finding).verdict == "blast_radius"
    first.close()

    second = Engine(policies, adapters, AuditLog(audit), s, clock=lambda: now[0])
    assert [p["plan_id"] for p in second.pending()] == [finding.id]
    now[0] += 3601.0  # an hour later, room frees up
    adapter.out.clear()
    assert second.tick() == []
    assert second.pending() == []
    assert drains(adapter) == []
    expired = [r for r in read_records(audit) if r["event"] == "expired"]
    assert [r["finding_id"] for r in expired] == [finding.id]
    second.close()
    assert replay(audit).waiting == []  # and it stays expired after another restart


def test_an_approval_on_disk_holds_after_a_restart(tmp_path: Path) -> None:
    """Issue 38: an operator's approval is journalled before it is acted on, and it holds. The
    log of an engine killed right after the ``approval`` record (before the approved plan was
    decided again) used to bring the plan back as waiting for approval: the operator had been
    told nothing, and the drain they approved waited for a second approval. Now the next
    engine runs it as approved, once."""
    adapter = RecordingAdapter("slurm", NODES)
    audit = tmp_path / "audit.jsonl"
    first = engine_on(audit, adapter, approval=("drain",))
    finding = xid("gpu07")
    assert first.submit(finding).verdict == "approval"
    assert first.approve(finding.id, by="alice").verdict == "act"
    assert first.wait(30)
    first.close()
    records = list(read_records(audit))
    cut = next(i for i, r in enumerate(records) if r["event"] == "approval")
    audit.write_text("".join(json.dumps(r) + "\n" for r in records[: cut + 1]))
    assert replay(audit).approved == {finding.id: "alice"}

    world = RecordingAdapter("slurm", NODES)
    second = engine_on(audit, world, approval=("drain",))
    assert [d.verdict for d in second.resume()] == ["act"]
    assert second.wait(30)
    assert drains(world) == ["gpu07"]
    assert second.pending() == []
    second.close()
    # and once: a third start finds the plan decided and done, nothing approved or waiting
    memory = replay(audit)
    assert memory.approved == {} and memory.waiting == [] and memory.unfinished == []


def test_an_approved_plan_the_blast_radius_held_stays_approved_after_a_restart(
    tmp_path: Path,
) -> None:
    """docs/SECURITY.md's hole 7: an operator approved a drain, the blast radius then held it,
    and the engine restarted. Before: the plan came back waiting as if never approved, and
    when room freed up it met the approval guard again and waited for a second approval. Now
    it is released as approved, and drained once."""
    adapter = RecordingAdapter("slurm", NODES)
    adapter.out = {"gpu01", "gpu02"}  # someone else's drains fill the blast radius
    audit = tmp_path / "audit.jsonl"
    s = EngineSettings(dry_run=False, max_nodes_out=2, max_fraction_out=1.0,
                       approval=("drain",))  # fmt: skip
    policies = load_policies(DEFAULT_POLICIES)
    adapters = {"slurm": adapter, "webhook": RecordingAdapter("webhook")}
    first = Engine(policies, adapters, AuditLog(audit), s)
    finding = xid("gpu08")
    assert first.submit(finding).verdict == "approval"
    assert first.approve(finding.id, by="alice").verdict == "blast_radius"
    first.close()

    second = Engine(policies, adapters, AuditLog(audit), s)
    assert [p["plan_id"] for p in second.pending()] == [finding.id]
    adapter.out.clear()  # room frees up
    assert [d.verdict for d in second.tick()] == ["act"]
    assert second.wait(30)
    assert drains(adapter) == ["gpu08"]
    second.close()


def test_an_approval_on_disk_past_its_plans_expiry_does_not_run(tmp_path: Path) -> None:
    """Review: a plan approved just before a stop that lasted days ran on the next start,
    although any plan waiting that long is expired (``pending_expire_s``). Now resume() expires
    waiting plans first: the approved one gets its ``expired`` record and nothing is drained."""
    adapter = RecordingAdapter("slurm", NODES)
    audit = tmp_path / "audit.jsonl"
    now = [time.time()]
    s = EngineSettings(dry_run=False, max_nodes_out=5, max_fraction_out=1.0,
                       approval=("drain",), pending_expire_s=3600.0)  # fmt: skip
    policies = load_policies(DEFAULT_POLICIES)
    adapters = {"slurm": adapter, "webhook": RecordingAdapter("webhook")}
    first = Engine(policies, adapters, AuditLog(audit), s, clock=lambda: now[0])
    finding = xid("gpu09")
    assert first.submit(finding).verdict == "approval"
    assert first.approve(finding.id, by="alice").verdict == "act"
    assert first.wait(30)
    first.close()
    records = list(read_records(audit))
    cut = next(i for i, r in enumerate(records) if r["event"] == "approval")
    audit.write_text("".join(json.dumps(r) + "\n" for r in records[: cut + 1]))
    now[0] += 3 * 86400.0  # the engine was down three days
    world = RecordingAdapter("slurm", NODES)
    second = Engine(policies, {"slurm": world, "webhook": RecordingAdapter("webhook")},
                    AuditLog(audit), s, clock=lambda: now[0])  # fmt: skip
    assert second.resume() == []
    assert drains(world) == [] and second.pending() == []
    assert [r["finding_id"] for r in read_records(audit) if r["event"] == "expired"] == [finding.id]
    second.close()


def test_an_approval_the_journal_refuses_leaves_the_plan_waiting(tmp_path: Path) -> None:
    """Review: approve() took the plan out of the waiting list before its records were on
    disk; when the decision record failed (a full disk) the operator was told to retry, the
    retry got 'no pending plan', and the plan ran on the next restart. Now it waits again (as
    approved, since that record is on disk), and the retry runs it once."""
    from gpuwarden.remediation.audit import JournalError

    adapter = RecordingAdapter("slurm", NODES)
    audit = tmp_path / "audit.jsonl"
    engine = engine_on(audit, adapter, approval=("drain",))
    finding = xid("gpu10")
    assert engine.submit(finding).verdict == "approval"
    calls = [0]

    def second_record_fails() -> None:
        calls[0] += 1
        if calls[0] == 2:  # the approval is written, the decision is not
            raise JournalError("disk full (CONSTRUCTED)")

    engine.audit.fence = second_record_fails
    with pytest.raises(JournalError):
        engine.approve(finding.id, by="alice")
    engine.audit.fence = None
    assert [p["plan_id"] for p in engine.pending()] == [finding.id]
    assert drains(adapter) == []
    assert engine.approve(finding.id, by="alice").verdict == "act"
    assert engine.wait(30)
    assert drains(adapter) == ["gpu10"]
    engine.close()


def test_an_approval_is_spent_when_its_plan_is_dropped(tmp_path: Path) -> None:
    """Review: replay kept every approved plan id for good, so a plan approved, then dropped
    (``queue_full``, or ``expired``), then sent again and held by the blast radius came back
    after a restart as approved, though nobody approved this one. Journal records written as
    the engine writes them (CONSTRUCTED)."""
    audit = AuditLog(tmp_path / "audit.jsonl")
    plan = [{"action_id": "a1", "action": "drain", "node": "gpu01"}]
    t = time.time()
    dropped: list[tuple[str, dict[str, Any]]] = [
        ("finding", {}),
        ("decision", {"verdict": "approval", "plan": plan}),
        ("approval", {"by": "alice"}),
        ("decision", {"verdict": "queue_full"}),
        ("finding", {}),
        ("decision", {"verdict": "blast_radius", "plan": plan}),
    ]
    for event, fields in dropped:
        audit.append(event, t, finding_id="f1", **fields)
    memory = replay(audit.path)
    assert [p.decision["verdict"] for p in memory.waiting] == ["blast_radius"]
    assert memory.approved_plans == set() and memory.approved == {}
    # without the drop, the approval holds for the plan held after it
    audit2 = AuditLog(tmp_path / "audit2.jsonl")
    held: list[tuple[str, dict[str, Any]]] = [
        ("finding", {}),
        ("decision", {"verdict": "approval", "plan": plan}),
        ("approval", {"by": "alice"}),
        ("decision", {"verdict": "blast_radius", "plan": plan}),
    ]
    for event, fields in held:
        audit2.append(event, t, finding_id="f1", **fields)
    assert replay(audit2.path).approved_plans == {"f1"}


def test_one_engine_per_audit_log(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    first = AuditLog(audit, exclusive=True)
    with pytest.raises(AuditLogBusyError, match=f"pid {os.getpid()}"):
        AuditLog(audit, exclusive=True)
    # `remediate apply` beside it is refused with that message, exit 2
    config = tmp_path / "remediation.toml"
    config.write_text(f'[engine]\naudit_log = "{audit}"\nnode_adapter = ""\n'
                      'notify_adapter = ""\ncheckpoint_adapter = ""\n')  # fmt: skip
    findings = tmp_path / "f.json"
    findings.write_text(json.dumps([xid("gpu07").to_json()]))
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(config), "apply",
         str(findings)], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "one engine per audit log" in done.stderr
    first.close()
    AuditLog(audit, exclusive=True).close()  # free again once the holder is gone


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=12),
    where=st.floats(min_value=0.0, max_value=1.0),
    length=st.integers(min_value=0, max_value=300),
    zero=st.booleans(),
)
def test_a_power_cut_never_breaks_replay_and_counts_what_it_lost(
    tmp_path_factory: pytest.TempPathFactory, n: int, where: float, length: int, zero: bool
) -> None:
    """Truncate the journal, or zero-fill part of it, at an arbitrary offset (what a power cut
    with unflushed pages leaves): replay never fails, every record wholly before the damage is
    kept, and each damaged line is counted as torn."""
    path = tmp_path_factory.mktemp("cut") / "audit.jsonl"
    log = AuditLog(path)
    for i in range(n):
        log.append("finding", float(i), finding_id=f"f{i}", kind="gpu_xid", subject={"node": "n"})
        log.append("decision", float(i), finding_id=f"f{i}", verdict="no_policy", plan=[])
    data = path.read_bytes()
    offset = int(where * len(data))
    if zero:
        data = data[:offset] + b"\0" * min(length, len(data) - offset) + data[offset + length :]
    else:
        data = data[:offset]
    path.write_bytes(data)
    lines = data.split(b"\n")
    whole_before = data[:offset].count(b"\n")
    memory = replay(path)
    kept = list(read_records(path))
    assert len(kept) >= whole_before
    damaged = [ln for ln in lines if ln.strip() and not _is_json(ln)]
    assert len(memory.torn_lines) == len(damaged)
    # every decision whose line survived counts its finding as seen
    for r in kept:
        if r["event"] == "decision":
            assert r["finding_id"] in memory.seen_findings
    # and a new engine can append after the damage: its record is whole
    AuditLog(path).append("finding", 99.0, finding_id="after")
    assert list(read_records(path))[-1]["finding_id"] == "after"


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
