"""Hung jobs: every rank has stopped reporting steps, and the job still holds its GPUs.

A job that hangs (a collective that never completes, one rank stuck in data loading or on a
failing GPU) costs every GPU it holds until someone notices or the collective library's
watchdog kills it. The watchdog's timeout is whatever the job set (PyTorch's NCCL default is
10 minutes; large jobs often raise it to 30-60 so that slow checkpoints survive), and a hang
outside a collective has no watchdog at all. No XID, no utilisation panel and no step-time
chart shows it: the GPUs look busier than ever (NCCL kernels spin at 100 % while waiting) and
the step chart simply ends.

Three things together make a hang here:

* **silence**: no rank has reported a step (``job_step``) for longer than the job's own
  patience: ``max(min_silence_s, step_factor x its median step time, gap_factor x the longest
  pause between two consecutive steps in the window)``. The last term learns the job's
  checkpoint and evaluation pauses, so a job that stops for 8 minutes every hour to save is not
  called hung at minute 9;
* **still there**: its GPUs reported with its ``job`` tag in the last ``alive_s``, so its
  processes are alive (a job that finished or crashed lets its GPUs go);
* it reported steps at all in ``lookback_s`` (a job without the training reporter cannot be
  judged: it never "stops").

The likely culprit, where one can be named: ranks whose last step is behind the others' (they
never reached the step the rest wait in), else ranks whose GPU is idle while most of the job's
GPUs spin (the rank that is not in the collective). When most GPUs spin, the hang is
``critical``; when they are all idle the job may be stuck outside the GPU (storage, data
loading, a Python deadlock) or in an unusually long checkpoint, and it is a ``warning``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

NS = 1_000_000_000


@dataclass(frozen=True)
class HangConfig:
    min_silence_s: float = 600.0
    """Never call a job hung sooner than this after its last step."""
    step_factor: float = 20.0
    """... nor before this many of its median steps have gone by without one."""
    gap_factor: float = 1.5
    """... nor before this times the longest pause between two of its steps in the window."""
    alive_s: float = 180.0
    """Its GPUs must have reported with its job tag this recently (the processes still hold
    them); at least twice the agents' interval."""
    lookback_s: float = 21600.0
    """How far back to look for each rank's last step."""
    busy_pct: float = 50.0
    """A GPU at or above this utilisation is busy (spinning, in a hang); below, idle."""

    def __post_init__(self) -> None:
        for name in ("min_silence_s", "step_factor", "gap_factor", "alive_s", "lookback_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"hangs.{name} must be > 0")
        if not 0 < self.busy_pct <= 100:
            raise ValueError("hangs.busy_pct must be within (0, 100]")
        if self.lookback_s <= self.min_silence_s:
            raise ValueError("hangs.lookback_s must be longer than min_silence_s")


@dataclass(frozen=True)
class Silence:
    """How long a job has gone without a step, against its patience."""

    silent_s: float
    patience_s: float
    """The silence it takes to call the job hung (see the module docstring)."""
    last_step: int
    last_step_ns: int
    median_step_s: float | None
    longest_gap_s: float | None


@dataclass(frozen=True)
class Hang:
    job: str
    quiet: Silence
    gpus: int
    """The job's GPUs still reporting with its tag (0: no job-tagged GPU data)."""
    busy_gpus: int
    ranks_beating: int
    """Ranks whose reporter still sends heartbeats (0: none do)."""
    ranks_in_step: int
    """... of which inside a step (computing or waiting in a collective)."""
    nodes: int
    """Nodes among the GPUs and heartbeats."""
    behind: list[str] = field(default_factory=list)
    """Ranks whose last step is behind the others'."""
    idle: list[str] = field(default_factory=list)
    """Ranks (or ``node/gpu`` where the rank is unknown) idle while most GPUs spin."""
    outside: list[str] = field(default_factory=list)
    """Ranks between steps while most ranks wait inside one."""
    suspect_nodes: list[str] = field(default_factory=list)
    unconfirmed_nodes: list[str] = field(default_factory=list)
    """Nodes only the job's own points name (its steps' or heartbeats' ``node`` tags) where the
    agents' GPU data for the job shows none of its GPUs: never a suspect (issue 38)."""

    @property
    def spinning(self) -> bool:
        """Most of the job's GPUs are busy: waiting in a collective."""
        return self.busy_gpus * 2 > self.gpus

    @property
    def waiting(self) -> bool:
        """The job waits in a collective: its GPUs spin, or (no GPU data) most of its ranks
        sit inside a step."""
        if self.gpus:
            return self.spinning
        return self._most_in_step

    @property
    def _most_in_step(self) -> bool:
        """At least half the live ranks inside a step (half: the 2-rank job, one waiting)."""
        return self.ranks_in_step > 0 and self.ranks_in_step * 2 >= self.ranks_beating

    @property
    def suspects(self) -> list[str]:
        return self.behind or self.idle or self.outside

    @property
    def culprit_node(self) -> str:
        """The one node to take out, when the evidence points at one: the job waits in a
        collective and every suspect rank sits on that node, one of several."""
        if self.waiting and len(self.suspect_nodes) == 1 and self.nodes > 1:
            return self.suspect_nodes[0]
        return ""

    def describe(self) -> str:
        """``no step for 14 min (last step 1234; it steps every 4.0 s, its longest pause in
        the window was 95 s); 127 of its 128 GPUs busy (waiting in a collective); rank 77 on
        node-009 idle while the others spin``."""
        q = self.quiet
        rhythm = []
        if q.median_step_s is not None:
            rhythm.append(f"it steps every {q.median_step_s:.1f} s")
        if q.longest_gap_s is not None:
            rhythm.append(f"its longest pause in the window was {q.longest_gap_s:.0f} s")
        parts = [
            f"no step for {q.silent_s / 60:.0f} min (last step {q.last_step}"
            + (f"; {', '.join(rhythm)}" if rhythm else "")
            + ")"
        ]
        state = "waiting in a collective" if self.waiting else "stuck outside the GPU?"
        if self.gpus:
            parts.append(f"{self.busy_gpus} of its {self.gpus} GPUs busy ({state})")
        if self.ranks_beating:
            inside = f"{self.ranks_in_step} of its {self.ranks_beating} live ranks inside a step"
            parts.append(inside if self.gpus else f"{inside} ({state})")
        if self.suspects:
            which = (
                "behind the others"
                if self.behind
                else "idle while the others spin"
                if self.idle
                else "between steps while the others wait inside one"
            )
            where = f" on {', '.join(self.suspect_nodes)}" if self.suspect_nodes else ""
            who = "rank " if all("/" not in s for s in self.suspects) else "GPU "
            parts.append(f"{who}{_short(self.suspects)}{where} {which}")
        return "; ".join(parts)


def _natural(name: str) -> tuple[int, str]:
    """``rank 2`` before ``rank 10``, ``node-9`` before ``node-10``."""
    return (len(name), name)


def _short(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def pace(steps: pl.DataFrame) -> tuple[float | None, float | None]:
    """The job's median step time and its longest pause between two reports of a rank whose
    step index went up (a restart rolls the index back, and its downtime does not count) in
    ``steps`` (``time, rank, step_index, step_time_s``)."""
    if steps.is_empty():
        return None, None
    median = steps["step_time_s"].median()
    done = (
        steps.sort("time")
        .with_columns(
            pl.col("time").diff().dt.total_nanoseconds().over("rank").alias("gap_ns"),
            pl.col("step_index").diff().over("rank").alias("advance"),
        )
        .filter(pl.col("advance") > 0)
    )
    gap = done["gap_ns"].max() if done.height else None
    return (
        float(median) if isinstance(median, int | float) else None,
        float(gap) / NS if isinstance(gap, int | float) else None,
    )


def silence(
    last: pl.DataFrame, steps: pl.DataFrame, end_ns: int, cfg: HangConfig
) -> Silence | None:
    """The job's silence when it has lasted past its patience, else None. ``last``: each
    rank's last ``step_index`` in the lookback and its ``time``; ``steps``: the window's."""
    if last.is_empty():
        return None
    last_ns = int(last["time"].dt.epoch("ns").max())  # type: ignore[arg-type]
    silent_s = (end_ns - last_ns) / NS
    median, gap = pace(steps)
    patience = max(
        cfg.min_silence_s,
        cfg.step_factor * (median or 0.0),
        cfg.gap_factor * (gap or 0.0),
    )
    if silent_s < patience:
        return None
    top = int(last["step_index"].max())  # type: ignore[arg-type]
    return Silence(silent_s, patience, top, last_ns, median, gap)


def find_hang(
    job: str,
    quiet: Silence,
    last: pl.DataFrame,
    gpus: pl.DataFrame,
    beats: pl.DataFrame,
    cfg: HangConfig,
    held: Collection[str] | None = None,
) -> Hang | None:
    """Whether a job that has been ``quiet`` is hung: it is, if it is still there -- its GPUs
    report with its tag, or its ranks' reporters still beat. ``held``: the nodes the agents saw
    the job's GPUs on over the whole lookback (None: those of ``gpus``); a node whose agent
    went silent with it (it died, NVML hung) is still one of them. ``last`` as for :func:`silence`;
    ``gpus``: the job's ``gpu`` points of the last ``alive_s`` (``node, gpu, rank,
    gpu_util_pct``); ``beats``: its ``job_heartbeat`` points of the same stretch (``time,
    node, rank, in_step_active``)."""
    if gpus.is_empty() and beats.is_empty():
        return None
    per_gpu = (
        gpus.group_by("node", "gpu").agg(
            pl.col("rank").drop_nulls().last(), pl.col("gpu_util_pct").mean()
        )
        if gpus.height
        else pl.DataFrame(schema={"node": pl.String, "gpu": pl.String, "rank": pl.String})
    )
    busy = per_gpu.filter(pl.col("gpu_util_pct") >= cfg.busy_pct) if gpus.height else per_gpu
    per_beat = (
        beats.sort("time").group_by("rank").agg(pl.col("node", "in_step_active").last())
        if beats.height
        else pl.DataFrame(
            schema={"rank": pl.String, "node": pl.String, "in_step_active": pl.Boolean}
        )
    )
    inside = per_beat.filter(pl.col("in_step_active"))
    per_rank = last.sort("time").group_by("rank").agg(pl.col("step_index", "node", "time").last())
    # a rank that went quiet long before the rest (one an elastic job dropped) is not behind
    recent = pl.col("time").dt.epoch("ns") >= quiet.last_step_ns - int(quiet.patience_s * NS)
    behind = per_rank.filter((pl.col("step_index") < quiet.last_step) & recent)
    hang = Hang(
        job=job,
        quiet=quiet,
        gpus=per_gpu.height,
        busy_gpus=busy.height,
        ranks_beating=per_beat.height,
        ranks_in_step=inside.height,
        nodes=pl.concat([per_gpu["node"], per_beat["node"]]).drop_nulls().n_unique(),
        behind=sorted(behind["rank"].to_list(), key=_natural),
    )
    seen = set(per_gpu["node"].to_list()) if held is None else set(held)
    if hang.behind:
        return _confirmed(replace(hang, suspect_nodes=_nodes(behind)), seen)
    if hang.gpus and hang.spinning:  # GPUs idle while most spin: not in the collective
        idle = per_gpu.filter(pl.col("gpu_util_pct") < cfg.busy_pct)
        if idle.height:
            names = [r["rank"] or f"{r['node']}/{r['gpu']}" for r in idle.iter_rows(named=True)]
            return replace(hang, idle=sorted(names, key=_natural), suspect_nodes=_nodes(idle))
    if hang._most_in_step:  # between steps while the others wait inside one
        between = per_beat.filter(~pl.col("in_step_active"))
        ranks = sorted(between["rank"].to_list(), key=_natural)
        return _confirmed(replace(hang, outside=ranks, suspect_nodes=_nodes(between)), seen)
    return hang


def _confirmed(hang: Hang, held: set[str]) -> Hang:
    """Suspects named by the job's own points (a rank's ``node`` tag) count only on nodes where
    the agents saw the job's GPUs, when they saw any: a rank whose tag names another node (a
    reporter in a container whose host name is not the node's, a job writing to the store
    itself) must not get that node drained (issue 38). A job with no GPU data at all (a CPU
    job; the agents not yet reporting) keeps its reporters' word. Not a boundary against a
    writer holding the store's credentials, who can write the agents' points too
    (docs/SECURITY.md)."""
    held = {n for n in held if n}
    if not held:
        return hang
    return replace(
        hang,
        suspect_nodes=[n for n in hang.suspect_nodes if n in held],
        unconfirmed_nodes=[n for n in hang.suspect_nodes if n not in held],
    )


def _nodes(frame: pl.DataFrame) -> list[str]:
    return sorted({n for n in frame["node"].to_list() if n}, key=_natural)


def config_from(section: Mapping[str, Any]) -> HangConfig:
    try:
        return HangConfig(**section)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"[hangs]: {exc}") from None
