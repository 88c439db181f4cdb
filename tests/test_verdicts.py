"""benchmarks/verdicts.py (issue 41, must-show 1) in its smoke size: a SIMULATED day of 24
nodes with its 20-node job crash goes through the agent's sources, the REAL influxd, the
analyze service's job rule and the shipped policies; and its scoring on CONSTRUCTED cases."""

from __future__ import annotations

from collections import Counter

from benchmarks.verdicts import (
    APP_XIDS,
    Removal,
    Week,
    agents,
    build_week,
    decide,
    name,
    run_seed,
    score,
)
from gpuwarden.simulation.faulttypes import Fault


def smoke_week() -> Week:
    return build_week(1, 24, 1.0, 20.0, 3, 1)


def test_the_20_node_job_crash_drains_nothing_and_is_one_job_finding(influxd):
    week = smoke_week()
    _, members = week.big_crash
    assert len(members) == 20
    scores = run_seed(week, influxd, "verdicts_test", 1)
    shipped = scores["shipped"]
    assert shipped.big_job_findings == 1
    assert shipped.big_job_removed == 0  # none of its nodes taken out without a fault
    assert shipped.wrong == 0
    # the same events with application XIDs fatal per node (as peers treat them) take the
    # job's nodes out: the test can tell the two apart
    assert scores["app-xids-fatal"].big_job_removed >= 19
    # the fold adds no removal and loses none
    assert [r for r, _ in scores["no-fold"].removals] == [r for r, _ in shipped.removals]


def test_one_job_finding_for_the_crash_on_the_fast_path_nothing():
    week = smoke_week()
    _, members = week.big_crash
    fast, _ = agents(week, ())
    big = {name(n) for n in members}
    assert [
        f
        for f in fast
        if f.kind == "gpu_xid" and f.subject["node"] in big and f.evidence["xid"] in APP_XIDS
    ] == []
    fast, _ = agents(week, APP_XIDS)
    assert {f.subject["node"] for f in fast if f.evidence.get("xid") == 43} >= big


def fault(node: int, onset: float, end: float, fatal: bool = True, kind: str = "xid79") -> Fault:
    return Fault(
        f"f-{node}-{onset}",
        kind,
        node,
        0,
        0,
        0,
        0,
        "",
        onset,
        onset,
        end,
        1.0,
        79,
        fatal,
        "CONSTRUCTED",
    )


def test_scoring_on_constructed_removals():
    week = Week(
        4,
        86400.0,
        faults=[
            fault(0, 1000, 5000),
            fault(1, 2000, 3000),
            fault(2, 4000, 9000, kind="node_down"),
            fault(3, 100, 200, fatal=False, kind="pcie_replay"),
        ],
    )
    removals = [
        Removal(name(0), 1010, "fatal-gpu-event", "gpu_xid"),  # right, in time
        Removal(name(3), 150, "fatal-gpu-event", "gpu_xid"),  # right: a fault, though not fatal
        Removal(name(3), 7000, "fatal-gpu-event", "gpu_xid"),  # wrong: nothing on node 3 then
    ]
    s = score(week, removals, [], Counter(), 1800.0)
    assert [right for _, right in s.removals] == [True, True, False]
    assert s.wrong_pct == 100 / 3
    assert s.should == 2 and s.missed == Counter({"xid79": 1})  # node 1 never removed
    assert s.blind == 1 and s.blind_missed == 1  # the down node, counted apart


def test_decide_counts_one_removal_per_node_per_cooldown():
    week = smoke_week()
    fast, _ = agents(week, APP_XIDS)
    removals, matched = decide(fast, 1800.0)
    assert matched["fatal-gpu-event"] >= len(removals) > 0
    last: dict[str, float] = {}
    for r in removals:
        assert r.t_s - last.get(r.node, -1e9) >= 1800.0
        last[r.node] = r.t_s
