"""A large job's week at StepFun's real rate (demo.fleet_week): the fault draw keeps the
trace's rate, and the predictor's alert model counts and replays what it is given.

The fault draws are SIMULATED from the REAL StepFun trace; the alerts CONSTRUCTED by hand."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from demo.fleet_week import (
    fleet_faults,
    job_mtbf_h,
    measure,
    model_alerts,
    node_names,
    oracle_alerts,
)
from demo.goodput import Alert, outages_of
from gpuwarden.analytics.cadence import stepfun_rate_per_node_s
from gpuwarden.core.faulttrace import STEPFUN_DAYS, stepfun_faults
from gpuwarden.simulation.faults import resolve
from gpuwarden.simulation.spec import FaultSpec

DAY = 86_400.0


def test_the_job_mtbf_is_the_issues() -> None:
    # issue 40: about 44, 5.6 and 2.8 h for 128, 1,024 and 2,048 nodes
    assert job_mtbf_h(128) == pytest.approx(44.8, abs=0.1)
    assert job_mtbf_h(1024) == pytest.approx(5.6, abs=0.05)
    assert job_mtbf_h(2048) == pytest.approx(2.8, abs=0.05)


def test_the_whole_trace_on_400_nodes_is_every_fault_once() -> None:
    faults = fleet_faults(400, STEPFUN_DAYS * DAY, np.random.default_rng(3))
    assert len(faults) == len(stepfun_faults()) == 584
    assert all(0 <= f.onset_s < STEPFUN_DAYS * DAY for f in faults)


def test_a_large_pool_keeps_the_per_node_rate() -> None:
    nodes, days = 2048, 30.0
    counts = [len(fleet_faults(nodes, days * DAY, np.random.default_rng(s))) for s in range(5)]
    expected = stepfun_rate_per_node_s() * nodes * days * DAY  # about 257
    assert statistics.mean(counts) == pytest.approx(expected, rel=0.2)
    # every node of the pool can fail, not only the first 400
    faults = fleet_faults(nodes, days * DAY, np.random.default_rng(0))
    assert max(f.node for f in faults) >= 1600


def _fault(kind: str, node: int, at_s: float, dur_s: float, xid: int = 0):
    spec = FaultSpec(type=kind, at_s=at_s, node=node, duration_s=dur_s, xid=xid)
    return resolve(spec, 0, 10 * DAY, np.random.default_rng(0), "StepFun: test")


def test_measure_counts_recall_lead_and_both_kinds_of_false_alarm() -> None:
    names = ["n0", "n1", "n2"]
    down = _fault("node_down", 0, 5000.0, 600.0)
    other = _fault("thermal_slowdown", 1, 9000.0, 600.0)
    assert outages_of([down], names) and not outages_of([other], names)
    alerts = [
        Alert("n0", 4400.0),  # 600 s before the fatal fault: warned
        Alert("n0", 4700.0),  # a second warning of the same fault: not a false alarm
        Alert("n1", 8800.0),  # near a fault that did not stop the job
        Alert("n2", 100.0),  # nothing near
        Alert("n0", 20000.0),  # after the fault, nothing follows: a false alarm
    ]
    s = measure([([down, other], names, alerts, 10 * DAY)], horizon_s=3600.0)
    assert s.recall == 1.0 and s.fatal_by_type == {"node_down": 1}
    assert s.leads_s == (600.0,)
    assert (s.near_faults, s.near_alarms, s.noise_alarms) == (1, 1, 2)
    assert s.noise_per_node_h == pytest.approx(2 / (3 * 240))
    # a fault past the horizon is not warned of
    late = measure([([down], names, [Alert("n0", 1000.0)], DAY)], horizon_s=3600.0)
    assert late.recall == 0.0 and late.noise_alarms == 1


def test_the_alert_model_replays_recall_and_lead() -> None:
    names = node_names(4)
    faults = [_fault("node_down", i, 3 * DAY + i * 1000.0, 600.0) for i in range(4)]
    seen = measure([(faults, names, [Alert(n, 3 * DAY + i * 1000.0 - 900.0)
                                    for i, n in enumerate(names)], 10 * DAY)], 3600.0)  # fmt: skip
    got = model_alerts(faults, names, 10 * DAY, seen, np.random.default_rng(1))
    assert sorted((a.node, a.at_s) for a in got) == sorted(
        (n, 3 * DAY + i * 1000.0 - 900.0) for i, n in enumerate(names)
    )
    blind = measure([(faults, names, [], 10 * DAY)], 3600.0)
    assert model_alerts(faults, names, 10 * DAY, blind, np.random.default_rng(1)) == []
    bound = oracle_alerts(outages_of(faults, names), 60.0)
    assert [a.at_s for a in bound] == [o.at_s - 60.0 for o in outages_of(faults, names)]
