"""The agent's ``/metrics``: its own health, and its GPUs under dcgm-exporter's names.

Self-metrics (always): cycles, ticks skipped, cycles the sink refused, and per source whether it
works, its errors, the points of its last cycle and the readings screened out as impossible;
the sink's counters.

GPU metrics (``[agent] metrics_gpu``, on by default): the last cycle's ``gpu`` points under
the names and labels of NVIDIA's dcgm-exporter (its default counters, with ``gpu``, ``UUID``,
``device``, ``modelName`` and ``Hostname`` labels) and in its units; gpuwarden's own ``job``
and ``rank`` come along as extra labels. Every metric dcgm-exporter's own Grafana dashboard
reads is here (``tests/data/dcgm_exporter_dashboard_metrics.txt`` lists them, from its
repository; ``tests/test_dcgm_names.py`` checks), so that dashboard reads a gpuwarden node;
of its other default counters, the ones NVML gives the agent are here too, the rest
(encoder/decoder use, NVLink bandwidth, vGPU licence, the DCP profiling fields other than
tensor activity) are not. Three come from more than one catalogue field or from events:

* ``DCGM_FI_DEV_FB_FREE``: ``mem_total_bytes - mem_used_bytes - mem_reserved_bytes``, in MiB.
* ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``: GPM's tensor activity (``gpm_tensor_active_pct``, any
  precision, Hopper and later) as a ratio; DCGM's field counts the HMMA pipe, which is the
  same pipe on these GPUs. Absent where GPM is (before Hopper, or GPM off).
* ``DCGM_FI_DEV_XID_ERRORS``: the last XID the agent saw on that GPU since it started (0:
  none), shown only while the ``xid`` source works: without a kernel log to read, 0 would
  claim a calm the agent cannot see.

Only what NVML answered is exposed: an unsupported field is absent, as in InfluxDB. The full
set stays in InfluxDB, under the catalogue's names: these are for sites that alert from
Prometheus.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuwarden.core.metrics import Metric
from gpuwarden.core.store.lineprotocol import Point

#: catalogue field -> (dcgm-exporter name, factor to its unit, kind, its help text)
DCGM: Mapping[str, tuple[str, float, str, str]] = {
    "gpu_util_pct": ("DCGM_FI_DEV_GPU_UTIL", 1.0, "gauge", "GPU utilization (in %)."),
    "mem_util_pct": ("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0, "gauge", "Memory utilization (in %)."),
    "mem_used_bytes": ("DCGM_FI_DEV_FB_USED", 1 / 2**20, "gauge",
                       "Framebuffer memory used (in MiB)."),
    "mem_reserved_bytes": ("DCGM_FI_DEV_FB_RESERVED", 1 / 2**20, "gauge",
                           "Framebuffer memory reserved (in MiB)."),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", 1.0, "gauge", "SM clock frequency (in MHz)."),
    "mem_clock_mhz": ("DCGM_FI_DEV_MEM_CLOCK", 1.0, "gauge", "Memory clock frequency (in MHz)."),
    "gpu_temp_c": ("DCGM_FI_DEV_GPU_TEMP", 1.0, "gauge", "GPU temperature (in C)."),
    "mem_temp_c": ("DCGM_FI_DEV_MEMORY_TEMP", 1.0, "gauge", "Memory temperature (in C)."),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", 1.0, "gauge", "Power draw (in W)."),
    "energy_j_total": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0, "counter",
                       "Total energy consumption since boot (in mJ)."),
    "pcie_replay_total": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0, "counter",
                          "Total number of PCIe retries."),
    "ecc_sbe_volatile_total": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0, "counter",
                               "Total number of single-bit volatile ECC errors."),
    "ecc_dbe_volatile_total": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0, "counter",
                               "Total number of double-bit volatile ECC errors."),
    "remapped_rows_correctable_total": ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1.0, "counter",
                                        "Number of remapped rows for correctable errors."),
    "remapped_rows_uncorrectable_total": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0,
                                          "counter",
                                          "Number of remapped rows for uncorrectable errors."),
    "gpm_tensor_active_pct": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01, "gauge",
                              "Ratio of cycles the tensor (HMMA) pipe is active "
                              "(NVML GPM tensor activity)."),
}  # fmt: skip
FB_FREE = ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
XID_ERRORS = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")


def _fb_free_mib(fields: Mapping[str, Any]) -> float | None:
    """Free framebuffer as DCGM counts it (total less used less the driver's reserve)."""
    total, used = fields.get("mem_total_bytes"), fields.get("mem_used_bytes")
    if not isinstance(total, int) or not isinstance(used, int):
        return None
    reserved = fields.get("mem_reserved_bytes")
    free = total - used - (reserved if isinstance(reserved, int) else 0)
    return max(free, 0) / 2**20


def gpu_metrics(
    points: Iterable[Point], hostname: str, last_xid: Mapping[str, int] | None = None
) -> list[Metric]:
    """The ``gpu`` points of one cycle as dcgm-exporter's metrics; ``last_xid`` (GPU index ->
    the last XID seen, None while no XID watcher works) gives ``DCGM_FI_DEV_XID_ERRORS``."""
    samples: dict[str, list[tuple[Mapping[str, str], float]]] = {k: [] for k in DCGM}
    free: list[tuple[Mapping[str, str], float]] = []
    xids: list[tuple[Mapping[str, str], float]] = []
    for p in points:
        if p.measurement != "gpu":
            continue
        gpu = p.tags.get("gpu", "")
        labels = {"gpu": gpu, "UUID": p.tags.get("gpu_uuid", ""), "device": f"nvidia{gpu}",
                  "modelName": p.tags.get("gpu_model", ""), "Hostname": hostname}  # fmt: skip
        for extra in ("job", "rank"):
            if p.tags.get(extra):
                labels[extra] = p.tags[extra]
        for key, value in p.fields.items():
            if key in DCGM and isinstance(value, int | float) and not isinstance(value, bool):
                samples[key].append((labels, float(value) * DCGM[key][1]))
        mib = _fb_free_mib(p.fields)
        if mib is not None:
            free.append((labels, mib))
        if last_xid is not None:
            xids.append((labels, float(last_xid.get(gpu, 0))))
    out = []
    for key, found in samples.items():
        if found:
            name, _, kind, help_ = DCGM[key]
            out.append(Metric(name, help_, "counter" if kind == "counter" else "gauge", found))
    for (name, help_), found in ((FB_FREE, free), (XID_ERRORS, xids)):
        if found:
            out.append(Metric(name, help_, "gauge", found))
    return out


def agent_metrics(
    agent: Any, sink_stats: Callable[[], dict[str, Any]] | None, *, gpu: bool, poster: Any = None
) -> list[Metric]:
    """What the agent's ``/metrics`` shows now (``agent``: a :class:`collector.agent.Agent`;
    ``poster``: its fast path to the engine, a :class:`core.poster.FindingPoster`, if any)."""
    out = [
        Metric.one("gpuwarden_agent_cycles_total", "collection cycles run", agent.cycles,
                   "counter"),
        Metric.one("gpuwarden_agent_skipped_ticks_total",
                   "ticks skipped because a cycle overran its interval", agent.skipped_ticks,
                   "counter"),
        Metric.one("gpuwarden_agent_interval_seconds", "the collection interval",
                   agent.interval_s),
        Metric.one("gpuwarden_agent_sink_errors_total",
                   "cycles whose points the sink refused (the loop went on)", agent.sink_errors,
                   "counter"),
        # the fast path to the engine (0 without one): a finding it could not deliver went
        # only the slow way, through InfluxDB; before, only the log said so (found in review)
        Metric.one("gpuwarden_agent_findings_posted_total",
                   "findings the engine took from this agent's fast path",
                   getattr(poster, "posted", 0), "counter"),
        Metric.one("gpuwarden_agent_findings_failed_total",
                   "findings the fast path could not deliver (engine unreachable, refused)",
                   getattr(poster, "failed", 0), "counter"),
        Metric.one("gpuwarden_agent_findings_merged_total",
                   "findings not sent again: the same one was queued or sent lately",
                   getattr(poster, "merged", 0), "counter"),
    ]  # fmt: skip
    health = sorted(agent.health.items())
    for name, help_, kind, value in (
        ("gpuwarden_agent_source_up", "1 while the source works, 0 in a failure streak",
         "gauge", lambda h: 0.0 if h.failing else 1.0),
        ("gpuwarden_agent_source_errors_total", "cycles in which the source failed", "counter",
         lambda h: h.errors),
        ("gpuwarden_agent_source_points", "points of the source's last successful cycle",
         "gauge", lambda h: h.points),
        ("gpuwarden_agent_source_implausible_total",
         "readings left out as physically impossible", "counter", lambda h: h.implausible),
    ):  # fmt: skip
        out.append(Metric(name, help_, kind, [({"source": s}, value(h)) for s, h in health]))  # type: ignore[arg-type]
    if sink_stats is not None:
        for key, value in sorted(sink_stats().items()):
            kind = "counter" if key.endswith("_total") else "gauge"
            out.append(Metric.one(f"gpuwarden_agent_sink_{key}", f"the sink's {key}", value, kind))  # type: ignore[arg-type]
    if gpu:
        xid = agent.health.get("xid")
        watched = xid is not None and not xid.failing
        out += gpu_metrics(agent.last_points, agent.node, agent.last_xid if watched else None)
    return out
