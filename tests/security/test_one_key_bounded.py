"""Found in a fourth review (2026-11-28, a helper reviewing as an attacker): what one sender's
key could make the engine do without bound. Each test fails on the code before the fix (shown
by running it there). The findings, alerts and relay lines are CONSTRUCTED.

* an alerts token named nodes the scheduler does not have: each such plan waited while the
  blast radius was full (up to ``max_pending``, each with a page), or failed against the
  scheduler: now ``unknown_node``, journaled and counted, nothing done, nobody paged;
* a node's own key sent 60 critical findings a minute about its node, each a different GPU:
  the ones decided while the first drain ran drained and requeued it again (cooldown starts
  when an action is recorded), and every ``cooldown`` after paged (86,000 a day);
* with ``return_requires = "command"``, 60 ``node_healthy`` a minute about its node (taken
  out, its check made to hang) each ran a return check that held an executor thread for up to
  15 minutes: every other node's plans waited behind them;
* a 1 MB summary grew the journal by 7 MB when acted on (copied into every action's reason);
* an alert whose value is an integer of 400 digits overflowed ``float()``: the connection was
  dropped unanswered, uncounted, and free of quota;
* a job's reporter could write ``rank=r<N>``, a new InfluxDB series per line.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.finding import MAX_EVIDENCE_BYTES, MAX_SUMMARY, Finding, FindingError, Severity
from gpuwarden.remediation.audit import read_records
from gpuwarden.remediation.engine import Engine
from gpuwarden.remediation.model import ActionKind, Outcome, Status
from tests.remediation_util import RecordingAdapter, poll, risk
from tests.security.identity_engine import IdentityEngine
from tests.test_remediation_guards import make_engine as guards_engine


def make_engine(tmp: Path, **settings: Any) -> tuple[Engine, RecordingAdapter, RecordingAdapter]:
    """The guards tests' engine (20 nodes, live, no rate limit), without a partition limit."""
    return guards_engine(tmp, max_fraction_out=1.0, **settings)


def xid(node: str, gpu: str = "0") -> Finding:
    return Finding(kind="gpu_xid", subject={"cluster": "c", "node": node, "gpu": gpu},
                   severity=Severity.CRITICAL, time_ns=time.time_ns(), evidence={"xid": 79},
                   confidence=1.0, summary="XID 79 (CONSTRUCTED)", source="agent")  # fmt: skip


def healthy(node: str, n: int) -> Finding:
    """A passing check, each a finding of its own (``n``: a GPU, to make the id differ)."""
    now = time.time_ns()
    return Finding(kind="node_healthy", subject={"cluster": "c", "node": node, "gpu": str(n)},
                   severity=Severity.INFO, time_ns=now,
                   evidence={"check": "pass", "checked_ns": now}, source="agent")  # fmt: skip


def test_a_node_the_scheduler_does_not_have_is_not_acted_on_nor_queued(tmp_path: Path) -> None:
    engine, sched, notes = make_engine(tmp_path, max_nodes_out=1, cooldown_s=0.0)
    assert engine.submit(xid("gpu01")).verdict == "act"
    assert engine.wait(10)
    told = len(notes.calls)
    # the blast radius is full: every invented name waited, each with a page
    verdicts = {engine.submit(xid(f"ghost-{i:03d}")).verdict for i in range(50)}
    assert verdicts == {"unknown_node"}
    assert engine.pending() == [] and engine.stats.decisions["unknown_node"] == 50
    assert engine.wait(10)
    assert len(notes.calls) == told  # nobody paged
    assert [a.node for a in sched.calls if a.kind is ActionKind.DRAIN] == ["gpu01"]
    why = next(r for r in read_records(tmp_path / "audit.jsonl")
               if r.get("verdict") == "unknown_node")["why"]  # fmt: skip
    assert "slurm has no node named 'ghost-000'" in why
    # a real node still waits for room, and its person is told
    assert engine.submit(xid("gpu02")).verdict == "blast_radius"
    assert [p["node"] for p in engine.pending()] == ["gpu02"]
    engine.close()


