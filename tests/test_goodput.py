"""Checkpoint cadence (analytics.cadence) and the levers model (demo.goodput).

CONSTRUCTED outages and alerts, with numbers worked by hand in each test."""

from __future__ import annotations

import dataclasses
import math

import pytest

from demo.goodput import (
    LEVERS,
    Alert,
    Levers,
    Outage,
    Setup,
    _Day,
    ablation,
    every_subset,
    fault_onsets,
    saved_pct,
    shapley,
    simulate,
)
from gpuwarden.analytics.cadence import (
    advise,
    count_announced,
    expected_waste,
    failure_rate,
    optimal_interval_s,
    stepfun_rate_per_node_s,
)


def test_stepfun_prior_is_one_fault_per_server_every_eight_months() -> None:
    # 584 faults on 400 servers over 349 days
    assert stepfun_rate_per_node_s() * 86_400 * 349 * 400 == pytest.approx(584)


def test_young_and_daly() -> None:
    # C << M: Daly's estimate tends to Young's sqrt(2CM)
    assert optimal_interval_s(1.0, 1e6) == pytest.approx(math.sqrt(2e6), rel=1e-3)
    # C = 300 s, M = 3 h: sqrt(2CM) (1 + sqrt(C/2M)/3 + C/18M) - C, by hand:
    # 2545.58 * (1 + 0.039284 + 0.001543) - 300 = 2349.5 s
    assert optimal_interval_s(300.0, 10_800.0) == pytest.approx(2349.5, abs=0.1)
    assert optimal_interval_s(5_000.0, 2_000.0) == 2_000.0  # C >= 2M: the MTBF itself
    assert optimal_interval_s(0.0, 100.0) == 0.0
    with pytest.raises(ValueError):
        optimal_interval_s(10.0, 0.0)


def test_the_advised_interval_minimises_the_waste() -> None:
    c, m = 276.0, 3 * 3600.0
    best = optimal_interval_s(c, m)
    w = expected_waste(best, c, m)
    for other in (0.5 * best, 0.8 * best, 1.25 * best, 2 * best, 3600.0):
        assert expected_waste(other, c, m) > w
    # by hand: hourly saves cost 276/3600; recompute (3600+276)/21600
    assert expected_waste(3600.0, c, m) == pytest.approx(276 / 3600 + 3876 / 21600)
    assert expected_waste(3600.0, c, m, restart_s=600.0) == pytest.approx(
        276 / 3600 + 3876 / 21600 + 600 / 10_800
    )


def test_failure_rate_moves_from_prior_to_history() -> None:
    prior = 1e-6
    none = failure_rate(0, 0.0, prior_per_node_s=prior)
    assert none.per_node_s == pytest.approx(prior) and none.history_weight == 0.0
    # 1000 faults over 1e8 node-seconds (1e-5) outweigh 5 prior faults at 1e-6
    lots = failure_rate(1000, 1e8, prior_per_node_s=prior)
    assert lots.per_node_s == pytest.approx(1005 / (5e6 + 1e8))
    assert lots.history_weight > 0.99
    assert lots.mtbf_s(10) == pytest.approx(1 / (10 * lots.per_node_s))
    with pytest.raises(ValueError):
        failure_rate(-1, 10.0)
    with pytest.raises(ValueError):
        failure_rate(1, 10.0, prior_faults=0)


def test_warned_faults_leave_the_rate_the_interval_is_set_by() -> None:
    prior = 1e-6
    # 10 faults over 1e7 node-s, 6 of them warned of: the unwarned rate counts the 5 prior
    # faults and the 4 unwarned ones over the same exposure
    r = failure_rate(10, 1e7, prior_per_node_s=prior, announced=6)
    assert r.per_node_s == pytest.approx(15 / (5e6 + 1e7))
    assert r.unannounced().per_node_s == pytest.approx(9 / (5e6 + 1e7))
    assert r.unannounced().mtbf_s(2) > r.mtbf_s(2)
    # nothing warned of, or no history: the whole rate
    assert failure_rate(10, 1e7, prior_per_node_s=prior).unannounced().per_node_s == r.per_node_s
    assert failure_rate(0, 0.0, prior_per_node_s=prior).unannounced().per_node_s == prior
    with pytest.raises(ValueError, match="announced"):
        failure_rate(2, 10.0, announced=3)
    faults = {"a": [100.0, 5000.0], "b": [300.0]}
    warnings = {"a": [50.0, 4990.0], "b": [301.0], "c": [10.0]}
    assert count_announced(faults, warnings, 60.0) == 2  # b's came after its fault
    assert count_announced(faults, warnings, 5.0) == 0


