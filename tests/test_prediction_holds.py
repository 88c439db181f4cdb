"""A node taken out on a prediction is held for the prediction's horizon, then offered back
(:mod:`remediation.holds`), and its outcome is whether the predicted fault came
(:mod:`remediation.outcomes`).

Before this, such a node never came back by itself where only the agent reports (its agent
announces ``node_healthy`` once per healthy stretch, and a prediction breaks none), and where
Slurm's HealthCheckProgram reports checks, the first passing check returned it, possibly
before the predicted fault, and the outcome reader counted it ``refuted`` on that check.
CONSTRUCTED findings, the in-memory scheduler, a clock driven by hand; every test here fails
on the code before (no hold, no ``prediction_expired``, a check refuted a prediction).
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.finding import Finding, FindingError, Severity
from gpuwarden.remediation.audit import AuditLog
from gpuwarden.remediation.clock import Clock
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.identity import Principal
from gpuwarden.remediation.outcomes import OutcomeSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from gpuwarden.remediation.server import Endpoint, make_server
from tests.remediation_util import HandClock, RecordingAdapter

NODES = {f"gpu{i:02d}": "a" for i in range(8)}
HOUR, DAY = 3600.0, 86400.0
HORIZON = 2 * HOUR
WINDOWS = OutcomeSettings(quick_pass_s=HOUR, clean_window_s=DAY, window_s=30 * DAY)


def make_engine(
    tmp: Path, clock: HandClock, **overrides: Any
) -> tuple[Engine, RecordingAdapter, RecordingAdapter]:
    sched, notes = RecordingAdapter("slurm", NODES), RecordingAdapter("webhook")
    base: dict[str, Any] = {
        "dry_run": False, "cooldown_s": 0.0, "actions_per_minute": 10_000, "max_nodes_out": 8,
        "max_fraction_out": 1.0, "return_requires": "none", "lemon_count": 0,
        "outcomes": WINDOWS,
    }  # fmt: skip
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": sched, "webhook": notes},
        AuditLog(tmp / "audit.jsonl"),
        EngineSettings(**(base | overrides)),
        clock=Clock(wall=clock.wall, mono=clock.mono),
    )
    return engine, sched, notes


def risk(node: str, clock: HandClock, **evidence: Any) -> Finding:
    """A failure-risk finding as the scorer sends it (its horizon in the evidence)."""
    return Finding(
        kind="failure_risk",
        subject={"cluster": "test", "node": node, "gpu": "3"},
        severity=Severity.WARNING,
        time_ns=int(clock.wall() * 1e9),
        evidence={"probability": 0.04, "horizon_s": HORIZON} | evidence,
        probability=0.04,
        summary=f"{node} GPU 3: risk of a hardware failure within 120 min",
        source="analytics",
    )


def xid(node: str, clock: HandClock) -> Finding:
    return Finding(
        kind="gpu_xid",
        subject={"cluster": "test", "node": node, "gpu": "0"},
        severity=Severity.CRITICAL,
        time_ns=int(clock.wall() * 1e9),
        evidence={"xid": 79},
        confidence=1.0,
        summary=f"XID 79 on {node}",
        source="agent",
    )


def healthy(node: str, clock: HandClock) -> Finding:
    """The node's agent (or Slurm's HealthCheckProgram): its check passed just now."""
    now = int(clock.wall() * 1e9)
    return Finding(
        kind="node_healthy",
        subject={"cluster": "test", "node": node},
        severity=Severity.INFO,
        time_ns=now,
        evidence={"check": "pass", "checked_ns": now},
        summary=f"{node} passed its check",
        source="agent",
    )


def records(tmp: Path, event: str) -> list[dict[str, Any]]:
    lines = (tmp / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def offers(tmp: Path) -> list[dict[str, Any]]:
    return [r for r in records(tmp, "finding") if r["kind"] == "prediction_expired"]


def drained(engine: Engine, finding: Finding) -> str:
    d = engine.submit(finding)
    assert d.verdict == "act", d.why
    assert engine.wait(10)
    return d.plan_id


def test_a_predicted_drain_is_offered_back_when_its_horizon_ends_with_no_fault(
    tmp_path: Path,
) -> None:
    clock = HandClock()
    engine, sched, notes = make_engine(tmp_path, clock)
    plan = drained(engine, risk("gpu01", clock))
    [drain] = [r for r in records(tmp_path, "action") if r["action"] == "drain"]
    assert drain["hold_s"] == HORIZON
    clock.advance(HORIZON - 1.0)
    engine.tick()
    assert "gpu01" in sched.out and offers(tmp_path) == []  # not before the horizon
    clock.advance(2.0)
    engine.tick()
    assert engine.wait(10)
    [offer] = offers(tmp_path)
    assert offer["subject"] == {"cluster": "test", "node": "gpu01"}
    assert offer["evidence"]["plan"] == plan and offer["evidence"]["held_s"] == HORIZON
    assert "gpu01" not in sched.out  # return_requires = "none": back at once
    [told] = [a for a in notes.calls if "ran to" in a.reason and "no fault" in a.reason]
    assert told.severity == "info" and "the engine returns it now" in told.reason
    clock.advance(60.0)
    engine.tick()  # asked once: no second offer
    assert len(offers(tmp_path)) == 1
    engine.close()


def test_a_passing_check_before_the_horizon_does_not_return_it(tmp_path: Path) -> None:
    """With ``return_requires = "check"``, the shipped default: a check during the hold is
    refused (``held``); the offer at the horizon tells a person a check is needed; the first
    passing check after the horizon returns the node."""
    clock = HandClock()
    engine, sched, notes = make_engine(tmp_path, clock, return_requires="check")
    drained(engine, risk("gpu01", clock))
    clock.advance(600.0)
    early = engine.submit(healthy("gpu01", clock))
    assert early.verdict == "held" and "holds it out until" in early.why
    assert engine.wait(10) and "gpu01" in sched.out
    clock.advance(HORIZON)
    engine.tick()
    assert engine.wait(10) and "gpu01" in sched.out
    [offer] = [r for r in records(tmp_path, "decision") if r["policy"] == "prediction-expired"]
    assert offer["verdict"] == "unchecked"
    [told] = [a for a in notes.calls if "ran to" in a.reason]
    # a person must act: a warning, which reaches the routes an info does not (Slack)
    assert told.severity == "warning" and "gpuwarden check --report" in told.reason
    # the check of 600 s in was before the hold ended: still not enough
    stale = replace(healthy("gpu01", clock), evidence=early_check(clock, -HORIZON))
    assert engine.submit(stale).verdict == "unchecked"
    clock.advance(300.0)
    assert engine.submit(healthy("gpu01", clock)).verdict == "act"
    assert engine.wait(10) and "gpu01" not in sched.out
    engine.close()


def early_check(clock: HandClock, ago_s: float) -> dict[str, Any]:
    return {"check": "pass", "checked_ns": int((clock.wall() + ago_s) * 1e9)}


def test_a_fault_while_held_keeps_the_node_out_for_the_fault(tmp_path: Path) -> None:
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    plan = drained(engine, risk("gpu01", clock))
    clock.advance(1200.0)
    # the fault came: inside the cooldown, a notification only, but a fault all the same
    assert engine.submit(xid("gpu01", clock)).verdict == "cooldown"
    assert engine.wait(10)
    clock.advance(HORIZON)
    engine.tick()
    assert offers(tmp_path) == [] and "gpu01" in sched.out
    [out] = records(tmp_path, "outcome")
    assert (out["plan_id"], out["verdict"]) == (plan, "confirmed")
    assert "while out on the prediction" in out["evidence"]["why"]
    engine.close()


def test_a_second_prediction_extends_the_hold(tmp_path: Path) -> None:
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock)
    drained(engine, risk("gpu01", clock))
    clock.advance(HOUR)
    second = risk("gpu01", clock)
    assert engine.submit(second).verdict == "act"  # drains a drained node: idempotent
    assert engine.wait(10)
    clock.advance(HORIZON - 1.0)  # the first hold has ended, the second has not
    engine.tick()
    assert offers(tmp_path) == [] and "gpu01" in sched.out
    clock.advance(2.0)
    engine.tick()
    assert engine.wait(10)
    [offer] = offers(tmp_path)
    assert offer["evidence"]["plan"] == second.id
    assert offer["evidence"]["held_s"] == HOUR + HORIZON  # from the first removal
    assert "gpu01" not in sched.out
    engine.close()


def test_a_prediction_does_not_shorten_an_outage_for_a_fault(tmp_path: Path) -> None:
    """A node out for a fault, then predicted to fail: no hold, so no offer at the horizon."""
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock)
    drained(engine, xid("gpu01", clock))
    clock.advance(600.0)
    drained(engine, risk("gpu01", clock))
    clock.advance(2 * HORIZON)
    engine.tick()
    assert offers(tmp_path) == [] and "gpu01" in sched.out
    engine.close()


@pytest.mark.parametrize("down_s", [600.0, HORIZON + 600.0])
def test_a_restart_holds_to_the_same_time_and_offers_once(tmp_path: Path, down_s: float) -> None:
    """Down within the hold: the new process offers the node back at the same wall time. Down
    past it: offered once at start; after the offer, another restart offers nothing again."""
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock)
    drained(engine, risk("gpu01", clock))
    removed = clock.wall()
    engine.close()
    clock.restart(down_s)
    engine, sched2, _ = make_engine(tmp_path, clock)
    sched2.out = set(sched.out)  # the scheduler kept its state; the engine did not
    engine.tick()
    if down_s < HORIZON:
        assert offers(tmp_path) == []
        clock.advance(removed + HORIZON - clock.wall() - 1.0)
        engine.tick()
        assert offers(tmp_path) == []
        clock.advance(2.0)
        engine.tick()
    assert engine.wait(10)
    assert len(offers(tmp_path)) == 1 and "gpu01" not in sched2.out
    engine.close()
    clock.restart(60.0)
    engine, _, _ = make_engine(tmp_path, clock)
    engine.tick()
    assert len(offers(tmp_path)) == 1
    assert len([r for r in records(tmp_path, "action") if r["action"] == "uncordon"]) == 1
    engine.close()


def test_the_outcome_of_a_prediction_is_whether_the_fault_came(tmp_path: Path) -> None:
    """A prediction's removal is refuted only by running its horizon after its return with no
    fault, never by a check; a fault within the horizon after the return confirms it."""
    clock = HandClock()
    engine, _, _ = make_engine(tmp_path, clock)
    quiet = drained(engine, risk("gpu01", clock))
    faulty = drained(engine, risk("gpu02", clock))
    clock.advance(HORIZON + 1.0)
    engine.tick()  # both offered back and returned (return_requires = "none")
    assert engine.wait(10)
    clock.advance(600.0)
    assert engine.submit(healthy("gpu01", clock)).verdict == "not_ours"  # a check: no verdict
    clock.advance(600.0)
    engine.submit(xid("gpu02", clock))  # gpu02 faults 1,200 s after its return
    engine.wait(10)
    engine.tick()
    verdicts = {r["plan_id"]: r["verdict"] for r in records(tmp_path, "outcome")}
    assert verdicts == {faulty: "confirmed"}
    clock.advance(HORIZON - 1200.0 + 1.0)
    engine.tick()
    verdicts = {r["plan_id"]: r["verdict"] for r in records(tmp_path, "outcome")}
    assert verdicts[quiet] == "refuted"
    [why] = [r["evidence"]["why"] for r in records(tmp_path, "outcome") if r["plan_id"] == quiet]
    assert "prediction's horizon" in why
    engine.close()


@pytest.mark.parametrize(
    "horizon", [None, 0, -5.0, math.inf, math.nan, "7200", True, 1e12, 10**400, [7200]]
)
def test_a_broken_or_hostile_horizon_holds_at_most_the_longest(horizon: object) -> None:
    from gpuwarden.remediation.engine.decide import prediction_hold  # (new: see the docstring)

    settings = EngineSettings(max_prediction_hold_s=DAY)
    clock = HandClock()
    evidence = {} if horizon is None else {"horizon_s": horizon}
    if horizon == 10**400:  # refused at the door now (an integer past 64 bits)
        with pytest.raises(FindingError, match="64 bits"):
            replace(risk("gpu01", clock), evidence=evidence)
        return
    f = replace(risk("gpu01", clock), evidence=evidence)
    assert prediction_hold(f, settings) == DAY
    assert prediction_hold(risk("gpu01", clock), settings) == HORIZON


@pytest.mark.parametrize(
    "principal",
    [
        Principal("agent/gpu01", "agent", "gpu01"),
        Principal("ops", "operator"),
        Principal("analyze", "analytics", kinds=frozenset({"prediction_expired"})),
        Principal("legacy", "shared"),
    ],
)
def test_no_sender_may_send_the_engines_own_offer(principal: Principal) -> None:
    """A forged ``prediction_expired`` would offer a held node back: no sender may send one,
    not even a node's own agent, nor the legacy shared credential."""
    why = principal.refuses("prediction_expired", "gpu01", True)
    assert "engine's own finding" in why


