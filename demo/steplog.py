"""Work lost, read from a training job's own step log (nothing else: not the scenario, not the
engine's view of what it did).

The log is what :mod:`testbed.jobs.train_job` writes, one JSON object a line: ``start`` (with
the step it resumed from), ``step`` (each completed step), ``save`` (a checkpoint), ``done``.
A *run* is everything from one ``start`` to the next. Between two runs the job lost:

* **recomputed steps**: the steps the earlier run had completed past the checkpoint the next
  run resumed from (they are done again);
* **time not stepping**: from the earlier run's last step to the next run's first step, less
  one step's time (what that step would have taken anyway).

A job that is not stepping when the observation ends (``end``) has lost the same, not yet
paid: the time since its last step, and the steps since its newest checkpoint, which its next
run will do again.

Within a run, a **save holds training up**: the gap from the saved step to the next one, less
one step's time (a synchronous save: the whole write; a background save: the copy of the
state). Gaps at steps without a save are not counted: they are the pace of the machine, the
same in every arm.

Work lost is ``recomputed x step time + time not stepping + time held by saves``, in seconds
of the whole job, and
in GPU-hours for the GPUs the job holds. The live loop runs at real time, so these are the
live run's own seconds, not a scaled-up figure.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Run:
    started: float
    resumed_from: int
    checkpoint: str
    nodes: str
    steps: list[tuple[int, float]] = field(default_factory=list)  # (step, time)
    saves: list[tuple[int, float, str]] = field(default_factory=list)  # (step, time, why)

    @property
    def last_step(self) -> int:
        return self.steps[-1][0] if self.steps else self.resumed_from


@dataclass(frozen=True)
class Stop:
    """Between two runs: what was lost, and when."""

    at: float  # the earlier run's last step
    resumed_at: float  # the next run's first step
    recomputed: int
    idle_s: float
    lost_s: float


@dataclass
class WorkLost:
    runs: list[Run]
    stops: list[Stop]
    step_s: float
    gpus: int

    saves_s: float = 0.0
    """Training held up by saves, within runs (see the module docstring)."""

    @property
    def lost_s(self) -> float:
        return sum(s.lost_s for s in self.stops) + self.saves_s

    @property
    def gpu_h(self) -> float:
        return self.lost_s * self.gpus / 3600.0

    @property
    def recomputed(self) -> int:
        return sum(s.recomputed for s in self.stops)

    @property
    def idle_s(self) -> float:
        return sum(s.idle_s for s in self.stops)

    @property
    def steps_done(self) -> int:
        return max((r.last_step for r in self.runs), default=0)


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line torn by a crash: the steps around it tell the story
    return out


def runs_of(events: list[dict[str, Any]]) -> list[Run]:
    runs: list[Run] = []
    for e in events:
        if e["event"] == "start":
            runs.append(Run(float(e["t"]), int(e["resume_step"]), str(e.get("checkpoint", "")),
                            str(e.get("nodes", ""))))  # fmt: skip
        elif runs and e["event"] == "step":
            runs[-1].steps.append((int(e["step"]), float(e["t"])))
        elif runs and e["event"] == "save":
            runs[-1].saves.append((int(e["step"]), float(e["t"]), str(e.get("why", ""))))
    return runs


def work_lost(path: Path, *, step_s: float, gpus: int, end: float | None = None) -> WorkLost:
    """Work lost over the log; with ``end`` (wall-clock seconds), a job still down then counts
    what it has lost so far (see the module docstring)."""
    runs = runs_of(read(path))
    stops = []
    stepped = [r for r in runs if r.steps]
    for before, after in itertools.pairwise(stepped):
        recomputed = max(0, before.last_step - after.resumed_from)
        idle = max(0.0, after.steps[0][1] - before.steps[-1][1] - step_s)
        lost = recomputed * step_s + idle
        stops.append(Stop(before.steps[-1][1], after.steps[0][1], recomputed, idle, lost))
    if end is not None and stepped:
        last = stepped[-1]
        last_at = last.steps[-1][1]
        if end - last_at > 2 * step_s:  # not stepping at the end: down, not between steps
            saved = [s for r in runs for s, _, _ in r.saves] + [r.resumed_from for r in runs]
            newest = max(s for s in saved if s <= last.last_step)
            recomputed = last.last_step - newest
            idle = end - last_at - step_s
            stops.append(Stop(last_at, end, recomputed, idle, recomputed * step_s + idle))
    held = 0.0
    for r in runs:
        at = dict(r.steps)
        for step in {s for s, _, _ in r.saves}:
            if step in at and step + 1 in at:
                held += max(0.0, at[step + 1] - at[step] - step_s)
    return WorkLost(runs, stops, step_s, gpus, held)