def test_advice_says_what_it_gains() -> None:
    rate = failure_rate(0, 0.0, prior_per_node_s=1 / (12 * 3 * 3600.0))  # 12 nodes: M = 3 h
    a = advise("llm", 12, 276.0, 3600.0, rate)
    assert a.mtbf_s == pytest.approx(3 * 3600.0)
    assert a.advised_s == pytest.approx(optimal_interval_s(276.0, 3 * 3600.0))
    assert a.waste_advised < a.waste_current and a.gain > 0
    assert "checkpoint every 38 min instead of 60 min" in a.describe()
    # a save every few seconds is advice no one takes
    assert advise("llm", 12, 0.01, 3600.0, rate, min_interval_s=60.0).advised_s == 60.0


def _setup(**kw: float | str) -> Setup:
    # the cases were worked by hand with a drained node back at its repair (return_s = 0)
    base = dict(pool=("n0", "n1", "n2", "n3"), job_nodes=2, day_s=20_000.0, interval_s=3600.0,
                cost_s=100.0, restart_s=600.0, horizon_s=3600.0, max_out=2,
                return_s=0.0)  # fmt: skip
    return Setup(**(base | kw))  # type: ignore[arg-type]


XID79 = Outage("n1", 5000.0, 6500.0, "xid79", slurm_sees=False)


def test_reactive_relands_on_a_broken_gpu_and_isolation_does_not() -> None:
    s = _setup()
    r = simulate([XID79], [], s, Levers())
    # stop at 5000 (last save done at 3700): recompute 1300; requeued at once onto n0,n1
    # (Slurm sees n1 idle), each start fails 60 s in (fail_s; placed at 5000, 5060, ..., 6440)
    # until n1 is repaired at 6500: 25 failed starts; placed at 6500, training again at 7100
    assert r.stops == 1 and r.failed_starts == 25
    assert r.recompute_s == pytest.approx(1300.0)
    assert r.restart_s == pytest.approx(2100.0)
    iso = simulate([XID79], [], s, Levers(isolation=True))
    assert iso.failed_starts == 0 and iso.restart_s == pytest.approx(600.0)
    assert saved_pct(r, iso) > 0


def test_a_vanished_node_waits_for_slurm_unless_isolated() -> None:
    gone = Outage("n0", 5000.0, 9000.0, "node_down", slurm_sees=True)
    s = _setup()
    r = simulate([gone], [], s, Levers())
    assert r.failed_starts == 0  # Slurm saw it DOWN and placed the job elsewhere
    assert r.restart_s == pytest.approx(300.0 + 600.0)  # SlurmdTimeout, then the restart
    iso = simulate([gone], [], s, Levers(isolation=True))
    assert iso.restart_s == pytest.approx(120.0 + 600.0)  # node_silent: two analyses


def test_a_requeued_job_is_placed_when_it_is_requeued() -> None:
    """Slurm places a requeued job on the nodes usable when it requeues it, not on those usable
    when the restart ends: n0 vanishes for 850 s; Slurm sees it after 300 s and requeues the
    job onto n1,n2 (n0 still DOWN), 50 s before n0 is back; n2's GPU then fails at 8000. The
    model before placed the job at the restart's end (5900, n0 back) and never met n2's fault."""
    gone = Outage("n0", 5000.0, 5850.0, "node_down", slurm_sees=True)
    later = Outage("n2", 8000.0, 8100.0, "xid79", slurm_sees=False)
    d = _Day([gone, later], [], _setup(), Levers())
    b = d.run()
    assert d.trace[0] == (5000.0, "stop", 5300.0, 5900.0, ["n1", "n2"])
    assert b.stops == 2 and b.failed_starts == 0


