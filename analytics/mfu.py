"""Model FLOPs utilisation, goodput (ETTR) and energy per job.

MFU follows the PaLM paper, appendix B: a dense decoder does ``6N + 12·L·H·Q·T`` FLOPs per
token for a forward and backward pass (L layers, H heads of dimension Q, so ``H·Q`` is the
hidden size, T the sequence length; a multiply-add counts as two FLOPs), where N counts the
parameters that take part in a matrix multiply: every token's forward passes each of them
once. The input embedding tables (token and learned position) are looked up, not multiplied,
so they are left out; the LM head is a matmul and stays in, tied or not (a tied head *is* the
token table, so its ``vocab x hidden`` counts once). :func:`flops_per_token` applies these
rules to what the job reported and says what it had to assume (docs/MFU.md).

Recomputation is *not* counted in MFU: it is work the hardware does but the model does not
need. HFU counts it: full recomputation runs the layers' forward again (``2·N_layers +
4·L·H·Q·T`` more per token, the LM head not: Megatron's accounting; with the head unknown, as
in PaLM, ``8N + 16·L·H·Q·T``), selective recomputation the attention scores only
(``4·L·H·Q·T`` more).

``MFU = tokens/s x FLOPs per token / (GPUs x dense peak FLOP/s)``. Peaks are the vendor's dense
(not 2:4 sparse) tensor-core figures per GPU, from NVIDIA's data sheets (A100: 312 TFLOP/s
bf16; H100 SXM and H200: 989.4; H100 PCIe: 756; B200: 2,250). A job that does not say which
GPU it runs on is looked up in the agent's ``gpu_info`` for the GPUs it ran on
(:func:`job_gpu_model`).

Beside every job's MFU stands the telemetry's own view, the mean GPM tensor-core activity of
its GPUs while it stepped (:func:`tensor_activity_estimate`); when the two are far apart the
reported shape is suspect (:func:`estimate_ratio`, finding ``mfu_mismatch``).

Goodput here is the effective training time ratio (ETTR): the time spent on steps the job kept,
over the elapsed time from its first step to its last in the window. The rest is split into
time *re-done* (steps executed, then rolled back to a checkpoint by a restart) and time *down*
(failures, restarts, hangs: no steps at all).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
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


def _words(name: str) -> list[str]:
    """A GPU name's words, upper-case, split at anything not a letter or digit: "NVIDIA
    H100-SXM5-80GB" -> NVIDIA, H100, SXM5, 80GB. Names are matched on whole words, so that
    "H20" is not found in "H200", nor "A100" in "RTX A1000"."""
    return re.findall(r"[A-Z0-9]+", name.upper())


def _named_at(words: list[str], key: list[str]) -> int:
    """Where ``key``'s words, one after the other, end in ``words`` (the last such place);
    -1 when they do not appear."""
    ends = [
        i + len(key) for i in range(len(words) - len(key) + 1) if words[i : i + len(key)] == key
    ]
    return ends[-1] if key and ends else -1


def gpu_family(name: str) -> str:
    """The :data:`PEAK_DENSE_FLOPS` key for an NVML product name ("NVIDIA H100 80GB HBM3"),
    on whole words (:func:`_words`; a GH200's GPU is an H200's).

    Refused (:class:`UnknownGpuError`) rather than guessed: an NVL card ("NVIDIA H100 NVL",
    "NVIDIA H200 NVL": PCIe cards whose peaks are not the SXM part's, and which NVIDIA has
    quoted per card and per bridged pair) and a Grace-Blackwell superchip ("NVIDIA GB200",
    whose GPU's peak is not the HGX B200's). An operator states those in ``[mfu]
    peak_tflops`` (:func:`peak_flops`)."""
    words = set(_words(name))
    if words & {"NVL", "GB200", "GB300"}:
        raise UnknownGpuError(
            f"no peak FLOP/s built in for GPU {name!r} (an NVL card or a Grace-Blackwell "
            "superchip: its peak is not its SXM or HGX sibling's); state its dense peak per "
            "GPU from its data sheet in [mfu] peak_tflops"
        )
    if "B200" in words:
        return "B200"
    if words & {"H200", "GH200"}:
        return "H200"
    if words & {"H100", "H800"}:
        return "H100-PCIE" if "PCIE" in words else "H100-SXM"
    if words & {"A100", "A800"}:
        return "A100"
    raise UnknownGpuError(
        f"no peak FLOP/s known for GPU {name!r}; known: {list(PEAK_DENSE_FLOPS)}; another GPU's "
        "dense peak can be stated in [mfu] peak_tflops"
    )


#: how jobs spell a precision (torch's names, upper case, fp8's formats) -> the peak tables' key;
#: found by a review against real job reports (2026-11-28): "BF16" or "torch.bfloat16" got no
#: MFU at all ("no peak for dtype")
DTYPE_SPELLINGS = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "tensorfloat32": "tf32", "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}  # fmt: skip


def canonical_dtype(dtype: str) -> str:
    """``dtype`` as the peak tables name it: ``"torch.bfloat16"``, ``"BF16"`` -> ``"bf16"``."""
    d = dtype.strip().lower().removeprefix("torch.")
    return DTYPE_SPELLINGS.get(d, d)


def peak_flops(
    gpu_model: str, dtype: str, stated: Mapping[str, Mapping[str, float]] | None = None
) -> float:
    """The dense peak FLOP/s of one GPU of ``gpu_model`` at ``dtype``: from ``stated`` (``[mfu]
    peak_tflops``: a name whose words, case ignored, appear one after the other in the GPU's
    name -> {dtype: TFLOP/s}) when one names this GPU, else from :data:`PEAK_DENSE_FLOPS`.
    A key applies to every GPU whose name holds its words ("H100" to an "H100 NVL" too), so a
    variant is named to tell it apart; of several, the one of most words wins, then the one
    reaching furthest into the name (NVML puts the variant last: "H100 NVL" before "NVIDIA
    H100" for "NVIDIA H100 NVL"). ``dtype`` in any spelling :func:`canonical_dtype` knows."""
    dtype = canonical_dtype(dtype)
    words = _words(gpu_model)
    best: tuple[int, int, str] | None = None
    for key in stated or {}:
        key_words = _words(key)
        end = _named_at(words, key_words)
        if end >= 0 and (best is None or (len(key_words), end) > best[:2]):
            best = (len(key_words), end, key)
    if best is not None:
        table = {canonical_dtype(k): v for k, v in (stated or {})[best[2]].items()}
        if dtype not in table:
            raise UnknownGpuError(
                f"[mfu] peak_tflops states {best[2]!r} without {dtype!r}; it has {list(table)}"
            )
        return float(table[dtype]) * T
    family = gpu_family(gpu_model)
    table = PEAK_DENSE_FLOPS[family]
    if dtype not in table:
        raise UnknownGpuError(f"no peak for dtype {dtype!r} on {family}; known: {list(table)}")
    return table[dtype]


def model_flops_per_token(params: float, layers: int, hidden: int, seq_len: int) -> float:
    """PaLM appendix B: 6N + 12·L·(H·Q)·T, with H·Q the hidden size and N the parameters that
    take part in matmuls (see :func:`flops_per_token` for which those are)."""
    return 6.0 * params + 12.0 * layers * hidden * seq_len


def hardware_flops_per_token(
    params: float, layers: int, hidden: int, seq_len: int, recompute: bool
) -> float:
    """With full activation recomputation the forward pass runs twice: 8N + 16·L·(H·Q)·T."""
    if not recompute:
        return model_flops_per_token(params, layers, hidden, seq_len)
    return 8.0 * params + 16.0 * layers * hidden * seq_len


#: matmul parameters of one layer of a standard dense decoder, in units of hidden²: attention's
#: Q, K, V and output projections (4·H²) and a 4H MLP's two matrices (8·H²); SwiGLU's three
#: 8/3·H matrices come to the same. Only used when a job reports nothing about its embeddings.
LAYER_MATMUL_H2 = 12


@dataclass(frozen=True)
class FlopsPerToken:
    """FLOPs per token of one forward and backward pass, and how they were counted."""

    model: float
    """For MFU: 6·N + 12·L·H·T, N = :attr:`matmul_params`."""
    hardware: float
    """For HFU: :attr:`model` plus what recomputation runs again."""
    matmul_params: float
    """Parameters that take part in a matmul: all but the input embedding tables; the LM head
    in (once, when it is tied to the token table)."""
    head_params: float
    """Of those, the LM head's (``vocab x hidden``; 0 when not known)."""
    assumed: str = ""
    """What the rules had to assume because the job did not say; "" when it said enough."""


def flops_per_token(shape: ModelShape) -> FlopsPerToken:
    """FLOPs per token from what the job reported (:class:`ModelShape`), by these rules:

    1. ``embedding_params`` given (the input embedding tables, token + position, as counted
       in ``params``): N = params - embedding_params, plus ``vocab x hidden`` back when the
       head is tied (the head's matmul uses the token table). Tied without ``vocab_size``:
       all of ``embedding_params`` is taken for the token table (no learned positions).
    2. only ``vocab_size`` given: the token table is ``vocab x hidden`` and no learned position
       table is assumed; N = params (tied) or params - vocab x hidden (untied).
    3. neither (callers from before these fields): the layers are assumed to be a standard
       dense decoder's, ``12·L·H²`` of matmul parameters; what ``params`` holds beyond them is
       the token table and the head, in equal parts with an untied head (half of it counted),
       all head with a tied one (all counted). Where ``params`` is not above ``12·L·H²``, or
       more than twice it (not a dense decoder: MoE, or a toy), every parameter is counted,
       as PaLM's 6N does.

    ``tied_head`` not given is taken as untied, and said. See docs/MFU.md.
    """
    p, layers, h, t = shape.params, shape.layers, shape.hidden, shape.seq_len
    table = float(shape.vocab_size * h) if shape.vocab_size > 0 else 0.0
    tied = bool(shape.tied_head)
    notes: list[str] = []
    if shape.tied_head is None and not (shape.embedding_params is None and not table):
        notes.append("head assumed untied (tied_head not reported)")
    if shape.embedding_params is not None:
        emb = float(shape.embedding_params)
        if tied and table:
            matmul, head = p - emb + table, table
        elif tied:
            matmul, head = p, emb
            notes.append("tied head without vocab_size: embedding_params taken for the token "
                         "table alone (no learned positions)")  # fmt: skip
        else:
            matmul, head = p - emb, table
    elif table:
        matmul, head = (p, table) if tied else (p - table, table)
        notes.append("no learned position table (embedding_params not reported)")
    else:
        body = float(LAYER_MATMUL_H2 * layers * h * h)
        rest = p - body
        if rest <= 0 or rest > body:
            matmul, head = p, 0.0
            notes.append(
                f"params ({p:,.0f}) not between 12·L·H² ({body:,.0f}) and twice that: not "
                "a dense decoder's shape, every parameter counted"
            )
        elif tied:
            matmul, head = p, rest
            notes.append(f"dense decoder assumed: the {rest:,.0f} parameters beyond 12·L·H² "
                         "are the tied token table and head, all counted")  # fmt: skip
        else:
            matmul, head = p - rest / 2, rest / 2
            notes = [
                f"dense decoder with an untied head assumed (neither vocab_size nor "
                f"embedding_params reported): of the {rest:,.0f} parameters beyond 12·L·H², "
                "half (the head) counted, half (the input embeddings) not"
            ]
    model = model_flops_per_token(matmul, layers, h, t)
    hardware = model
    if shape.recompute and shape.recompute_selective:
        hardware += 4.0 * layers * h * t  # the attention scores' forward (QK^T, AV) again
    elif shape.recompute:
        k = shape.recompute_layers
        share = min(k, layers) / layers if k and layers > 0 else 1.0
        hardware += share * (2.0 * (matmul - head) + 4.0 * layers * h * t)
    return FlopsPerToken(model, hardware, matmul, head, "; ".join(notes))


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
    """A job's ``job_model`` report (:meth:`Reporter.model`)."""

    params: float
    layers: int
    hidden: int
    seq_len: int
    world_size: int
    dtype: str
    gpu_model: str
    recompute: bool = False
    vocab_size: int = 0
    """0: not reported."""
    tied_head: bool | None = None
    """None: not reported (taken as untied)."""
    embedding_params: float | None = None
    """Parameters of the input embedding tables (token + position) inside ``params``; None:
    not reported."""
    recompute_layers: int = 0
    """Full recomputation of this many layers; 0: all of them (with ``recompute``)."""
    recompute_selective: bool = False
    """Only the attention scores are recomputed (Megatron's selective recomputation)."""

    def __post_init__(self) -> None:
        """A shape is the job's word: refused (ValueError) when no model has it, so that a
        zero ``world_size`` or a NaN ``params`` is a problem of that job's, not a division by
        zero that stopped the whole analysis pass (found by a review as an attacker)."""
        ints = {"layers": self.layers, "hidden": self.hidden, "seq_len": self.seq_len,
                "world_size": self.world_size}  # fmt: skip
        low = [k for k, v in ints.items() if v < 1]
        if low:
            raise ValueError(f"model shape: {', '.join(low)} must be >= 1 ({ints})")
        if not (math.isfinite(self.params) and self.params > 0):
            raise ValueError(f"model shape: params must be a positive number, not {self.params}")
        if self.vocab_size < 0 or self.recompute_layers < 0:
            raise ValueError("model shape: vocab_size and recompute_layers must be >= 0")
        emb = self.embedding_params
        if emb is not None and not (math.isfinite(emb) and 0 <= emb < self.params):
            raise ValueError(f"model shape: embedding_params {emb} is not within [0, params)")

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ModelShape:
        def given(key: str) -> Any:
            value = row.get(key)
            return None if value is None or value == "" else value

        tied, emb = given("tied_head_active"), given("embedding_params_count")
        return cls(
            params=float(row["params_count"]),
            layers=int(row["layers_count"]),
            hidden=int(row["hidden_size_count"]),
            seq_len=int(row["seq_len_tokens"]),
            world_size=int(row["world_size_count"]),
            dtype=str(row.get("dtype") or "bf16"),
            gpu_model=str(row.get("gpu_model") or ""),
            recompute=bool(row.get("recompute_active") or False),
            vocab_size=int(given("vocab_size_count") or 0),
            tied_head=None if tied is None else bool(tied),
            embedding_params=None if emb is None else float(emb),
            recompute_layers=int(given("recompute_layers_count") or 0),
            recompute_selective=bool(given("recompute_selective_active") or False),
        )


@dataclass(frozen=True)
class Mfu:
    mfu: float
    hfu: float | None
    model_flops_per_s_per_gpu: float
    tokens_per_s: float
    goodput: float
    peak_flops: float
    flops: FlopsPerToken | None = None
    """The FLOPs per token behind it, and what was assumed to count them."""


def compute_mfu(
    shape: ModelShape, tp: JobThroughput, stated: Mapping[str, Mapping[str, float]] | None = None
) -> Mfu:
    """MFU (and HFU when the job recomputes) of one job; ``stated``: ``[mfu] peak_tflops``."""
    peak = peak_flops(shape.gpu_model, shape.dtype, stated)
    flops = flops_per_token(shape)
    per_gpu = tp.tokens_per_s * flops.model / shape.world_size
    hfu = None
    if shape.recompute:
        hfu = tp.tokens_per_s * flops.hardware / shape.world_size / peak
    return Mfu(
        mfu=per_gpu / peak,
        hfu=hfu,
        model_flops_per_s_per_gpu=per_gpu,
        tokens_per_s=tp.tokens_per_s,
        goodput=tp.goodput,
        peak_flops=peak,
        flops=flops,
    )


def tensor_activity_estimate(gpu: pl.DataFrame) -> float | None:
    """Telemetry-only MFU *estimate*: the mean GPM tensor-core activity of a job's GPUs (each
    GPU's mean, then their mean). Tensor pipes busy is an upper bound on useful model FLOPs
    (it counts recomputation, padding and pipes that are not at full rate), so label it an
    estimate. For a job that reports steps, ``gpu`` holds its GPUs' samples from its first
    step to its last (start-up excluded); REAL, on an H200: 58.9 % against 51.4 % counted."""
    if "gpm_tensor_active_pct" not in gpu.columns:
        return None
    keys = [k for k in ("node", "gpu") if k in gpu.columns]
    col = pl.col("gpm_tensor_active_pct")
    per_gpu = gpu.drop_nulls("gpm_tensor_active_pct")
    if keys:
        per_gpu = per_gpu.group_by(keys).agg(col.mean())
    value = per_gpu["gpm_tensor_active_pct"].mean()
    return None if not isinstance(value, int | float) else float(value) / 100.0


@dataclass(frozen=True)
class MfuConfig:
    mismatch_ratio: float = 0.5
    """``mfu_mismatch`` when MFU (HFU with recomputation) and the GPM tensor-activity
    estimate are further apart than this: the larger over the smaller, minus one (0.5: one is
    1.5 times the other). REAL, on an H200 with the right shape: 0.17."""
    mismatch_min: float = 0.05
    """... and the larger of the two is at least this (a nearly idle job's ratios are noise)."""
    info_lookback_s: float = 1800.0
    """A job that does not report its GPU model: its GPUs' ``gpu_info`` is looked for from this
    long before the window's start (the agent writes it every ``[nvml] info_every_s``)."""
    peak_tflops: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Dense peaks the operator states, per GPU, in TFLOP/s: ``{"H100 NVL": {"bf16": ...}}``
    (a name the GPU's NVML name contains -> dtype -> TFLOP/s); they come before the built-in
    table, and are the only way to an MFU for a GPU it lacks or refuses (:func:`gpu_family`)."""

    def __post_init__(self) -> None:
        if self.mismatch_ratio <= 0 or not 0 <= self.mismatch_min < 1:
            raise ValueError("mfu.mismatch_ratio must be positive, mismatch_min in [0, 1)")
        if self.info_lookback_s < 0:
            raise ValueError("mfu.info_lookback_s must not be negative")
        for name, table in self.peak_tflops.items():
            if not isinstance(table, Mapping) or not _words(str(name)) or not table:
                raise ValueError(
                    f"mfu.peak_tflops.{name}: a GPU name and a table of dtype = TFLOP/s, "
                    'e.g. "H100 NVL" = { bf16 = 835.5 }'
                )
            for dtype, tflops in table.items():
                ok = isinstance(tflops, int | float) and not isinstance(tflops, bool)
                if not ok or not 0 < float(tflops) < 1e6:
                    raise ValueError(
                        f"mfu.peak_tflops.{name}.{dtype}: a dense peak in TFLOP/s (a positive "
                        f"number under a million), got {tflops!r}"
                    )


#: dtypes whose matmuls run on tensor cores (GPM's tensor activity sees them)
TENSOR_DTYPES = frozenset({"bf16", "fp16", "tf32", "fp8"})


def estimate_ratio(
    mfu: Mfu, estimate: float | None, tp: JobThroughput, dtype: str, cfg: MfuConfig
) -> float | None:
    """How far the counted and the observed utilisation are apart: the larger over the
    smaller (1.0: equal; ``inf``: one is 0), or None when there is nothing to compare (no
    GPM, a dtype tensor cores do not run, both below ``mismatch_min``).

    The counted side is HFU when the job recomputes (tensor activity sees recomputation), and
    is brought to the same span as the estimate's: the estimate is the GPUs' mean from the
    first step to the last, downtime included, MFU is over the running time only."""
    if estimate is None or canonical_dtype(dtype) not in TENSOR_DTYPES or tp.elapsed_s <= 0:
        return None
    counted = (mfu.hfu if mfu.hfu is not None else mfu.mfu) * tp.running_s / tp.elapsed_s
    high, low = max(counted, estimate), min(counted, estimate)
    if high < cfg.mismatch_min:
        return None
    return high / low if low > 0 else math.inf


def job_gpu_model(placed: pl.DataFrame, info: pl.DataFrame) -> tuple[str, str]:
    """The GPU model of a job that did not report one, and a note when it is not clear-cut.

    ``placed``: the job's GPUs (``node, gpu``, and ``gpu_model`` where its series carry the
    tag): from its ``gpu`` and ``gpu_process`` points. ``info``: the agent's ``gpu_info``
    (``node, gpu, gpu_model``) near the window. The model is ``gpu_info``'s for those GPUs,
    else the series' own tag; on GPUs of several models, the one most of them have (and the
    note says so: MFU is then against that model's peak)."""
    if placed.is_empty():
        return "", "no GPU carries the job's tag: its GPU model is unknown"
    gpus = placed.select("node", "gpu").unique()
    models = pl.DataFrame(schema={"node": pl.String, "gpu": pl.String, "gpu_model": pl.String})
    if not info.is_empty():
        models = gpus.join(info.select("node", "gpu", "gpu_model"), on=["node", "gpu"])
    if "gpu_model" in placed.columns and models.filter(pl.col("gpu_model") != "").is_empty():
        models = placed.select("node", "gpu", "gpu_model")
    models = models.drop_nulls("gpu_model").filter(pl.col("gpu_model") != "").unique()
    if models.is_empty():
        return "", "neither the job nor the agent's gpu_info names its GPUs' model"
    counts = models.group_by("gpu_model").agg(pl.len().alias("n")).sort(["n", "gpu_model"])
    model = str(counts["gpu_model"][-1])
    if counts.height == 1:
        return model, ""
    seen = ", ".join(f"{m} ({n})" for m, n in counts.iter_rows())
    return model, f"the job's GPUs are of several models: {seen}; MFU against {model}'s peak"


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