def test_a_node_being_acted_on_is_acted_on_once_and_pages_once(tmp_path: Path) -> None:
    engine, sched, notes = make_engine(tmp_path, max_nodes_out=4, cooldown_s=1800.0)
    gate, entered = threading.Event(), threading.Event()
    perform = sched.perform

    def slow(action):  # the first drain takes its time (a checkpoint, a slow scontrol)
        if action.kind is ActionKind.DRAIN:
            entered.set()
            gate.wait(30)
        return perform(action)

    sched.perform = slow
    assert engine.submit(xid("gpu03", "0")).verdict == "act"
    assert entered.wait(10), "the plan under way"
    later = [engine.submit(xid("gpu03", str(g))) for g in range(1, 8)]
    # they wait for it (nobody paged), four at most (max_pending_per_node); the rest are 503s
    # their sender retries, not remembered
    assert [d.verdict for d in later] == ["busy"] * 4 + ["queue_full"] * 3
    assert "under way" in later[0].why
    gate.set()
    assert engine.wait(10)
    released = engine.tick()  # decided again now: acted on just now, so cooldown
    assert engine.wait(10)
    assert [d.verdict for d in released] == ["cooldown"] * 4
    assert [a.kind for a in sched.calls].count(ActionKind.DRAIN) == 1
    assert [a.kind for a in sched.calls].count(ActionKind.REQUEUE) == 1
    # the plan's own notification and one for the cooldown; the other three journaled only
    assert len(released[0].actions) == 1 and all(d.actions == () for d in released[1:])
    assert "told at most once" in released[1].why
    assert len([a for a in notes.calls if a.node == "gpu03"]) == 2
    engine.close()


def test_a_restart_does_not_page_again_for_a_node_in_cooldown(tmp_path: Path) -> None:
    """Found by a review of what a restart forgets (2026-11-28): who was told within the
    cooldown was the process's memory only. After a drain, a later finding in cooldown paged
    once and the next not at all; after a restart (or a standby taking over) the next one
    paged again, and analytics' findings get a fresh id every window. Now rebuilt from the
    journal's decisions."""
    engine, _, notes = make_engine(tmp_path, max_nodes_out=4, cooldown_s=1800.0)
    assert engine.submit(xid("gpu03", "0")).verdict == "act"
    assert engine.wait(10)
    assert engine.submit(xid("gpu03", "1")).verdict == "cooldown"  # told once
    assert engine.wait(10)
    engine.close()
    paged = len(notes.calls)
    engine, _, notes = make_engine(tmp_path, max_nodes_out=4, cooldown_s=1800.0)
    again = engine.submit(xid("gpu03", "2"))
    assert engine.wait(10)
    engine.close()
    assert again.verdict == "cooldown" and again.actions == (), again.why
    assert "told at most once" in again.why
    assert paged == 2 and notes.calls == []


def test_a_fault_while_a_predictions_plan_runs_ends_its_hold(tmp_path: Path) -> None:
    """Found by a third look (a helper) at the busy rule as first written (a cooldown): a
    fatal XID that came while a prediction's plan waited for its checkpoint was cut to a
    notification before the hold existed, so the hold never saw the fault, and the node was
    offered back when the prediction's horizon ended. It now waits for that plan, and then
    ends the hold: the node is out for the fault."""
    engine, sched, _ = make_engine(tmp_path, max_nodes_out=4, cooldown_s=1800.0,
                                   predicted_kinds=("failure_risk",))  # fmt: skip
    gate, entered = threading.Event(), threading.Event()
    perform = sched.perform

    def slow(action):  # the prediction's checkpoint waits for the job
        if action.kind is ActionKind.CHECKPOINT:
            entered.set()
            gate.wait(30)
        return perform(action)

    sched.perform = slow
    r = risk("gpu03")
    prediction = Finding(kind=r.kind, subject=r.subject, severity=r.severity,
                         time_ns=r.time_ns, evidence={"horizon_s": 3600}, probability=0.93,
                         summary=r.summary, source="analytics")  # fmt: skip
    assert engine.submit(prediction).verdict == "act"
    assert entered.wait(10)
    assert engine.submit(xid("gpu03")).verdict == "busy"
    gate.set()
    assert engine.wait(10)
    assert [h["node"] for h in engine.held()] == ["gpu03"]  # the prediction holds it
    assert [d.verdict for d in engine.tick()] == ["cooldown"]
    assert engine.held() == [] and "gpu03" in engine.holds.fault_at  # out for the fault
    engine.close()