def test_a_node_that_breaks_while_the_job_starts_fails_the_start() -> None:
    """Isolation drains n1 at its fault (5000-5100) and the job is placed on n0,n2; n2's GPU
    fails at 5300, inside the 600 s restart: the start fails then, and the job is placed anew
    at once on n0,n1 (n1 repaired, n2 drained), training again at 5900."""
    faults = [Outage("n1", 5000.0, 5100.0, "xid79", slurm_sees=False)]
    faults.append(Outage("n2", 5300.0, 5400.0, "xid79", slurm_sees=False))
    d = _Day(faults, [], _setup(), Levers(isolation=True))
    b = d.run()
    assert d.trace[1] == (5300.0, "failed start", 5300.0, 5900.0, ["n0", "n1"])
    assert (b.stops, b.failed_starts) == (1, 1) and b.restart_s == pytest.approx(900.0)


def test_a_fault_during_the_engines_save_loses_it() -> None:
    """The engine's checkpoint request is a synchronous save (cost_s, 100 s here): a job node
    that fails before it is on storage loses it, and the job stops there, recomputing from its
    last save before the alert (3700) to the alert (4000). Both policies: a checkpoint-only one
    (the job would have run on) and a move (n1 is drained all the same, so the job is placed on
    n0,n2 and no start fails). The model before let the save finish after the fault: a perfect
    predictor's alert 60 s ahead then saved everything, with a save of 276 s."""
    during = Outage("n1", 4050.0, 4060.0, "xid79", slurm_sees=False)
    warned = [Alert("n1", 4000.0)]
    d = _Day([during], warned, _setup(alert_action="checkpoint"), Levers(prediction=True))
    b = d.run()
    assert (b.stops, b.warned_saves, b.moves) == (1, 1, 0) and b.recompute_s == pytest.approx(300.0)
    assert d.trace[0][:3] == (4050.0, "stop", 4050.0)
    # placed at once on n0,n1 with n1 still broken (to 4060): that start fails 60 s in
    assert b.failed_starts == 1
    d = _Day([during], warned, _setup(), Levers(prediction=True))
    b = d.run()
    assert (b.stops, b.moves, b.failed_starts) == (1, 0, 0)
    assert b.recompute_s == pytest.approx(300.0)
    assert d.trace[0] == (4050.0, "stop", 4050.0, 4650.0, ["n0", "n2"])


def test_isolation_drains_what_broke_before_the_job_is_placed() -> None:
    """n0 vanishes at 5000; isolation sees it silent at 5120 and the job is requeued then. n2's
    GPU broke at 5050, in between: the fast path drained it within seconds, so the job is placed
    on n1,n3, not on n2 to fail its start (a review of the placement at requeue found the drains
    run only to the stop)."""
    gone = Outage("n0", 5000.0, 9000.0, "node_down", slurm_sees=True)
    spare = Outage("n2", 5050.0, 5150.0, "xid79", slurm_sees=False)
    d = _Day([gone, spare], [], _setup(), Levers(isolation=True))
    b = d.run()
    assert d.trace[0] == (5000.0, "stop", 5120.0, 5720.0, ["n1", "n3"])
    assert b.failed_starts == 0


def test_a_start_that_takes_no_time_is_refused() -> None:
    """A start that fails at once would fail again at once, for ever: the model refuses it."""
    for bad in ({"fail_s": 0.0}, {"restart_s": 0.0}):
        with pytest.raises(ValueError):
            _setup(**bad)


def test_an_alert_at_the_days_end_charges_no_time_past_it() -> None:
    """An alert 50 s before the day's end: the engine's 100 s save is charged 50 s, and no
    restart (the review found -50 s of restart)."""
    s = _setup()
    near = simulate([], [Alert("n0", 19_950.0)], s, Levers(prediction=True))
    quiet = simulate([], [], s, Levers(prediction=True))
    assert near.restart_s == 0.0 and near.moves == 1
    assert near.checkpoint_s == pytest.approx(quiet.checkpoint_s + 50.0)


