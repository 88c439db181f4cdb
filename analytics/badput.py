"""Badput by cause, per job: where the time went that did not train the model.

Over an analysis window, a job's elapsed time (its first step to its last,
:func:`analytics.mfu.throughput`) splits into the time of the steps it kept (productive) and
the rest, which this module names:

* **checkpoint**: the training time its saves held up, summed from ``job_checkpoint`` (what
  the job-side reporter says each save cost; 0 for a job that does not report saves);
* **recompute**: steps executed, then rolled back to a checkpoint by a restart and run again;
* **hang**: the job is hung at the window's end (:mod:`analytics.hangs`): its silence so far;
* **restart**: the rest of the time with no step at all (failures, the scheduler's requeue,
  start-up, loading the checkpoint), less the saves and the hang;
* **straggler**: steps that took longer because one rank (or stage) was slow: for each
  straggler, over the steps where it was flagged, each step's wall time minus the slowest
  *other* rank's (what fixing that straggler would give back);
* **mixed configuration**: the same, for stragglers on nodes set up unlike their fleet
  (``config_drift``): a setting, not a fault, slows them.

The straggler and mixed-configuration shares are inside the productive steps' time (the steps
were kept, they were only slower); the others are outside it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import polars as pl

from gpuwarden.analytics.mfu import JobThroughput

CAUSES = ("checkpoint", "recompute", "restart", "hang", "straggler", "mixed_config")


@dataclass(frozen=True)
class Badput:
    job: str
    elapsed_s: float
    productive_s: float
    checkpoint_s: float
    recompute_s: float
    restart_s: float
    hang_s: float
    straggler_s: float
    mixed_config_s: float

    def seconds(self) -> dict[str, float]:
        return {c: getattr(self, f"{c}_s") for c in CAUSES}

    @property
    def lost_s(self) -> float:
        return sum(self.seconds().values())

    def describe(self) -> str:
        parts = [f"{c} {s:.0f} s" for c, s in self.seconds().items() if s > 0.5]
        return f"job {self.job}: {self.lost_s:.0f} s of {self.elapsed_s:.0f} s lost" + (
            f" ({', '.join(parts)})" if parts else ""
        )


def straggler_cost_s(timings: pl.DataFrame, worker: str, first: int, last: int) -> float:
    """What fixing one straggling rank gives back over samples ``first..last``: each step's
    wall time (its slowest rank) minus the slowest other rank's. ``timings``: ``worker, step,
    time_s`` (and ``steps``, how many steps a sample stands for; 1 if absent)."""
    return straggler_costs(timings, {worker: (first, last)})[worker]


def straggler_costs(
    timings: pl.DataFrame,
    spans: Mapping[str, tuple[int, int]],
    weights: pl.DataFrame | None = None,
) -> dict[str, float]:
    """:func:`straggler_cost_s` of several ranks (``spans``: rank -> first and last sample),
    from one pass over ``timings``. Only a step's slowest rank gives anything back by being
    fixed, and then its time minus the next slowest rank's: so each step's leader, its time
    and the runner-up's are found once, and a rank's cost is the sum over the steps it leads
    (a tie gives nothing back, whichever rank leads). A 16,384-rank job has a hundred
    stragglers; each used to cost a pass over its whole step log. ``weights``: ``step, steps``
    when ``timings`` does not carry ``steps`` itself."""
    if not spans:
        return {}
    weight = pl.col("steps").first() if "steps" in timings.columns else pl.lit(1)
    per = timings.group_by("step", "worker").agg(pl.col("time_s").max(), weight.alias("n"))
    lead = (
        per.sort(["step", "time_s"], descending=[False, True])
        .group_by("step", maintain_order=True)
        .agg(
            pl.col("worker").first().alias("leader"),
            pl.col("time_s").first().alias("wall"),
            pl.col("time_s").slice(1, 1).first().alias("runner_up"),
            pl.col("n").first(),
        )
        .drop_nulls("runner_up")
    )
    if weights is not None:
        lead = lead.drop("n").join(weights.select("step", pl.col("steps").alias("n")), on="step")
    gain = (pl.col("wall") - pl.col("runner_up")).clip(lower_bound=0.0) * pl.col("n")
    lead = lead.with_columns(gain.alias("gain"))
    out = {}
    for worker, (first, last) in spans.items():
        mine = lead.filter((pl.col("leader") == worker) & pl.col("step").is_between(first, last))
        out[worker] = float(mine["gain"].sum() or 0.0)
    return out


def badput(
    job: str,
    tp: JobThroughput,
    *,
    saves_s: float,
    hang_s: float,
    straggler_s: Mapping[str, float],
    worker_node: Mapping[str, str],
    drifted: Collection[str],
) -> Badput:
    """The split for one job. ``straggler_s``: each straggling rank's cost
    (:func:`straggler_cost_s`); ``drifted``: nodes with a ``config_drift``."""
    mixed = float(sum(s for w, s in straggler_s.items() if worker_node.get(w, "") in drifted))
    slow = float(sum(straggler_s.values())) - mixed
    checkpoint = min(saves_s, tp.down_s)
    hang = min(hang_s, tp.down_s - checkpoint)
    return Badput(
        job=job,
        elapsed_s=tp.elapsed_s,
        productive_s=tp.productive_s,
        checkpoint_s=checkpoint,
        recompute_s=tp.redone_s,
        restart_s=max(0.0, tp.down_s - checkpoint - hang),
        hang_s=hang,
        straggler_s=slow,
        mixed_config_s=mixed,
    )