def test_a_healthy_node_does_not_make_the_engine_ask_the_scheduler(tmp_path: Path) -> None:
    """A node_healthy about a node gpuwarden did not take out is not_ours: the unknown-node
    look (the scheduler's whole inventory) is not needed for a return, and was made for
    every one (a Slurm health check reports every idle node every 5 minutes)."""
    engine, sched, _ = make_engine(tmp_path)
    asked = []
    inventory = sched.inventory

    def counted():
        asked.append(1)
        return inventory()

    sched.inventory = counted
    assert {engine.submit(healthy("gpu07", n)).verdict for n in range(5)} == {"not_ours"}
    assert asked == []
    engine.close()


def test_a_return_that_failed_is_not_tried_again_within_the_cooldown(tmp_path: Path) -> None:
    engine, sched, _ = make_engine(tmp_path, max_nodes_out=4, cooldown_s=1800.0)
    perform = sched.perform

    def failing_return(action):  # the return check fails (or hangs, then times out)
        if action.kind is ActionKind.UNCORDON:
            sched.calls.append(action)
            return Outcome(Status.FAILED, "return check failed (CONSTRUCTED)")
        return perform(action)

    sched.perform = failing_return
    assert engine.submit(xid("gpu05")).verdict == "act"
    assert engine.wait(10)
    first = engine.submit(healthy("gpu05", 0))
    assert first.verdict == "act"
    assert engine.wait(10)
    again = [engine.submit(healthy("gpu05", n)) for n in range(1, 20)]
    assert engine.wait(10)
    assert {d.verdict for d in again} == {"cooldown"}
    assert "failed" in again[0].why
    assert [a.kind for a in sched.calls].count(ActionKind.UNCORDON) == 1
    # a restart remembers it (the journal's action record)
    engine.close()
    engine2, _, _ = make_engine(tmp_path, max_nodes_out=4, cooldown_s=1800.0)
    assert engine2.submit(healthy("gpu05", 30)).verdict == "cooldown"
    engine2.close()


def test_a_findings_text_and_evidence_are_bounded() -> None:
    """Refused when they arrive (the endpoint's 422); cut to fit when built here."""
    common: dict[str, Any] = {"kind": "gpu_xid", "subject": {"node": "gpu01"},
                              "severity": Severity.CRITICAL, "time_ns": time.time_ns()}  # fmt: skip
    sent = Finding(**common).to_json()
    with pytest.raises(FindingError, match="summary is over"):
        Finding.from_json(sent | {"summary": "x" * (MAX_SUMMARY + 1)})
    with pytest.raises(FindingError, match="evidence is over"):
        Finding.from_json(sent | {"evidence": {"blob": "x" * MAX_EVIDENCE_BYTES}})
    with pytest.raises(FindingError, match="kind is over"):
        Finding(**(common | {"kind": "k" * 65}))
    with pytest.raises(FindingError, match="source is over"):
        Finding(source="s" * 129, **common)