def test_the_blast_radius_cap_counts_every_node_out_as_the_guard_does() -> None:
    """The engine's guard counts the nodes out by anyone, from the scheduler (a third review):
    with ``max_out`` 1, a spare DOWN in Slurm (n3, a vanished slurmd), or one isolation drained
    a second before, leaves no room, and the alert on n0 is not acted on (before, the model
    counted only gpuwarden's drains, and those only up to the last stop, and moved the job)."""
    warned = [Alert("n0", 2000.0)]
    down = Outage("n3", 1000.0, 9000.0, "node_down", slurm_sees=True)
    assert simulate([down], warned, _setup(max_out=1), Levers(prediction=True)).moves == 0
    assert simulate([down], warned, _setup(max_out=2), Levers(prediction=True)).moves == 1
    gpu = Outage("n3", 1999.0, 9000.0, "xid79", slurm_sees=False)
    both = Levers(prediction=True, isolation=True)
    assert simulate([gpu], warned, _setup(max_out=1), both).moves == 0


def test_a_save_under_way_when_the_day_ends_is_charged() -> None:
    """A day that ends 50 s into the first save (hourly, 100 s): those 50 s held training (a
    review found holds under way at a segment's end charged to nothing)."""
    assert simulate([], [], _setup(day_s=3650.0), Levers()).checkpoint_s == pytest.approx(50.0)


def test_waiting_for_nodes_at_the_days_start_is_lost_time() -> None:
    """n0, n1 and n2 are DOWN until 5000: the 2-node job cannot start before; those 5000 s are
    lost (charged as restart: the job waiting for nodes), in every arm."""
    down = [Outage(n, 0.0, 5000.0, "node_down", slurm_sees=True) for n in ("n0", "n1", "n2")]
    for levers in (Levers(), Levers.all()):
        assert simulate(down, [], _setup(), levers).restart_s == pytest.approx(5000.0)


def test_prediction_moves_the_job_before_the_fault() -> None:
    s = _setup()
    warned = simulate([XID79], [Alert("n1", 4000.0)], s, Levers(prediction=True))
    assert warned.moves == 1 and warned.stops == 0
    assert warned.recompute_s == 0.0  # it checkpointed on the alert
    assert warned.restart_s == pytest.approx(600.0)
    # an alert on a node the job is not on costs nothing
    idle = simulate([], [Alert("n3", 4000.0)], s, Levers(prediction=True))
    assert idle.moves == 0 and idle.total_s == simulate([], [], s, Levers()).total_s


def test_cadence_saves_more_often_when_faults_are_frequent() -> None:
    s = _setup(prior_scale=1e5)  # a fleet that fails every few hours per node
    flat = simulate([XID79], [], s, Levers())
    tuned = simulate([XID79], [], s, Levers(cadence=True))
    assert max(tuned.intervals) < 3600.0
    assert tuned.checkpoint_s > flat.checkpoint_s  # more saves ...
    assert tuned.recompute_s < flat.recompute_s  # ... and less to recompute


def test_cadence_learns_the_rate_from_the_fleets_past_not_from_a_setting() -> None:
    """The model's cadence is told nothing of the scenario: the prior is the product's
    (StepFun's rate, scale 1: before, 150, the scenario's compression). With no past it
    advises saving less often than the job's hour (StepFun's fleet fails rarely); the same
    fleet with 30 days of its faults in the store (here 4 nodes, a fault an hour per node)
    learns the rate and saves more often than hourly."""
    assert _setup().prior_scale == 1.0
    blind = simulate([XID79], [], _setup(), Levers(cadence=True))
    assert blind.intervals and min(blind.intervals) > 3600.0
    days = 29 * 86_400.0
    past = _setup(history_faults=int(4 * days / 3_600), history_node_s=4 * days)
    learned = simulate([XID79], [], past, Levers(cadence=True))
    assert max(learned.intervals) < 3600.0
    assert learned.recompute_s < blind.recompute_s


