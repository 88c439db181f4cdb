"""Goodput levers over a SIMULATED day: a MODEL of one job's lost time, lever by lever.

The backtest's accounting (:mod:`demo.accounting`) credits one lever, prediction. This model
replays the same trace for a job with any set of levers switched on, and splits what the job
loses into its causes. Everything it reads is either the scenario's faults (SIMULATED: when a
node breaks and when it is repaired) or the product's own output on that scenario (the
failure-risk alerts of the shipped model, scored by the production scorer); the levers'
decisions are the product's rules (:mod:`analytics.cadence` for the interval, the engine's
blast-radius cap on how many nodes may be out). What it is not: a run of the engine. The
live loop (``gpuwarden demo``) is where the product acts for real.

The job needs ``job_nodes`` nodes from a pool; Slurm places it on the first usable nodes in
pool order (node weights), as the backtest's Slurm does. It checkpoints every interval, each
save costing ``cost_s`` of training, and restarts ``restart_s`` after a stop from its last
checkpoint.

*Reactive* (no lever) is Slurm on its own: a node whose slurmd is gone (``node_down``) is
DOWN and skipped; a node whose GPU broke (an XID 79, an uncorrectable ECC error, an NVLink or
InfiniBand failure) still looks idle to Slurm, so the requeued job lands on it again and fails
at start (``Setup.fail_s`` in), until the node is repaired. No prediction, the configured
cadence. In every arm Slurm places a requeued job when it requeues it, on the nodes usable
then, and the restart (``restart_s``) runs on them; a node that breaks meanwhile fails the
start.

The levers, each on or off:

* ``prediction``: a failure-risk alert on one of the job's nodes checkpoints the job and moves
  it off the node before the fault (one restart, nothing recomputed, if the save, synchronous
  and ``cost_s`` long, is on storage before a job node fails: a fault during it loses it);
* ``cadence``: at each start the job checkpoints at the interval :func:`analytics.cadence.advise`
  gives for the failure rate the fleet has seen: the faults in its store from before the day
  (``Setup.history_faults`` over ``history_node_s``: the analyze service reads ``[cadence]
  lookback_s``, 30 days) and the day's so far, with the StepFun prior at the product's default
  weight and scale. Nothing tells it the scenario's rate: before, the prior was scaled 150x,
  the scenario's fault compression (issue 40's review); with prediction on and
  ``Setup.discount_announced``, the faults an alert warned of are left out
  (:meth:`analytics.cadence.FailureRate.unannounced`);
* ``isolation``: the fast path drains a node whose GPU broke within seconds, so no restart
  lands on it until it is repaired and back (``Setup.return_s`` after the repair: the agent's
  ``node_healthy`` and a passing check);
* ``lemon``: the engine's rule (``[guards] lemon_count``, ``lemon_window_s``): a node
  gpuwarden took out ``lemon_count`` times within ``lemon_window_s`` stays out for the rest of
  the day (until an operator returns it);
* ``async_save``: the job saves on its cadence through the job-side
  :class:`collector.jobside.background_save.BackgroundSave`: a save holds training up for
  ``snapshot_s`` (the copy to host memory), and the checkpoint is on storage ``cost_s -
  snapshot_s`` later, while training goes on. A stop before that falls back to the save
  before. One write at a time: an interval shorter than the write waits for it, and the wait
  counts as held. Cadence then advises from the held time (what the job reports as
  ``save_s``). A save the engine asks for is made durable before the job answers, so it costs
  ``cost_s`` as before.

The engine's guards hold in every arm that acts: at most ``max_out`` nodes out at once, and no
second action on a node within ``cooldown_s`` of the last (a risk alert then only notifies).
The model leaves out hot spares (the pool's idle nodes are free in every arm) and whatever a
restart costs beyond ``restart_s``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuwarden.analytics.cadence import (
    advise,
    count_announced,
    failure_rate,
    merged_onsets,
    stepfun_rate_per_node_s,
)
from gpuwarden.analytics.config import DEFAULTS as ANALYTICS_DEFAULTS
from gpuwarden.simulation.faulttypes import Fault, of

LEVERS = ("prediction", "cadence", "isolation", "lemon", "async_save")


@dataclass(frozen=True)
class Outage:
    """A node broken from ``at_s`` until ``until_s`` (repaired); ``slurm_sees`` when its slurmd
    is gone, so that Slurm marks it DOWN by itself."""

    node: str
    at_s: float
    until_s: float
    cause: str
    slurm_sees: bool


@dataclass(frozen=True)
class Alert:
    node: str
    at_s: float


@dataclass(frozen=True)
class Levers:
    prediction: bool = False
    cadence: bool = False
    isolation: bool = False
    lemon: bool = False
    async_save: bool = False

    @classmethod
    def all(cls) -> Levers:
        return cls(**dict.fromkeys(LEVERS, True))

    def without(self, lever: str) -> Levers:
        return dataclasses.replace(self, **{lever: False})

    def describe(self) -> str:
        on = [n for n in LEVERS if getattr(self, n)]
        return "+".join(on) if on else "reactive"


CADENCE_DEFAULTS = ANALYTICS_DEFAULTS["cadence"]


@dataclass(frozen=True)
class Setup:
    pool: tuple[str, ...]
    job_nodes: int
    day_s: float
    interval_s: float = 3600.0
    cost_s: float = 280.0
    snapshot_s: float = 12.0
    """With ``async_save``: how long a save holds training up (the copy to host memory)."""
    restart_s: float = 600.0
    horizon_s: float = 7200.0
    prior_scale: float = 1.0
    """The StepFun prior's rate times this: 1, the product's default (``[cadence]
    prior_scale``); a constructed test may set a fleet of its own."""
    prior_faults: float = 5.0
    history_faults: int = 0
    """Faults in the fleet's store from before the day (the fleet's past, which the analyze
    service learns its rate from), seen over ``history_node_s`` node-seconds."""
    history_node_s: float = 0.0
    merge_s: float = float(CADENCE_DEFAULTS["merge_s"])
    """A node's outages this close count as one fault, as the analyze service merges a node's
    critical findings (``[cadence] merge_s``; :func:`fault_onsets`)."""
    max_out: int = 3
    cooldown_s: float = 1800.0
    min_gain: float = 0.01
    discount_announced: bool = False
    """With prediction on, cadence counts only the faults no alert warned of (``[cadence]
    discount_announced``; off, as the product's default)."""
    alert_action: str = "move"
    """What a risk alert does: ``move`` (the default policy ``predicted-gpu-failure``:
    checkpoint, drain, requeue) or ``checkpoint`` (a policy with ``actions = ["notify",
    "checkpoint"]``: the job saves and carries on where it is; a false alarm costs one save,
    not a save and a restart)."""
    lemon_count: int = 3
    lemon_window_s: float = 7 * 86400.0 / 150.0  # a week, at the scenario's 150x compression
    slurmd_timeout_s: float = 300.0
    silence_s: float = 120.0
    fail_s: float = 60.0
    """How long a start on a broken GPU takes to fail: the launch, then CUDA's initialisation
    errors (a stated assumption; a start is charged at most ``restart_s``)."""
    return_s: float = 1800.0
    """A node gpuwarden took out is back in service this long after its repair: the agent
    says ``node_healthy`` after ``[health] healthy_after_s`` (1,800 s) without a break, and the
    engine returns only a node whose check passed (``return_requires = "check"``; the check's
    own seconds are left out). Before 2026-11-27 a drain ended at the repair itself, so a node
    whose slurmd flapped three times in minutes was taken out three times and made a lemon
    (seed 7610 of 7601-7620, looked at after its run)."""
    pending_expire_s: float = 3600.0
    """A drain the blast-radius cap refuses waits (the engine's ``[guards]
    pending_expire_s``) and is done when room frees, oldest first; after this long it is
    dropped. (Before 2026-11-27 the model dropped it at once: a review.)"""
    operator_s: float = math.inf
    """Without isolation: a person drains the node that stopped the job this long after the
    stop (inf: nobody does, Slurm alone; a sensitivity, not the reactive arm)."""

    def __post_init__(self) -> None:
        if self.return_s < 0:
            raise ValueError("return_s must be >= 0")
        if self.restart_s <= 0 or self.fail_s <= 0:  # a failed start must take time, or it
            raise ValueError("restart_s and fail_s must be > 0")  # fails again at once, forever


@dataclass
class Badput:
    """Seconds of the job's wall time lost, by cause."""

    checkpoint_s: float = 0.0
    recompute_s: float = 0.0
    restart_s: float = 0.0
    stops: int = 0
    failed_starts: int = 0
    moves: int = 0
    warned_saves: int = 0
    intervals: list[float] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.checkpoint_s + self.recompute_s + self.restart_s

    def shares(self) -> dict[str, float]:
        return {
            "checkpoint": self.checkpoint_s,
            "recompute": self.recompute_s,
            "restart": self.restart_s,
        }


def saved_pct(reactive: Badput, other: Badput) -> float:
    r = reactive.total_s
    return 100.0 * (r - other.total_s) / r if r > 0 else 0.0


class _Day:
    """One job's day under one set of levers."""

    def __init__(
        self, outages: Sequence[Outage], alerts: Sequence[Alert], s: Setup, levers: Levers
    ) -> None:
        self.outages = sorted(outages, key=lambda o: o.at_s)
        self.of_node: dict[str, list[Outage]] = {}  # the same, by node (pools of thousands)
        for o in self.outages:
            self.of_node.setdefault(o.node, []).append(o)
        self.alerts = sorted(alerts, key=lambda a: a.at_s) if levers.prediction else []
        self.s, self.levers = s, levers
        self.out_until: dict[str, float] = {}  # drained by gpuwarden, until then (inf: lemon)
        self.out_from: dict[str, float] = {}  # ... from then (a drain that waited: later)
        self.taken_out: dict[str, list[float]] = {}  # when gpuwarden took each node out
        self.saved_on: dict[str, list[float]] = {}  # when an alert on it made the job save
        self.by_hand: dict[str, tuple[float, float]] = {}  # a person's drain: from, until
        self.trace: list[tuple[float, str, float, float, list[str]]] = []

    @property
    def held_s(self) -> float:
        """How long a save on the job's cadence holds training up."""
        return self.s.snapshot_s if self.levers.async_save else self.s.cost_s

    @property
    def write_s(self) -> float:
        """How long a cadence save's write runs behind training (0: a synchronous save)."""
        return max(0.0, self.s.cost_s - self.s.snapshot_s) if self.levers.async_save else 0.0

    def broken(self, node: str, t: float) -> Outage | None:
        for o in self.of_node.get(node, ()):
            if o.at_s <= t < o.until_s:
                return o
        return None

    @property
    def fail_s(self) -> float:
        """How long a start on a broken node runs before it fails (at most the restart)."""
        return min(self.s.fail_s, self.s.restart_s)

    def start_fails(self, nodes: list[str], placed: float, ready: float) -> float | None:
        """When the start of a job placed on ``nodes`` at ``placed`` fails, if it does before
        ``ready`` (the restart's end): ``fail_s`` after placement on a node broken then (Slurm
        saw it idle), or when one of its nodes breaks while it starts."""
        fails = []
        for n in nodes:
            for o in self.of_node.get(n, ()):
                if o.at_s <= placed < o.until_s:
                    fails.append(placed + self.fail_s)
                elif placed < o.at_s <= ready:
                    fails.append(o.at_s)
        return min(fails, default=None)

    def next_change(self, t: float) -> float:
        """The first time after ``t`` where what :meth:`place` and :meth:`start_fails` see can
        change: an outage begins or ends, a drain begins (one that waited for room) or ends, a
        person's drain begins or ends (else the day's end)."""
        times = [x for o in self.outages for x in (o.at_s, o.until_s) if x > t]
        times += [u for u in self.out_until.values() if u > t]
        times += [f for f in self.out_from.values() if f > t]
        times += [x for window in self.by_hand.values() for x in window if x > t]
        return min(times, default=self.s.day_s)

    def drained(self, node: str, t: float) -> bool:
        return self.out_from.get(node, -math.inf) <= t < self.out_until.get(node, -math.inf)

    def usable(self, node: str, t: float) -> bool:
        o = self.broken(node, t)
        if o is not None and o.slurm_sees:
            return False
        by_hand = self.by_hand.get(node)
        if by_hand is not None and by_hand[0] <= t < by_hand[1]:
            return False
        return not self.drained(node, t)

    def may_act(self, node: str, t: float) -> bool:
        """Whether the engine's guards let a risk alert act on ``node``: not within
        ``cooldown_s`` of the last time, and (when it drains) not past the blast-radius cap
        (an alert the cap refuses only notifies; the engine would queue its plan: a limit)."""
        acted = self.taken_out.get(node, []) + self.saved_on.get(node, [])
        if any(0 <= t - x < self.s.cooldown_s for x in acted):
            return False
        if self.s.alert_action == "checkpoint":
            return True
        out = self.out_at(t)
        return node in out or len(out) < self.s.max_out

    def out_at(self, t: float) -> set[str]:
        """The nodes out at ``t`` by anyone, as the engine's blast-radius guard counts them from
        the scheduler: drained by gpuwarden, DOWN in Slurm (a vanished slurmd), or drained by a
        person."""
        out = {n for n in self.out_until if self.drained(n, t)}
        out |= {n for n in self.of_node if (o := self.broken(n, t)) is not None and o.slurm_sees}
        return out | {n for n, (a, b) in self.by_hand.items() if a <= t < b}

    def drain(self, node: str, t: float, until_s: float) -> bool:
        """Take ``node`` out until ``until_s`` (its return), within the engine's blast-radius
        cap (no more than ``max_out`` nodes out at once, counted as :meth:`out_at` does): a
        drain the cap refuses waits until room frees, up to ``pending_expire_s`` (the drains
        that wait are released oldest first, as the engine's are; one asked for later finds
        the room taken; a limit: the room a waiting drain found is not checked again when a
        later drain comes first, so the cap can be passed, and a drain released while the job
        runs on the node does not requeue it). A lemon stays out for good. False: not done."""
        out = self.out_at(t)
        if node not in out and len(out) >= self.s.max_out:
            limit = min(t + self.s.pending_expire_s, until_s)
            frees = {u for u in self.out_until.values() if t < u < limit}
            frees |= {o.until_s for o in self.outages if o.slurm_sees and t < o.until_s < limit}
            frees |= {b for _, b in self.by_hand.values() if t < b < limit}
            t = next((c for c in sorted(frees) if len(self.out_at(c)) < self.s.max_out), math.nan)
            if math.isnan(t):
                return False
        if not self.drained(node, t):  # a new drain from t (or a waiting one, sooner)
            if self.out_until.get(node, -math.inf) > t:  # it waits: this one replaces it
                self.taken_out[node].remove(self.out_from[node])
            self.taken_out.setdefault(node, []).append(t)
            self.out_from[node] = t
        times = [x for x in self.taken_out.get(node, []) if t - x <= self.s.lemon_window_s]
        if self.levers.lemon and len(times) >= self.s.lemon_count:
            until_s = math.inf
        self.out_until[node] = max(self.out_until.get(node, -math.inf), until_s)
        return True

    def place(self, t: float) -> tuple[list[str], float]:
        """The first usable nodes in pool order at ``t``, waiting for nodes if too few."""
        while True:
            odd = self.of_node.keys() | self.by_hand.keys() | self.out_until.keys()
            nodes = [n for n in self.s.pool if n not in odd or self.usable(n, t)]
            nodes = nodes[: self.s.job_nodes]
            if len(nodes) == self.s.job_nodes or t >= self.s.day_s:
                return nodes, t
            later = [o.until_s for o in self.outages if o.until_s > t]
            later += [u for u in self.out_until.values() if u > t]
            later += [u for _, u in self.by_hand.values() if u > t]
            t = min(later, default=self.s.day_s)

    def interval(self, t: float, nodes: int) -> float:
        if not self.levers.cadence:
            return self.s.interval_s
        faults = fault_onsets([o for o in self.outages if o.at_s < t], self.s.merge_s)
        discount = self.levers.prediction and self.s.discount_announced
        announced = 0
        if discount:  # the alerts so far, on the node, within the predictor's horizon
            warnings: dict[str, list[float]] = {}
            for alert in self.alerts:
                if alert.at_s < t:
                    warnings.setdefault(alert.node, []).append(alert.at_s)
            announced = count_announced(faults, warnings, self.s.horizon_s)
        rate = failure_rate(
            sum(len(times) for times in faults.values()) + self.s.history_faults,
            len(self.s.pool) * t + self.s.history_node_s,
            prior_per_node_s=stepfun_rate_per_node_s() * self.s.prior_scale,
            prior_faults=self.s.prior_faults,
            announced=announced,
        )
        if discount:
            rate = rate.unannounced()
        a = advise("job", nodes, self.held_s, self.s.interval_s, rate)
        return a.advised_s if a.gain >= self.s.min_gain else self.s.interval_s

    def detect_s(self, nodes: list[str], t: float) -> float:
        """From a stop to the job being requeued. A GPU that breaks kills its rank at once
        (a CUDA error; ``srun --kill-on-bad-exit`` ends the step). A node that vanishes is
        noticed by Slurm after ``SlurmdTimeout`` (300 s by default); with isolation, by the
        analyze service's ``node_silent`` (two analyses) and drained and requeued then."""
        vanished = any(
            (o := self.broken(n, t)) is not None and o.slurm_sees and o.at_s == t for n in nodes
        )
        if not vanished:
            return 0.0
        return self.s.silence_s if self.levers.isolation else self.s.slurmd_timeout_s

    def isolate_to(
        self, seen_until: float, t: float, job: Sequence[str], running_to: float = math.inf
    ) -> float:
        """Isolation's drains of what broke from ``seen_until`` up to ``t`` (inclusive), the
        job on ``job`` meanwhile, running until ``running_to``; the new ``seen_until``."""
        self.isolate_as_they_break(seen_until, t + 1e-9, set(job), running_to)
        return max(seen_until, t + 1e-9)

    def isolate_as_they_break(
        self, t0: float, t1: float, job: set[str], running_to: float = math.inf
    ) -> None:
        """The fast path drains each node whose GPU or link breaks, job node or spare (the
        agent's fatal-GPU-event policies); a node that vanishes is drained only when it stops
        the job (``job-stopped-culprit``): the shipped ``node-silent`` policy only notifies,
        and Slurm marks a vanished spare DOWN itself. (Before 2026-11-27 the model drained a
        vanished spare too, and could make a lemon of it: a review.)"""
        if not self.levers.isolation:
            return
        for o in self.outages:
            if not t0 <= o.at_s < t1:
                continue
            if not o.slurm_sees or (o.node in job and o.at_s <= running_to):
                self.drain(o.node, o.at_s, o.until_s + self.s.return_s)
            elif self.drained(o.node, o.at_s):  # out already: back when healthy after this too
                self.out_until[o.node] = max(self.out_until[o.node], o.until_s + self.s.return_s)

    def run(self) -> Badput:
        s, b = self.s, Badput()
        t, seen_until = 0.0, 0.0
        nodes, t = self.place(0.0)
        b.restart_s += min(t, s.day_s)  # waiting for nodes at the day's start
        placed: float | None = t  # when the job was placed; None while it runs on after a save
        while t < s.day_s:
            failed = None if placed is None else self.start_fails(nodes, placed, t)
            if failed is not None:  # landed on a broken node, or one broke as it started
                b.failed_starts += 1
                assert placed is not None
                if (
                    failed == placed + self.fail_s
                ):  # broken when placed: Slurm places it there again
                    # every fail_s until something changes; the starts that fail whole before
                    # then, at once (the same books as one by one: a repair that takes days
                    # is thousands of them)
                    until = min(self.next_change(placed), s.day_s)
                    again = math.floor((until - placed) / self.fail_s)
                    if again > 1:
                        b.failed_starts += again - 1
                        failed = placed + again * self.fail_s
                b.restart_s += failed - t  # its restart was charged to t when placed
                down_at = failed + self.detect_s(nodes, failed)
                seen_until = self.isolate_to(seen_until, down_at, nodes, failed)
                nodes, placed = self.place(down_at)
                t = placed + s.restart_s
                self.trace.append((failed, "failed start", down_at, t, nodes))
                b.restart_s += min(t, s.day_s) - failed
                continue
            tau = self.interval(t, len(nodes))
            b.intervals.append(tau)
            on = set(nodes)
            stop = min(
                (o.at_s for o in self.outages if o.node in on and o.at_s > t),
                default=s.day_s,
            )
            alert = None
            for a in self.alerts:
                if a.node in on and t <= a.at_s < stop:
                    # what broke before the alert is drained already (the guard counts it)
                    seen_until = self.isolate_to(seen_until, a.at_s, nodes)
                    if self.may_act(a.node, a.at_s):
                        alert = a
                        break
            end = min(stop, alert.at_s if alert else stop, s.day_s)
            # a save every `period`: tau of training, then held (waiting for the previous
            # write, then the snapshot); save k holds the state at t + k * period, on storage
            # `write_s` later (a synchronous save: at once)
            period = max(tau, self.write_s) + self.held_s
            saves = math.floor((end - t) / period)
            durable = saves - (1 if saves and t + saves * period + self.write_s > end else 0)
            last_save = t + durable * period
            # time held by saves: on a stop, those on storage (the rest, and a hold under way,
            # are in what it recomputes); else every save, and a hold under way at `end`
            held_all = saves * (period - tau) + max(0.0, end - t - saves * period - tau)
            held_durable = durable * (period - tau)
            seen_until = self.isolate_to(seen_until, end, nodes)
            if end >= s.day_s:
                b.checkpoint_s += held_all
                break
            lost_to = end  # the work since last_save is lost if the job stops
            if alert is not None:
                # the engine's checkpoint request: a synchronous save of cost_s; a job node that
                # fails before it is on storage loses it, and the job stops there
                cut = min(
                    (
                        o.at_s
                        for o in self.outages
                        if o.node in on and end < o.at_s <= end + s.cost_s
                    ),
                    default=None,
                )
                b.checkpoint_s += min(s.cost_s, s.day_s - end) if cut is None else cut - end
                if s.alert_action == "checkpoint":
                    b.warned_saves += 1
                    self.saved_on.setdefault(alert.node, []).append(end)
                else:
                    follows = [o for o in self.outages if o.node == alert.node and o.at_s >= end]
                    until = (  # a false alarm's node: back when the horizon has passed
                        follows[0].until_s + s.return_s
                        if follows and follows[0].at_s < end + s.horizon_s
                        else (end + s.horizon_s)
                    )
                    self.drain(alert.node, end, until)
                if cut is not None:
                    seen_until = self.isolate_to(seen_until, cut, nodes)
                    end, alert = cut, None
                elif s.alert_action == "checkpoint":  # saved; it runs on where it is
                    b.checkpoint_s += held_all
                    t, placed = end + s.cost_s, None
                    continue
            if alert is not None:
                b.moves += 1
                b.checkpoint_s += held_all
                lost_from = down_at = end + s.cost_s
            else:
                b.stops += 1
                b.checkpoint_s += held_durable
                if not self.levers.isolation and math.isfinite(s.operator_s):
                    for o in self.outages:
                        if o.node in on and o.at_s == end and not o.slurm_sees:
                            self.by_hand[o.node] = (end + s.operator_s, o.until_s)
                b.recompute_s += lost_to - last_save
                lost_from, down_at = end, end + self.detect_s(nodes, end)
            # Slurm places the requeued job when it requeues it, on the nodes usable then; the
            # restart (launch, load, warm-up) runs on them. (Before 2026-11-27 the model placed
            # it when the restart ended, which let a job land on a node repaired during its own
            # restart: docs/BENCHMARKS.md, seed 7419.)
            # what broke until the requeue (the job stopped at `end`)
            seen_until = self.isolate_to(seen_until, down_at, nodes, end)
            nodes, placed = self.place(down_at)
            t = placed + s.restart_s
            self.trace.append((end, "move" if alert else "stop", down_at, t, nodes))
            b.restart_s += max(0.0, min(t, s.day_s) - lost_from)
        return b


def simulate(
    outages: Sequence[Outage], alerts: Sequence[Alert], setup: Setup, levers: Levers
) -> Badput:
    return _Day(outages, alerts, setup, levers).run()


def every_subset(
    outages: Sequence[Outage], alerts: Sequence[Alert], setup: Setup
) -> dict[frozenset[str], Badput]:
    """The day under every subset of the levers (16 runs), keyed by the levers on."""
    return {
        frozenset(on): simulate(outages, alerts, setup, Levers(**dict.fromkeys(on, True)))
        for k in range(len(LEVERS) + 1)
        for on in itertools.combinations(LEVERS, k)
    }


def ablation(runs: dict[frozenset[str], Badput]) -> dict[str, Badput]:
    """Reactive, every lever, and every lever but one, in turn (from :func:`every_subset`)."""
    every = frozenset(LEVERS)
    arms = {"reactive": runs[frozenset()], "all": runs[every]}
    return arms | {f"no-{lever}": runs[every - {lever}] for lever in LEVERS}


def shapley(runs: dict[frozenset[str], Badput]) -> dict[str, float]:
    """Each lever's Shapley share of the seconds saved (from :func:`every_subset`): its
    marginal saving averaged over every order of switching the levers on (levers that stand in
    for each other, such as prediction and isolation both keeping a job off a broken node,
    share the saving instead of each showing none). The shares add up to the whole saving."""
    n = len(LEVERS)
    share = {}
    for lever in LEVERS:
        others = [x for x in LEVERS if x != lever]
        total = 0.0
        for k in range(n):
            weight = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
            for on in itertools.combinations(others, k):
                key = frozenset(on)
                total += weight * (runs[key].total_s - runs[key | {lever}].total_s)
        share[lever] = total
    return share


def fault_onsets(outages: Iterable[Outage], merge_s: float) -> dict[str, list[float]]:
    """The faults the analyze service would count in ``outages``, per node, their times: a
    node's outage within ``merge_s`` of its last one is the same fault
    (:func:`analytics.cadence.merged_onsets`, as the service merges a node's critical
    findings)."""
    return merged_onsets(((o.node, o.at_s) for o in outages), merge_s)


def outages_of(faults: Iterable[Fault], names: Sequence[str]) -> list[Outage]:
    """The scenario's fatal faults as outages (SIMULATED ground truth: the model's hardware)."""
    return [
        Outage(names[f.node], f.onset_s, f.end_s, f.type, slurm_sees=f.type == "node_down")
        for f in faults
        if f.fatal and of(f).downs_node(f)
    ]
