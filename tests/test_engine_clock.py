"""Issue 39, "Clocks": the engine's timers run on the monotonic clock, wall time is only for
timestamps and for comparing a finding's time with the engine's (docs/DURABILITY.md, "Clocks").

A clock stepped back an hour and forward an hour mid-run, on an injected clock (wall and
monotonic time driven by hand): a cooldown, the rate limit's minute, the lemon window and a
waiting plan's expiry each last exactly their setting in monotonic time; findings with correct
timestamps are refused while the engine's own wall clock is off and accepted once it is
corrected; a restart across a step behaves as the documented rule says. Before this change
every timer read wall time: the cooldown and rate-limit cases here fail on that code (the
commit message has the output). CONSTRUCTED findings, an in-memory scheduler.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.signing import sign_request
from gpuwarden.remediation.audit import AuditLog
from gpuwarden.remediation.clock import Clock
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from gpuwarden.remediation.server import Endpoint
from tests.remediation_util import HandClock, RecordingAdapter

NODES = {f"gpu{i:02d}": "a" for i in range(8)}
POLICIES = load_policies(DEFAULT_POLICIES)
HOUR = 3600.0
TOKEN = "t0ken-for-tests"
SECRET = b"hmac-secret"
T0 = 1_800_000_000.0  # the true time when each test starts


def engine_clock(clock: HandClock) -> Clock:
    """What the engine is given (the code before this change took one callable: the wall)."""
    return Clock(wall=clock.wall, mono=clock.mono)


def make_engine(
    tmp: Path, clock: HandClock, **overrides: object
) -> tuple[Engine, RecordingAdapter]:
    sched = RecordingAdapter("slurm", NODES)
    base = {"dry_run": False, "cooldown_s": 0.0, "actions_per_minute": 10_000,
            "max_nodes_out": 8, "max_fraction_out": 1.0, "return_requires": "none"}  # fmt: skip
    engine = Engine(
        POLICIES,
        {"slurm": sched, "webhook": RecordingAdapter("webhook")},
        AuditLog(tmp / "audit.jsonl"),
        EngineSettings(**(base | overrides)),  # type: ignore[arg-type]
        clock=engine_clock(clock),
    )
    return engine, sched


def xid(node: str, n: int) -> Finding:
    """A fatal XID on ``node``; ``n`` makes its id unique (its own time bucket), whatever the
    clocks say (the engine's Python API does not check a finding's time; the endpoint does)."""
    return Finding(
        kind="gpu_xid",
        subject={"cluster": "test", "node": node, "gpu": "0"},
        severity=Severity.CRITICAL,
        time_ns=int((T0 + n * 300) * 1e9),
        evidence={"xid": 79},
        confidence=1.0,
        summary=f"XID 79 on {node}",
        source="agent",
    )


def healthy(node: str, n: int) -> Finding:
    return Finding(
        kind="node_healthy",
        subject={"cluster": "test", "node": node},
        severity=Severity.INFO,
        time_ns=int((T0 + n * 300) * 1e9),
        summary=f"{node} repaired",
    )


# -- mid-run steps ----------------------------------------------------------------------------


@pytest.mark.parametrize("step_s", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_cooldown_lasts_its_setting_whatever_the_wall_clock_does(
    tmp_path: Path, step_s: float
) -> None:
    """Before: forward, the cooldown ended an hour early (a second drain 10 s after the
    first); back, it lasted an hour longer."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    assert engine.submit(xid("gpu01", 1)).verdict == "act"
    assert engine.wait(10)
    clock.advance(10.0)
    clock.step(step_s)
    held = engine.submit(xid("gpu01", 2))
    assert held.verdict == "cooldown", held.why
    clock.advance(1800.0 - 10.0 - 1.0)  # 1 s before the cooldown ends
    assert engine.submit(xid("gpu01", 3)).verdict == "cooldown"
    clock.advance(2.0)  # 1 s after
    after = engine.submit(xid("gpu01", 4))
    assert after.verdict == "act", after.why
    assert engine.wait(10)
    engine.close()
    assert "acted on 10 s ago" in held.why  # what the operator is told (before: -3590 s)