def test_cadence_counts_faults_as_the_analyze_service_does() -> None:
    """A node's outages within ``[cadence] merge_s`` (600 s) are one fault, as the service
    merges a node's critical findings; before, the model counted each (a review: about 19 %
    more faults than the product on the backtest day's history)."""
    outs = [Outage("n1", 100.0, 200.0, "node_down", slurm_sees=True),
            Outage("n1", 175.0, 300.0, "node_down", slurm_sees=True),
            Outage("n1", 720.0, 800.0, "xid79", slurm_sees=False),  # 545 s after the last
            Outage("n1", 2000.0, 2100.0, "xid79", slurm_sees=False),
            Outage("n2", 150.0, 250.0, "xid79", slurm_sees=False)]  # fmt: skip
    # 720 s is 620 s after the first: merged only because it is within 600 s of the last
    assert fault_onsets(outs, 600.0) == {"n1": [100.0, 2000.0], "n2": [150.0]}
    assert _setup().merge_s == 600.0
    # cadence after two outages of one node a minute apart: one fault, not two
    s = _setup(prior_scale=1e5, day_s=60_000.0)
    twice = [XID79, dataclasses.replace(XID79, at_s=XID79.at_s + 60.0)]
    merged = simulate(twice, [], s, Levers(cadence=True))
    each = simulate(twice, [], dataclasses.replace(s, merge_s=0.0), Levers(cadence=True))
    assert each.intervals[-1] < merged.intervals[-1]


def test_cadence_leaves_out_the_faults_prediction_warned_of() -> None:
    """Every fault warned of an hour before: with prediction on, the interval is set by the
    unwarned rate (the prior alone), so the job saves less often than when it counts them."""
    s = _setup(prior_scale=1e5, day_s=60_000.0)
    faults = [Outage("n1", 5000.0 + k * 9000.0, 5500.0 + k * 9000.0, "xid79", slurm_sees=False)
              for k in range(6)]  # fmt: skip
    warned = [Alert(o.node, o.at_s - 600.0) for o in faults]
    both = Levers(prediction=True, cadence=True)
    discounted = simulate(faults, warned, _setup(prior_scale=1e5, day_s=60_000.0,
                                                discount_announced=True), both)  # fmt: skip
    counted = simulate(faults, warned, s, both)
    assert discounted.moves == counted.moves == 1 and discounted.recompute_s == 0.0
    # the first start sees no fault (the prior alone, the same in both); after the move the
    # fleet has seen one, warned of: only the run that counts it saves more often for it
    assert discounted.intervals[0] == counted.intervals[0]
    assert discounted.intervals[1] > counted.intervals[1]
    assert discounted.checkpoint_s < counted.checkpoint_s


def test_a_lemon_stays_out_and_the_blast_radius_cap_holds() -> None:
    def gpu(node: str, at_s: float) -> Outage:
        return Outage(node, at_s, at_s + 100.0, "xid79", slurm_sees=False)

    # n1 fails three times; n2's failures bring the job back onto n1 (placed in pool order,
    # when it is requeued: n1 drained until its repair is passed over, n3 is the last choice)
    faults = [gpu("n1", 2000.0), gpu("n2", 3000.0), gpu("n1", 4000.0), gpu("n2", 6000.0)]
    faults.append(gpu("n1", 9000.0))
    s = _setup(lemon_count=2, lemon_window_s=4 * 3600.0)
    lemon = simulate(faults, [], s, Levers(isolation=True, lemon=True))
    plain = simulate(faults, [], s, Levers(isolation=True))
    # plain: on n0,n1 again from 6000, it meets n1's third failure at 9000; with lemon, n1 is
    # out for good after its second (4000) and the job takes n3 instead
    assert plain.stops == 5 and lemon.stops == 4
    # with no room under the cap, nothing is drained: the job stays on n0,n1 and meets n1's
    # three failures; after each, two starts on n1 fail (placed at x and x + 60, broken until
    # x + 100)
    capped = simulate(
        faults, [], _setup(max_out=0, lemon_count=2), Levers(isolation=True, lemon=True)
    )
    assert (capped.stops, capped.failed_starts) == (3, 6)


def test_ablation_has_every_arm() -> None:
    arms = ablation(every_subset([XID79], [Alert("n1", 4000.0)], _setup()))
    assert set(arms) == {"reactive", "all", "no-prediction", "no-cadence", "no-isolation",
                         "no-lemon", "no-async_save"}  # fmt: skip
    assert arms["all"].total_s < arms["reactive"].total_s