# -- what a review found (it reproduced each on this change's first version) ---------------------


def test_an_offer_the_full_queue_refused_is_tried_again_later(tmp_path: Path) -> None:
    """``queue_full`` is not remembered (a re-send is decided afresh): the offer is tried again
    ``OFFER_RETRY_S`` later, live as after a restart, not dropped for good."""
    from gpuwarden.remediation.engine.engine import OFFER_RETRY_S

    clock = HandClock()
    engine, _, _ = make_engine(
        tmp_path, clock, return_requires="approval", max_pending=1, pending_expire_s=0.0
    )
    drained(engine, risk("gpu01", clock))
    drained(engine, xid("gpu02", clock))
    assert engine.submit(healthy("gpu02", clock)).verdict == "approval"  # the one place
    clock.advance(HORIZON + 1.0)
    engine.tick()
    decided = [r for r in records(tmp_path, "decision") if r["policy"] == "prediction-expired"]
    assert [r["verdict"] for r in decided] == ["queue_full"]
    [waiting] = engine.pending()
    engine.approve(waiting["plan_id"])  # the place frees
    assert engine.wait(10)
    engine.tick()  # not yet: tried again after OFFER_RETRY_S
    assert (
        len([r for r in records(tmp_path, "decision") if r["policy"] == "prediction-expired"]) == 1
    )
    clock.advance(OFFER_RETRY_S)
    engine.tick()
    decided = [r for r in records(tmp_path, "decision") if r["policy"] == "prediction-expired"]
    assert [r["verdict"] for r in decided] == ["queue_full", "approval"]
    engine.close()


