"""The analytics runner: plan partitions, run them on Dask (or in-process), emit results.

One analysis of a window ``[start, end)``:

1. **Plan** (on the driver, two cheap grouped counts): the jobs with steps or GPUs in the
   window, and the nodes with InfiniBand ports. Nodes are grouped so that every switch's hosts
   land in one task (a switch's score is a median over its ports).
2. **Phase 1** (parallel): one task per job (:func:`analytics.tasks.job_task`: MFU, goodput,
   energy, stragglers), one per node group (:func:`analytics.tasks.ports_task`: per-port
   rates and per-switch congestion series) and one for the fleet's GPU configuration
   (:func:`analytics.tasks.drift_task`).
3. **Phase 2** (parallel, small): for each worker straggler, read its node's telemetry over the
   slow stretch and attribute it (:func:`analytics.tasks.attribution_task`). Hot switches are
   ranked and correlated with the step times of the jobs whose ranks sit under them.
4. **Emit**: findings (the DESIGN contract) and the catalogue's derived measurements (``mfu``,
   ``energy``, ``straggler``, ``congestion``, ``finding``), written back to InfluxDB through the
   sink and, when ``[findings] url`` is set, posted to the remediation endpoint.

The executor is the only difference between the Dask path and the plain single-process path
(:class:`LocalExecutor`), so ``benchmarks/analytics.py`` compares like with like.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gpuwarden.analytics.badput import Badput, badput
from gpuwarden.analytics.cadence import Advice, fleet_failure_rate, job_advice
from gpuwarden.analytics.config import AnalyticsConfig, check_send
from gpuwarden.analytics.congestion import SwitchReport, job_impact, rank_switches
from gpuwarden.analytics.drift import Drift, JobMix
from gpuwarden.analytics.jobfaults import AppFaults, find_app_faults
from gpuwarden.analytics.silence import Silence, silent_nodes
from gpuwarden.analytics.tasks import (
    DriftResult,
    JobResult,
    PortsResult,
    attribution_task,
    drift_task,
    job_task,
    ports_task,
)
from gpuwarden.analytics.topology import load_topology
from gpuwarden.core.store.reader import InfluxReader

log = logging.getLogger(__name__)

Call = tuple[Callable[..., Any], tuple[Any, ...]]
Progress = Callable[[str, int, int], None]


class LocalExecutor:
    """Runs every task in this process, one after the other: the plain polars baseline."""

    name = "polars"

    def describe(self) -> str:
        return "local: in this process, no Dask"

    def run(self, calls: Sequence[Call], label: str, progress: Progress | None = None) -> list[Any]:
        out = []
        for i, (fn, args) in enumerate(calls):
            out.append(fn(*args))
            if progress:
                progress(label, i + 1, len(calls))
        return out

    def close(self) -> None:
        pass


class DaskExecutor:
    """A ``LocalCluster`` of worker processes by default, or a running scheduler's address.

    ``POLARS_MAX_THREADS`` is set before the workers start (polars reads it once): with one
    thread per Dask worker, workers do not fight over cores."""

    name = "dask"

    def __init__(
        self,
        scheduler: str = "",
        workers: int = 2,
        threads_per_worker: int = 1,
        polars_threads: int = 1,
    ) -> None:
        from dask.distributed import Client, LocalCluster

        self._cluster = None
        self.scheduler = scheduler
        if scheduler:
            self.client = Client(scheduler)  # type: ignore[no-untyped-call]
        else:
            os.environ["POLARS_MAX_THREADS"] = str(polars_threads)
            self._cluster = LocalCluster(  # type: ignore[no-untyped-call]
                n_workers=workers,
                threads_per_worker=threads_per_worker,
                processes=True,
                dashboard_address=None,
            )
            self.client = Client(self._cluster)  # type: ignore[no-untyped-call]

    def describe(self) -> str:
        workers = len(self.client.scheduler_info().get("workers", {}))
        where = f"scheduler {self.scheduler}" if self.scheduler else "a LocalCluster"
        return f"dask: {where}, {workers} workers"

    def run(self, calls: Sequence[Call], label: str, progress: Progress | None = None) -> list[Any]:
        from dask.distributed import as_completed

        futures = [self.client.submit(fn, *args, pure=False) for fn, args in calls]
        for done, _ in enumerate(as_completed(futures), start=1):  # type: ignore[no-untyped-call]
            if progress:
                progress(label, done, len(futures))
        return list(self.client.gather(futures))  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]
        if self._cluster is not None:
            self._cluster.close()


def executor_from_config(cfg: AnalyticsConfig, local: bool = False) -> LocalExecutor | DaskExecutor:
    if local:
        return LocalExecutor()
    d = cfg["dask"]
    return DaskExecutor(d["scheduler"], d["workers"], d["threads_per_worker"], d["polars_threads"])


def stderr_progress(label: str, done: int, total: int) -> None:
    """A one-line progress bar on stderr (redrawn in place on a terminal)."""
    width = 30
    filled = width * done // max(total, 1)
    bar = "#" * filled + "." * (width - filled)
    end = "\n" if done == total or not sys.stderr.isatty() else "\r"
    if done == total or sys.stderr.isatty():
        print(f"[analyze] {label:<12} [{bar}] {done}/{total}", end=end, file=sys.stderr, flush=True)


@dataclass
class Analysis:
    start_ns: int
    end_ns: int
    executor: str
    jobs: list[JobResult] = field(default_factory=list)
    switches: list[SwitchReport] = field(default_factory=list)
    ports: pl.DataFrame = field(default_factory=pl.DataFrame)
    attributions: dict[tuple[str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict)
    switch_of: dict[str, str] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)
    """Nodes with InfiniBand data that the topology file does not list (each counts as its own
    switch, so their congestion is not pooled with their real neighbours')."""
    drift: list[Drift] = field(default_factory=list)
    """Nodes with GPUs set up unlike their fleet, or waiting for a reset."""
    job_mix: list[JobMix] = field(default_factory=list)
    """Jobs whose GPUs are not all set up alike."""
    info_gpus: int = 0
    """GPUs with a ``gpu_info`` report (0: no agent sends it, drift was not checked)."""
    silent: list[Silence] = field(default_factory=list)
    """Nodes whose agent reported in the window, then stopped (:mod:`analytics.silence`)."""
    advice: list[Advice] = field(default_factory=list)
    """Checkpoint-interval advice per job that reports its saves (:mod:`analytics.cadence`)."""
    badput: dict[str, Badput] = field(default_factory=dict)
    """Per job: the time it lost in the window, by cause (:mod:`analytics.badput`)."""
    app_faults: AppFaults = field(default_factory=AppFaults)
    """Application XIDs on most of a job's nodes at once, and on one GPU across jobs
    (:mod:`analytics.jobfaults`)."""
    repeat_window_s: float = 7 * 86400.0
    advice_min_gain: float = 0.01
    """A ``checkpoint_advice`` finding only when the advice gives back this share of wall time."""
    timings_s: dict[str, float] = field(default_factory=dict)

    def job(self, name: str) -> JobResult:
        for j in self.jobs:
            if j.job == name:
                return j
        raise KeyError(f"job {name!r} not in this analysis")


def node_groups(nodes: Sequence[str], switch_of: Mapping[str, str], size: int) -> list[list[str]]:
    """Groups of at most ``size`` nodes (or one whole larger switch) that never split a switch."""
    by_switch: dict[str, list[str]] = {}
    for n in sorted(nodes):
        by_switch.setdefault(switch_of.get(n, n), []).append(n)
    groups: list[list[str]] = []
    current: list[str] = []
    for members in by_switch.values():
        if current and len(current) + len(members) > size:
            groups.append(current)
            current = []
        current = current + members
    if current:
        groups.append(current)
    return groups


def _blame_network(out: Analysis) -> None:
    """A stage, or a worker with no cause of its own, whose nodes sit mostly under a switch
    that was hot at the time is slow because of the network: say so (cause ``nic``)."""
    hot = [sw for sw in out.switches if sw.hot]
    if not hot:
        return
    for job in out.jobs:
        for s in job.stragglers:
            if s.kind == "stage" and s.stage is not None:
                key, nodes = (job.job, f"stage:{s.stage}"), set(job.stage_nodes.get(s.stage, []))
            elif s.kind == "worker" and s.worker is not None:
                key = (job.job, s.worker)
                if out.attributions.get(key, ("unknown",))[0] != "unknown":
                    continue
                nodes = {s.node or job.rank_node.get(s.worker, "")} - {""}
            else:
                continue
            onset = job.step_times.get(s.onset_step, (0, out.start_ns))[1]
            last = job.step_times.get(s.last_step, (0, out.end_ns))[1]
            for sw in hot:
                under = nodes & set(sw.nodes)
                lo, hi = sw.first_hot_ns or 0, sw.last_hot_ns or 0
                overlaps = lo <= last and onset <= hi + 60 * 10**9
                if nodes and len(under) * 2 >= len(nodes) and overlaps:
                    evidence: dict[str, Any] = {"switch": sw.switch, "score": round(sw.score, 4)}
                    evidence["nodes_under_switch"] = sorted(under)
                    out.attributions[key] = ("nic", evidence)
                    break


def _advise(
    cfg: AnalyticsConfig,
    jobs: Sequence[JobResult],
    start_ns: int,
    end_ns: int,
    where: Mapping[str, str] | None,
) -> list[Advice]:
    """Two small queries per job, in the driver: the fleet's fault history and the job's
    reported checkpoint saves."""
    if not jobs:
        return []
    c = cfg["cadence"]
    reader = InfluxReader(**cfg.reader_kwargs())
    try:
        rate = fleet_failure_rate(reader, end_ns - int(c["lookback_s"] * 1e9), end_ns, c, where)
        if c["discount_announced"]:
            rate = rate.unannounced()
        found = (job_advice(reader, j.job, len(j.nodes), rate, start_ns, end_ns, c, where)
                 for j in jobs)  # fmt: skip
        return [a for a in found if a is not None]
    finally:
        reader.close()


def analyse(
    cfg: AnalyticsConfig,
    start_ns: int,
    end_ns: int,
    executor: LocalExecutor | DaskExecutor,
    progress: Progress | None = None,
) -> Analysis:
    """Everything but the writing: see the module docstring."""
    if isinstance(executor, DaskExecutor) and cfg["dask"]["credentials"] == "send":
        check_send(executor.scheduler)  # also for an executor not built from this config
        cfg = cfg.with_secrets()
    t0 = time.perf_counter()
    out = Analysis(start_ns, end_ns, executor.name)
    a = cfg["analysis"]
    out.switch_of = load_topology(a["topology"]) if a["topology"] else {}
    where = {"cluster": a["cluster"]} if a["cluster"] else None
    reader = InfluxReader(**cfg.reader_kwargs())
    try:
        jobs = set(reader.tag_values("job_step", "job", "step_time_s", start_ns, end_ns, where))
        jobs |= set(reader.tag_values("gpu", "job", "power_w", start_ns, end_ns, where))
        nodes = reader.tag_values(
            "ib_port", "node", "port_xmit_data_bytes_total", start_ns, end_ns, where
        )
        if a["silent_after_s"] > 0:
            out.silent = silent_nodes(reader, start_ns, end_ns, a["silent_after_s"], where)
        out.app_faults = find_app_faults(reader, cfg.jobfaults, start_ns, end_ns, where)
        out.repeat_window_s = cfg.jobfaults.repeat_window_s
    finally:
        reader.close()
    if out.switch_of:
        out.unplaced = sorted(set(nodes) - set(out.switch_of))
        if out.unplaced:
            log.warning(
                "topology %s does not list %d node(s), each analysed as its own switch: %s",
                a["topology"],
                len(out.unplaced),
                ", ".join(out.unplaced[:10]),
            )
    groups = node_groups(nodes, out.switch_of, int(a["nodes_per_task"]))
    out.timings_s["plan"] = time.perf_counter() - t0
    calls: list[Call] = [(job_task, (cfg, j, start_ns, end_ns)) for j in sorted(jobs)]
    calls += [
        (
            ports_task,
            (cfg, g, {n: out.switch_of[n] for n in g if n in out.switch_of}, start_ns, end_ns),
        )
        for g in groups
    ]
    calls.append((drift_task, (cfg, end_ns)))
    results = executor.run(calls, "read+analyse", progress)
    out.jobs = [r for r in results if isinstance(r, JobResult)]
    port_results = [r for r in results if isinstance(r, PortsResult)]
    for r in results:
        if isinstance(r, DriftResult):
            out.drift, out.info_gpus, out.job_mix = r.drifts, r.gpus, r.mixes
    out.timings_s["phase1"] = time.perf_counter() - t0 - out.timings_s["plan"]
    series = [p.series for p in port_results if p.series.height]
    all_series = pl.concat(series) if series else pl.DataFrame()
    port_frames = [p.ports for p in port_results if p.ports.height]
    out.ports = pl.concat(port_frames) if port_frames else pl.DataFrame()
    out.switches = rank_switches(all_series, out.switch_of, nodes, cfg.congestion)
    bucket_s = float(a["ib_bucket_s"])
    for sw in out.switches:
        if not sw.hot:
            continue
        for job in out.jobs:
            if set(job.nodes) & set(sw.nodes):
                impact = job_impact(all_series, sw.switch, job.walls, max(bucket_s, 60.0))
                if impact is not None:
                    sw.jobs.append({"job": job.job, **{k: round(v, 4) for k, v in impact.items()}})
    # Phase 2: attribute slow workers from their node's telemetry over the slow stretch,
    # one task per (job, node) however many of its ranks are slow.
    per_node: dict[tuple[str, str], tuple[list[str], int, int]] = {}
    for job in out.jobs:
        for s in job.stragglers:
            if s.kind != "worker" or s.worker is None:
                continue
            node = s.node or job.rank_node.get(s.worker, "")
            if not node:
                continue
            lo = job.step_times.get(s.onset_step, (0, start_ns))[1] - 60 * 10**9
            hi = job.step_times.get(s.last_step, (0, end_ns))[1] + 1
            ranks, lo0, hi0 = per_node.get((job.job, node), ([], lo, hi))
            per_node[(job.job, node)] = ([*ranks, s.worker], min(lo, lo0), max(hi, hi0))
    attr_calls: list[Call] = [
        (attribution_task, (cfg, job, node, ranks, max(start_ns, lo), hi))
        for (job, node), (ranks, lo, hi) in per_node.items()
    ]
    if attr_calls:
        results_by_node = executor.run(attr_calls, "attribute", progress)
        for (job_name, _), res in zip(per_node, results_by_node, strict=True):
            for rank, cause in res.items():
                out.attributions[(job_name, rank)] = cause
    _blame_network(out)
    drifted = {d.node for d in out.drift}
    for j in out.jobs:
        if j.throughput is not None:
            out.badput[j.job] = badput(
                j.job,
                j.throughput,
                saves_s=j.saves_s,
                hang_s=j.hang.quiet.silent_s if j.hang is not None else 0.0,
                straggler_s=j.straggler_cost_s,
                worker_node=j.rank_node,
                drifted=drifted,
            )
    out.advice = _advise(cfg, out.jobs, start_ns, end_ns, where)
    out.advice_min_gain = float(cfg["cadence"]["min_gain"])
    out.timings_s["total"] = time.perf_counter() - t0
    return out