def test_the_engine_guards_hold_for_risk_alerts() -> None:
    day = _Day([XID79], [], _setup(max_out=2), Levers(prediction=True, isolation=True))
    assert day.drain("n1", 5000.0, 6500.0)
    assert not day.may_act("n1", 5000.0 + 1799.0)  # cooldown (1800 s): only a notification
    assert day.may_act("n1", 5000.0 + 1801.0)
    assert day.drain("n2", 5000.0, 6000.0)
    assert not day.may_act("n3", 5500.0)  # two out: the cap (max_out=2)
    assert not day.drain("n3", 5500.0, 6000.0)
    assert day.may_act("n3", 6200.0)  # n2 back at 6000


def test_shapley_shares_add_up_to_the_saving() -> None:
    outages = [XID79, Outage("n0", 12_000.0, 15_000.0, "node_down", slurm_sees=True)]
    alerts = [Alert("n1", 4000.0)]
    runs = every_subset(outages, alerts, _setup())
    reactive, every, share = runs[frozenset()], runs[frozenset(LEVERS)], shapley(runs)
    assert set(share) == {"prediction", "cadence", "isolation", "lemon", "async_save"}
    assert sum(share.values()) == pytest.approx(reactive.total_s - every.total_s)
    assert share["lemon"] == pytest.approx(0.0)  # no node taken out three times
    assert share["prediction"] > 0 and share["isolation"] > 0


def test_a_person_who_drains_the_broken_node_shortens_the_reactive_loss() -> None:
    s = _setup()
    alone = simulate([XID79], [], s, Levers())
    helped = simulate([XID79], [], _setup(operator_s=900.0), Levers())
    # Slurm alone re-lands on n1 25 times (placed at 5000, 5060, ..., 6440); a person drains
    # n1 at 5900, so the placement at 5900 takes n2: 15 failed starts
    assert (alone.failed_starts, helped.failed_starts) == (25, 15)
    assert helped.total_s < alone.total_s
    # with isolation, nobody needs to
    assert (
        simulate([XID79], [], _setup(operator_s=900.0), Levers(isolation=True)).failed_starts == 0
    )


def test_a_checkpoint_only_alert_saves_and_carries_on() -> None:
    """``alert_action = "checkpoint"``: the job saves on the alert and stays where it is."""
    s = _setup(alert_action="checkpoint")
    warned = simulate([XID79], [Alert("n1", 4000.0)], s, Levers(prediction=True))
    # saves at 3600-3700 and on the alert, 4000-4100; the fault at 5000 stops it: recompute
    # 900 (not 1300); it restarts at 5600 on n0,n1 (no isolation): fails twice, as reactive
    assert warned.moves == 0 and warned.warned_saves == 1 and warned.stops == 1
    assert warned.recompute_s == pytest.approx(900.0)
    assert warned.checkpoint_s == pytest.approx(s.cost_s * (2 + 3))  # + 3 after the restart
    # a false alarm costs one save, not a save and a restart
    false = simulate([], [Alert("n1", 4000.0)], s, Levers(prediction=True))
    quiet = simulate([], [], s, Levers())
    assert false.total_s - quiet.total_s == pytest.approx(s.cost_s)
    moved = simulate([], [Alert("n1", 4000.0)], _setup(), Levers(prediction=True))
    assert moved.total_s - quiet.total_s == pytest.approx(s.cost_s + s.restart_s)
    # the cooldown holds: a second alert within 1800 s only notifies
    twice = simulate([], [Alert("n1", 4000.0), Alert("n1", 5000.0)], s, Levers(prediction=True))
    assert twice.warned_saves == 1


def test_a_background_save_holds_training_only_for_its_snapshot() -> None:
    s = _setup(snapshot_s=10.0)  # a 100 s save: 10 s copy, then 90 s written behind training
    assert simulate([], [], s, Levers()).checkpoint_s == pytest.approx(5 * 100.0)  # every 3700 s
    quiet = simulate([], [], s, Levers(async_save=True))
    assert quiet.checkpoint_s == pytest.approx(5 * 10.0)  # every 3610 s: 5 saves by 20,000
    # a fault at 5000: the save taken at 3610 (on disk at 3700) is where it resumes
    hit = simulate([XID79], [], s, Levers(async_save=True))
    assert hit.recompute_s == pytest.approx(5000.0 - 3610.0)