def test_a_prediction_the_cooldown_cut_to_nothing_is_not_a_fault(tmp_path: Path) -> None:
    """A policy without ``notify``: a second prediction inside the cooldown is cut to an empty
    plan, which carries no ``hold_s``; it is still a prediction (the decision says so), so it
    neither ends the hold nor confirms the removal."""
    policies = [p for p in DEFAULT_POLICIES if p["name"] != "predicted-gpu-failure"]
    bare = {"name": "predicted-gpu-failure", "kinds": ["failure_risk"], "actions": ["drain"]}
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    engine.policies = load_policies([bare, *policies])
    engine.outcomes.by_name = {p.name: p for p in engine.policies}
    plan = drained(engine, risk("gpu01", clock))
    clock.advance(300.0)
    assert engine.submit(risk("gpu01", clock)).verdict == "cooldown"
    assert engine.wait(10)
    clock.advance(60.0)
    assert engine.submit(healthy("gpu01", clock)).verdict == "held"
    assert engine.wait(10) and "gpu01" in sched.out
    engine.tick()
    assert [r for r in records(tmp_path, "outcome") if r["plan_id"] == plan] == []
    engine.close()


def test_a_check_from_before_the_fault_that_ended_the_hold_does_not_return_it(
    tmp_path: Path,
) -> None:
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock, return_requires="check", cooldown_s=1800.0)
    drained(engine, risk("gpu01", clock))
    clock.advance(600.0)
    early = healthy("gpu01", clock)
    assert engine.submit(early).verdict == "held"
    clock.advance(600.0)
    assert engine.submit(xid("gpu01", clock)).verdict == "cooldown"  # the fault: hold ends
    assert engine.wait(10)
    clock.advance(60.0)
    again = replace(early, time_ns=int(clock.wall() * 1e9))  # the same check, re-sent
    d = engine.submit(again)
    assert d.verdict == "unchecked" and "older than the fault" in d.why
    clock.advance(300.0)
    assert engine.submit(healthy("gpu01", clock)).verdict == "act"
    assert engine.wait(10) and "gpu01" not in sched.out
    engine.close()


