"""Straggler attribution against a known answer: each cause blamed where, and only where, it is
true.

The scenario is SIMULATED (``benchmarks.attribution.mix_spec``: every slowdown fault type at
once on one 32-node job, a slow GPU under a congested switch, a power-braked node beside a node
with a slow GPU, a slow pipeline stage), written into the REAL influxd and analysed by the
production runner; the true causes come from the fault types (``simulation.causes``). The
hand-built frames below are CONSTRUCTED, one per mistake the attribution used to make.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import polars as pl
import pytest

from benchmarks.attribution import JOB, blamed_causes, mix_spec, run_scenario, truth_for
from gpuwarden.analytics.attribution import attribute
from gpuwarden.analytics.runner import Analysis
from gpuwarden.simulation.causes import CAUSES, Score, score, true_causes
from gpuwarden.simulation.generator import ScenarioGenerator
from testbed.influxd import LocalInfluxd

pytestmark = pytest.mark.influxdb
SEED = 3


@dataclass
class Mix:
    gen: ScenarioGenerator
    analysis: Analysis
    truth: dict[str, str]
    blamed: dict[str, str]
    missed: int


@pytest.fixture(scope="module")
def mix(influxd: LocalInfluxd, tmp_path_factory: pytest.TempPathFactory) -> Mix:
    spec = mix_spec(SEED)
    gen, a = run_scenario(spec, SEED, influxd, tmp_path_factory.mktemp("attribution"))
    js = spec.jobs[0]
    blamed = blamed_causes(a, JOB)
    ranks = true_causes(gen, JOB, 0.0, float(spec.duration_s))
    truth, missed = truth_for(ranks, blamed, js.nodes * spec.gpus_per_node, js.pp)
    return Mix(gen, a, truth, blamed, missed)


def test_the_mix_has_every_cause_and_every_slowed_rank_is_found(mix: Mix) -> None:
    assert set(mix.truth.values()) >= set(CAUSES)
    assert {mix.truth[k] for k in mix.blamed} == set(CAUSES)
    assert mix.missed == 0


@pytest.mark.parametrize("cause", CAUSES)
def test_each_cause_is_blamed_where_it_is_true_and_nowhere_else(mix: Mix, cause: str) -> None:
    true_here = sorted(k for k in mix.blamed if mix.truth.get(k) == cause)
    blamed_here = sorted(k for k, c in mix.blamed.items() if c == cause)
    assert true_here, f"no straggler with true cause {cause}"
    assert blamed_here == true_here, {k: (mix.truth.get(k), mix.blamed[k]) for k in blamed_here}


def test_a_slow_gpu_under_a_congested_switch_is_the_gpu_and_its_peers_the_network(
    mix: Mix,
) -> None:
    spec = mix.gen.spec
    tor = next(f for f in spec.faults if f.type == "tor_congestion")
    hot = mix.gen.switch_of[tor.node]
    under = {n for n, s in enumerate(mix.gen.switch_of) if s == hot}
    slow = next(f for f in spec.faults if f.type == "slow_gpu" and f.node in under)
    rank = str(slow.node * spec.gpus_per_node + slow.gpu)  # the job runs on every node in order
    assert mix.blamed[rank] == "gpu"
    assert mix.analysis.attributions[(JOB, rank)][1]["clock_ratio"] < 0.95
    switch_blames = {c for k, c in mix.blamed.items() if k != rank and mix.truth.get(k) == "nic"}
    assert switch_blames == {"nic"}


def test_neighbouring_faults_are_told_apart(mix: Mix) -> None:
    spec = mix.gen.spec
    brake = next(f for f in spec.faults if f.type == "power_brake")
    slow = next(f for f in spec.faults if f.type == "slow_gpu" and f.node == brake.node + 1)
    g = spec.gpus_per_node
    assert {mix.blamed[str(brake.node * g + i)] for i in range(g)} == {"power"}
    assert mix.blamed[str(slow.node * g + slow.gpu)] == "gpu"
    assert not any(str(slow.node * g + i) in mix.blamed for i in range(g) if i != slow.gpu)


# -- the score ---------------------------------------------------------------------------------


def test_the_score_counts_a_wrong_blame_against_both_causes() -> None:
    truth = {"1": "gpu", "2": "nic", "3": "nic", "4": "pcie"}
    s = score(truth, {"1": "gpu", "2": "gpu", "3": "nic", "4": "unknown", "5": "nic"})
    assert s.confusion == Counter(
        {("gpu", "gpu"): 1, ("nic", "gpu"): 1, ("nic", "nic"): 1, ("pcie", "unknown"): 1,
         ("none", "nic"): 1}
    )  # fmt: skip
    rows = {r.cause: r for r in s.per_cause()}
    assert (rows["gpu"].precision, rows["gpu"].recall) == (0.5, 1.0)
    assert (rows["nic"].precision, rows["nic"].recall) == (0.5, 0.5)
    assert (rows["pcie"].precision, rows["pcie"].recall, rows["pcie"].f1) == (0.0, 0.0, 0.0)
    assert s.macro_f1() == pytest.approx((2 / 3 + 0.5 + 0.0) / 3)
    assert Score(Counter({("gpu", "gpu"): 4})).macro_f1() == 1.0


# -- the mistakes, CONSTRUCTED -----------------------------------------------------------------


Cols = dict[str, list[Any]]


def _node(suspect: Cols, peers: Cols, n: int = 20) -> pl.DataFrame:
    """A node's 8 GPUs over ``n`` samples: GPU 3 takes ``suspect``'s columns, the others
    ``peers``' (each a list cycled over the samples)."""
    rows = []
    for t in range(n):
        for g in range(8):
            cols = suspect if g == 3 else peers
            row: dict[str, object] = {"time": t, "gpu": str(g), "sm_clock_max_mhz": 1410.0}
            row |= {k: v[t % len(v)] for k, v in cols.items()}
            rows.append(row)
    return pl.DataFrame(rows)


