"""Configuration drift: GPUs set up unlike the rest of their fleet.

A node that came back from repair with an older driver, a GPU with ECC turned off, persistence
mode off after a reboot, a MIG mode nobody asked for, an ECC or MIG change waiting for a GPU
reset that never came: none of these shows in a utilisation panel, and each can cost a job
(ranks on different drivers are among the first things to rule out when a job hangs or
slows; a GPU without ECC does not even report the memory errors it suffers). The agent
writes ``gpu_info`` at start and every ``[nvml] info_every_s``; this module reads the last one
of each GPU and compares it with the GPUs of the same model in the same cluster.

What counts as the fleet's setting is the value most of those GPUs have, and only when it is
clear: at least ``min_nodes`` nodes of the model report the field, and at least ``min_share``
of their GPUs agree. A fleet halfway through a driver rollout (60/40) has no reference, so
nothing is said about it; a fleet at 95/5 does, and the 5 % are named. A mode whose pending
value differs from its current one (``ecc_mode_pending_active`` vs ``ecc_mode_active``, the
same for MIG) is reported whatever the fleet does: the GPU needs a reset.

A job is looked at as well (:func:`find_job_mix`): one whose GPUs of a model do not all agree
on a setting (ranks on two drivers, one GPU of 96 without ECC). Where the fleet has a clear
setting, the odd GPUs are already named per node, and the job's view only says which job they
hit; halfway through a rollout nothing is named per node, and a job spread over both halves is
the one thing worth saying, so it is said louder (``explained`` is False).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

log = logging.getLogger(__name__)

INFO_FIELDS = (
    "driver_version",
    "vbios_version",
    "persistence_mode_active",
    "ecc_mode_active",
    "ecc_mode_pending_active",
    "mig_mode_active",
    "mig_mode_pending_active",
)
PENDING = {
    "ecc_mode_active": "ecc_mode_pending_active",
    "mig_mode_active": "mig_mode_pending_active",
}
LABEL = {
    "driver_version": "driver",
    "vbios_version": "VBIOS",
    "persistence_mode_active": "persistence mode",
    "ecc_mode_active": "ECC",
    "mig_mode_active": "MIG mode",
}


@dataclass(frozen=True)
class DriftConfig:
    fields: list[str] = field(
        default_factory=lambda: [
            "driver_version",
            "vbios_version",
            "persistence_mode_active",
            "ecc_mode_active",
            "mig_mode_active",
        ]
    )
    """``gpu_info`` fields compared with the fleet (pending modes are always checked)."""
    lookback_s: float = 1800.0
    """How far back to look for each GPU's last ``gpu_info`` (at least twice the agents'
    ``info_every_s``, so every live GPU has one)."""
    min_nodes: int = 3
    """A model's setting is only a reference when at least this many nodes report it."""
    min_share: float = 0.75
    """... and at least this share of their GPUs agree on it."""
    job_window_s: float = 300.0
    """A job's GPUs are those it ran on in this last stretch of the window (its placement now,
    not where it ran before a restart moved it)."""

    def __post_init__(self) -> None:
        unknown = set(self.fields) - set(LABEL)
        if unknown:
            raise ValueError(f"drift.fields: unknown {sorted(unknown)}; known: {sorted(LABEL)}")
        if not 0.5 < self.min_share <= 1.0 or self.min_nodes < 2:
            raise ValueError("drift: min_share in (0.5, 1] and min_nodes >= 2")
        if self.lookback_s <= 0 or self.job_window_s <= 0:
            raise ValueError("drift: lookback_s and job_window_s must be > 0")


@dataclass(frozen=True)
class Difference:
    gpu: str
    field: str
    value: Any
    fleet: Any
    """The fleet's setting, or the pending value when ``pending`` is set."""
    share: float
    """Share of the model's GPUs that have the fleet's setting (1.0 for a pending change)."""
    pending: bool = False

    def to_json(self) -> dict[str, Any]:
        out = {"gpu": self.gpu, "field": self.field, "value": self.value}
        if self.pending:
            return {**out, "pending": self.fleet}
        return {**out, "fleet": self.fleet, "fleet_share": round(self.share, 4)}


