"""Checkpoint cadence: the interval that minimises a job's expected waste.

A job that checkpoints every ``tau`` seconds, each save costing ``C`` seconds of training, on
nodes whose combined mean time between failures is ``M``, loses on average (first order, as
Young (1974) and Daly (2006) model it):

* ``C / tau`` of its time to saving;
* ``(tau + C) / (2 M)`` to recomputation: a failure lands, on average, half an interval after
  the last save;
* ``R / M`` to restarts, ``R`` seconds each (the interval does not change this share).

The interval that minimises that is Young's ``sqrt(2 C M)``; :func:`optimal_interval_s` uses
Daly's higher-order estimate, which stays right when ``C`` is not small against ``M``.

``M`` comes from a failure rate per node, :func:`failure_rate`: the fleet's own history (fatal
faults over node-time observed) pulled towards a prior, the REAL StepFun trace's rate (584
faults on 400 servers over 349 days, :mod:`core.faulttrace`), with the weight of
``prior_faults`` faults. While the history is short the prior decides; a fleet that has seen
many faults decides for itself. A job on ``n`` nodes fails at ``n`` times the rate per node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import polars as pl

from gpuwarden.core.faulttrace import STEPFUN_DAYS, STEPFUN_SERVERS, stepfun_faults
from gpuwarden.core.store.reader import InfluxReader

DAY_S = 86_400.0
T = TypeVar("T", int, float)


def stepfun_rate_per_node_s() -> float:
    """The REAL StepFun trace's fault rate per server-second (about one fault per 240 days)."""
    return len(stepfun_faults()) / (STEPFUN_SERVERS * STEPFUN_DAYS * DAY_S)


@dataclass(frozen=True)
class FailureRate:
    """Fatal faults per node-second, and what it rests on."""

    per_node_s: float
    faults: int
    exposure_node_s: float
    prior_per_node_s: float
    prior_faults: float
    announced: int = 0
    """Of ``faults``, those a ``failure_risk`` finding had named the node of beforehand."""

    def unannounced(self) -> FailureRate:
        """The rate of the faults no one warned of. Where the engine moves a job off a node at
        risk (a save and a restart, nothing recomputed), a warned fault costs the same at any
        interval, so the interval should be set by the others: counting every fault makes the
        job save too often, the more so the better the predictor. The prior's faults count as
        unwarned, so while the history is short this is the whole rate."""
        share = self.announced / (self.faults + self.prior_faults)
        return replace(self, per_node_s=self.per_node_s * (1.0 - share))

    def mtbf_s(self, nodes: int) -> float:
        """Mean time between failures of a job on ``nodes`` nodes."""
        return 1.0 / (self.per_node_s * max(1, nodes))

    @property
    def history_weight(self) -> float:
        """How much of the estimate is the fleet's own history (0: all prior, 1: all history)."""
        return self.faults / (self.faults + self.prior_faults) if self.faults else 0.0


def failure_rate(
    faults: int,
    exposure_node_s: float,
    *,
    prior_per_node_s: float | None = None,
    prior_faults: float = 5.0,
    announced: int = 0,
) -> FailureRate:
    """The posterior mean rate of a Poisson process with a gamma prior: ``prior_faults`` faults
    seen at the prior's rate, plus ``faults`` seen over ``exposure_node_s`` node-seconds, of
    which ``announced`` were warned of (:meth:`FailureRate.unannounced`)."""
    if faults < 0 or exposure_node_s < 0:
        raise ValueError(f"faults ({faults}) and exposure ({exposure_node_s}) must be >= 0")
    if not 0 <= announced <= faults:
        raise ValueError(f"announced ({announced}) must be between 0 and faults ({faults})")
    if prior_faults <= 0:
        raise ValueError(f"prior_faults must be > 0, not {prior_faults}")
    prior = stepfun_rate_per_node_s() if prior_per_node_s is None else prior_per_node_s
    if prior <= 0:
        raise ValueError(f"the prior rate must be > 0, not {prior}")
    prior_exposure = prior_faults / prior
    rate = (prior_faults + faults) / (prior_exposure + exposure_node_s)
    return FailureRate(rate, faults, exposure_node_s, prior, prior_faults, announced)


def count_announced(
    faults: Mapping[str, list[float]], warnings: Mapping[str, list[float]], window_s: float
) -> int:
    """How many faults (per node, their times) had a warning on their node (per node, its
    times) within ``window_s`` before them."""
    return sum(
        1
        for node, times in faults.items()
        for t in times
        if any(t - window_s <= w < t for w in warnings.get(node, ()))
    )


def optimal_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum of the compute time between checkpoints (2006, eq. 37):
    ``sqrt(2CM) * (1 + sqrt(C/2M)/3 + C/(18M)) - C`` while ``C < 2M``, else ``M``."""
    if cost_s < 0 or mtbf_s <= 0:
        raise ValueError(f"need cost >= 0 and MTBF > 0, got C={cost_s}, M={mtbf_s}")
    if cost_s == 0:
        return 0.0  # free checkpoints: save every step
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost_s


def expected_waste(
    interval_s: float, cost_s: float, mtbf_s: float, restart_s: float = 0.0
) -> float:
    """The share of wall time lost (first order): saving, recomputation and restarts."""
    if interval_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"need interval > 0 and MTBF > 0, got {interval_s}, {mtbf_s}")
    return cost_s / interval_s + (interval_s + cost_s) / (2 * mtbf_s) + restart_s / mtbf_s


@dataclass(frozen=True)
class Advice:
    """One job's checkpoint interval, now and advised, with the waste expected at each."""

    job: str
    nodes: int
    cost_s: float
    mtbf_s: float
    current_s: float
    advised_s: float
    waste_current: float
    waste_advised: float
    history_weight: float

    @property
    def gain(self) -> float:
        """Share of wall time the advised interval would give back."""
        return self.waste_current - self.waste_advised

    def describe(self) -> str:
        return (
            f"job {self.job}: checkpoint every {self.advised_s / 60:.0f} min instead of "
            f"{self.current_s / 60:.0f} min (save {self.cost_s:.0f} s, job MTBF "
            f"{self.mtbf_s / 3600:.1f} h): expected waste {self.waste_current:.1%} -> "
            f"{self.waste_advised:.1%}"
        )