@pytest.mark.parametrize("step_s", [HOUR, -HOUR], ids=["forward", "back"])
def test_the_rate_limit_holds_for_a_minute_whatever_the_wall_clock_does(
    tmp_path: Path, step_s: float
) -> None:
    """Before: forward, the minute's actions were forgotten at once; back, for an hour."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock, actions_per_minute=3)
    assert engine.submit(xid("gpu01", 1)).verdict == "act"  # checkpoint, drain, requeue: 3
    assert engine.wait(10)
    clock.step(step_s)
    clock.advance(59.0)
    held = engine.submit(xid("gpu02", 1))
    assert held.verdict == "rate_limited", held.why
    assert engine.tick() == []  # still inside the minute
    clock.advance(2.0)
    assert [d.verdict for d in engine.tick()] == ["act"]
    assert engine.wait(10)
    engine.close()


@pytest.mark.parametrize("step_s", [HOUR, -HOUR], ids=["forward", "back"])
def test_the_lemon_window_is_monotonic(tmp_path: Path, step_s: float) -> None:
    """A node taken out 3 times in ``lemon_window_s`` stays a lemon for exactly that long."""
    clock = HandClock()
    engine, sched = make_engine(tmp_path, clock, lemon_count=3, lemon_window_s=86400.0)
    for n in range(1, 4):
        assert engine.submit(xid("gpu04", n)).verdict == "act"
        assert engine.wait(10) and "gpu04" in sched.out
        clock.advance(60.0)
        if n < 3:
            assert engine.submit(healthy("gpu04", n)).verdict == "act"
            assert engine.wait(10) and "gpu04" not in sched.out
    # the first removal was 180 s ago; the window closes on it 86400 s after it
    clock.advance(86400.0 - 180.0 - 30.0)
    clock.step(step_s)
    assert len(engine.guards.lemon("gpu04")) == 3  # 30 s left
    clock.advance(60.0)
    assert len(engine.guards.lemon("gpu04")) == 0  # the first removal is out of the window
    engine.close()


@pytest.mark.parametrize("step_s", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_waiting_plan_expires_after_its_setting_in_monotonic_time(
    tmp_path: Path, step_s: float
) -> None:
    clock = HandClock()
    engine, sched = make_engine(tmp_path, clock, max_nodes_out=1, pending_expire_s=HOUR)
    sched.out = {"gpu07"}  # someone else's drain fills the blast radius
    assert engine.submit(xid("gpu01", 1)).verdict == "blast_radius"
    clock.advance(600.0)
    clock.step(step_s)
    assert engine.tick() == [] and len(engine.pending()) == 1  # 50 minutes left
    clock.advance(HOUR - 600.0 + 1.0)
    assert engine.tick() == [] and engine.pending() == []  # expired, not run
    assert "gpu01" not in sched.out
    engine.close()


def test_record_durations_are_monotonic(tmp_path: Path) -> None:
    """An action's ``duration_s`` and ``since_finding_s`` come from the monotonic clock (a
    step between two readings made them an hour long, or negative); its ``t`` is wall time."""
    clock = HandClock()
    engine, sched = make_engine(tmp_path, clock)
    original = sched.perform

    def slow_and_stepped(action: Any) -> Any:
        clock.advance(2.0)
        clock.step(-HOUR)
        return original(action)

    sched.perform = slow_and_stepped
    assert engine.submit(xid("gpu01", 1)).verdict == "act"
    assert engine.wait(10)
    engine.close()
    records = engine.audit.records()
    drain = next(r for r in records if r["event"] == "action" and r["action"] == "drain")
    assert drain["duration_s"] == 2.0
    assert 0.0 < drain["since_finding_s"] <= 6.0
    assert drain["t"] < T0  # the wall clock stepped back twice, and the record says so


# -- across a restart -------------------------------------------------------------------------


def test_a_step_after_the_restart_moves_no_timer(tmp_path: Path) -> None:
    """The journal's wall times are placed on the monotonic clock once, at start: a step
    afterwards does not end a cooldown restored from the journal early."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    assert engine.submit(xid("gpu01", 1)).verdict == "act"
    assert engine.wait(10)
    engine.close()
    clock.restart(down_s=600.0)
    engine, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    clock.step(HOUR)
    assert engine.submit(xid("gpu01", 2)).verdict == "cooldown"
    clock.advance(1800.0 - 600.0 - 1.0)
    assert engine.submit(xid("gpu01", 3)).verdict == "cooldown"
    clock.advance(2.0)
    assert engine.submit(xid("gpu01", 4)).verdict == "act"
    assert engine.wait(10)
    engine.close()


@pytest.mark.parametrize(("step_s", "verdict"), [(0.0, "cooldown"), (HOUR, "act")])
def test_a_step_forward_while_the_engine_is_down_counts_as_time_passed(
    tmp_path: Path, step_s: float, verdict: str
) -> None:
    """The documented residual: across a restart only wall time exists, so an hour the wall
    clock was stepped forward while the engine was down is an hour of cooldown spent (with no
    step, the cooldown restored from the journal still holds after a minute down)."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    assert engine.submit(xid("gpu01", 1)).verdict == "act"
    assert engine.wait(10)
    engine.close()
    clock.restart(down_s=60.0, step_s=step_s)
    engine, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    assert engine.submit(xid("gpu01", 2)).verdict == verdict
    assert engine.wait(10)
    engine.close()


def test_a_record_from_the_future_counts_from_the_restart(tmp_path: Path) -> None:
    """A clock stepped back while the engine was down puts the journal's records in the
    future: each is placed at the restart (clamped), so its cooldown runs whole from there,
    not an hour longer (before: the cooldown read the wall clock and lasted the hour more)."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    assert engine.submit(xid("gpu01", 1)).verdict == "act"
    assert engine.wait(10)
    engine.close()
    clock.restart(down_s=60.0, step_s=-HOUR)
    engine, _ = make_engine(tmp_path, clock, cooldown_s=1800.0)
    assert engine.submit(xid("gpu01", 2)).verdict == "cooldown"
    clock.advance(1799.0)
    assert engine.submit(xid("gpu01", 3)).verdict == "cooldown"
    clock.advance(2.0)
    assert engine.submit(xid("gpu01", 4)).verdict == "act"
    assert engine.wait(10)
    engine.close()


