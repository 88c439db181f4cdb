"""Issue 7, must-show 4: the engine's guards, as properties over floods of (SIMULATED) findings."""

from __future__ import annotations

import math
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import MUTATING, ActionKind
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from tests.remediation_util import RecordingAdapter, risk

NODES = {f"gpu{i:02d}": ("a" if i < 12 else "b") for i in range(20)}
POLICIES = load_policies(DEFAULT_POLICIES)


def make_engine(
    tmp: Path, **overrides: object
) -> tuple[Engine, RecordingAdapter, RecordingAdapter]:
    sched = RecordingAdapter("slurm", NODES)
    notes = RecordingAdapter("webhook")
    # predicted_kinds=(): these tests return nodes a risk finding took out, to test the other
    # guards; the prediction's hold is tests/test_prediction_holds.py's
    base = {"dry_run": False, "cooldown_s": 0.0, "actions_per_minute": 10_000,
            "predicted_kinds": ()}  # fmt: skip
    engine = Engine(
        POLICIES,
        {"slurm": sched, "webhook": notes},
        AuditLog(tmp / "audit.jsonl"),
        EngineSettings(**(base | overrides)),  # type: ignore[arg-type]
    )
    return engine, sched, notes


def xid(node: str, t_ns: int) -> Finding:
    return Finding(
        kind="gpu_xid",
        subject={"cluster": "test", "node": node, "gpu": "0"},
        severity=Severity.CRITICAL,
        time_ns=t_ns,
        evidence={"xid": 79},
        confidence=1.0,
        summary=f"XID 79 on {node}",
        source="agent",
    )


flood = st.lists(
    st.tuples(
        st.sampled_from(sorted(NODES)),
        st.sampled_from(["risk", "xid", "straggler"]),
        st.integers(0, 20),  # time bucket: repeats of one observation share an id
    ),
    min_size=1,
    max_size=60,
)