def advise(
    job: str,
    nodes: int,
    cost_s: float,
    current_s: float,
    rate: FailureRate,
    *,
    restart_s: float = 0.0,
    min_interval_s: float = 60.0,
) -> Advice:
    """The advised interval for a job, never under ``min_interval_s`` (a save every few steps
    would be advice no one takes)."""
    mtbf = rate.mtbf_s(nodes)
    advised = max(min_interval_s, optimal_interval_s(cost_s, mtbf))
    return Advice(
        job=job,
        nodes=nodes,
        cost_s=cost_s,
        mtbf_s=mtbf,
        current_s=current_s,
        advised_s=advised,
        waste_current=expected_waste(current_s, cost_s, mtbf, restart_s),
        waste_advised=expected_waste(advised, cost_s, mtbf, restart_s),
        history_weight=rate.history_weight,
    )


# -- from the store ---------------------------------------------------------------------------


def _findings(
    reader: InfluxReader,
    start_ns: int,
    end_ns: int,
    where: Mapping[str, str] | None,
    **match: str,
) -> pl.DataFrame:
    """The findings about a node in ``[start_ns, end_ns)`` whose tags match: time and node."""
    return reader.read(
        "finding",
        start_ns,
        end_ns,
        fields=["finding_id"],
        tags=["node"],
        where={**(where or {}), **match},
    ).drop_nulls("node")


def merged_onsets(events: Iterable[tuple[str, T]], merge: T) -> dict[str, list[T]]:
    """The faults in ``(node, time)`` events, per node, their times: an event within
    ``merge`` of the node's last one is the same fault (a GPU that falls off the bus raises
    several findings at once); each node's onsets in time order. Times and ``merge`` in one
    unit (seconds, or integer ns)."""
    onsets: dict[str, list[T]] = {}
    last: dict[str, T] = {}
    for node, t in sorted(events, key=lambda e: e[1]):
        if node not in last or t - last[node] > merge:
            onsets.setdefault(node, []).append(t)
        last[node] = t
    return onsets


def fleet_failure_rate(
    reader: InfluxReader,
    start_ns: int,
    end_ns: int,
    cfg: Mapping[str, Any],
    where: Mapping[str, str] | None = None,
) -> FailureRate:
    """The fleet's failure rate over ``[start_ns, end_ns)``: its critical findings (a fatal
    XID, a lost GPU, a failed row remap ...), one fault per node within ``merge_s`` (a GPU that
    falls off the bus raises several at once), over the node-time of the nodes whose agents
    reported; with the StepFun prior times ``prior_scale`` (1 in production; a compressed
    scenario sets its compression). With ``discount_announced``, it also counts the faults that
    a ``failure_risk`` finding named the node of within ``announce_window_s`` before."""
    found = _findings(reader, start_ns, end_ns, where, severity="critical")
    by_ns = merged_onsets(  # in integer ns, so that the merge boundary is exact
        zip((str(n) for n in found["node"]), found["time"].cast(pl.Int64).to_list(), strict=True),
        int(float(cfg["merge_s"]) * 1e9),
    )
    onsets = {node: [t / 1e9 for t in times] for node, times in by_ns.items()}
    announced = 0
    if cfg["discount_announced"] and onsets:
        window_s = float(cfg["announce_window_s"])
        since = start_ns - int(window_s * 1e9)
        risks = _findings(reader, since, end_ns, where, kind="failure_risk")
        warnings: dict[str, list[float]] = {}
        for node, t in zip(risks["node"], risks["time"].dt.epoch("ns"), strict=True):
            warnings.setdefault(str(node), []).append(t / 1e9)
        announced = count_announced(onsets, warnings, window_s)
    nodes = reader.tag_values("agent", "node", "points_count", start_ns, end_ns, where)
    exposure = len(nodes) * (end_ns - start_ns) / 1e9
    return failure_rate(
        sum(len(t) for t in onsets.values()),
        exposure,
        prior_per_node_s=stepfun_rate_per_node_s() * float(cfg["prior_scale"]),
        prior_faults=float(cfg["prior_faults"]),
        announced=announced,
    )


def job_advice(
    reader: InfluxReader,
    job: str,
    nodes: int,
    rate: FailureRate,
    start_ns: int,
    end_ns: int,
    cfg: Mapping[str, Any],
    where: Mapping[str, str] | None = None,
) -> Advice | None:
    """Advice for a job that reported its checkpoints (``job_checkpoint``) in the window: the
    median save time of its saves, its latest interval. None when it reported none."""
    saves = reader.read(
        "job_checkpoint",
        start_ns,
        end_ns,
        fields=["save_s", "interval_s"],
        where={**(where or {}), "job": job},
    ).drop_nulls(["save_s", "interval_s"])
    if saves.is_empty() or nodes < 1:
        return None
    saves = saves.sort("time")
    return advise(
        job,
        nodes,
        float(saves["save_s"].median()),  # type: ignore[arg-type]
        float(saves["interval_s"][-1]),
        rate,
        restart_s=float(cfg["restart_s"]),
        min_interval_s=float(cfg["min_interval_s"]),
    )
