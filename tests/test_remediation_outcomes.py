"""Issue 41, "Outcome of every action" and "Precision per rule and policy".

Every plan that took a node out gets one ``outcome`` record once its verdict is known
(confirmed, refuted, unknown: :mod:`remediation.outcomes`), derived from the journal alone so
that a restarted engine decides the same outcome, once; a policy whose precision falls below
its ``min_precision`` is demoted to notify, audited, and promoted back when it recovers
(must-show 3). CONSTRUCTED findings, an in-memory scheduler (RecordingAdapter) and an
injected clock driven by hand. Before this change the engine recorded no outcome and had no
``min_precision``: every test here fails on that code (the commit message has the output).
"""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.catalogue import check_point
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.audit import AuditLog
from gpuwarden.remediation.cli import main as remediate
from gpuwarden.remediation.cli import outcome_point
from gpuwarden.remediation.clock import Clock
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.outcomes import OutcomeSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, Policy, load_policies
from gpuwarden.remediation.server import Endpoint, make_server
from tests.remediation_util import HandClock, RecordingAdapter

NODES = {f"gpu{i:02d}": "a" for i in range(8)}
T0 = 1_800_000_000.0
HOUR, DAY = 3600.0, 86400.0
WINDOWS = OutcomeSettings(quick_pass_s=HOUR, clean_window_s=DAY, window_s=30 * DAY)


def make_engine(
    tmp: Path, clock: HandClock, policies: list[Policy] | None = None
) -> tuple[Engine, RecordingAdapter]:
    sched = RecordingAdapter("slurm", NODES)
    settings = EngineSettings(
        dry_run=False, cooldown_s=0.0, actions_per_minute=10_000, max_nodes_out=8,
        max_fraction_out=1.0, return_requires="none", lemon_count=0, outcomes=WINDOWS,
    )  # fmt: skip
    engine = Engine(
        policies or load_policies(DEFAULT_POLICIES),
        {"slurm": sched, "webhook": RecordingAdapter("webhook")},
        AuditLog(tmp / "audit.jsonl"),
        settings,
        clock=Clock(wall=clock.wall, mono=clock.mono),
    )
    return engine, sched


_n = iter(range(1, 1_000_000))


def finding(kind: str, node: str, severity: Severity = Severity.CRITICAL, **ev: Any) -> Finding:
    """A finding in a time bucket of its own (a unique id)."""
    return Finding(
        kind=kind,
        subject={"cluster": "test", "node": node} | ({"gpu": "0"} if kind == "gpu_xid" else {}),
        severity=severity,
        time_ns=int((T0 + next(_n) * 300) * 1e9),
        evidence=ev,
        confidence=1.0,
        summary=f"{kind} on {node}",
        source="agent",
    )


def xid(node: str) -> Finding:
    return finding("gpu_xid", node, xid=79)


def healthy(node: str, clock: HandClock | None = None, **evidence: Any) -> Finding:
    """The node's agent: its check passed (at the engine's ``clock``, after the removal)."""
    if not evidence:
        evidence = {"check": "pass", "checked_ns": int((clock.wall() if clock else T0) * 1e9)}
    return finding("node_healthy", node, Severity.INFO, **evidence)


