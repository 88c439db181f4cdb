"""Work lost to failures, with and without proactive remediation, on one SIMULATED trace.

The reactive run is the scenario itself (``simulation/jobs.py``): a job runs until a
fatal fault on one of its nodes stops it, then restarts ``restart_s`` later (or when a spare
node is up) from its last checkpoint. It loses, per stop, the work since that checkpoint
(recomputed) and the time until it runs again (downtime).

The proactive run replays the same trace, but the remediation engine's decisions come first:
when the engine checkpointed and drained a node (the job moved off it, ``requeue``) before a
stop on that node, within ``horizon_s``, that stop loses no recomputation, and its downtime is
one restart (``restart_s``): the job had already moved. A drain of a job node that no stop
followed is a false alarm and costs one restart too. Stops with no engine action before them
(sudden failures: a node that vanishes, an XID 79) cost what they cost reactively.

Everything here is a model over SIMULATED events: it says how much of the scenario's loss the
engine's actual decisions would have avoided, not what a real cluster would save.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stop:
    """The job stopped at ``at_s`` because ``node`` failed; it ran again at ``resume_s``."""

    at_s: float
    node: str
    resume_s: float
    run_start_s: float
    cause: str = ""


@dataclass(frozen=True)
class Move:
    """The engine checkpointed and moved the job off ``node`` at ``at_s`` (simulated time)."""

    at_s: float
    node: str
    why: str = ""


@dataclass
class Loss:
    recompute_s: float = 0.0
    downtime_s: float = 0.0
    rows: list[dict[str, object]] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.recompute_s + self.downtime_s


@dataclass
class Comparison:
    wall_s: float
    gpus: int
    reactive: Loss
    proactive: Loss

    def ettr(self, loss: Loss) -> float:
        """Effective training time ratio: productive time over wall time."""
        return max(0.0, self.wall_s - loss.total_s) / self.wall_s

    def gpu_hours(self, loss: Loss) -> float:
        return loss.total_s * self.gpus / 3600.0

    @property
    def work_saved_pct(self) -> float:
        r = self.reactive.total_s
        return 100.0 * (r - self.proactive.total_s) / r if r > 0 else 0.0


def last_checkpoint(at_s: float, run_start_s: float, interval_s: float) -> float:
    """The job checkpoints every ``interval_s`` from each (re)start."""
    return run_start_s + math.floor((at_s - run_start_s) / interval_s) * interval_s


def compare(
    stops: Sequence[Stop],
    moves: Sequence[Move],
    *,
    wall_s: float,
    gpus: int,
    checkpoint_interval_s: float,
    restart_s: float,
    horizon_s: float,
) -> Comparison:
    reactive, proactive = Loss(), Loss()
    used: set[int] = set()
    for stop in stops:
        recompute = stop.at_s - last_checkpoint(stop.at_s, stop.run_start_s, checkpoint_interval_s)
        downtime = stop.resume_s - stop.at_s
        reactive.recompute_s += recompute
        reactive.downtime_s += downtime
        row: dict[str, object] = {
            "at_s": stop.at_s,
            "node": stop.node,
            "cause": stop.cause,
            "reactive_lost_s": recompute + downtime,
        }
        before = [
            i
            for i, m in enumerate(moves)
            if m.node == stop.node and stop.at_s - horizon_s <= m.at_s < stop.at_s
        ]
        if before:
            used.update(before)
            proactive.downtime_s += restart_s
            row |= {
                "proactive_lost_s": restart_s,
                "moved_before_s": stop.at_s - moves[before[0]].at_s,
            }
        else:
            proactive.recompute_s += recompute
            proactive.downtime_s += downtime
            row |= {"proactive_lost_s": recompute + downtime, "moved_before_s": None}
        reactive.rows.append(row)
    for i, m in enumerate(moves):
        if i not in used:
            proactive.downtime_s += restart_s
            proactive.rows.append({"at_s": m.at_s, "node": m.node, "false_alarm": True})
    return Comparison(wall_s, gpus, reactive, proactive)
