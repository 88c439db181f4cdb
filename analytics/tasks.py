"""The units of work the runner hands to Dask workers (or runs in-process).

Each task opens its own InfluxDB reader, reads its own partition for the window straight from
the server (a job, a group of nodes behind whole switches, one node), and returns a small
result: a few rows per job, port or switch, never the raw telemetry. Functions are module-level
so Dask can pickle them; their arguments are plain data.

Where InfluxDB aggregates more cheaply than a raw export, it does (``GROUP BY time``): per-GPU
energy and power are read as one value per minute (``analysis.gpu_bucket_s``). Per-port
counters are one ``last()`` per bucket (``analysis.ib_bucket_s``), but taken here from the raw
points: influxd 1.x spends about ten times the CPU on nine ``last()`` per 10 s bucket that it
spends reading the points (``InfluxReader.aggregate(here=True)``). ``job_step`` is read raw:
the per-step, per-rank times are what straggler detection needs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from gpuwarden.analytics.attribution import attribute
from gpuwarden.analytics.badput import straggler_costs
from gpuwarden.analytics.config import AnalyticsConfig
from gpuwarden.analytics.congestion import RATE_COUNTERS, port_rates, switch_series
from gpuwarden.analytics.culprit import Stop, find_stop
from gpuwarden.analytics.drift import INFO_FIELDS, Drift, JobMix, find_drift, find_job_mix
from gpuwarden.analytics.hangs import Hang, find_hang, silence
from gpuwarden.analytics.mfu import (
    JobThroughput,
    Mfu,
    ModelShape,
    UnknownGpuError,
    compute_mfu,
    estimate_ratio,
    executions,
    job_energy,
    job_gpu_model,
    tensor_activity_estimate,
    throughput,
    with_attempts,
)
from gpuwarden.analytics.stragglers import Straggler, confirmed, detect
from gpuwarden.core.errors import StoreError
from gpuwarden.core.store.reader import InfluxReader

log = logging.getLogger(__name__)

CONGESTION_FIELDS = (
    "xmit_util_ratio",
    "rcv_util_ratio",
    "xmit_wait_ratio",
    "cnp_per_s",
    "ecn_marked_per_s",
    "symbol_errors_per_s",
    "score_ratio",
)


def _reader(cfg: AnalyticsConfig) -> InfluxReader:
    return InfluxReader(**cfg.reader_kwargs())


def _where(cfg: AnalyticsConfig, **tags: str | list[str]) -> dict[str, str | list[str]]:
    where: dict[str, str | list[str]] = dict(tags)
    if cfg["analysis"]["cluster"]:
        where["cluster"] = cfg["analysis"]["cluster"]
    return where


@dataclass
class JobResult:
    job: str
    cluster: str
    shape: ModelShape | None = None
    throughput: JobThroughput | None = None
    mfu: Mfu | None = None
    estimate: float | None = None
    """GPM tensor-core activity of the job's GPUs (while it stepped, when it reports steps):
    beside MFU for every job, the only figure for a job that reports nothing."""
    estimate_ratio: float | None = None
    """MFU (HFU with recomputation) against :attr:`estimate`: the larger over the smaller."""
    mismatch_limit: float | None = None
    """Set when :attr:`estimate_ratio` is beyond the limit (``1 + [mfu] mismatch_ratio``): the
    limit. The reported shape is then suspect (finding ``mfu_mismatch``)."""
    gpu_model_from: str = ""
    """Where the GPU model came from: ``job`` (its report) or ``gpu_info`` (the agent's)."""
    problems: list[str] = field(default_factory=list)
    stragglers: list[Straggler] = field(default_factory=list)
    step_times: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Straggler sample number -> (step_index, time_ns), to report onsets as steps and times."""
    energy: dict[str, float] | None = None
    walls: pl.DataFrame = field(default_factory=pl.DataFrame)
    """One row per executed step: ``time_ns, wall_s`` (for congestion correlation)."""
    nodes: list[str] = field(default_factory=list)
    rank_node: dict[str, str] = field(default_factory=dict)
    stage_nodes: dict[int, list[str]] = field(default_factory=dict)
    hang: Hang | None = None
    """Set when the job stopped stepping but still holds its GPUs."""
    stop: Stop | None = None
    """Set when the job stopped in the window and one node is to blame (analytics.culprit)."""
    saves_s: float = 0.0
    """Training time the job's checkpoint saves held up in the window (``job_checkpoint``)."""
    straggler_cost_s: dict[str, float] = field(default_factory=dict)
    """Per straggling rank: what fixing it would give back (:mod:`analytics.badput`)."""


def _layout(steps: pl.DataFrame, shape: ModelShape | None, model: dict[str, Any]) -> pl.DataFrame:
    """Add ``stage`` and ``dp_rank`` when the job reported its parallel layout (Megatron order:
    tensor-parallel ranks fastest, then data-parallel, then pipeline stage)."""
    tp = int(model.get("tensor_parallel_count") or 0)
    pp = int(model.get("pipeline_parallel_count") or 0)
    if shape is None or tp < 1 or pp < 1 or shape.world_size % (tp * pp):
        return steps
    per_stage = shape.world_size // pp
    r = pl.col("rank").cast(pl.Int64)
    return steps.with_columns(
        (r // per_stage).alias("stage"), ((r % per_stage) // tp).alias("dp_rank")
    )


def _last_per_rank(
    reader: InfluxReader,
    cfg: AnalyticsConfig,
    job: str,
    measurement: str,
    field: str,
    since_ns: int,
    end_ns: int,
) -> pl.DataFrame:
    """Each rank's last ``field`` point (and its time) since ``since_ns``: one grouped
    ``last()``, not its points."""
    return reader.aggregate(
        measurement,
        {field: f"last:{field}"},
        since_ns,
        end_ns,
        every_s=None,
        group_tags=["rank", "node"],
        where=_where(cfg, job=job),
    ).filter(pl.col("rank").is_not_null() & (pl.col("rank") != ""))


def _stop(
    reader: InfluxReader,
    cfg: AnalyticsConfig,
    job: str,
    last: pl.DataFrame,
    start_ns: int,
    end_ns: int,
) -> Stop | None:
    """The node that stopped the job (:mod:`analytics.culprit`), read only for a job whose
    steps stopped in the window: its ranks' last heartbeats and the critical findings near."""
    sc = cfg.stops
    if last.is_empty():
        return None
    last_ns = int(last["time"].dt.epoch("ns").max())  # type: ignore[arg-type]
    if (end_ns - last_ns) / 1e9 < sc.stop_after_s or last_ns < start_ns:
        return None
    since = last_ns - int(cfg.hangs.lookback_s * 1e9)
    beats = _last_per_rank(reader, cfg, job, "job_heartbeat", "since_step_s", since, end_ns)
    signs = [last.select("rank", "node", "time", "step_index")]
    if beats.height:
        signs.append(beats.select("rank", "node", "time").with_columns(
            pl.lit(None, pl.Int64).alias("step_index")))  # fmt: skip
    ranks = (
        pl.concat([s.with_columns(pl.col("step_index").cast(pl.Int64)) for s in signs])
        .sort("time")
        .group_by("rank")
        .agg(pl.col("node").last(), pl.col("time").max(), pl.col("step_index").max())
    )
    found = reader.read(
        "finding",
        last_ns - int(sc.before_s * 1e9),
        end_ns,
        fields=["finding_id"],
        tags=["node", "kind"],
        where={**_where(cfg), "severity": "critical"},
    ).drop_nulls("node")
    # the nodes the agents saw the job's GPUs on: a rank's node tag alone names no culprit
    held = set(_job_gpus(reader, cfg, job, since, end_ns)["node"].to_list())
    return find_stop(job, ranks, found, start_ns, end_ns, sc, held)


def _hang(
    reader: InfluxReader,
    cfg: AnalyticsConfig,
    job: str,
    steps: pl.DataFrame,
    end_ns: int,
    last: pl.DataFrame,
) -> Hang | None:
    """Whether the job is hung at the window's end (:mod:`analytics.hangs`): given each rank's
    last step, and only when that is long ago, its GPUs' and its reporters' heartbeats' last
    few minutes."""
    hc = cfg.hangs
    quiet = silence(last, steps, end_ns, hc)
    if quiet is None:
        return None
    gpus = reader.read(
        "gpu",
        end_ns - int(hc.alive_s * 1e9),
        end_ns,
        fields=["gpu_util_pct"],
        tags=["node", "gpu", "rank"],
        where=_where(cfg, job=job),
    ).drop_nulls("gpu_util_pct")
    beats = reader.read(
        "job_heartbeat",
        end_ns - int(hc.alive_s * 1e9),
        end_ns,
        fields=["in_step_active"],
        tags=["node", "rank"],
        where=_where(cfg, job=job),
    ).drop_nulls("in_step_active")
    # the nodes the agents saw the job's GPUs on over the lookback, not only the last alive_s:
    # a node that died with its agent is silent now and must still be one of them
    since = end_ns - int(hc.lookback_s * 1e9)
    held = set(_job_gpus(reader, cfg, job, since, end_ns)["node"].to_list())
    return find_hang(job, quiet, last, gpus, beats, hc, held)


def read_steps(
    reader: InfluxReader,
    cfg: AnalyticsConfig,
    job: str,
    start_ns: int,
    end_ns: int,
    pool: ThreadPoolExecutor | None = None,
) -> pl.DataFrame:
    """The job's step log over the window, one row per rank and step, in time order.

    influxd answers a raw query by merging every series it matches into one time-ordered
    stream, and the cost per row of that merge grows with the number of series: the
    16,384-rank step log (11.7 M rows, the store at rest) took 41.8-65.6 s as one query and
    29.6-31.0 s in groups of 128 nodes (docs/SCALE.md). So a job on more than
    ``analysis.nodes_per_read`` nodes is read in groups of that many nodes (names from the
    series index, sorted; series without a ``node`` tag go with the first group), on ``pool``
    when given, and the groups are put back in time order. A stable sort of the groups in
    series-key order gives the rows in the order one query would have.
    """
    nodes = reader.indexed_tag_values("job_step", "node", _where(cfg, job=job))
    per = int(cfg["analysis"]["nodes_per_read"])
    groups: list[list[str] | None] = [None]  # None: no node filter, the one merged query
    if len(nodes) > per:
        chunks = [nodes[i : i + per] for i in range(0, len(nodes), per)]
        groups = [["", *chunks[0]], *chunks[1:]]  # "": series without a node tag

    def read(group: list[str] | None) -> pl.DataFrame:
        where = _where(cfg, job=job) if group is None else _where(cfg, job=job, node=group)
        return reader.read(
            "job_step",
            start_ns,
            end_ns,
            fields=["step_index", "step_time_s", "tokens_count"],
            tags=["cluster", "node", "rank"],
            where=where,
        ).drop_nulls(["step_index", "step_time_s", "rank"])

    frames = list(pool.map(read, groups)) if pool is not None else [read(g) for g in groups]
    if len(frames) == 1:
        return frames[0]
    return pl.concat(frames).sort("time", maintain_order=True)


def _job_gpus(
    reader: InfluxReader, cfg: AnalyticsConfig, job: str, start_ns: int, end_ns: int
) -> pl.DataFrame:
    """The GPUs the job ran on in the window: ``node, gpu, gpu_model`` (the model where the
    series carry it), from the agent's ``gpu`` and ``gpu_process`` points with the job's tag
    (one grouped count each, no raw rows)."""
    frames = [
        reader.aggregate(
            measurement,
            {"n": f"count:{name}"},
            start_ns,
            end_ns,
            every_s=None,
            group_tags=["node", "gpu", "gpu_model"],
            where=_where(cfg, job=job),
        ).select("node", "gpu", "gpu_model")
        for measurement, name in (("gpu", "power_w"), ("gpu_process", "pid"))
    ]
    return pl.concat(frames).drop_nulls(["node", "gpu"]).unique()


def _gpu_model_of(
    reader: InfluxReader,
    cfg: AnalyticsConfig,
    job: str,
    step_nodes: list[str],
    start_ns: int,
    end_ns: int,
) -> tuple[str, str]:
    """The model of the job's GPUs from the agent's ``gpu_info`` (:func:`job_gpu_model`), for
    a job that does not say: ``(model, note)``. The job's GPUs are those with its tag; when
    none has it (no attribution on its nodes), every GPU of the nodes its ranks report from."""
    placed = _job_gpus(reader, cfg, job, start_ns, end_ns)
    nodes = sorted(set(placed["node"])) if placed.height else step_nodes
    if not nodes:
        return job_gpu_model(placed, pl.DataFrame())
    since = start_ns - int(cfg.mfu.info_lookback_s * 1e9)
    info = reader.aggregate(
        "gpu_info",
        {"n": "count:driver_version"},
        since,
        end_ns,
        every_s=None,
        group_tags=["node", "gpu", "gpu_model"],
        where=_where(cfg, node=nodes),
    )
    if placed.is_empty():  # no GPU has its tag: every GPU of the nodes its ranks run on
        placed = info.select("node", "gpu", pl.lit(None, pl.String).alias("gpu_model"))
        model, note = job_gpu_model(placed, info)
        if model and not note:
            note = f"no GPU carries the job's tag: {model} is the model of its nodes' GPUs"
        return model, note
    return job_gpu_model(placed, info)


def _tensor_activity(
    reader: InfluxReader, cfg: AnalyticsConfig, job: str, first_ns: int, last_ns: int
) -> float | None:
    """Mean GPM tensor activity of the job's GPUs from its first step to its last: start-up
    (loading, compiling) left out. One grouped mean per GPU."""
    gpu = reader.aggregate(
        "gpu",
        {"gpm_tensor_active_pct": "mean:gpm_tensor_active_pct"},
        first_ns,
        last_ns + 1,
        every_s=None,
        group_tags=["node", "gpu"],
        where=_where(cfg, job=job),
    )
    return tensor_activity_estimate(gpu)


def _mfu(
    cfg: AnalyticsConfig,
    result: JobResult,
    gpu: pl.DataFrame,
    step_nodes: list[str],
    start_ns: int,
    end_ns: int,
) -> None:
    """MFU, HFU and the GPM estimate beside them; the GPU model from ``gpu_info`` when the job
    does not say; whether the two disagree (``mfu_mismatch``)."""
    shape, tp = result.shape, result.throughput
    if tp is None:  # no steps: the telemetry's estimate is all there is
        result.estimate = tensor_activity_estimate(gpu)
        return
    reader = _reader(cfg)
    try:
        if shape is not None and not shape.gpu_model:
            model, note = _gpu_model_of(reader, cfg, result.job, step_nodes, start_ns, end_ns)
            if note:
                result.problems.append(note)
            if model:
                shape = result.shape = replace(shape, gpu_model=model)
                result.gpu_model_from = "gpu_info"
        elif shape is not None:
            result.gpu_model_from = "job"
        result.estimate = _tensor_activity(reader, cfg, result.job, tp.first_ns, tp.last_ns)
    finally:
        reader.close()
    if shape is None:
        return
    try:
        result.mfu = compute_mfu(shape, tp, cfg.mfu.peak_tflops)
    except UnknownGpuError as exc:
        result.problems.append(str(exc))
        return
    if result.mfu.mfu > 1.0:
        result.problems.append(
            f"MFU {result.mfu.mfu:.0%} is above 100 %: the reported model shape, tokens per "
            "step or GPU model cannot all be right"
        )
    mc = cfg.mfu
    result.estimate_ratio = estimate_ratio(result.mfu, result.estimate, tp, shape.dtype, mc)
    if result.estimate_ratio is not None and result.estimate_ratio > 1.0 + mc.mismatch_ratio:
        result.mismatch_limit = 1.0 + mc.mismatch_ratio


def _confirm(
    cfg: AnalyticsConfig, job: str, steps: pl.DataFrame, result: JobResult, start: int, end: int
) -> set[str]:
    """A slow rank's node is its reporters' tag: it counts only where the agents saw the job's
    GPUs over the hang analysis's lookback (a node whose agent died with it is still one of
    them) and where every point of the rank named that node
    (:func:`analytics.stragglers.confirmed`). Phase 2 then reads only such a node's
    telemetry. Returns the nodes the agents saw (empty: no GPU data, the tags stand)."""
    reader = _reader(cfg)
    try:
        since = min(start, end - int(cfg.hangs.lookback_s * 1e9))
        held = set(_job_gpus(reader, cfg, job, since, end)["node"].to_list())
    finally:
        reader.close()
    per_rank = steps.drop_nulls(["rank", "node"]).group_by("rank").agg(pl.col("node").unique())
    tagged = {str(r["rank"]): list(r["node"]) for r in per_rank.iter_rows(named=True)}
    result.stragglers = confirmed(result.stragglers, held, tagged)
    result.rank_node = {
        r: n
        for r, n in result.rank_node.items()
        if not n or ((not held or n in held) and len(tagged.get(str(r), [n])) == 1)
    }
    return held


def job_task(cfg: AnalyticsConfig, job: str, start_ns: int, end_ns: int) -> JobResult:
    """MFU, goodput, energy and stragglers of one job over the window; whether it is hung.

    What a job reports is its own (any job may write anything its relay accepts): an error
    its data raises is that job's problem, logged with its traceback, and every other job is
    still analysed (a job's ``world_size = 0`` stopped the whole pass, every window). An
    error of the store (:class:`core.errors.StoreError`) is everyone's and still stops it."""
    try:
        return _job_task(cfg, job, start_ns, end_ns)
    except StoreError:
        raise
    except Exception as exc:
        log.exception("analysis of job %s failed on its own data; the other jobs go on", job)
        said = f"analysis failed on this job's own data: {type(exc).__name__}: {exc}"[:500]
        return JobResult(job=job, cluster=cfg["analysis"]["cluster"], problems=[said])


def _job_task(cfg: AnalyticsConfig, job: str, start_ns: int, end_ns: int) -> JobResult:
    reader = _reader(cfg)
    # The GPUs' per-minute energy and power are read while the step log is (the reader's
    # connection pool is thread-safe): influxd answers each query on one core, and for a
    # 16,384-rank job these two are most of the task's time.
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        gpu_read = pool.submit(
            reader.aggregate,
            "gpu",
            {
                "energy_j_total": "last:energy_j_total",
                "power_w": "mean:power_w",
                "gpm_tensor_active_pct": "mean:gpm_tensor_active_pct",
            },
            start_ns,
            end_ns,
            every_s=int(cfg["analysis"]["gpu_bucket_s"]),
            group_tags=["node", "gpu"],
            where=_where(cfg, job=job),
        )
        steps = read_steps(reader, cfg, job, start_ns, end_ns, pool)
        models = reader.read("job_model", None, end_ns, where=_where(cfg, job=job))
        since = end_ns - int(cfg.hangs.lookback_s * 1e9)
        last = _last_per_rank(reader, cfg, job, "job_step", "step_index", since, end_ns)
        hang = _hang(reader, cfg, job, steps, end_ns, last)
        stop = None if hang is not None else _stop(reader, cfg, job, last, start_ns, end_ns)
        saves = reader.read(
            "job_checkpoint",
            start_ns,
            end_ns,
            fields=["step_index", "save_s"],
            where=_where(cfg, job=job),
        ).drop_nulls(["step_index", "save_s"])
        gpu = gpu_read.result()
    finally:
        pool.shutdown(wait=True)
        reader.close()
    cluster = str(steps["cluster"].drop_nulls()[0]) if steps.height else ""
    result = JobResult(job=job, cluster=cluster or cfg["analysis"]["cluster"], hang=hang, stop=stop)
    if saves.height:  # every rank may report its save: a save holds the job up once
        result.saves_s = float(
            saves.group_by("step_index").agg(pl.col("save_s").max())["save_s"].sum()
        )
    model = models.sort("time").row(-1, named=True) if models.height else {}
    if model and model.get("params_count") is not None:
        try:
            result.shape = ModelShape.from_row(model)
        except (KeyError, TypeError, ValueError) as exc:
            result.problems.append(f"job_model unusable: {exc}")
    else:
        result.problems.append("no job_model reported: MFU needs the model shape")
    steps = with_attempts(steps)  # once: throughput, executions and timings all need them
    result.throughput = throughput(steps)
    step_nodes = sorted(set(steps["node"].drop_nulls())) if steps.height else []
    _mfu(cfg, result, gpu, step_nodes, start_ns, end_ns)
    result.energy = job_energy(gpu, result.throughput)
    if steps.height:
        result.nodes = sorted(set(steps["node"].drop_nulls()))
        pairs = steps.select("rank", "node").unique("rank")
        result.rank_node = dict(zip(pairs["rank"], pairs["node"], strict=True))
        ex = executions(steps).with_row_index("sample")
        result.walls = ex.select("time_ns", "wall_s")
        result.step_times = {
            int(r["sample"]): (int(r["step_index"]), int(r["time_ns"]))
            for r in ex.iter_rows(named=True)
        }
        timings = (
            _layout(with_attempts(steps), result.shape, model)
            .join(ex.select("attempt", "step_index", "sample"), on=["attempt", "step_index"])
            .rename({"rank": "worker", "sample": "step", "step_time_s": "time_s"})
        )
        result.stragglers = detect(timings, cfg.stragglers)
        held: set[str] = set()
        if result.stragglers:  # ranks' nodes are their reporters' tags: see _confirm
            held = _confirm(cfg, job, steps, result, start_ns, end_ns)
        weights = ex.select(pl.col("sample").alias("step"), "steps")
        spans = {s.worker: (s.onset_step, s.last_step) for s in result.stragglers
                 if s.kind == "worker" and s.worker is not None}  # fmt: skip
        result.straggler_cost_s = straggler_costs(timings, spans, weights)
        if "stage" in timings.columns:
            per_stage = timings.group_by("stage").agg(pl.col("node").unique().sort())
            result.stage_nodes = {
                int(r["stage"]): [n for n in r["node"] if n and (not held or n in held)]
                for r in per_stage.iter_rows(named=True)
            }
    return result


@dataclass
class PortsResult:
    nodes: list[str]
    series: pl.DataFrame
    """Per switch and bucket: ``switch, time, score, ports``."""
    ports: pl.DataFrame
    """Per port over the window: the catalogue's congestion fields (means; score also max)."""
    problems: list[str] = field(default_factory=list)


def read_port_rates(
    reader: InfluxReader, cfg: AnalyticsConfig, nodes: list[str], start_ns: int, end_ns: int
) -> pl.DataFrame:
    ib = reader.aggregate(
        "ib_port",
        {c: f"last:{c}" for c in (*RATE_COUNTERS, "rate_gbps")},
        start_ns,
        end_ns,
        every_s=int(cfg["analysis"]["ib_bucket_s"]),
        group_tags=["node", "hca", "port"],
        where=_where(cfg, node=nodes),
        here=True,  # nine last() per small bucket cost influxd ~10x the raw read (reader)
    )
    return port_rates(ib, cfg.congestion)


def ports_task(
    cfg: AnalyticsConfig, nodes: list[str], switch_of: Mapping[str, str], start_ns: int, end_ns: int
) -> PortsResult:
    """Congestion of a group of nodes that holds whole switches."""
    reader = _reader(cfg)
    try:
        rates = read_port_rates(reader, cfg, nodes, start_ns, end_ns)
    finally:
        reader.close()
    series = switch_series(rates, switch_of)
    ports = rates.group_by("node", "hca", "port").agg(
        *[pl.col(c).mean() for c in CONGESTION_FIELDS if c != "score_ratio"],
        pl.col("score_ratio").mean(),
        pl.col("score_ratio").max().alias("peak_score_ratio"),
    )
    return PortsResult(nodes=nodes, series=series, ports=ports)


def attribution_task(
    cfg: AnalyticsConfig, job: str, node: str, ranks: list[str], start_ns: int, end_ns: int
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Cause of each slow rank of one node, from the node's GPUs and ports over the slow
    stretch (read once for all the node's slow ranks)."""
    reader = _reader(cfg)
    try:
        gpu = reader.read(
            "gpu",
            start_ns,
            end_ns,
            fields=[
                "sm_clock_mhz",
                "sm_clock_max_mhz",
                "power_w",
                "gpu_util_pct",
                "gpu_temp_c",
                "clock_event_reasons_code",
                "pcie_link_downtrained_active",
                "pcie_link_width_count",
                "pcie_link_width_max_count",
            ],
            tags=["gpu", "job", "rank"],
            where=_where(cfg, node=node),
        )
        ports = read_port_rates(reader, cfg, [node], start_ns, end_ns)
    finally:
        reader.close()
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for rank in ranks:
        mine = gpu.filter((pl.col("job") == job) & (pl.col("rank") == rank))
        if mine.is_empty():
            out[rank] = ("unknown", {"note": f"no gpu samples tagged job={job} rank={rank}"})
        else:
            out[rank] = attribute(gpu, ports, str(mine["gpu"][0]))
    return out


@dataclass
class DriftResult:
    drifts: list[Drift]
    gpus: int
    """GPUs with a ``gpu_info`` report in the lookback."""
    mixes: list[JobMix] = field(default_factory=list)


def _gpu_jobs(
    reader: InfluxReader,
    cfg: AnalyticsConfig,
    start_ns: int,
    end_ns: int,
    tags: list[str],
    **where: list[str],
) -> pl.DataFrame:
    """The jobs on each GPU (or node) in ``[start, end)``: one grouped count, no raw rows."""
    return reader.aggregate(
        "gpu",
        {"n": "count:power_w"},
        start_ns,
        end_ns,
        every_s=max(1, (end_ns - start_ns) // 10**9),
        group_tags=[*tags, "job"],
        where=_where(cfg, **where),
    ).filter(pl.col("job").is_not_null() & (pl.col("job") != ""))


def drift_task(cfg: AnalyticsConfig, end_ns: int) -> DriftResult:
    """GPUs set up unlike the rest of their model's fleet (:mod:`analytics.drift`), from each
    GPU's last ``gpu_info`` within ``[drift] lookback_s`` of the window's end, with the jobs
    that ran on each such node in that time; and the jobs whose GPUs, where they run now
    (``[drift] job_window_s``), are not all set up alike."""
    drift = cfg.drift
    lookback_ns = int(drift.lookback_s * 1e9)
    reader = _reader(cfg)
    try:
        info = reader.read(
            "gpu_info",
            end_ns - lookback_ns,
            end_ns,
            fields=list(INFO_FIELDS),
            tags=["cluster", "node", "gpu", "gpu_model"],
            where=_where(cfg),
        )
        drifts, mixes = find_drift(info, drift), []
        if drifts:  # the jobs on those nodes: drift under a running job is the urgent kind
            nodes = sorted({d.node for d in drifts})
            used = _gpu_jobs(reader, cfg, end_ns - lookback_ns, end_ns, ["node"], node=nodes)
            jobs = {n: sorted(set(g["job"])) for (n,), g in used.group_by("node")}
            drifts = [replace(d, jobs=jobs.get(d.node, [])) for d in drifts]
        if info.height:
            start_ns = end_ns - int(drift.job_window_s * 1e9)
            placement = _gpu_jobs(reader, cfg, start_ns, end_ns, ["cluster", "node", "gpu"])
            mixes = find_job_mix(info, placement, drift)
    finally:
        reader.close()
    gpus = info.select("cluster", "node", "gpu").n_unique() if info.height else 0
    return DriftResult(drifts, gpus, mixes)
