"""The node that stopped a job: for a job whose ranks all stopped stepping *and* beating (its
processes are gone: it crashed, or ended), the evidence that names one node.

A hang keeps its processes (:mod:`analytics.hangs`); a crash does not, and Slurm or torchrun
restarts the job where the scheduler likes, which can be the node that broke it. In order:

1. **a hardware finding** on one of the job's nodes around the stop: a critical finding (a
   fatal XID or SXid, a lost GPU, a failed row remap, a silent node) from ``before_s`` before
   the job's last step to ``after_s`` after it; the earliest names the node;
2. **the node that went first**: a node whose ranks' last heartbeat or step came at least
   ``lead_s`` before the median node's and the next node's (the others waited in a collective
   for it, then died of their watchdog).

With neither, nothing is named: a job whose ranks stop together with no hardware finding most
likely ended, and it is not gpuwarden's to act on. The fast path usually names a broken GPU
within a second (its XID); this catches what it does not see: a GPU lost without an XID that
another source reported, a node that vanished, a rank that died first.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import polars as pl

NS = 1_000_000_000


@dataclass(frozen=True)
class StopConfig:
    stop_after_s: float = 60.0
    """No step and no heartbeat from any rank for this long: the job has stopped."""
    before_s: float = 120.0
    after_s: float = 60.0
    """A critical finding on a job node this long before/after its last step is evidence."""
    lead_s: float = 45.0
    """A rank that went silent this long before the median rank went first."""

    def __post_init__(self) -> None:
        for name in ("stop_after_s", "before_s", "after_s", "lead_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"stops.{name} must be >= 0")


@dataclass(frozen=True)
class Stop:
    job: str
    node: str
    method: str
    """``finding`` (a hardware finding named it) or ``first_silent`` (its rank went first)."""
    last_step: int
    last_step_ns: int
    stopped_s: float
    evidence: dict[str, Any]

    def describe(self) -> str:
        why = (
            f"{self.evidence['finding_kind']} on it"
            if self.method == "finding"
            else f"rank {self.evidence['first_rank']} went silent "
            f"{self.evidence['lead_s']:.0f} s before the others"
        )
        return (
            f"job {self.job} stopped at step {self.last_step} {self.stopped_s:.0f} s ago; "
            f"{self.node} stopped it ({why})"
        )


def _ns(df: pl.DataFrame) -> pl.Expr:
    return pl.col("time").dt.epoch("ns") if df.schema["time"] != pl.Int64 else pl.col("time")


def find_stop(
    job: str,
    ranks: pl.DataFrame,
    found: pl.DataFrame,
    start_ns: int,
    end_ns: int,
    cfg: StopConfig,
    held: Collection[str] = (),
) -> Stop | None:
    """``ranks``: each rank's last sign of life, ``rank, node, time`` (its last step or
    heartbeat, whichever is later), with ``step_index`` of its last step; ``found``: critical
    findings on the job's nodes, ``time, node, kind``. Only a stop that began in the window
    ``[start_ns, end_ns)`` is reported (not the same one every window after). ``held``: the
    nodes where the agents saw the job's GPUs; when given, only they can be named (a rank's
    ``node`` tag is its writer's word: issue 38), and the others are listed as
    ``unconfirmed_nodes``."""
    if ranks.is_empty():
        return None
    ranks = ranks.with_columns(_ns(ranks).alias("t")).drop_nulls("t")
    last_ns = int(ranks["t"].max())  # type: ignore[arg-type]
    stopped_s = (end_ns - last_ns) / NS
    if stopped_s < cfg.stop_after_s or not start_ns <= last_ns < end_ns:
        return None
    last_step = int(ranks["step_index"].max()) if "step_index" in ranks.columns else -1  # type: ignore[arg-type]
    nodes = sorted(set(ranks["node"].drop_nulls()))
    base: dict[str, Any] = {"ranks": ranks.height, "nodes": nodes}
    if held:
        unconfirmed = [n for n in nodes if n not in held]
        if unconfirmed:
            base["unconfirmed_nodes"] = unconfirmed
            nodes = [n for n in nodes if n in held]
            ranks = ranks.filter(pl.col("node").is_in(nodes))
    if found.height:
        near = (
            found.with_columns(_ns(found).alias("t"))
            .filter(
                pl.col("node").is_in(nodes)
                & pl.col("t").is_between(
                    last_ns - int(cfg.before_s * NS), last_ns + int(cfg.after_s * NS)
                )
            )
            .sort("t")
        )
        if near.height:
            first = near.row(0, named=True)
            evidence = base | {
                "finding_kind": first["kind"],
                "finding_time_ns": int(first["t"]),
                "findings": near.height,
            }
            return Stop(job, str(first["node"]), "finding", last_step, last_ns, stopped_s, evidence)
    per_node = ranks.group_by("node").agg(pl.col("t").max(), pl.col("rank").sort_by("t").first())
    if per_node.height >= 2:
        order = per_node.sort("t")
        median = float(order["t"].median())  # type: ignore[arg-type]
        first, second = order.row(0, named=True), order.row(1, named=True)
        lead = (median - first["t"]) / NS
        # the first node alone must be early: two as early name no single culprit
        if lead >= cfg.lead_s and (second["t"] - first["t"]) / NS >= cfg.lead_s:
            evidence = base | {"first_rank": str(first["rank"]), "lead_s": round(lead, 1)}
            return Stop(
                job, str(first["node"]), "first_silent", last_step, last_ns, stopped_s, evidence
            )
    return None
