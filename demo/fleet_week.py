"""A large job's week at StepFun's REAL fault rate, and a MODEL of the predictor's alerts on it.

The backtest day (:mod:`demo.backtest`) compresses StepFun's fault process 150x onto 16 nodes,
so that one simulated day holds enough faults to score the predictor on telemetry. What that
day cannot say is what the levers are worth to the jobs where faults cost most: a job of 128,
1,024 or 2,048 nodes at the fault rate a real fleet has. Nothing here is compressed.

Faults (:func:`fleet_faults`): the REAL StepFun trace (:mod:`core.faulttrace`, 584 faults on
400 servers over 349 days) replayed at its own pace. The trace has 400 servers; a job's pool is
cut into blocks of at most 400 nodes, and each block is mapped, as the scenario generator maps
a cluster (:func:`simulation.faults.stepfun_process`), onto a random subset of the trace's 400
servers (the 169 that never failed included) over a random window of its timeline (one window
per block, wrapping around the trace's end, so the expected rate is the trace's own). Each
fault's class and description give its type, its repair time is the trace's, and whether it
stops the job is the fault type's own rule (:func:`demo.goodput.outages_of`). SIMULATED faults,
drawn from a REAL process.

Alerts (:class:`AlertModel`): the predictor cannot score thousands of simulated nodes' telemetry
on this machine, so its alerts here are a MODEL fitted to what it did on backtest days
(:func:`measure`): the share of fatal faults of each type it warned of within its horizon
(recall), how long before (lead, drawn from the measured leads), and its false alarms, split
into those near a fault that did not stop the job (a rate per such fault) and the rest (a rate
per node-hour: telemetry is not compressed in the backtest, so that rate carries over as it
is). Per fault type, recall rests on few faults; a type the backtest days never showed takes
the overall recall.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from demo.goodput import Alert, Outage, outages_of
from gpuwarden.analytics.cadence import stepfun_rate_per_node_s
from gpuwarden.core.faulttrace import STEPFUN_DAYS, STEPFUN_SERVERS, FaultRecord, stepfun_faults
from gpuwarden.simulation.faults import resolve, stepfun_type
from gpuwarden.simulation.faulttypes import DAY, Fault
from gpuwarden.simulation.spec import FaultSpec

BLOCK = STEPFUN_SERVERS


def node_names(n: int) -> tuple[str, ...]:
    return tuple(f"node-{i:04d}" for i in range(n))


def fleet_faults(
    nodes: int, duration_s: float, rng: np.random.Generator, gpus_per_node: int = 8
) -> list[Fault]:
    """Every StepFun fault on ``nodes`` nodes over ``duration_s`` at the trace's own pace."""
    records = stepfun_faults()
    servers = sorted({r.node for r in records})
    pool = servers + [f"never-failed-{i}" for i in range(STEPFUN_SERVERS - len(servers))]
    by_server: dict[str, list[FaultRecord]] = {}
    for rec in records:
        by_server.setdefault(rec.node, []).append(rec)
    window_d = duration_s / DAY
    specs: list[tuple[FaultSpec, str]] = []
    for first in range(0, nodes, BLOCK):
        size = min(BLOCK, nodes - first)
        chosen = rng.choice(len(pool), size=size, replace=False)
        w0 = float(rng.uniform(0.0, STEPFUN_DAYS))
        for k, i in enumerate(chosen):
            for rec in by_server.get(pool[i], ()):
                since = (rec.start_d - w0) % STEPFUN_DAYS
                if since >= window_d:
                    continue
                kind, xid = stepfun_type(rec, rng)
                spec = FaultSpec(
                    type=kind,
                    at_s=since * DAY,
                    node=first + k,
                    gpu=int(rng.integers(gpus_per_node)),
                    duration_s=max(60.0, (rec.end_d - rec.start_d) * DAY),
                    xid=xid if kind == "ecc_row_remap" else 0,
                )
                specs.append((spec, f"StepFun: {rec.level} / {rec.klass} / {rec.desc}"))
    specs.sort(key=lambda p: p[0].at_s)
    return [resolve(fs, j, duration_s, rng, origin) for j, (fs, origin) in enumerate(specs)]