def test_a_hold_that_ended_before_the_compacted_horizon_is_not_offered_again() -> None:
    """After a compaction dropped an old offer's records, a restart must not offer again."""
    from gpuwarden.remediation.holds import Holds

    holds = Holds(lambda _: False)
    drain = {"event": "action", "action": "drain", "outcome": "ok", "node": "gpu01",
             "finding_id": "p1", "cluster": "test", "hold_s": HORIZON}  # fmt: skip
    holds.observe(drain, 1_000.0, 50.0)
    assert [h.node for h in holds.due(50.0 + HORIZON)] == ["gpu01"]
    assert holds.due(50.0 + HORIZON, compacted_before=1_000.0 + HORIZON + 1.0) == []


def test_an_offer_decided_after_a_later_prediction_does_not_mark_the_new_hold_asked() -> None:
    """An executor thread writes a new prediction's drain between the tick's look at the holds
    and the offer's decision: that decision answers the old hold, and the new one is still
    offered when it ends (the journal's order, replayed)."""
    from gpuwarden.remediation.holds import EXPIRED_KIND, Holds

    holds = Holds(lambda _: True)
    drain = {"event": "action", "action": "drain", "outcome": "ok", "node": "gpu01",
             "cluster": "test", "hold_s": HORIZON}  # fmt: skip
    holds.observe(drain | {"finding_id": "p1"}, 1_000.0, 50.0)
    offer = {"event": "finding", "kind": EXPIRED_KIND, "finding_id": "o1",
             "subject": {"node": "gpu01"}, "evidence": {"plan": "p1"}}  # fmt: skip
    holds.observe(offer, 1_000.0 + HORIZON, 50.0 + HORIZON)
    holds.observe(drain | {"finding_id": "p2"}, 1_000.0 + HORIZON, 50.0 + HORIZON)
    decided = {"event": "decision", "finding_id": "o1", "verdict": "held", "node": "gpu01",
               "policy": "prediction-expired", "plan": []}  # fmt: skip
    holds.observe(decided, 1_000.0 + HORIZON, 50.0 + HORIZON)
    [hold] = holds.held.values()
    assert (hold.plan_id, hold.asked) == ("p2", False)
    assert holds.due(50.0 + 2 * HORIZON) == [hold]