def records(tmp: Path, event: str) -> list[dict[str, Any]]:
    lines = (tmp / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def drained(engine: Engine, node: str) -> str:
    d = engine.submit(xid(node))
    assert d.verdict == "act", d.why
    assert engine.wait(10)
    return d.plan_id


def test_a_quick_pass_and_a_clean_window_refute_the_drain(tmp_path: Path) -> None:
    clock = HandClock()
    engine, sched = make_engine(tmp_path, clock)
    plan = drained(engine, "gpu01")
    clock.advance(600.0)  # passes its check 10 min later (< quick_pass_s)
    assert engine.submit(healthy("gpu01", clock)).verdict == "act"
    assert engine.wait(10)
    assert "gpu01" not in sched.out
    clock.advance(DAY - 1.0)
    engine.tick()
    assert records(tmp_path, "outcome") == []  # not clean for the whole window yet
    clock.advance(2.0)
    engine.tick()
    [out] = records(tmp_path, "outcome")
    assert (out["verdict"], out["plan_id"], out["node"]) == ("refuted", plan, "gpu01")
    assert (out["policy"], out["kind"]) == ("fatal-gpu-event", "gpu_xid")
    assert len(out["action_ids"]) == 2  # the drain and the requeue of the plan
    assert "passed its check 600 s after removal" in out["evidence"]["why"]
    assert engine.outcomes.precision()["fatal-gpu-event"] == (0, 1, 0)
    engine.close()


def test_a_healthy_node_with_no_check_refutes_nothing(tmp_path: Path) -> None:
    """A node_healthy without a passed check after the removal (no [check] on the node, or a
    node's own identity forging one) does not count as "passed its check": else a node could
    refute its own drains and talk a policy into demotion (an attacker's review)."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock)
    drained(engine, "gpu01")
    clock.advance(600.0)
    engine.submit(healthy("gpu01", clock, state="healthy"))  # no check at all
    engine.wait(10)
    clock.advance(600.0)
    stale = int((clock.wall() - 7200.0) * 1e9)  # a check from before the removal
    engine.submit(healthy("gpu01", clock, check="pass", checked_ns=stale))
    engine.wait(10)
    clock.advance(8 * DAY)
    engine.tick()
    assert [o["verdict"] for o in records(tmp_path, "outcome")] == ["unknown"]
    engine.close()


def test_a_fault_again_after_the_return_confirms_the_drain(tmp_path: Path) -> None:
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock)
    plan = drained(engine, "gpu02")
    clock.advance(2 * HOUR)  # repaired and checked later than quick_pass_s
    engine.submit(healthy("gpu02", clock))
    assert engine.wait(10)
    clock.advance(3 * HOUR)
    engine.submit(xid("gpu02"))  # within clean_window_s of the return
    assert engine.wait(10)
    engine.tick()
    [out] = records(tmp_path, "outcome")
    assert (out["verdict"], out["plan_id"]) == ("confirmed", plan)
    assert (
        "gpu02 faulted again (fatal-gpu-event) 10800 s after it returned" in out["evidence"]["why"]
    )
    engine.close()


def test_a_fault_after_the_clean_window_is_a_new_story(tmp_path: Path) -> None:
    """Returned late (no quick pass), clean for the whole window: unknown; a fault after that
    does not reach back to change it (and its own drain is a new plan, judged on its own)."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock)
    plan = drained(engine, "gpu02")
    clock.advance(2 * HOUR)
    engine.submit(healthy("gpu02", clock))
    assert engine.wait(10)
    clock.advance(DAY + 1.0)
    engine.tick()
    later = drained(engine, "gpu02")
    engine.tick()
    assert [(r["plan_id"], r["verdict"]) for r in records(tmp_path, "outcome")] == [
        (plan, "unknown")
    ]
    assert later in engine.outcomes.open
    engine.close()


def test_a_failed_node_check_confirms_the_drain(tmp_path: Path) -> None:
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock)
    plan = drained(engine, "gpu03")
    clock.advance(300.0)
    engine.submit(finding("node_check_failed", "gpu03", check="fail"))
    assert engine.wait(10)
    engine.tick()
    outs = [r for r in records(tmp_path, "outcome") if r["plan_id"] == plan]
    assert [r["verdict"] for r in outs] == ["confirmed"]
    assert "gpu03 failed its check" in outs[0]["evidence"]["why"]
    engine.close()


def test_an_operators_undo_says_false_alarm_or_repaired(tmp_path: Path) -> None:
    clock = HandClock()
    engine, sched = make_engine(tmp_path, clock)
    alarm = drained(engine, "gpu04")
    repaired = drained(engine, "gpu05")
    engine.undo("gpu04", by="alice", reason="false_alarm")
    engine.undo("gpu05", by="bob", reason="repaired")
    assert engine.wait(10)
    assert not sched.out & {"gpu04", "gpu05"}
    verdicts = {r["plan_id"]: r["verdict"] for r in records(tmp_path, "outcome")}
    assert verdicts == {alarm: "refuted", repaired: "confirmed"}
    assert [r.get("reason") for r in records(tmp_path, "undo")] == ["false_alarm", "repaired"]
    engine.close()