@dataclass(frozen=True)
class AlertStats:
    """What the predictor did on backtest days, counted (see :func:`measure`)."""

    fatal_by_type: dict[str, int]
    warned_by_type: dict[str, int]
    leads_s: tuple[float, ...]
    near_faults: int
    """Non-fatal StepFun faults on those days (the denominator of ``near_alarms``)."""
    near_alarms: int
    """False alarms near one of them (from ``horizon_s`` before its precursor to its end)."""
    noise_alarms: int
    node_s: float
    horizon_s: float

    @property
    def recall(self) -> float:
        total = sum(self.fatal_by_type.values())
        return sum(self.warned_by_type.values()) / total if total else 0.0

    def recall_of(self, kind: str) -> float:
        n = self.fatal_by_type.get(kind, 0)
        return self.warned_by_type.get(kind, 0) / n if n else self.recall

    @property
    def near_per_fault(self) -> float:
        return self.near_alarms / self.near_faults if self.near_faults else 0.0

    @property
    def noise_per_node_h(self) -> float:
        return self.noise_alarms / (self.node_s / 3600.0) if self.node_s else 0.0


def measure(
    days: Sequence[tuple[Sequence[Fault], Sequence[str], Sequence[Alert], float]],
    horizon_s: float,
) -> AlertStats:
    """Count recall, leads and false alarms over backtest days: each is (its faults, its node
    names, the predictor's alerts, its length). A fatal fault is warned of when an alert on
    its node came within ``horizon_s`` before it (the lead is from the first such alert); an
    alert that warned of no fatal fault is a false alarm."""
    fatal: Counter[str] = Counter()
    warned: Counter[str] = Counter()
    leads: list[float] = []
    near_faults = near_alarms = noise = 0
    node_s = 0.0
    for faults, names, alerts, length_s in days:
        node_s += len(names) * length_s
        outages = outages_of(faults, names)
        true: set[int] = set()
        for o in outages:
            fatal[o.cause] += 1
            before = [
                i
                for i, a in enumerate(alerts)
                if a.node == o.node and o.at_s - horizon_s <= a.at_s < o.at_s
            ]
            if before:
                warned[o.cause] += 1
                leads.append(o.at_s - min(alerts[i].at_s for i in before))
                true.update(before)
        fatal_ids = {(o.node, o.at_s) for o in outages}
        others = [
            f
            for f in faults
            if f.origin.startswith("StepFun") and (names[f.node], f.onset_s) not in fatal_ids
        ]
        near_faults += len(others)
        for i, a in enumerate(alerts):
            if i in true:
                continue
            near = any(
                names[f.node] == a.node and f.precursor_start_s - horizon_s <= a.at_s < f.end_s
                for f in others
            )
            if near:
                near_alarms += 1
            else:
                noise += 1
    return AlertStats(
        dict(fatal), dict(warned), tuple(leads), near_faults, near_alarms, noise, node_s, horizon_s
    )


def model_alerts(
    faults: Sequence[Fault],
    names: Sequence[str],
    duration_s: float,
    stats: AlertStats,
    rng: np.random.Generator,
) -> list[Alert]:
    """Alerts drawn from ``stats`` for this week's faults (a MODEL of the predictor): each
    fatal fault warned of with its type's recall, a measured lead before it; each other StepFun
    fault draws Poisson(``near_per_fault``) false alarms between ``horizon_s`` before its onset
    and its end; every node draws Poisson(``noise_per_node_h`` x hours) at uniform times."""
    out: list[Alert] = []
    fatal_ids = set()
    for o in outages_of(faults, names):
        fatal_ids.add((o.node, o.at_s))
        if stats.leads_s and rng.random() < stats.recall_of(o.cause):
            lead = float(stats.leads_s[int(rng.integers(len(stats.leads_s)))])
            out.append(Alert(o.node, max(0.0, o.at_s - lead)))
    for f in faults:
        if (names[f.node], f.onset_s) in fatal_ids:
            continue
        for _ in range(int(rng.poisson(stats.near_per_fault))):
            lo = max(0.0, f.onset_s - stats.horizon_s)
            out.append(Alert(names[f.node], float(rng.uniform(lo, max(lo, f.end_s)))))
    mean = stats.noise_per_node_h * duration_s / 3600.0
    for node in names:
        for _ in range(int(rng.poisson(mean))):
            out.append(Alert(node, float(rng.uniform(0.0, duration_s))))
    return sorted(out, key=lambda a: a.at_s)


def oracle_alerts(outages: Sequence[Outage], lead_s: float) -> list[Alert]:
    """A perfect predictor (ground truth): a BOUND, never a result."""
    return [Alert(o.node, max(0.0, o.at_s - lead_s)) for o in outages]


def job_mtbf_h(nodes: int, per_node_s: float | None = None) -> float:
    rate = stepfun_rate_per_node_s() if per_node_s is None else per_node_s
    return 1.0 / (rate * nodes) / 3600.0 if rate > 0 else math.inf