def test_a_fault_while_the_save_is_written_falls_back_to_the_save_before() -> None:
    s = _setup(snapshot_s=10.0, day_s=4000.0)  # the restart (at 4250) is past the day's end
    during = Outage("n1", 3650.0, 6500.0, "xid79", slurm_sees=False)  # 3610 < 3650 < 3700
    b = simulate([during], [], s, Levers(async_save=True))
    # the snapshot held training 10 s and never reached storage: all 3650 s since the start are
    # recomputed, those 10 s with them (counted once: a review found them in both)
    assert b.checkpoint_s == 0.0
    assert b.recompute_s == pytest.approx(3650.0)


def test_an_interval_shorter_than_the_write_waits_for_it() -> None:
    s = _setup(snapshot_s=10.0, interval_s=50.0, day_s=1000.0)
    # each save waits 40 s for the last write (90 s), then copies for 10: one every 100 s
    assert simulate([], [], s, Levers(async_save=True)).checkpoint_s == pytest.approx(10 * 50.0)


def test_cadence_advises_from_what_a_background_save_holds() -> None:
    s = _setup(prior_scale=1e5, snapshot_s=10.0)
    sync = simulate([XID79], [], s, Levers(cadence=True))
    background = simulate([XID79], [], s, Levers(cadence=True, async_save=True))
    # the start and the restart that runs (a failed start trains nothing)
    assert len(background.intervals) == len(sync.intervals) == 2
    assert all(b < a for b, a in zip(background.intervals, sync.intervals, strict=True))
    assert background.total_s < sync.total_s


def test_a_save_the_engine_asks_for_is_durable_first() -> None:
    s = _setup(snapshot_s=10.0)
    warned = simulate([XID79], [Alert("n1", 4000.0)], s, Levers(prediction=True, async_save=True))
    # a background save at 3610 (10 s), the requested save before the move (all 100 s), then
    # restarted at 4700 on n2, n0: four background saves by 20,000
    assert warned.moves == 1 and warned.checkpoint_s == pytest.approx(10.0 + 100.0 + 4 * 10.0)
    assert warned.recompute_s == 0.0


def test_random_days_keep_the_books() -> None:
    """300 CONSTRUCTED random days (a fixed seed: outages, some DOWN in Slurm, alerts,
    settings) under every subset of the levers: no lost time is negative, the day's losses never
    exceed the day, and a day plays the same twice (a review's randomized check found a lost
    save counted twice: 20,012 s lost in a 20,000 s day, which this catches on that model)."""
    import random

    rng = random.Random(4005)
    pool = tuple(f"n{i}" for i in range(6))
    for _ in range(300):
        day = 20_000.0
        outages = []
        for _ in range(rng.randint(0, 6)):
            at = float(rng.randint(0, int(day)))
            outages.append(
                Outage(rng.choice(pool), at, at + rng.randint(30, 6000), "x", rng.random() < 0.3)
            )
        alerts = [Alert(rng.choice(pool), float(rng.randint(0, int(day)))) for _ in range(4)]
        s = Setup(
            pool=pool, job_nodes=4, day_s=day, interval_s=rng.choice([600.0, 1800.0, 3600.0]),
            cost_s=rng.choice([30.0, 276.0, 600.0]), snapshot_s=12.0,
            max_out=rng.choice([1, 2, 3]), alert_action=rng.choice(["move", "checkpoint"]),
            operator_s=rng.choice([math.inf, 1800.0]), lemon_count=2, lemon_window_s=day,
        )  # fmt: skip
        runs = every_subset(outages, alerts, s)
        for on, b in runs.items():
            parts = (b.checkpoint_s, b.recompute_s, b.restart_s)
            assert min(parts) >= -1e-6 and b.total_s <= day + 1e-6, (on, b)
        assert simulate(outages, alerts, s, Levers.all()) == runs[frozenset(LEVERS)]