# -- findings: the one place two hosts' clocks meet ----------------------------------------------


def post(endpoint: Endpoint, finding: Finding, sign_at: float | None) -> tuple[int, dict[str, Any]]:
    """POST one finding, signed with the sender's clock reading ``sign_at`` (None: unsigned,
    the legacy bearer-only mode, as an alert source posts with ``alerts_unsigned``)."""
    body = json.dumps(finding.to_json()).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Length": str(len(body))}
    if sign_at is not None:
        headers |= sign_request(SECRET, "POST", "/v1/findings", body, t=int(sign_at))
    status, payload = endpoint.handle("POST", "/v1/findings", headers, lambda n: body[:n])
    return int(status), payload


def risk_at(node: str, t: float) -> Finding:
    return Finding(
        kind="failure_risk",
        subject={"cluster": "test", "node": node, "gpu": "3"},
        severity=Severity.WARNING,
        time_ns=int(t * 1e9),
        evidence={"ecc_sbe_growth": 41.0},
        probability=0.95,
        source="analytics",
    )


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
@pytest.mark.parametrize("step_s", [HOUR, -HOUR], ids=["forward", "back"])
def test_findings_are_refused_while_the_engines_clock_is_off_and_accepted_once_corrected(
    tmp_path: Path, step_s: float, signed: bool
) -> None:
    """The engine's wall clock stepped an hour: a finding with a correct timestamp (made 60 s
    ago by a host whose clock is right) is refused and counted, nothing acted on: 401 when
    signed (the signature's timestamp is an hour off), 422 when not (the finding an hour in
    the future, or an hour older than ``max_finding_age_s`` allows). Once the engine's clock
    is corrected, the sender's retry (signed afresh) is accepted and decided."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock)
    endpoint = Endpoint(engine, TOKEN, secret=SECRET if signed else b"", clock=engine_clock(clock))
    made = clock.wall() - 60.0
    finding = risk_at("gpu02", made)
    clock.step(step_s)  # the engine's clock is wrong; the sender's, true time, is not
    status, payload = post(endpoint, finding, T0 if signed else None)
    assert status == (401 if signed else 422), payload
    want = "signature timestamp" if signed else ("old" if step_s > 0 else "in the future")
    assert want in payload["error"]
    assert endpoint.rejected == {status: 1} and engine.stats.findings == 0
    clock.step(-step_s)  # corrected (chrony); the sender retries
    clock.advance(30.0)
    status, payload = post(endpoint, finding, T0 + 30.0 if signed else None)
    assert status == 202, payload
    assert [r["verdict"] for r in payload["results"]] == ["act"]
    assert engine.wait(10)
    engine.close()


def test_a_node_300_s_ahead_is_accepted_and_301_s_ahead_refused(tmp_path: Path) -> None:
    """The documented rule for a node whose clock is off: within ``max_clock_skew_s`` (300 s)
    either way its requests are accepted; beyond, refused and counted (401 signed, 422 for an
    unsigned finding's time). The engine's timers are not involved: this is two hosts'
    clocks compared, and the fix is the node's clock (chrony)."""
    clock = HandClock()
    engine, _ = make_engine(tmp_path, clock)
    signed = Endpoint(engine, TOKEN, secret=SECRET, clock=engine_clock(clock))
    unsigned = Endpoint(engine, TOKEN, clock=engine_clock(clock))
    ahead = clock.wall() + 300.0  # the node's clock
    assert post(signed, risk_at("gpu01", ahead), ahead)[0] == 202
    assert post(unsigned, risk_at("gpu02", ahead), None)[0] == 202
    ahead += 1.0
    status, payload = post(signed, risk_at("gpu03", ahead), ahead)
    assert status == 401 and "301 s off" in payload["error"]
    status, payload = post(unsigned, risk_at("gpu03", ahead), None)
    assert status == 422 and "301 s in the future" in payload["error"]
    assert signed.rejected == {401: 1} and unsigned.rejected == {422: 1}
    assert engine.wait(10)
    engine.close()