@dataclass(frozen=True)
class Drift:
    """One node whose GPUs differ from their fleet, or wait for a reset."""

    cluster: str
    node: str
    gpu_model: str
    gpus: int
    """GPUs of the node that reported (to say "all 8 GPUs")."""
    differences: list[Difference]
    jobs: list[str] = field(default_factory=list)
    """Jobs that ran on the node in the lookback (the analytics runner fills them in)."""

    def describe(self) -> str:
        """``driver 535.129.03 (fleet 550.54.15, 97%) on all 8 GPUs; ECC off (fleet on, 99%)
        on GPU 2, 3; ECC turns on at the next GPU reset on GPU 5``."""
        groups: dict[tuple[str, str, bool], list[Difference]] = {}
        for d in self.differences:
            groups.setdefault((d.field, repr(d.value), d.pending), []).append(d)
        parts = []
        for (name, _, pending), ds in groups.items():
            gpus = ", ".join(d.gpu for d in ds)
            label = LABEL.get(name, name)
            if pending:
                turn = "on" if ds[0].fleet else "off"
                parts.append(f"{label} turns {turn} at the next GPU reset on GPU {gpus}")
                continue
            d = ds[0]
            where = f"all {self.gpus} GPUs" if len(ds) == self.gpus > 1 else f"GPU {gpus}"
            parts.append(
                f"{label} {_word(d.value)} (fleet {_word(d.fleet)}, {d.share:.0%}) on {where}"
            )
        if self.jobs:
            parts.append(f"running job {', '.join(self.jobs)}")
        return "; ".join(parts)


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def latest(info: pl.DataFrame) -> pl.DataFrame:
    """The last report of each GPU (per field: the last non-null value in the window)."""
    if info.is_empty():
        return info
    present = [f for f in INFO_FIELDS if f in info.columns]
    return (
        info.with_columns(pl.col("cluster", "gpu_model").fill_null(""))
        .sort("time")
        .group_by("cluster", "node", "gpu", maintain_order=True)
        .agg(pl.col("gpu_model").last(), *[pl.col(f).drop_nulls().last() for f in present])
    )


def reference(gpus: pl.DataFrame, name: str, cfg: DriftConfig) -> tuple[Any, float] | None:
    """The model fleet's setting of ``name`` and the share of GPUs that have it, if clear."""
    known = gpus.filter(pl.col(name).is_not_null())
    if known.is_empty() or known["node"].n_unique() < cfg.min_nodes:
        return None
    votes = Counter(known[name].to_list())
    value, count = votes.most_common(1)[0]
    share = count / known.height
    return (value, share) if share >= cfg.min_share else None


def find_drift(info: pl.DataFrame, cfg: DriftConfig) -> list[Drift]:
    """Every node with at least one GPU that differs from its fleet or waits for a reset
    (``info``: ``gpu_info`` rows with cluster, node, gpu, gpu_model and the fields)."""
    last = latest(info)
    if last.is_empty():
        return []
    found: dict[tuple[str, str, str], list[Difference]] = {}
    for (cluster, model), gpus in last.group_by("cluster", "gpu_model", maintain_order=True):
        for name in cfg.fields:
            if name not in gpus.columns:
                continue
            ref = reference(gpus, name, cfg)
            if ref is None:
                continue
            value, share = ref
            odd = gpus.filter(pl.col(name).is_not_null() & (pl.col(name) != value))
            for row in odd.iter_rows(named=True):
                key = (str(cluster), row["node"], str(model))
                found.setdefault(key, []).append(
                    Difference(str(row["gpu"]), name, row[name], value, share)
                )
        for now, pending in PENDING.items():
            if now not in gpus.columns or pending not in gpus.columns:
                continue
            waiting = gpus.filter(
                pl.col(now).is_not_null()
                & pl.col(pending).is_not_null()
                & (pl.col(now) != pl.col(pending))
            )
            for row in waiting.iter_rows(named=True):
                key = (str(cluster), row["node"], str(model))
                found.setdefault(key, []).append(
                    Difference(str(row["gpu"]), now, row[now], row[pending], 1.0, pending=True)
                )
    per_node = Counter(zip(last["cluster"].to_list(), last["node"].to_list(), strict=True))
    return [
        Drift(cluster, node, model, per_node[(cluster, node)], sorted(ds, key=_order))
        for (cluster, node, model), ds in sorted(found.items())
    ]