def test_a_node_taken_out_comes_back_when_healthy_not_at_its_repair() -> None:
    """The product returns a node it took out on the agent's ``node_healthy`` (``[health]
    healthy_after_s`` = 1,800 s without a break) and a passing check. The model before
    5bd9eab ended the drain at the repair, so a slurmd that flapped three times in minutes was
    three take-outs and a lemon, out for the day (seed 7610 of 7601-7620, after its run): the
    job then had no second node when n1 broke (18,436 s lost to the lemon rule on this day).
    Now: one take-out (the job stopped on n0; its later flaps stop no job), and n0 is back
    1,800 s after the last of them."""
    flaps = [Outage("n0", a, a + 60.0, "node_down", slurm_sees=True) for a in (1000, 1070, 1140)]
    day = [*flaps, Outage("n1", 20_000.0, 40_000.0, "xid79", slurm_sees=False)]
    s = Setup(pool=("n0", "n1", "n2"), job_nodes=2, day_s=86_400.0, cost_s=276.0,
              snapshot_s=12.0, restart_s=600.0)  # fmt: skip
    assert s.return_s == 1800.0  # the product's healthy_after_s
    d = _Day(day, [], s, Levers(isolation=True, lemon=True))
    lemon = d.run()
    assert d.taken_out["n0"] == [1000.0] and d.out_until["n0"] == 1200.0 + 1800.0
    assert lemon.total_s == simulate(day, [], s, Levers(isolation=True)).total_s == 10_800.0


def test_a_spare_that_vanishes_is_not_drained_and_never_a_lemon() -> None:
    """The shipped ``node-silent`` policy only notifies; a vanished node is drained only when
    it stops the job (``job-stopped-culprit``). The model drained a vanished spare too, so a
    spare whose slurmd dropped three times in a day was a lemon (a review's case)."""
    spare = [Outage("n3", a, a + 60.0, "node_down", slurm_sees=True) for a in (1000, 2950, 4900)]
    day = [*spare, Outage("n0", 8000.0, 15_000.0, "xid79", slurm_sees=False),
           Outage("n1", 9000.0, 15_000.0, "xid79", slurm_sees=False)]  # fmt: skip
    s = _setup(lemon_count=3, lemon_window_s=86_400.0, return_s=1800.0)
    d = _Day(day, [], s, Levers(isolation=True, lemon=True))
    with_lemon = d.run()
    assert "n3" not in d.taken_out and "n3" not in d.out_until
    assert with_lemon.total_s == simulate(day, [], s, Levers(isolation=True)).total_s


def test_a_drain_the_cap_refuses_waits_for_room() -> None:
    """The engine keeps a plan the blast-radius cap refuses waiting (``pending_expire_s``) and
    runs it when room frees; the model dropped it, so the job landed on the broken node again
    and again (a review's case: 633 failed starts). Spares n2 and n3 break at 1,000 s and are
    back at 2,900 s (repaired at 1,100, then 1,800 s); n0 breaks for good at 2,200 s."""
    day = [Outage(n, 1000.0, 1100.0, "xid79", slurm_sees=False) for n in ("n2", "n3")]
    day += [Outage("n0", 2000.0, 2100.0, "xid79", slurm_sees=False),
            Outage("n0", 2200.0, 19_000.0, "xid79", slurm_sees=False)]  # fmt: skip
    s = _setup(return_s=1800.0)  # max_out 2: n2 and n3 fill it until 2,900 s
    d = _Day(day, [], s, Levers(isolation=True))
    b = d.run()
    assert d.out_from["n0"] == 2900.0 and d.out_until["n0"] == 19_000.0 + 1800.0
    assert d.taken_out["n0"] == [2900.0]  # the two refused plans are one drain, when room freed
    # until then the job starts on n0 and fails (every fail_s); after, it runs elsewhere
    assert 0 < b.failed_starts <= (2900 - 2000) / s.fail_s + 1
    expired = _Day(day, [], dataclasses.replace(s, pending_expire_s=600.0), Levers(isolation=True))
    expired.run()
    assert "n0" not in expired.taken_out  # waited past pending_expire_s: dropped


def test_a_predicted_nodes_drain_lasts_until_it_is_healthy_again() -> None:
    s = _setup(return_s=1800.0)
    d = _Day([XID79], [Alert("n1", 4000.0)], s, Levers(prediction=True))
    d.run()
    assert d.out_until["n1"] == XID79.until_s + 1800.0
    # a false alarm (no fault within the horizon) is back when the horizon has passed
    d = _Day([], [Alert("n1", 4000.0)], s, Levers(prediction=True))
    d.run()
    assert d.out_until["n1"] == 4000.0 + s.horizon_s
    with pytest.raises(ValueError, match="return_s"):
        _setup(return_s=-1.0)
