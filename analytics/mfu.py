"""Model FLOPs utilisation, goodput (ETTR) and energy per job.

MFU follows the PaLM paper, appendix B: a dense decoder does ``6N + 12·L·H·Q·T`` FLOPs per
token for a forward and backward pass (N parameters, L layers, H heads of dimension Q, so
``H·Q`` is the hidden size, T the sequence length; a multiply-add counts as two FLOPs).
Recomputation is *not* counted in MFU: it is work the hardware does but the model does not
need. HFU counts it: with full activation recomputation the forward runs twice, so
``8N + 16·L·H·Q·T`` per token.

``MFU = tokens/s x FLOPs per token / (GPUs x dense peak FLOP/s)``. Peaks are the vendor's dense
(not 2:4 sparse) tensor-core figures per GPU, from NVIDIA's data sheets (A100: 312 TFLOP/s
bf16; H100 SXM and H200: 989.4; H100 PCIe: 756; B200: 2,250).

Goodput here is the effective training time ratio (ETTR): the time spent on steps the job kept,
over the elapsed time from its first step to its last in the window. The rest is split into
time *re-done* (steps executed, then rolled back to a checkpoint by a restart) and time *down*
(failures, restarts, hangs: no steps at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from gpuwarden.analytics.counters import increases
from gpuwarden.analytics.errors import AnalyticsError
from gpuwarden.analytics.scalars import num

T = 1e12
PEAK_DENSE_FLOPS: dict[str, dict[str, float]] = {
    "A100": {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "bf16": 312 * T},
    "H100-SXM": {
        "fp32": 67 * T,
        "tf32": 494.7 * T,
        "fp16": 989.4 * T,
        "bf16": 989.4 * T,
        "fp8": 1978.9 * T,
    },
    "H100-PCIE": {
        "fp32": 51 * T,
        "tf32": 378 * T,
        "fp16": 756 * T,
        "bf16": 756 * T,
        "fp8": 1513 * T,
    },
    "H200": {
        "fp32": 67 * T,
        "tf32": 494.7 * T,
        "fp16": 989.4 * T,
        "bf16": 989.4 * T,
        "fp8": 1978.9 * T,
    },
    "B200": {"fp32": 75 * T, "tf32": 1125 * T, "fp16": 2250 * T, "bf16": 2250 * T, "fp8": 4500 * T},
}


class UnknownGpuError(AnalyticsError, ValueError):
    """No peak FLOP/s is known for this GPU model or dtype."""


def gpu_family(name: str) -> str:
    """The :data:`PEAK_DENSE_FLOPS` key for an NVML product name ("NVIDIA H100 80GB HBM3")."""
    upper = name.upper().replace(" ", "")
    for family in ("B200", "H200"):
        if family in upper:
            return family
    if "H100" in upper or "H800" in upper:
        return "H100-PCIE" if "PCIE" in upper else "H100-SXM"
    if "A100" in upper or "A800" in upper:
        return "A100"
    raise UnknownGpuError(f"no peak FLOP/s known for GPU {name!r}; known: {list(PEAK_DENSE_FLOPS)}")


def peak_flops(gpu_model: str, dtype: str) -> float:
    family = gpu_family(gpu_model)
    table = PEAK_DENSE_FLOPS[family]
    if dtype not in table:
        raise UnknownGpuError(f"no peak for dtype {dtype!r} on {family}; known: {list(table)}")
    return table[dtype]


def model_flops_per_token(params: float, layers: int, hidden: int, seq_len: int) -> float:
    """PaLM appendix B: 6N + 12·L·(H·Q)·T, with H·Q the hidden size."""
    return 6.0 * params + 12.0 * layers * hidden * seq_len


def hardware_flops_per_token(
    params: float, layers: int, hidden: int, seq_len: int, recompute: bool
) -> float:
    """With full activation recomputation the forward pass runs twice: 8N + 16·L·(H·Q)·T."""
    if not recompute:
        return model_flops_per_token(params, layers, hidden, seq_len)
    return 8.0 * params + 16.0 * layers * hidden * seq_len


def executions(steps: pl.DataFrame) -> pl.DataFrame:
    """One row per executed step (all ranks together): ``attempt, step_index, time_ns, tokens,
    wall_s``.

    A restart rolls ``step_index`` back to the last checkpoint; ``attempt`` counts a rank's
    rollbacks, so a step run twice is two executions. A synchronous step takes as long as its
    slowest rank; ``tokens`` sums the ranks' reported tokens.

    ``steps``: how many steps the row stands for. A reporter may send every Nth step only
    (``report_every_steps``); each reported step then stands for the steps since the previous
    report of the same attempt (the first of an attempt, for the job's typical gap), so time
    and tokens add up to the whole run, not to the sample.
    """
    if steps.is_empty():
        return pl.DataFrame(
            schema={
                "attempt": pl.Int64,
                "step_index": pl.Int64,
                "time_ns": pl.Int64,
                "tokens": pl.Int64,
                "wall_s": pl.Float64,
                "steps": pl.Int64,
            }
        )
    ex = (
        with_attempts(steps)
        .group_by("attempt", "step_index")
        .agg(
            pl.col("time_ns").max(),
            pl.col("tokens_count").sum().alias("tokens"),
            pl.col("step_time_s").max().alias("wall_s"),
        )
        .sort("time_ns")
    )
    gap = pl.col("step_index").diff().over("attempt")
    gaps = ex.select(gap.alias("g")).filter(pl.col("g") > 0)["g"]
    typical = int(gaps.median()) if gaps.len() else 1  # type: ignore[arg-type]
    return ex.with_columns(
        pl.when(gap > 0).then(gap).otherwise(typical).cast(pl.Int64).alias("steps")
    )


def with_attempts(steps: pl.DataFrame) -> pl.DataFrame:
    """``job_step`` rows with ``time_ns`` and ``attempt`` (how many times this rank's step index
    went back, i.e. restarts from a checkpoint, before this row). Rows that have them already
    are returned as they are: the sort by rank is most of a job task's own time, so a caller
    that needs them more than once adds them once."""
    if "attempt" in steps.columns and "time_ns" in steps.columns:
        return steps
    t = pl.col("time")
    if steps.schema["time"] != pl.Int64:
        t = t.dt.epoch("ns")
    return (
        steps.with_columns(t.alias("time_ns"))
        .sort("rank", "time_ns")
        .with_columns(
            (pl.col("step_index").diff().over("rank") <= 0)
            .fill_null(False)
            .cast(pl.Int64)
            .cum_sum()
            .over("rank")
            .alias("attempt")
        )
    )


@dataclass(frozen=True)
class JobThroughput:
    executions: int
    tokens: int
    running_s: float
    elapsed_s: float
    productive_s: float
    redone_s: float
    down_s: float
    first_ns: int
    last_ns: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.running_s if self.running_s > 0 else 0.0

    @property
    def goodput(self) -> float:
        return min(1.0, self.productive_s / self.elapsed_s) if self.elapsed_s > 0 else 0.0


def throughput(steps: pl.DataFrame) -> JobThroughput | None:
    """Tokens/s while running, and the elapsed time split into productive, re-done and down."""
    ex = executions(steps)
    if ex.is_empty():
        return None
    final = ex.group_by("step_index").agg(pl.col("attempt").max())
    kept = ex.join(final, on=["step_index", "attempt"])
    # fsum: exact, so the answer does not hang on the order the join hands rows back in
    running = math.fsum((ex["wall_s"] * ex["steps"]).to_list())
    productive = math.fsum((kept["wall_s"] * kept["steps"]).to_list())
    first = int(num(ex["time_ns"].min())) - int(float(ex["wall_s"][0]) * 1e9)
    last = int(num(ex["time_ns"].max()))
    elapsed = max(running, (last - first) / 1e9)
    return JobThroughput(
        executions=int(ex["steps"].sum()),
        tokens=int((ex["tokens"] * ex["steps"]).sum()),
        running_s=running,
        elapsed_s=elapsed,
        productive_s=productive,
        redone_s=running - productive,
        down_s=max(0.0, elapsed - running),
        first_ns=first,
        last_ns=last,
    )


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    hidden: int
    seq_len: int
    world_size: int
    dtype: str
    gpu_model: str
    recompute: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ModelShape:
        return cls(
            params=float(row["params_count"]),
            layers=int(row["layers_count"]),
            hidden=int(row["hidden_size_count"]),
            seq_len=int(row["seq_len_tokens"]),
            world_size=int(row["world_size_count"]),
            dtype=str(row.get("dtype") or "bf16"),
            gpu_model=str(row.get("gpu_model") or ""),
            recompute=bool(row.get("recompute_active") or False),
        )


@dataclass(frozen=True)
class Mfu:
    mfu: float
    hfu: float | None
    model_flops_per_s_per_gpu: float
    tokens_per_s: float
    goodput: float
    peak_flops: float


def compute_mfu(shape: ModelShape, tp: JobThroughput) -> Mfu:
    peak = peak_flops(shape.gpu_model, shape.dtype)
    per_token = model_flops_per_token(shape.params, shape.layers, shape.hidden, shape.seq_len)
    per_gpu = tp.tokens_per_s * per_token / shape.world_size
    hfu = None
    if shape.recompute:
        hw = hardware_flops_per_token(shape.params, shape.layers, shape.hidden, shape.seq_len, True)
        hfu = tp.tokens_per_s * hw / shape.world_size / peak
    return Mfu(
        mfu=per_gpu / peak,
        hfu=hfu,
        model_flops_per_s_per_gpu=per_gpu,
        tokens_per_s=tp.tokens_per_s,
        goodput=tp.goodput,
        peak_flops=peak,
    )


def tensor_activity_estimate(gpu: pl.DataFrame) -> float | None:
    """Telemetry-only MFU *estimate* for a job that reports nothing: the mean GPM tensor-core
    activity of its GPUs. Tensor pipes busy is an upper bound on useful model FLOPs (it counts
    recomputation, padding and pipes that are not at full rate), so label it an estimate."""
    if "gpm_tensor_active_pct" not in gpu.columns:
        return None
    value = gpu["gpm_tensor_active_pct"].drop_nulls().mean()
    return None if not isinstance(value, int | float) else float(value) / 100.0


def job_energy(gpu: pl.DataFrame, tp: JobThroughput | None) -> dict[str, float] | None:
    """Energy of a job's GPUs from their ``energy_j_total`` counters (resets handled), per
    token and per step; mean power. ``gpu`` holds ``time, gpu_uuid or node+gpu, energy_j_total,
    power_w`` of the job's GPUs."""
    if gpu.is_empty() or "energy_j_total" not in gpu.columns:
        return None
    keys = ["node", "gpu"] if "gpu_uuid" not in gpu.columns else ["gpu_uuid"]
    inc = increases(gpu.drop_nulls("energy_j_total"), keys, ["energy_j_total"])
    energy = float(inc["energy_j_total_inc"].sum() or 0.0)
    out = {"energy_j": energy, "power_w": float(gpu["power_w"].mean() or 0.0)}  # type: ignore[arg-type]
    if tp is not None and tp.tokens:
        out["j_per_token"] = energy / tp.tokens
        out["j_per_step"] = energy / tp.executions
        out["tokens_per_j"] = tp.tokens / energy if energy > 0 else 0.0
    return out