def test_an_operator_sees_the_held_nodes_over_http(tmp_path: Path) -> None:
    """``GET /v1/pending`` lists them (``held``), ``/metrics`` counts them by state; a
    forged offer over HTTP is refused (403) and changes nothing."""
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock, return_requires="check")
    endpoint = Endpoint(engine, "t0ken", max_body_bytes=64 * 1024)
    server = make_server(endpoint, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    auth = {"Authorization": "Bearer t0ken", "Content-Type": "application/json"}

    def request(method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request(method, path, body=body, headers=auth)
        resp = conn.getresponse()
        data = resp.read().decode()
        conn.close()
        return resp.status, data

    try:
        plan = drained(engine, risk("gpu01", clock))
        # (the endpoint checks a finding's freshness on the host's clock)
        forged = Finding(
            kind="prediction_expired",
            subject={"cluster": "test", "node": "gpu01"},
            severity=Severity.INFO,
            time_ns=time.time_ns(),
            source="agent",
        )
        status, said = request("POST", "/v1/findings", json.dumps(forged.to_json()).encode())
        assert status == 403 and "engine's own finding" in said, said
        status, said = request("GET", "/v1/pending")
        [held] = json.loads(said)["held"]
        assert held == {"node": "gpu01", "plan_id": plan, "ended": False, "offered": False,
                        "until": round(clock.wall() + HORIZON, 3)}  # fmt: skip
        metrics = request("GET", "/metrics")[1]
        assert 'gpuwarden_engine_nodes_held{state="holding"} 1' in metrics
        clock.advance(HORIZON + 1.0)
        engine.tick()  # offered; with return_requires = "check" it waits for a check
        assert engine.wait(10) and "gpu01" in sched.out
        [held] = json.loads(request("GET", "/v1/pending")[1])["held"]
        assert (held["ended"], held["offered"]) == (True, True)
        metrics = request("GET", "/metrics")[1]
        assert 'gpuwarden_engine_nodes_held{state="ended"} 1' in metrics
        assert 'gpuwarden_engine_nodes_held{state="holding"} 0' in metrics
    finally:
        server.shutdown()
        engine.close()


def test_predictions_that_keep_coming_hold_a_node_at_most_the_longest_hold(
    tmp_path: Path,
) -> None:
    """The scorer raises a finding every run while a GPU's risk stays high: each extends the
    hold, but never past ``max_prediction_hold_s`` from the first removal; then the node is
    offered back (a prediction after that starts a new hold: the lemon rule counts the
    removals of a node that returned in between)."""
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock, max_prediction_hold_s=DAY)
    drained(engine, risk("gpu01", clock))
    removed = clock.wall()
    for _ in range(23):  # a prediction every hour, each inside the hold: capped at 24 h
        clock.advance(HOUR)
        drained(engine, risk("gpu01", clock))
    [held] = engine.held()
    assert held["until"] == round(removed + DAY, 3)
    clock.advance(removed + DAY - clock.wall() + 1.0)
    engine.tick()
    assert engine.wait(10) and len(offers(tmp_path)) == 1 and "gpu01" not in sched.out
    engine.close()


def test_a_node_returned_by_hand_outside_gpuwarden_gets_a_new_hold_when_drained_again(
    tmp_path: Path,
) -> None:
    """An admin resumes the node with scontrol or kubectl (gpuwarden never sees it): its old
    hold has ended; a prediction a day later starts a new hold, not one already over (an
    operator's review: it was offered back at once)."""
    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock, return_requires="check")
    drained(engine, risk("gpu01", clock))
    sched.out.discard("gpu01")  # scontrol update State=RESUME, by hand
    clock.advance(DAY + HOUR)
    engine.tick()  # the old hold's offer (unchecked: no check came)
    assert engine.wait(10)
    drained(engine, risk("gpu01", clock))
    [held] = engine.held()
    assert (held["ended"], held["until"]) == (False, round(clock.wall() + HORIZON, 3))
    engine.close()


