"""Stragglers: workers or pipeline stages that are slower than their peers *and stay so*.

The input is a table of per-step timings, one row per (worker, step): ``worker`` (a rank or
worker id), ``step`` (a step index or any increasing sample number), ``time_s`` (the worker's
own time for the step, or any quantity proportional to it), and optionally ``stage`` and
``dp_rank``. What the time must be: the rank's *own* busy time (compute before it blocks in a
collective). In a synchronous job the wall time of a step is the same on every rank, so a wall
time cannot show who made the others wait.

Method (in the spirit of Minder: a machine that is dissimilar from its peers and stays so):

1. **Compare to peers, robustly.** Each sample is divided by the median of its peers in the
   same step: all workers, or, when stages are known, the workers of the same stage (stages do
   different work, so a worker is only comparable to its own stage). Stages themselves are
   compared by their per-step median against the median over stages.
2. **A threshold from the job's own noise.** A sample is slow when its ratio exceeds
   ``1 + max(min_slowdown, noise_k * sigma)``, where ``sigma`` is the typical step-to-step
   jitter of a unit around its own level (median over units of 1.4826 x MAD in time). A unit
   that is persistently offset does not widen the threshold; jitter does.
3. **Persistence.** A unit is flagged where at least ``persistence`` of the samples in a
   sliding window of ``window`` samples are slow. The finding reports from the first slow sample
   of the first such window (the onset) to the last.
4. **Kinds.** A slow stage whose workers are alike is a *stage* finding (pipeline imbalance: no
   machine to blame). A worker slower than its own stage (or than everyone, without stages) is a
   *worker* finding. When no unit is persistently slow yet the slowest worker of each step is
   well above the median and changes from step to step, the finding is *spread* imbalance
   (sequence-length or data imbalance, which the ByteDance what-if study found far more common
   than bad machines).

Pure polars over a small frame: no I/O here. Readers for real traces are in
:mod:`analytics.importers`; the telemetry attribution of a slow worker is in
:mod:`analytics.attribution`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from gpuwarden.analytics.scalars import num

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class StragglerConfig:
    min_slowdown: float = 0.10
    """Never call a unit slow below this fraction over its peers."""
    noise_k: float = 4.0
    """Threshold in units of the job's step-to-step jitter (robust sigma)."""
    window: int = 10
    """Samples in the persistence window (shorter series use their whole length)."""
    persistence: float = 0.6
    """Fraction of the window's samples that must be slow."""
    report_persistence: float = 0.5
    """A flagged stretch is reported when at least this share of its samples were slow (a
    unit hovering at the threshold qualifies now and then but is not persistently slow)."""
    spread_min: float = 0.10
    """Spread imbalance: the median step's slowest worker is this much above the median."""
    spread_top_share: float = 0.5
    """... and no single worker is the slowest in more than this share of the steps."""