BUSY: Cols = {"gpu_util_pct": [99.0], "sm_clock_mhz": [1410.0], "power_w": [350.0],
        "clock_event_reasons_code": [0]}  # fmt: skip
WAITING = pl.DataFrame({"xmit_wait_ratio": [0.2] * 5, "symbol_error_total_inc": [0.0] * 5})


def test_a_gpu_idling_while_its_rank_waits_on_the_network_is_not_blamed() -> None:
    """The benchmark's GPU 0s under the congested switch: idle (parked clock) while its busy
    peers run at full clock; the old rule read the parked clock as a slow GPU."""
    idle: Cols = {"gpu_util_pct": [0.0], "sm_clock_mhz": [210.0], "power_w": [60.0],
            "clock_event_reasons_code": [1]}  # fmt: skip
    peers = {k: [*v, *v, *v, idle[k][0]] for k, v in BUSY.items()}  # idle a quarter of the time
    cause, ev = attribute(_node(idle, peers), WAITING, "3")
    assert cause == "nic" and ev["compared_while"] == "idle" and ev["clock_ratio"] == 1.0
    slower_idle = idle | {"sm_clock_mhz": [150.0]}  # its idle clock is lower than theirs
    assert attribute(_node(slower_idle, peers), WAITING, "3")[0] == "gpu"


def test_a_power_cap_at_full_clock_slows_nothing() -> None:
    """A GPU that draws more than its peers sits at its software power cap (reason 0x4) all the
    time, at full clock: the old rule blamed it on its throttle share alone."""
    capped = BUSY | {"power_w": [400.0], "clock_event_reasons_code": [0x4]}
    cause, ev = attribute(_node(capped, BUSY), WAITING, "3")
    assert cause == "nic" and ev["throttled_share"] == 1.0 and ev["slowed_share"] == 0.0
    throttled = capped | {"sm_clock_mhz": [1410.0, 1410.0, 1000.0, 1000.0]}  # half the time
    assert attribute(_node(throttled, BUSY), WAITING, "3")[0] == "gpu"


def test_a_node_held_back_by_its_power_brake_is_power() -> None:
    braked = BUSY | {"sm_clock_mhz": [705.0], "clock_event_reasons_code": [0x80 | 0x8]}
    cause, ev = attribute(_node(braked, braked), WAITING, "3")
    assert cause == "power" and ev["node_clock_ratio"] == 0.5
    assert ev["node_power_brake_share"] == 1.0
    capped = braked | {"clock_event_reasons_code": [0x4]}  # the driver's own cap: not power
    assert attribute(_node(capped, capped), WAITING, "3")[0] == "nic"