def test_nothing_for_the_whole_window_is_unknown(tmp_path: Path) -> None:
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock)
    plan = drained(engine, "gpu06")
    clock.advance(HOUR + DAY - 1.0)
    engine.tick()
    assert records(tmp_path, "outcome") == []
    clock.advance(2.0)
    engine.tick()
    assert [(r["plan_id"], r["verdict"]) for r in records(tmp_path, "outcome")] == [
        (plan, "unknown")
    ]
    assert engine.outcomes.precision()["fatal-gpu-event"] == (0, 0, 1)
    engine.close()


def test_outcomes_survive_restarts_and_are_never_recorded_twice(tmp_path: Path) -> None:
    """The drain, the quick pass and the return before a stop; the clean window ends while
    the engine is down: the restarted engine decides the same outcome, once; a second restart
    adds nothing."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock)
    plan = drained(engine, "gpu01")
    clock.advance(600.0)
    engine.submit(healthy("gpu01", clock))
    assert engine.wait(10)
    confirmed = drained(engine, "gpu02")
    engine.undo("gpu02", by="bob", reason="repaired")
    assert engine.wait(10)
    engine.close()
    assert [r["plan_id"] for r in records(tmp_path, "outcome")] == [confirmed]

    clock.restart(down_s=2 * HOUR)
    engine, _ = make_engine(tmp_path, clock)
    assert plan in engine.outcomes.open  # rebuilt from the journal; not yet decided
    clock.advance(DAY)
    engine.tick()
    first = {r["plan_id"]: r["verdict"] for r in records(tmp_path, "outcome")}
    assert first == {confirmed: "confirmed", plan: "refuted"}
    precision = engine.outcomes.precision()
    engine.close()

    for _ in range(2):
        clock.restart(down_s=HOUR)
        engine, _ = make_engine(tmp_path, clock)
        engine.tick()
        clock.advance(60 * DAY)
        engine.tick()
        engine.close()
    outs = records(tmp_path, "outcome")
    assert sorted(r["plan_id"] for r in outs) == sorted([plan, confirmed])  # once each
    engine, _ = make_engine(tmp_path, clock)
    assert set(engine.outcomes.decided) == {plan, confirmed}
    assert engine.outcomes.open == {}
    engine.close()
    assert precision["fatal-gpu-event"] == (1, 1, 0)


def test_a_policy_below_min_precision_is_demoted_to_notify_and_promoted_back(
    tmp_path: Path,
) -> None:
    """Must-show 3. fatal-gpu-event with ``min_precision = 0.5`` over at least 3 outcomes
    (margin 0.05): three false alarms demote it, so the next XID only notifies (audited);
    at 3/6 (0.50, inside the hysteresis band) it stays demoted; at 4/7 (0.57) it is
    promoted and the next XID drains again."""
    data = [dict(p) for p in DEFAULT_POLICIES]
    data[0] |= {"min_precision": 0.5, "min_samples": 3}
    assert data[0]["name"] == "fatal-gpu-event"
    clock = HandClock()
    engine, sched = make_engine(tmp_path, clock, load_policies(data))
    plans = [drained(engine, f"gpu{i:02d}") for i in range(7)]
    for node in ("gpu00", "gpu01", "gpu02"):
        engine.undo(node, by="alice", reason="false_alarm")
    assert engine.wait(10)
    assert "fatal-gpu-event" in engine.outcomes.demoted

    before = len(sched.calls)
    d = engine.submit(xid("gpu07"))
    assert engine.wait(10)
    assert d.verdict == "demoted"
    assert [str(a.kind) for a in d.actions] == ["notify"]
    assert "precision 0.00 (0 confirmed, 3 refuted" in d.why
    assert "gpu07" not in sched.out and len(sched.calls) == before  # the node is not touched
    [demoted] = records(tmp_path, "demoted")
    assert (demoted["policy"], demoted["samples"], demoted["precision"]) == (
        "fatal-gpu-event", 3, 0.0,
    )  # fmt: skip
    kinds = [r["kind"] for r in records(tmp_path, "finding")]
    assert "policy_demoted" in kinds
    webhook = engine.adapters["webhook"]
    assert isinstance(webhook, RecordingAdapter)
    told = [a for a in webhook.calls if a.params.get("kind") == "policy_demoted"]
    assert len(told) == 1 and "precision 0.00" in told[0].reason  # a person is told, once
    decision = [r for r in records(tmp_path, "decision") if r["finding_id"] == d.plan_id]
    assert decision[0]["verdict"] == "demoted" and decision[0]["actions"] == ["notify"]

    for node in ("gpu03", "gpu04", "gpu05"):  # the nodes still out fail their checks
        engine.undo(node, by="bob", reason="repaired")
    assert engine.wait(10)
    assert "fatal-gpu-event" in engine.outcomes.demoted  # 3/6 = 0.50 < 0.55: still demoted
    assert records(tmp_path, "promoted") == []
    engine.undo("gpu06", by="bob", reason="rma")
    assert engine.wait(10)
    assert "fatal-gpu-event" not in engine.outcomes.demoted
    [promoted] = records(tmp_path, "promoted")
    assert (promoted["policy"], promoted["samples"]) == ("fatal-gpu-event", 7)
    assert "policy_promoted" in [r["kind"] for r in records(tmp_path, "finding")]
    assert engine.outcomes.precision()["fatal-gpu-event"] == (4, 3, 0)

    again = engine.submit(xid("gpu07"))
    assert engine.wait(10)
    assert again.verdict == "act"
    assert "gpu07" in sched.out
    engine.close()
    assert len(plans) == 7

    # the demotion state is the journal's: a restart keeps it (promoted, here)
    engine, _ = make_engine(tmp_path, clock, load_policies(data))
    assert engine.outcomes.demoted == {}
    engine.close()


# -- the operator's side: undo with a reason over HTTP, /metrics, the precision table, InfluxDB


def test_undo_reason_over_http_metrics_precision_table_and_influx_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = HandClock()
    engine, sched = make_engine(tmp_path, clock)
    written: list[dict[str, Any]] = []
    engine.outcomes.on_outcome = written.append
    endpoint = Endpoint(engine, "t0ken", max_body_bytes=64 * 1024)
    server = make_server(endpoint, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    auth = {"Authorization": "Bearer t0ken", "Content-Type": "application/json"}

    def request(method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request(method, path, body=body, headers=auth)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data

    try:
        plan = drained(engine, "gpu01")
        drained(engine, "gpu02")
        assert request("POST", "/v1/undo/gpu01", b'{"reason": "sure"}')[0] == 400
        assert "gpu01" in sched.out  # a bad reason changes nothing
        assert request("POST", "/v1/undo/gpu01", b'{"reason": "false_alarm"}')[0] == 202
        assert request("POST", "/v1/undo/gpu02", b'{"reason": "repaired"}')[0] == 202
        assert engine.wait(10)
        status, body = request("GET", "/metrics")
        assert status == 200
        text = body.decode()
        assert 'gpuwarden_policy_precision{policy="fatal-gpu-event"} 0.5' in text
        assert 'gpuwarden_policy_outcomes{policy="fatal-gpu-event",verdict="refuted"} 1' in text
        assert 'gpuwarden_policy_demoted{policy="fatal-gpu-event"} 0' in text
    finally:
        server.shutdown()
        engine.close()
    assert (written[0]["plan_id"], written[0]["verdict"]) == (plan, "refuted")
    point = outcome_point(written[0])
    assert check_point(point.measurement, point.tags, point.fields) == []
    assert point.tags["verdict"] == "refuted" and point.tags["policy"] == "fatal-gpu-event"
    assert "false_alarm" in str(point.fields["message"])
    assert point.fields["finding_id"] == plan

    config = tmp_path / "remediation.toml"
    config.write_text(f'[engine]\naudit_log = "{tmp_path / "audit.jsonl"}"\n')
    assert remediate(["--config", str(config), "precision"]) == 0
    out = capsys.readouterr().out
    assert any(
        line.split()[:5] == ["fatal-gpu-event", "1", "1", "0", "0.50"] for line in out.splitlines()
    ), out
    assert remediate(["--config", str(config), "precision", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row == {"policy": "fatal-gpu-event", "confirmed": 1, "refuted": 1, "unknown": 0,
                   "precision": 0.5, "min_precision": 0.0, "demoted": False}  # fmt: skip