def test_a_finding_built_here_is_cut_to_fit_and_still_taken() -> None:
    """Found by a third look (a helper): the bounds refused what analytics builds on a large
    job, a hang whose summary names 128 nodes (4,626 characters) and a job across a driver
    rollout that lists every node per setting (18 KB), and the whole analysis window was lost.
    Built here, a finding is cut to its bounds, and the engine takes it."""
    nodes = [f"gpu-h100-r{i // 32:02d}-n{i % 32:02d}.cluster.example" for i in range(512)]
    mixed = {"fields": {"driver_version": [{"value": "550.54.15", "nodes": nodes[:256]},
                                           {"value": "535.161.08", "nodes": nodes[256:]}]},
             "gpus": 4096, "explained": False}  # fmt: skip
    f = Finding(kind="job_config_mixed", subject={"cluster": "c", "job": "77"},
                severity=Severity.WARNING, time_ns=time.time_ns(), evidence=mixed,
                summary="job 77 hangs: ranks behind on " + ", ".join(nodes[:128]),
                source="analytics")  # fmt: skip
    assert len(f.summary) == MAX_SUMMARY and f.summary.endswith("…")
    ev = f.evidence
    assert len(json.dumps(ev, separators=(",", ":"))) <= MAX_EVIDENCE_BYTES
    assert ev["gpus"] == 4096 and ev["explained"] is False  # what is not a list stays whole
    cut = ev["evidence_truncated"]
    kept = {s["value"]: len(s["nodes"]) for s in ev["fields"]["driver_version"]}
    assert all(n >= 32 for n in kept.values()), kept  # each setting keeps nodes to look at
    assert sum(kept.values()) + sum(cut.values()) == 512, (kept, cut)
    again = Finding.from_json(f.to_json())  # what the engine's endpoint does with it
    assert again.id == f.id and again.digest == f.digest


def test_a_huge_summary_is_a_422_and_journals_nothing(tmp_path: Path) -> None:
    engine = IdentityEngine(tmp_path)
    try:
        payload = {"kind": "gpu_xid", "subject": {"cluster": "c", "node": "node-001", "gpu": "0"},
                   "severity": "critical", "time_ns": time.time_ns(), "summary": "x" * 900_000,
                   "source": "agent"}  # fmt: skip
        status, reply = engine.post("node-001", "/v1/findings", payload)
        assert status == 422 and "summary is over" in reply["error"], (status, reply)
        assert engine.records("finding") == []
    finally:
        engine.close()


def test_an_alert_value_that_overflows_is_a_422_counted(tmp_path: Path) -> None:
    engine = IdentityEngine(tmp_path)
    try:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        alert = {"status": "firing", "startsAt": now,
                 "labels": {"kind": "failure_risk", "node": "node-001", "severity": "warning"},
                 "values": {"B": 10**400}}  # fmt: skip
        body = json.dumps({"alerts": [alert]}).encode()
        headers = {"Authorization": f"Bearer {engine.bearer('grafana')}"}
        for _ in range(3):  # before: no answer at all (the connection dropped)
            status, reply = engine.send("POST", "/v1/alerts/grafana", body, headers)
            assert status == 422 and "64 bits" in reply["error"], (status, reply)
        status, stats = engine.send(
            "GET", "/v1/stats", b"", {"Authorization": "Bearer t0ken-for-tests"}
        )
        assert status == 200 and stats["rejected"].get("422") == 3, stats
    finally:
        engine.close()


def test_a_relay_rank_that_is_not_a_number_is_a_400() -> None:
    from gpuwarden.collector.relay import checked_lines

    now = time.time_ns()
    for rank in ("r0", "0x1f", "1" * 10):
        _, status, why = checked_lines(f"job_step,job=77,rank={rank} step_index=1i {now}", "", now)
        assert status == 400 and "tag rank" in why, (rank, status, why)
    lines, status, _ = checked_lines(f"job_step,job=77,rank=12 step_index=1i {now}", "", now)
    assert status == 204 and len(lines) == 1


