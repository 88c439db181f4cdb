"""What a straggler costs the job: simulated step time as traced, against every operation
taking its typical time (the what-if analysis of Lin et al., "Understanding Stragglers in
Large Model Training Using What-if Analysis", ByteDance Seed, whose ST trace ships in
``shared/data/bytedance-straggler-st``).

Each step is replayed as a non-interleaved 1F1B pipeline (Megatron's schedule): per
data-parallel replica, stage ``s`` runs ``min(P - s - 1, M)`` forward micro-batches, then
alternates one forward and one backward, then drains its backwards. A forward waits for the
same micro-batch's forward on the stage before; a backward for its backward on the stage
after (the last stage: its own forward); each hop adds the step's median point-to-point send.
The step's makespan is its slowest replica's. Around it, the operations outside the pipeline
(parameter all-gather, gradient all-reduces and reduce-scatter, gradient clipping, the
optimizer) count at their *shortest* duration across ranks: what they take without waiting
for a slow peer.

``job_slowdown`` is the traced job's simulated time over the same simulation with every
forward and every backward of a step set to the step's mean: the slowdown that stragglers of
any kind (a slow rank, a slow stage, a mis-partitioned pipeline) cost the job. On the REAL ST
trace it gives 1.16; the published analysis gives 1.18 (``ms-ST.json``: 2.173 s against
1.843 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

COMPUTE = ("forward-compute", "backward-compute")
SENDS = ("forward-send", "backward-send")
OUTSIDE = (
    "params-all-gather",
    "layernorm-grads-all-reduce",
    "embedding-grads-all-reduce",
    "grads-reduce-scatter",
    "optimizer-clip-main-grad",
    "optimizer",
)


def one_f_one_b(stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s order of forwards (``F``) and backwards (``B``) in 1F1B."""
    warmup = min(stages - stage - 1, micro)
    order = [("F", m) for m in range(warmup)]
    for i in range(micro - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", m) for m in range(micro - warmup, micro)]


def makespan(fwd: Sequence[Sequence[float]], bwd: Sequence[Sequence[float]], hop_s: float) -> float:
    """One replica's pipeline time; ``fwd[s][m]``, ``bwd[s][m]``: stage ``s``, micro-batch
    ``m``'s compute time."""
    stages, micro = len(fwd), len(fwd[0])
    orders = [one_f_one_b(s, stages, micro) for s in range(stages)]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * stages
    at = [0] * stages
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for s in range(stages):
            if at[s] == len(orders[s]):
                continue
            kind, m = orders[s][at[s]]
            if kind == "F":
                ready = 0.0 if s == 0 else done.get(("F", s - 1, m))
                hop, cost = (hop_s if s > 0 else 0.0), fwd[s][m]
            else:
                last = s == stages - 1
                ready = done.get(("F", s, m)) if last else done.get(("B", s + 1, m))
                hop, cost = (0.0 if last else hop_s), bwd[s][m]
            if ready is None:
                continue  # waits for another stage
            free[s] = done[(kind, s, m)] = max(free[s], ready + hop) + cost
            at[s] += 1
            left -= 1
            moved = True
        if not moved:
            raise ValueError("the 1F1B schedule cannot proceed: a micro-batch is missing")
    return max(free)


@dataclass(frozen=True)
class WhatIf:
    steps: int
    actual_s: float
    """Mean simulated step time, operations as traced."""
    ideal_s: float
    """Mean simulated step time, each forward and backward at its step's mean."""

    @property
    def job_slowdown(self) -> float:
        return self.actual_s / self.ideal_s


def _table(
    t: dict[tuple[str, int, int, int], float], kind: str, dp: int, stages: int, micro: int
) -> list[list[float]]:
    return [[t[(kind, dp, s, m)] for m in range(micro)] for s in range(stages)]


def job_slowdown(ops: pl.DataFrame) -> WhatIf:
    """``ops``: one row per traced operation: ``dp_rank, stage, step, optype, mb_id,
    duration`` (the StragglerAnalysis format)."""
    ops = ops.with_columns(pl.col("optype").cast(pl.String))
    compute = ops.filter(pl.col("optype").is_in(COMPUTE))
    stages = int(compute["stage"].n_unique())
    micro = int(compute["mb_id"].n_unique())
    actual = ideal = 0.0
    steps = sorted(compute["step"].unique().to_list())
    for step in steps:
        c = compute.filter(pl.col("step") == step)
        t = {
            (o[0].upper(), int(dp), int(s), int(m)): float(d)
            for o, dp, s, m, d in c.select(
                "optype", "dp_rank", "stage", "mb_id", "duration"
            ).iter_rows()
        }
        rest = ops.filter(pl.col("step") == step)
        hop = rest.filter(pl.col("optype").is_in(SENDS))["duration"].median()
        hop_s = float(hop) if hop is not None else 0.0  # type: ignore[arg-type]
        outside = (
            rest.filter(pl.col("optype").is_in(OUTSIDE))
            .group_by("optype")
            .agg(pl.col("duration").min())
        )
        around = float(outside["duration"].sum())
        grid = [(s, m) for s in range(stages) for m in range(micro)]
        try:
            replicas = sorted({k[1] for k in t})
            actual += around + max(
                makespan(
                    _table(t, "F", dp, stages, micro), _table(t, "B", dp, stages, micro), hop_s
                )
                for dp in replicas
            )
        except KeyError as exc:
            raise ValueError(f"step {step}: no compute time traced for {exc}") from None
        f_mean = sum(v for k, v in t.items() if k[0] == "F") / (len(replicas) * len(grid))
        b_mean = sum(v for k, v in t.items() if k[0] == "B") / (len(replicas) * len(grid))
        same_f = [[f_mean] * micro for _ in range(stages)]
        same_b = [[b_mean] * micro for _ in range(stages)]
        ideal += around + makespan(same_f, same_b, hop_s)
    n = len(steps)
    return WhatIf(n, actual / n, ideal / n)