@dataclass(frozen=True)
class Straggler:
    kind: str
    """``worker``, ``stage`` or ``spread``."""
    slowdown: float
    """Median ratio to the peer median over the flagged samples."""
    persistence: float
    """Share of the samples from onset to the last flagged one that were slow."""
    onset_step: int
    last_step: int
    samples: int
    """Slow samples in the flagged stretch."""
    threshold: float
    """The ratio above which a sample counted as slow."""
    worker: str | None = None
    dp_rank: int | None = None
    stage: int | None = None
    node: str | None = None
    time_s: float | None = None
    """Median own time of the unit while flagged."""
    peer_time_s: float | None = None
    """Median time of its peers over the same samples."""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "slowdown": round(self.slowdown, 4),
            "persistence": round(self.persistence, 4),
            "onset_step": self.onset_step,
            "last_step": self.last_step,
            "samples": self.samples,
            "threshold": round(self.threshold, 4),
        }
        for key in ("worker", "dp_rank", "stage", "node"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.time_s is not None:
            out["time_s"] = round(self.time_s, 6)
        if self.peer_time_s is not None:
            out["peer_time_s"] = round(self.peer_time_s, 6)
        if self.evidence:
            out["evidence"] = self.evidence
        return out

    def describe(self) -> str:
        if self.kind == "stage":
            who = f"pipeline stage {self.stage}"
        elif self.kind == "spread":
            who = "imbalance spread over all workers"
        else:
            who = f"worker {self.worker}"
            extra = [f"{k} {getattr(self, k)}" for k in ("dp_rank", "stage", "node")]
            extra = [e for e in extra if not e.endswith(" None")]
            if extra:
                who += f" ({', '.join(extra)})"
        return (
            f"{who}: {self.slowdown:.2f}x its peers from step {self.onset_step} to "
            f"{self.last_step} ({self.persistence:.0%} of those steps slow)"
        )


def confirmed(
    stragglers: list[Straggler],
    held: Collection[str],
    tagged: Mapping[str, Collection[str]] | None = None,
) -> list[Straggler]:
    """A worker's ``node`` is its reporter's tag (the relay stamps its own node, but a writer
    to the store may say anything): it stands only where the agents saw the job's GPUs, when
    they saw any (``held``), and only when every point of that worker named the same node
    (``tagged``: each worker's nodes). Otherwise it moves to ``evidence.unconfirmed_node``
    and the finding names no node (issue 38, as :func:`analytics.hangs` does for a hang's
    suspects). A job with no GPU data at all (a CPU job, the agents not yet reporting) keeps
    its tags."""
    held = {n for n in held if n}
    out = []
    for one in stragglers:
        nodes = sorted({str(n) for n in (tagged or {}).get(one.worker or "", ()) if n})
        if one.node is not None and (len(nodes) > 1 or (held and one.node not in held)):
            said = ", ".join(nodes) if len(nodes) > 1 else one.node
            one = replace(one, node=None, evidence={**one.evidence, "unconfirmed_node": said})  # noqa: PLW2901
        out.append(one)
    return out


def _normalise(df: pl.DataFrame) -> pl.DataFrame:
    missing = {"worker", "step", "time_s"} - set(df.columns)
    if missing:
        raise ValueError(f"straggler input lacks columns {sorted(missing)}")
    out = df.with_columns(
        pl.col("worker").cast(pl.String),
        pl.col("step").cast(pl.Int64),
        pl.col("time_s").cast(pl.Float64),
    ).filter(pl.col("time_s").is_finite() & (pl.col("time_s") > 0))
    keys = ["worker", "step"]
    extra = [c for c in ("stage", "dp_rank", "node") if c in out.columns]
    # A worker reporting one step twice (a duplicated line) counts once, at its mean.
    return out.group_by(keys, maintain_order=True).agg(
        pl.col("time_s").mean(), *[pl.col(c).first() for c in extra]
    )


def _ratios(df: pl.DataFrame, unit: str, peers: list[str]) -> pl.DataFrame:
    ref = pl.col("time_s").median().over(["step", *peers])
    return df.with_columns(ref.alias("peer_time_s")).with_columns(
        (pl.col("time_s") / pl.col("peer_time_s")).alias("ratio")
    )


def _jitter(df: pl.DataFrame, unit: str) -> float:
    """Median over units of the robust sigma of each unit's ratio around its own median."""
    per = df.group_by(unit).agg(
        ((pl.col("ratio") - pl.col("ratio").median()).abs().median() * MAD_TO_SIGMA).alias("s")
    )
    value = per["s"].median()
    return float(value) if isinstance(value, int | float) else 0.0


def _persistent(df: pl.DataFrame, unit: str, cfg: StragglerConfig) -> tuple[pl.DataFrame, float]:
    """Per-sample flags: ``slow`` and ``flagged`` (slow and inside a qualifying window)."""
    sigma = _jitter(df, unit)
    threshold = 1.0 + max(cfg.min_slowdown, cfg.noise_k * sigma)
    n_max = int(num(df.group_by(unit).len()["len"].max()))
    w = max(1, min(cfg.window, n_max))
    need = cfg.persistence
    out = (
        df.sort(unit, "step")
        .with_columns((pl.col("ratio") >= threshold).alias("slow"))
        .with_columns(
            (
                pl.col("slow").cast(pl.Float64).rolling_mean(w, min_samples=w).over(unit) >= need
            ).alias("qualifies")
        )
        .with_columns(
            # a sample is covered when a qualifying window ends within the next w samples
            pl.col("qualifies")
            .fill_null(False)
            .cast(pl.Int8)
            .reverse()
            .rolling_max(w, min_samples=1)
            .reverse()
            .over(unit)
            .cast(pl.Boolean)
            .alias("covered")
        )
        .with_columns((pl.col("slow") & pl.col("covered")).alias("flagged"))
    )
    return out, threshold


def _summaries(flags: pl.DataFrame, unit: str) -> pl.DataFrame:
    """One row per unit with any flagged sample."""
    flagged = flags.filter(pl.col("flagged"))
    if flagged.is_empty():
        return flagged
    spans = flagged.group_by(unit).agg(
        pl.col("step").min().alias("onset_step"),
        pl.col("step").max().alias("last_step"),
        pl.col("ratio").median().alias("slowdown"),
        pl.col("time_s").median().alias("unit_time_s"),
        pl.col("peer_time_s").median().alias("peer_median_s"),
        pl.len().alias("samples"),
    )
    within = (
        flags.join(spans, on=unit)
        .filter(pl.col("step").is_between(pl.col("onset_step"), pl.col("last_step")))
        .group_by(unit)
        .agg(pl.col("slow").mean().alias("persistence"))
    )
    return spans.join(within, on=unit).sort("slowdown", descending=True)


def _reported(summary: pl.DataFrame, cfg: StragglerConfig) -> pl.DataFrame:
    if summary.is_empty():
        return summary
    return summary.filter(pl.col("persistence") >= cfg.report_persistence)


def _where_workers(df: pl.DataFrame, workers: pl.Series) -> dict[str, dict[str, Any]]:
    """Each of ``workers``' first stage, data-parallel rank and node, in one pass (not a pass
    per worker: a 16,384-rank job has a hundred stragglers)."""
    cols = [c for c in ("stage", "dp_rank", "node") if c in df.columns]
    if not cols or workers.is_empty():
        return {}
    firsts = (
        df.filter(pl.col("worker").is_in(workers.implode()))
        .group_by("worker", maintain_order=True)
        .agg(*[pl.col(c).first() for c in cols])
    )
    return {str(r.pop("worker")): r for r in firsts.iter_rows(named=True)}


def _from_row(kind: str, row: dict[str, Any], threshold: float, **who: Any) -> Straggler:
    return Straggler(
        kind=kind,
        slowdown=row["slowdown"],
        persistence=row["persistence"],
        onset_step=row["onset_step"],
        last_step=row["last_step"],
        samples=row["samples"],
        threshold=threshold,
        time_s=row["unit_time_s"],
        peer_time_s=row["peer_median_s"],
        **who,
    )


def detect(timings: pl.DataFrame, cfg: StragglerConfig | None = None) -> list[Straggler]:
    """All persistent stragglers in ``timings`` (see the module docstring)."""
    cfg = cfg or StragglerConfig()
    df = _normalise(timings)
    if df.is_empty() or df["worker"].n_unique() < 2:
        return []
    staged = "stage" in df.columns and df["stage"].drop_nulls().n_unique() > 1
    found: list[Straggler] = []
    if staged:
        per_stage = df.group_by("stage", "step").agg(pl.col("time_s").median())
        flags, thr = _persistent(_ratios(per_stage, "stage", []), "stage", cfg)
        for row in _reported(_summaries(flags, "stage"), cfg).iter_rows(named=True):
            found.append(_from_row("stage", row, thr, stage=int(row["stage"])))
    peers = ["stage"] if staged else []
    ratios = _ratios(df, "worker", peers)
    flags, thr = _persistent(ratios, "worker", cfg)
    reported = _reported(_summaries(flags, "worker"), cfg)
    where = _where_workers(
        df, reported["worker"] if reported.height else pl.Series([], dtype=pl.String)
    )
    for row in reported.iter_rows(named=True):
        w = row["worker"]
        stage, dp, node = (where.get(w, {}).get(c) for c in ("stage", "dp_rank", "node"))
        found.append(
            _from_row(
                "worker",
                row,
                thr,
                worker=w,
                dp_rank=None if dp is None else int(dp),
                stage=None if stage is None else int(stage),
                node=None if node is None else str(node),
            )
        )
    if not found:
        spread = _spread(df, cfg)
        if spread is not None:
            found.append(spread)
    return found


def _spread(df: pl.DataFrame, cfg: StragglerConfig) -> Straggler | None:
    per_step = (
        df.group_by("step")
        .agg(
            (pl.col("time_s").max() / pl.col("time_s").median()).alias("spread"),
            pl.col("worker").sort_by("time_s").last().alias("slowest"),
            pl.col("time_s").median().alias("median_s"),
            pl.col("time_s").max().alias("max_s"),
        )
        .sort("step")
    )
    med = per_step["spread"].median()
    if not isinstance(med, int | float) or med < 1.0 + cfg.spread_min:
        return None
    top = per_step["slowest"].value_counts(sort=True)
    top_share = float(top["count"][0]) / per_step.height
    if top_share > cfg.spread_top_share:
        return None
    return Straggler(
        kind="spread",
        slowdown=float(med),
        persistence=num((per_step["spread"] >= 1.0 + cfg.spread_min).mean()),
        onset_step=int(per_step["step"][0]),
        last_step=int(per_step["step"][-1]),
        samples=per_step.height,
        threshold=1.0 + cfg.spread_min,
        time_s=num(per_step["max_s"].median()),
        peer_time_s=num(per_step["median_s"].median()),
        evidence={
            "distinct_slowest_workers": int(top.height),
            "top_slowest_share": round(top_share, 3),
        },
    )