def test_a_peer_gone_mid_body_is_not_an_internal_error(tmp_path: Path) -> None:
    """The catch-all 500 (above) must not take a reset connection for a bug: that stays the
    server's own matter (logged at debug), uncounted, and nothing is written back."""
    from gpuwarden.remediation.server import Endpoint

    engine, _, _ = make_engine(tmp_path)
    endpoint = Endpoint(engine, "tok")

    def read(n: int) -> bytes:
        raise ConnectionResetError(104, "Connection reset by peer")

    headers = {"Authorization": "Bearer tok", "Content-Length": "10"}
    with pytest.raises(ConnectionResetError):
        endpoint.handle("POST", "/v1/findings", headers, read)
    assert endpoint.rejected == {}
    engine.close()


# -- found by a fourth look (a helper) at the busy wait and the fitting ----------------------


def _held(sched: RecordingAdapter, kind: ActionKind) -> tuple[threading.Event, threading.Event]:
    """``kind`` on the scheduler blocks until the first event is set (the second says it
    started)."""
    gate, entered = threading.Event(), threading.Event()
    perform = sched.perform

    def slow(action):
        if action.kind is kind:
            entered.set()
            gate.wait(30)
        return perform(action)

    sched.perform = slow
    return gate, entered


def test_a_return_resumed_after_a_restart_keeps_its_node_busy(tmp_path: Path) -> None:
    """A return (uncordon) in flight at a crash was resumed without marking its node busy:
    a fault's plan then ran beside it (drain, requeue, then the resumed uncordon), and the
    faulty node ended back in service."""
    first, sched1, _ = make_engine(tmp_path)
    assert first.submit(xid("gpu03")).verdict == "act" and first.wait(10)
    gate1, in1 = _held(sched1, ActionKind.UNCORDON)
    assert first.submit(healthy("gpu03", 0)).verdict == "act" and in1.wait(10)
    # the engine dies here, its uncordon's intent on disk; another starts on the journal
    again, sched2, _ = make_engine(tmp_path)
    sched2.out.add("gpu03")
    gate2, in2 = _held(sched2, ActionKind.UNCORDON)
    assert [[a.kind for a in d.actions] for d in again.resume()] == [[ActionKind.UNCORDON]]
    assert in2.wait(10)
    assert again.submit(xid("gpu03", "5")).verdict == "busy"
    gate2.set()
    assert again.wait(10)
    assert [d.verdict for d in again.tick()] == ["act"]  # after the return: out again
    assert again.wait(10) and "gpu03" in sched2.out
    gate1.set()
    first.close()
    again.close()


def test_a_busy_plan_that_then_waits_for_room_says_so(tmp_path: Path) -> None:
    """Released from ``busy`` into ``blast_radius``, a plan kept its old verdict and reason,
    unjournaled and unpaged, until it expired."""
    engine, sched, notes = make_engine(tmp_path, max_nodes_out=2)
    assert engine.submit(xid("gpu03")).verdict == "act" and engine.wait(10)
    gate, entered = _held(sched, ActionKind.UNCORDON)
    assert engine.submit(healthy("gpu03", 0)).verdict == "act" and entered.wait(10)
    assert engine.submit(xid("gpu03", "1")).verdict == "busy"
    told = len(notes.calls)
    gate.set()
    assert engine.wait(10)
    sched.out |= {"gpu05", "gpu07"}  # an administrator drains two nodes meanwhile
    assert engine.tick() == []
    assert [p["verdict"] for p in engine.pending()] == ["blast_radius"]
    assert engine.wait(10) and len(notes.calls) == told + 1  # a person is told it waits
    engine.close()