@pytest.mark.parametrize("reannounce_s", [HOUR, 0.0])
def test_an_agent_that_reannounces_brings_a_held_node_back_by_itself(
    tmp_path: Path, reannounce_s: float
) -> None:
    """The default return rule (a passing check newer than the hold's end) with nothing but
    the agent reporting, as on Kubernetes: with ``[health] reannounce_s`` the agent's next
    announcement after the hold returns the node; without it, none comes."""
    from gpuwarden.collector.check import Result, check_finding
    from gpuwarden.collector.health import HealthGate

    clock = HandClock()
    engine, sched, _ = make_engine(tmp_path, clock, return_requires="check")

    def post(finding: Finding) -> None:  # the agent's sink to the engine
        engine.submit(finding)

    gate = HealthGate(
        "test", "gpu01", post, healthy_after_s=1800.0, reannounce_s=reannounce_s,
        check=lambda now: check_finding("test", "gpu01", [Result("disk", "pass", "ok")], now),
    )  # fmt: skip

    def cycle() -> None:
        gate.cycle(int(clock.wall() * 1e9), [])
        for c in gate.checks:
            c.join(10)
        engine.tick()
        assert engine.wait(10)

    for _ in range(4):  # the agent's first stretch: said once, the node is in service
        cycle()
        clock.advance(600.0)
    drained(engine, risk("gpu01", clock))
    for _ in range(int(2 * HORIZON / 600.0)):
        cycle()
        clock.advance(600.0)
    assert ("gpu01" not in sched.out) == bool(reannounce_s)
    engine.close()