def finding_of(node: str, what: str, bucket: int) -> Finding:
    t_ns = 1_790_000_000_000_000_000 + bucket * 300_000_000_000
    if what == "risk":
        return risk(node, 0.95, t_ns)
    if what == "xid":
        return xid(node, t_ns)
    return Finding(
        kind="straggler",
        subject={"cluster": "test", "job": "j1", "node": node},
        severity=Severity.WARNING,
        time_ns=t_ns,
        evidence={"cause": "gpu"},
        confidence=0.9,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    findings=flood,
    max_nodes=st.integers(1, 6),
    fraction=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    already_out=st.sets(st.sampled_from(sorted(NODES)), max_size=3),
)
def test_blast_radius_is_never_exceeded(
    findings: list[tuple[str, str, int]], max_nodes: int, fraction: float, already_out: set[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine, sched, _ = make_engine(
            Path(tmp), max_nodes_out=max_nodes, max_fraction_out=fraction
        )
        sched.out |= already_out  # someone else's drains count too
        per_part_max: dict[str, int] = {}
        original = sched.perform

        def perform_and_measure(action):
            outcome = original(action)
            for part in ("a", "b"):
                n = sum(1 for x in sched.out - already_out if NODES[x] == part)
                per_part_max[part] = max(per_part_max.get(part, 0), n)
            return outcome

        sched.perform = perform_and_measure
        threads = [threading.Thread(target=engine.submit, args=(finding_of(*f),)) for f in findings]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        engine.tick()
        assert engine.wait(30)
        engine.close()
        new_out = sched.out - already_out
        # the limit holds for what the engine added, on top of what was already out
        assert len(sched.out) <= max(max_nodes, len(already_out))
        if new_out:
            assert len(sched.out) <= max_nodes
        for part, n in per_part_max.items():
            size = sum(1 for p in NODES.values() if p == part)
            already = sum(1 for x in already_out if NODES[x] == part)
            # the share of the partition, rounded down but at least one node
            allowed = max(1, math.floor(fraction * size + 1e-9))
            assert n == 0 or n + already <= allowed
        # every plan the limit stopped is waiting for a human, and a human was told
        waiting = [p for p in engine.pending() if p["verdict"] == "blast_radius"]
        for p in waiting:
            assert p["node"] not in new_out


@settings(max_examples=25, deadline=None)
@given(copies=st.integers(2, 8), bucket=st.integers(0, 5))
def test_a_duplicate_finding_acts_once(copies: int, bucket: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine, sched, notes = make_engine(Path(tmp), max_nodes_out=5, max_fraction_out=1.0)
        finding = finding_of("gpu03", "risk", bucket)
        verdicts: list[str] = []
        threads = [
            threading.Thread(target=lambda: verdicts.append(engine.submit(finding).verdict))
            for _ in range(copies)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert engine.wait(30)
        assert sorted(verdicts) == ["act"] + ["duplicate"] * (copies - 1)
        assert [a.kind for a in sched.calls] == ["checkpoint", "drain", "requeue"]
        assert len(notes.calls) == 1
        # and after a restart, the audit log remembers it
        engine.close()
        again, sched2, _ = make_engine(Path(tmp), max_nodes_out=5, max_fraction_out=1.0)
        assert again.submit(finding).verdict == "duplicate"
        assert again.wait(10) and sched2.calls == []
        again.close()


@settings(max_examples=25, deadline=None)
@given(findings=flood)
def test_dry_run_changes_nothing_on_the_target(findings: list[tuple[str, str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine, sched, notes = make_engine(
            Path(tmp), dry_run=True, max_nodes_out=20, max_fraction_out=1.0
        )
        for f in findings:
            engine.submit(finding_of(*f))
        assert engine.wait(30)
        engine.close()
        assert sched.calls == [] and sched.out == set()
        assert all(a.kind is ActionKind.NOTIFY for a in notes.calls)
        audited = [r for r in read_records(Path(tmp) / "audit.jsonl") if r["event"] == "action"]
        mutating = [r for r in audited if ActionKind(r["action"]) in MUTATING]
        assert all(r["dry_run"] and r["outcome"] == "dry_run" for r in mutating)
        assert all(r["message"].startswith("would ") for r in mutating)


def test_cooldown_approval_rate_limit_and_release(tmp_path: Path) -> None:
    engine, sched, notes = make_engine(
        tmp_path,
        max_nodes_out=1,
        max_fraction_out=1.0,
        cooldown_s=3600.0,
        actions_per_minute=3,
        return_requires="approval",
    )
    first = engine.submit(finding_of("gpu01", "risk", 0))
    assert first.verdict == "act"
    assert engine.wait(10)
    # another finding about the same node inside the cooldown: only a notification
    again = engine.submit(finding_of("gpu01", "xid", 1))
    assert again.verdict == "cooldown" and [a.kind for a in again.actions] == ["notify"]
    # a second node would exceed max_nodes_out=1: queued, a human told
    second = engine.submit(finding_of("gpu02", "risk", 0))
    assert second.verdict == "blast_radius" and "max_nodes_out=1" in second.why
    assert engine.wait(10)
    assert any("needs a human (blast_radius)" in a.reason for a in notes.calls)
    assert [p["node"] for p in engine.pending()] == ["gpu02"]
    # gpu01 comes back: the queued plan runs by itself on the next tick... but the rate limit
    # (3 actions a minute, 3 used) holds it until the minute has passed
    sched.out.discard("gpu01")
    assert engine.tick() == []
    engine.guards.recent.clear()  # the minute passes
    released = engine.tick()
    assert [d.finding_id for d in released] == [second.finding_id]
    assert engine.wait(10)
    assert "gpu02" in sched.out
    # return_requires = "approval": a node_healthy finding proposes uncordon, which waits for
    # an operator
    healthy = Finding(
        kind="node_healthy", subject={"node": "gpu02"}, severity=Severity.INFO, time_ns=1
    )
    assert engine.submit(healthy).verdict == "approval"
    assert "gpu02" in sched.out
    engine.guards.recent.clear()
    assert engine.approve(healthy.id, by="test").verdict == "act"
    assert engine.wait(10)
    assert "gpu02" not in sched.out
    with pytest.raises(KeyError):
        engine.approve("nope")
    engine.close()


def test_failing_adapter_stops_the_ladder_and_is_audited(tmp_path: Path) -> None:
    engine, sched, _ = make_engine(tmp_path, max_nodes_out=5, max_fraction_out=1.0)

    def broken(action):
        from gpuwarden.remediation.model import AdapterError

        if action.kind is ActionKind.DRAIN:
            raise AdapterError("scontrol: Invalid node name specified")
        return RecordingAdapter.perform(sched, action)

    sched.perform = broken
    engine.submit(finding_of("gpu04", "risk", 0))
    assert engine.wait(10)
    engine.close()
    records = [r for r in read_records(tmp_path / "audit.jsonl") if r["event"] == "action"]
    assert [(r["action"], r["outcome"]) for r in records] == [
        ("notify", "ok"),
        ("checkpoint", "ok"),
        ("drain", "failed"),
    ]
    assert "Invalid node name" in records[-1]["message"]


def test_torn_audit_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    engine, _, _ = make_engine(tmp_path, max_nodes_out=5, max_fraction_out=1.0)
    f = finding_of("gpu05", "risk", 0)
    engine.submit(f)
    assert engine.wait(10)
    engine.close()
    with (tmp_path / "audit.jsonl").open("a") as fh:
        fh.write('{"event": "action", "action_id": "tor')  # power cut mid-write
    again, _, _ = make_engine(tmp_path, max_nodes_out=5, max_fraction_out=1.0)
    assert again.memory.torn_lines and f.id in again.memory.seen_findings
    assert "gpu05" in again.memory.taken_out
    again.close()


def test_repaired_nodes_come_back_but_only_ours(tmp_path: Path) -> None:
    engine, sched, _ = make_engine(
        tmp_path,
        max_nodes_out=5,
        max_fraction_out=1.0,
        cooldown_s=3600.0,
        approval=(),
        return_requires="none",
    )
    engine.submit(finding_of("gpu01", "risk", 0))
    assert engine.wait(10) and "gpu01" in sched.out
    sched.out.add("gpu09")  # an admin's maintenance drain

    def healthy(node: str) -> Finding:
        return Finding(
            kind="node_healthy", subject={"node": node}, severity=Severity.INFO, time_ns=5
        )

    # inside the cooldown, and that is fine: putting a repaired node back disrupts nothing
    assert engine.submit(healthy("gpu01")).verdict == "act"
    decision = engine.submit(healthy("gpu09"))
    assert decision.verdict == "not_ours" and "did not take gpu09 out" in decision.why
    assert engine.wait(10)
    engine.close()
    assert sched.out == {"gpu09"}


def _clocked(tmp: Path, now: list[float], **overrides: object):
    """An engine whose clock (guards, audit, memory) is ``now[0]``."""
    sched = RecordingAdapter("slurm", NODES)
    notes = RecordingAdapter("webhook")
    base = {"dry_run": False, "actions_per_minute": 10_000, "max_nodes_out": 5,
            "max_fraction_out": 1.0, "approval": (), "return_requires": "none",
            "predicted_kinds": ()}  # fmt: skip
    engine = Engine(
        POLICIES,
        {"slurm": sched, "webhook": notes},
        AuditLog(tmp / "audit.jsonl"),
        EngineSettings(**(base | overrides)),  # type: ignore[arg-type]
        clock=lambda: now[0],
    )
    return engine, sched, notes


def _xid(node: str, bucket: int) -> Finding:
    return xid(node, 1_790_000_000_000_000_000 + bucket * 300_000_000_000)


def _healthy(node: str, bucket: int) -> Finding:
    return Finding(
        kind="node_healthy",
        subject={"node": node},
        severity=Severity.INFO,
        time_ns=1_790_000_000_000_000_000 + bucket * 300_000_000_000,
        summary=f"{node} repaired",
    )


def test_a_node_that_breaks_right_after_it_returns_comes_out_again(tmp_path: Path) -> None:
    """Returning a node must not start the cooldown: it did before, so an XID minutes after a
    repair only notified, and Slurm put the requeued job back on the broken node."""
    now = [1_790_000_000.0]
    engine, sched, _ = _clocked(tmp_path, now, cooldown_s=1800.0)
    assert engine.submit(_xid("gpu03", 1)).verdict == "act"
    assert engine.wait(10) and "gpu03" in sched.out
    now[0] += 2000.0  # repaired after the cooldown
    assert engine.submit(_healthy("gpu03", 1)).verdict == "act"
    assert engine.wait(10) and "gpu03" not in sched.out
    now[0] += 60.0  # breaks again a minute later
    again = engine.submit(_xid("gpu03", 2))
    assert again.verdict == "act", again.why
    assert engine.wait(10) and "gpu03" in sched.out
    engine.close()


def test_a_lemon_stays_out_until_an_operator_returns_it(tmp_path: Path) -> None:
    now = [1_790_000_000.0]
    engine, sched, notes = _clocked(
        tmp_path, now, cooldown_s=0.0, lemon_count=3, lemon_window_s=86400.0
    )
    for i in range(3):
        assert engine.submit(_xid("gpu04", i + 1)).verdict == "act"
        assert engine.wait(10) and "gpu04" in sched.out
        now[0] += 600.0
        back = engine.submit(_healthy("gpu04", i + 1))
        if i < 2:  # twice: it comes back by itself
            assert back.verdict == "act", back.why
            assert engine.wait(10) and "gpu04" not in sched.out
        now[0] += 600.0
    # the third time it is a lemon: it stays out, a person is told its history
    assert back.verdict == "lemon"
    assert "taken out 3 times in 1 days" in back.why and "XID 79 on gpu04" in back.why
    assert back.why.count("Z ") == 3  # when, each time
    assert engine.wait(10) and "gpu04" in sched.out
    assert any("needs a human (lemon)" in a.reason for a in notes.calls)
    assert [p["node"] for p in engine.pending()] == ["gpu04"]
    # another node taken out once is no lemon
    assert engine.submit(_xid("gpu05", 9)).verdict == "act"
    assert engine.wait(10)
    now[0] += 600.0
    assert engine.submit(_healthy("gpu05", 9)).verdict == "act"
    # the operator returns the lemon
    assert engine.approve(back.finding_id, by="test").verdict == "act"
    assert engine.wait(10) and "gpu04" not in sched.out
    # a day later the window has passed: no longer a lemon
    assert engine.guards.lemon("gpu04") != []
    now[0] += 86400.0
    assert engine.guards.lemon("gpu04") == []
    engine.close()
    # the history survives a restart (rebuilt from the audit log)
    again, _, _ = _clocked(tmp_path, now, lemon_count=3, lemon_window_s=10 * 86400.0)
    assert len(again.memory.taken_out_at["gpu04"]) == 3
    again.close()


def test_a_released_plan_meets_every_guard_again(tmp_path: Path) -> None:
    """A plan the rate limit held is checked again by every guard when released, not waved
    through as if an operator had approved it (docs/SECURITY.md, known hole 7: before, a held
    ``node_healthy`` returned a node that was taken out again, for a new fault, while it
    waited, on a check older than that removal). CONSTRUCTED findings, a fake clock."""
    now = [1_800_000_000.0]
    sched, notes = RecordingAdapter("slurm", NODES), RecordingAdapter("webhook")
    engine = Engine(
        POLICIES,
        {"slurm": sched, "webhook": notes},
        AuditLog(tmp_path / "audit.jsonl"),
        EngineSettings(
            dry_run=False,
            cooldown_s=0.0,
            actions_per_minute=3,
            max_nodes_out=5,
            max_fraction_out=1.0,
            predicted_kinds=(),  # the rate limit's test; the hold: tests/test_prediction_holds.py
        ),
        clock=lambda: now[0],
    )
    first = risk("gpu01", 0.95, int(now[0] * 1e9))
    assert engine.submit(first).verdict == "act"  # checkpoint, drain, requeue: the minute's 3
    assert engine.wait(10) and "gpu01" in sched.out
    now[0] += 30
    healthy = Finding(
        kind="node_healthy",
        subject={"cluster": "test", "node": "gpu01"},
        severity=Severity.INFO,
        time_ns=int(now[0] * 1e9),
        evidence={"check": "pass", "checked_ns": int(now[0] * 1e9)},
    )
    assert engine.submit(healthy).verdict == "rate_limited"
    now[0] += 61
    engine.undo("gpu01", by="test")  # an operator returns it by hand ...
    assert engine.wait(10) and "gpu01" not in sched.out
    # ... and it breaks again, for a new fault, while the return still waits: taken out anew
    assert engine.submit(xid("gpu01", int(now[0] * 1e9))).verdict == "act"
    assert engine.wait(10) and "gpu01" in sched.out
    released = engine.tick()  # (before: held while the minute was full, then run as approved)
    now[0] += 61
    released += engine.tick()
    assert [d.verdict for d in released] == ["unchecked"]  # the check predates the removal
    assert engine.wait(10)
    assert "gpu01" in sched.out and engine.pending() == []
    engine.close()


def test_the_seen_finding_memory_is_bounded_by_its_retention(tmp_path: Path) -> None:
    """With ``seen_retention_s`` (what ``remediate serve`` sets past the endpoint's staleness
    limit), ids older than it are forgotten at each tick and after a restart (before: kept for
    ever, in memory and rebuilt from the whole journal; docs/SECURITY.md known hole 5). Inside
    the retention a re-send is still a duplicate. CONSTRUCTED findings, a fake clock."""
    now = [1_800_000_000.0]
    keep = 3600.0 + 300.0 + 60.0

    def engine_at() -> tuple[Engine, RecordingAdapter]:
        sched = RecordingAdapter("slurm", NODES)
        return Engine(
            POLICIES,
            {"slurm": sched, "webhook": RecordingAdapter("webhook")},
            AuditLog(tmp_path / "audit.jsonl"),
            EngineSettings(dry_run=True, seen_retention_s=keep),
            clock=lambda: now[0],
        ), sched

    engine, _ = engine_at()
    old = [xid(node, int(now[0] * 1e9)) for node in sorted(NODES)[:10]]
    for f in old:
        assert engine.submit(f).verdict in ("dry_run", "blast_radius")
    now[0] += keep / 2
    assert engine.submit(old[0]).verdict == "duplicate"
    fresh = xid("gpu15", int(now[0] * 1e9))
    engine.submit(fresh)
    now[0] += keep / 2 + 1
    engine.tick()
    assert engine.memory.seen_findings == {fresh.id}
    assert set(engine.memory.finding_digests) <= {fresh.id}
    assert engine.wait(10)
    engine.close()
    again, _ = engine_at()  # a restart rebuilds the memory from the journal: the same bound
    assert again.memory.seen_findings == {fresh.id}
    assert again.submit(fresh).verdict == "duplicate"
    again.close()


def test_a_small_partition_may_have_one_node_out(tmp_path: Path) -> None:
    """Found by a review (2026-11-28): ``max_fraction_out = 0.1`` of a partition of fewer than
    ten nodes allowed none, so a node with a fatal XID stayed in service with jobs landing on
    it (on Kubernetes, one pool per GPU model made such pools common). The share rounds down
    but is at least one node; ``0`` still allows none."""
    small = {f"gpu{i:02d}": "small" for i in range(8)}
    sched = RecordingAdapter("slurm", small)
    engine = Engine(POLICIES, {"slurm": sched, "webhook": RecordingAdapter("webhook")},
                    AuditLog(tmp_path / "audit.jsonl"),
                    EngineSettings(dry_run=False, cooldown_s=0.0, max_nodes_out=4,
                                   max_fraction_out=0.1, predicted_kinds=()))  # fmt: skip
    assert engine.submit(xid("gpu01", time.time_ns())).verdict == "act"
    assert engine.wait(10) and sched.out == {"gpu01"}
    second = engine.submit(xid("gpu02", time.time_ns()))
    assert second.verdict == "blast_radius" and "(1 of 8)" in second.why
    engine.close()
    none = Engine(POLICIES, {"slurm": RecordingAdapter("slurm", small),
                             "webhook": RecordingAdapter("webhook")},
                  AuditLog(tmp_path / "none.jsonl"),
                  EngineSettings(dry_run=False, max_fraction_out=0.0))  # fmt: skip
    assert none.submit(xid("gpu03", time.time_ns())).verdict == "blast_radius"
    none.close()