@dataclass(frozen=True)
class Setting:
    """One value of a field among a job's GPUs, and where it is."""

    value: Any
    gpus: int
    nodes: list[str]


@dataclass(frozen=True)
class JobMix:
    """One job whose GPUs of a model are not all set up alike."""

    cluster: str
    job: str
    gpu_model: str
    gpus: int
    """The job's GPUs of this model that reported ``gpu_info``."""
    fields: dict[str, list[Setting]]
    """Each field the GPUs disagree on -> its values, the most common first (in a tie, the
    fleet's setting)."""
    explained: bool
    """Every field it mixes has a clear fleet setting, so the odd GPUs are in ``config_drift``
    findings of their nodes already; False is a mix nothing else reports (a rollout half
    done, and the job straddles it)."""

    def describe(self) -> str:
        """``driver 550.90.07 for 88 GPUs (11 nodes), 535.129.03 for 8 GPUs (node-013)``."""
        parts = []
        for name, settings in self.fields.items():
            each = ", ".join(
                f"{_word(s.value)} for {_count(s.gpus, 'GPU')} ({_where(s.nodes)})"
                for s in settings
            )
            parts.append(f"{LABEL.get(name, name)} {each}")
        return "; ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _where(nodes: list[str]) -> str:
    return ", ".join(nodes) if len(nodes) <= 3 else _count(len(nodes), "node")


def find_job_mix(info: pl.DataFrame, placement: pl.DataFrame, cfg: DriftConfig) -> list[JobMix]:
    """Every job whose GPUs (of one model) disagree on a ``cfg.fields`` setting. ``info`` as
    for :func:`find_drift`; ``placement``: ``cluster, node, gpu, job`` rows, the GPUs each job
    ran on (in ``cfg.job_window_s``)."""
    last = latest(info)
    if last.is_empty() or placement.is_empty():
        return []
    keys = ["cluster", "node", "gpu"]
    on = (
        placement.select(*keys, "job")
        .with_columns(pl.col("cluster").fill_null(""), pl.col("gpu", "node").cast(pl.String))
        .filter(pl.col("job").is_not_null() & (pl.col("job") != ""))
        .unique()
        .join(last.with_columns(pl.col("gpu", "node").cast(pl.String)), on=keys, how="inner")
    )
    refs: dict[tuple[Any, Any, str], tuple[Any, float] | None] = {}  # per fleet, not per job

    def fleet_reference(cluster: Any, model: Any, name: str) -> tuple[Any, float] | None:
        if (cluster, model, name) not in refs:
            fleet = last.filter((pl.col("cluster") == cluster) & (pl.col("gpu_model") == model))
            refs[(cluster, model, name)] = reference(fleet, name, cfg)
        return refs[(cluster, model, name)]

    out = []
    for (cluster, job, model), gpus in on.group_by(
        "cluster", "job", "gpu_model", maintain_order=True
    ):
        mixed: dict[str, list[Setting]] = {}
        explained = True
        for name in cfg.fields:
            if name not in gpus.columns:
                continue
            known = gpus.filter(pl.col(name).is_not_null())
            if known[name].n_unique() < 2:
                continue
            ref = fleet_reference(cluster, model, name)
            settings = [
                Setting(value, g.height, sorted(set(g["node"].to_list()), key=_natural))
                for (value,), g in known.group_by(name)
            ]
            # the most common first; in a tie, the fleet's setting, then by value
            first = ref[0] if ref else None
            mixed[name] = sorted(settings, key=lambda s: (-s.gpus, s.value != first, str(s.value)))
            explained = explained and ref is not None
        if mixed:
            n_gpus = gpus.select("node", "gpu").n_unique()
            out.append(JobMix(str(cluster), str(job), str(model), n_gpus, mixed, explained))
    return sorted(out, key=lambda m: (m.cluster, _natural(m.job), m.gpu_model))


def _natural(name: str) -> tuple[int, str]:
    return (len(name), name)


def _order(d: Difference) -> tuple[int, str, bool, int, str]:
    rank = list(LABEL).index(d.field) if d.field in LABEL else len(LABEL)
    return (rank, d.field, d.pending, len(d.gpu), d.gpu)


def config_from(section: Mapping[str, Any]) -> DriftConfig:
    try:
        return DriftConfig(**section)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"[drift]: {exc}") from None