def test_approving_a_busy_plan_does_not_run_it_beside_the_other(tmp_path: Path) -> None:
    engine, sched, _ = make_engine(tmp_path)
    gate, entered = _held(sched, ActionKind.DRAIN)
    assert engine.submit(xid("gpu03")).verdict == "act" and entered.wait(10)
    second = engine.submit(xid("gpu03", "1"))
    assert second.verdict == "busy"
    assert engine.approve(second.plan_id).verdict == "busy"  # still waits, now approved
    assert engine.guards.busy["gpu03"] == 1  # (it had started a second plan beside the first)
    gate.set()
    assert engine.wait(10)
    assert [d.verdict for d in engine.tick()] == ["act"]  # approved: no cooldown
    assert engine.wait(10)
    assert [a.kind for a in sched.calls].count(ActionKind.DRAIN) == 2  # one after the other
    engine.close()


def test_fitted_evidence_is_what_the_engine_takes() -> None:
    common: dict[str, Any] = {"kind": "gpu_xid", "subject": {"node": "gpu01"},
                              "severity": Severity.CRITICAL, "time_ns": time.time_ns()}  # fmt: skip
    # many lists under long keys: the note of what was cut must fit too (it did not)
    many = {("k" * 110) + f"{i:02d}": [f"node-{j:04d}.cluster.example" for j in range(25)]
            for i in range(30)}  # fmt: skip
    f = Finding(evidence=many, **common)
    assert Finding.from_json(f.to_json()).digest == f.digest
    # a long one-item list beside a list that can be cut: the list is cut, not dropped
    odd = {"log": ["x" * 9000], "nodes": [f"gpu-{j:04d}.cluster.example" for j in range(300)]}
    g = Finding(evidence=odd, **common)
    assert 0 < len(g.evidence["nodes"]) < 300 and g.evidence["log"] == odd["log"]
    # evidence that arrives as a list of pairs is refused, not made a dict and cut
    with pytest.raises(FindingError, match="must be an object"):
        Finding.from_json(Finding(**common).to_json() | {"evidence": [["blob", "x" * 20000]]})


def test_return_checks_that_hang_do_not_hold_up_a_faults_drain(tmp_path: Path) -> None:
    """Left open by the fourth review: with ``return_requires = "command"`` each return's check
    held one of the executor's ``workers`` threads (4) for up to ``return_check_timeout_s`` (15
    min). Six repaired nodes (or six nodes' keys) sending node_healthy together held all four,
    and a fatal XID's drain on another node waited behind them. Return checks now run on
    ``return_workers`` threads of their own; the returns wait their turn, none lost, and an
    operator's undo (no check) is not among them. The check command is REAL (``sh``), made to
    hang until the test lets it pass."""
    gate = tmp_path / "checks-pass"
    hang = ("sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; echo {{node}} ok")
    engine, sched, _ = make_engine(tmp_path, max_nodes_out=10, return_requires="command",
                                   return_check_command=hang)  # fmt: skip
    repaired = [f"gpu{i:02d}" for i in range(1, 7)]
    for node in [*repaired, "gpu07"]:
        assert engine.submit(xid(node)).verdict == "act"
    assert engine.wait(10) and set(sched.out) == {*repaired, "gpu07"}
    assert {engine.submit(healthy(node, 0)).verdict for node in repaired} == {"act"}
    # a fault elsewhere is drained while every check still hangs
    assert engine.submit(xid("gpu10")).verdict == "act"
    poll(lambda: "gpu10" in sched.out, 30, "the fault's drain while return checks hang")
    assert engine.undo("gpu07", by="test").verdict == "act"
    poll(lambda: "gpu07" not in sched.out, 30, "the operator's undo while return checks hang")
    assert set(repaired) <= set(sched.out)  # no check has passed: none of them is back
    gate.touch()
    assert engine.wait(60)
    assert set(sched.out) == {"gpu10"}  # every return done once its check passed
    uncordons = [r for r in read_records(tmp_path / "audit.jsonl")
                 if r["event"] == "action" and r["action"] == "uncordon"]  # fmt: skip
    assert sorted(r["node"] for r in uncordons) == sorted([*repaired, "gpu07"])
    assert {r["outcome"] for r in uncordons} == {"ok"}
    engine.close()
