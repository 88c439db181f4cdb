"""Turn a :class:`~simulation.spec.ScenarioSpec` into SIMULATED telemetry.

Output is exactly the catalogue's measurements, as polars frames ready for
:meth:`core.store.sink.InfluxSink.write_frame`, in time chunks, plus the ground truth (what was
injected, where and when) as ``scenario_fault`` points. Generation is vectorised over GPUs and
ports with numpy; a chunk of ticks is a handful of array operations.

Model, in brief (each part documented where it is built):

* per GPU, a latent AR(1) "load" process (shared in part by every GPU of a job), mapped through
  a Gaussian copula onto the real AcmeTrace marginals (:mod:`.calibration`);
* jobs with a tensor/pipeline/data-parallel layout report ``job_step`` per rank (and a
  ``job_heartbeat`` every 30 s while they hold their nodes, hung or not); a rank's step
  time grows with whatever slows its GPU, node, switch or stage, and a synchronous step takes
  as long as the slowest rank; a fatal fault stops the job, which restarts after ``restart_s``
  from its last checkpoint (on a spare node if the failed one is still down);
* faults move exactly the catalogue fields of their documented signature, each type its own
  (:mod:`.faulttypes`); :mod:`.faults` decides which happen when.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl
from numpy.typing import NDArray
from scipy.signal import lfilter  # type: ignore[import-untyped]
from scipy.special import ndtr  # type: ignore[import-untyped]

from gpuwarden.core.catalogue import CATALOGUE
from gpuwarden.core.xidcat import catalogue as xid_catalogue
from gpuwarden.simulation.calibration import LOAD_CORRELATION, acmetrace, lingjun_tors
from gpuwarden.simulation.faults import resolve_all
from gpuwarden.simulation.faulttypes import Chunk, Fault, Window, of
from gpuwarden.simulation.jobs import JobSchedule
from gpuwarden.simulation.spec import MEASUREMENTS, ScenarioSpec

NS = 1_000_000_000
LATENT_TAU_S = 900.0  # how long a GPU's load level persists (AR(1) time constant)
JOB_SHARE = 0.8  # weight of the job-wide component in a job GPU's load latent


@dataclass(frozen=True)
class GpuProfile:
    model: str
    sm_max: float
    sm_idle: float
    mem_clock: float
    power_limit: float
    power_scale: float  # AcmeTrace is an A100 fleet: its power CDF is scaled to this limit
    pcie_gen: int
    gpm: bool  # GPM metrics exist on Hopper and newer
    vbios: str  # gpu_info's VBIOS string (the CONSTRUCTED golden recordings' value)


GPU_PROFILES = {
    "A100": GpuProfile(
        "NVIDIA A100-SXM4-80GB", 1410.0, 210.0, 1593.0, 400.0, 1.0, 4, False, "92.00.36.00.02"
    ),
    "H100": GpuProfile(
        "NVIDIA H100 80GB HBM3", 1980.0, 345.0, 2619.0, 700.0, 700 / 400, 5, True, "96.00.74.00.01"
    ),
}
#: what the driver says after each XID code (the catalogue's description)
_XID_WORDS = {code: info.description for code, info in xid_catalogue().items()}
DRIVER = "550.90.07"
OLD_DRIVER = "535.129.03"  # what a config_drift fault's node runs
INFO_EVERY_S = 600.0  # the agent's [nvml] info_every_s default
MEM_TOTAL = 80 * 2**30
IB_RATE_GBPS = 200.0

GPU_COUNTERS = (
    "ecc_sbe_volatile_total",
    "ecc_dbe_volatile_total",
    "remapped_rows_correctable_total",
    "remapped_rows_uncorrectable_total",
    "pcie_replay_total",
)
NVLINK_COUNTERS = (
    "crc_flit_errors_total",
    "crc_data_errors_total",
    "replay_errors_total",
    "recovery_errors_total",
    "tx_bytes_total",
    "rx_bytes_total",
)
IB_COUNTERS = (
    "port_xmit_data_bytes_total",
    "port_rcv_data_bytes_total",
    "port_xmit_packets_total",
    "port_rcv_packets_total",
    "symbol_error_total",
    "link_error_recovery_total",
    "link_downed_total",
    "port_xmit_wait_total",
    "np_cnp_sent_total",
    "rp_cnp_handled_total",
    "np_ecn_marked_roce_packets_total",
)


def _zeros(names: tuple[str, ...], n: int) -> dict[str, NDArray[np.int64]]:
    return {k: np.zeros(n, dtype=np.int64) for k in names}


class ScenarioGenerator:
    """Deterministic for a given (spec, seed): every random draw comes from one generator."""

    def __init__(self, spec: ScenarioSpec, seed: int = 0) -> None:
        self.spec = spec
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.profile = GPU_PROFILES[spec.gpu_model]
        self.cdfs = acmetrace()
        self.faults: list[Fault] = resolve_all(spec, self.rng)
        n, g, h = spec.nodes, spec.gpus_per_node, spec.hcas_per_node
        self.n_gpu, self.n_port = n * g, n * h
        self.node_names = [f"node-{i:03d}" for i in range(n)]
        self.switch_of = self._place_on_tors()
        self.schedule = JobSchedule(spec, self.faults, self.switch_of, self.node_names)
        self.jobs = self.schedule.plans
        # AR(1) latent states carried from chunk to chunk
        self._z_job = self.rng.standard_normal(len(self.jobs))
        self._z_gpu = self.rng.standard_normal(self.n_gpu)
        self._z_metric = {m: self.rng.standard_normal(self.n_gpu) for m in LOAD_CORRELATION}
        self._z_ib = self.rng.standard_normal((2, n))
        self._energy = self.rng.uniform(1e6, 1e8, self.n_gpu)
        # Counters carried from chunk to chunk (raw totals, as the hardware reports them).
        links = max(spec.nvlink_links, 1)
        self._gpu_counters = _zeros(GPU_COUNTERS, self.n_gpu)
        self._nvl_counters = _zeros(NVLINK_COUNTERS, self.n_gpu * links)
        self._ib_counters = _zeros(IB_COUNTERS, self.n_port)

    # -- layout ---------------------------------------------------------------------------

    def _place_on_tors(self) -> list[str]:
        """Nodes fill the real Lingjun ToRs in file order, as many hosts per ToR as it has."""
        out: list[str] = []
        for name, hosts in lingjun_tors():
            out += [name] * hosts
            if len(out) >= self.spec.nodes:
                break
        while len(out) < self.spec.nodes:  # larger than Lingjun: 8 per synthetic ToR
            out.append(f"SIM-S{len(out) // 8}")
        return out[: self.spec.nodes]

    # -- ground truth ---------------------------------------------------------------------

    def ground_truth(self) -> pl.DataFrame:
        """``scenario_fault`` points: precursor start (if any), onset, repair, per fault."""
        rows = []
        for f in self.faults:
            kind = of(f)
            phases = [(2, f.onset_s)]
            if f.precursor_start_s < f.onset_s:
                phases.insert(0, (1, f.precursor_start_s))
            if f.end_s < self.spec.duration_s:
                phases.append((3, f.end_s))
            for code, t in phases:
                rows.append(
                    {
                        "time": self.spec.start_ns + int(t * NS),
                        "cluster": self.spec.cluster,
                        "node": self.node_names[f.node],
                        "gpu": str(f.gpu) if kind.gpu_scoped else "",
                        "hca": f"mlx5_{f.hca}" if kind.port_scoped else "",
                        "port": "1" if kind.port_scoped else "",
                        "job": f.job,
                        "kind": f.type,
                        "source": "scenario",
                        "fault_id": f.fault_id,
                        "phase_code": code,
                        "fatal_active": f.fatal,
                        "xid_code": f.xid,
                        "summary": f"{f.type} ({f.origin}); signature: {kind.defaults.signature}",
                    }
                )
        return pl.DataFrame(rows) if rows else pl.DataFrame()

    # -- per-tick telemetry ---------------------------------------------------------------

    def _ar1(self, state: NDArray[np.float64], ticks: int) -> NDArray[np.float64]:
        """``ticks`` steps of a standard-normal AR(1) from ``state`` (updated in place)."""
        phi = math.exp(-self.spec.interval_s / LATENT_TAU_S)
        noise = self.rng.standard_normal((ticks, *state.shape))
        out, _ = lfilter(
            [math.sqrt(1 - phi * phi)], [1.0, -phi], noise, axis=0, zi=(phi * state)[None, ...]
        )
        state[...] = out[-1]
        return np.asarray(out)

    def chunks(self, ticks_per_chunk: int = 60) -> Iterator[dict[str, pl.DataFrame]]:
        """Frames per measurement, chunk after chunk of ``ticks_per_chunk`` ticks, in time
        order (a point's time is within its chunk's ticks)."""
        spec = self.spec
        # the jobs' own reports, whole scenario at once, handed out chunk by chunk
        wanted = {"job_step", "job_heartbeat"} & set(spec.measurements)
        steps = self.schedule.steps(self.rng) if wanted else pl.DataFrame()
        reports = {
            "job_step": steps,
            "job_heartbeat": self.schedule.heartbeats(steps) if steps.height else steps,
        }
        reports = {m: df for m, df in reports.items() if m in wanted and df.height}
        total = spec.duration_s // spec.interval_s
        first = True
        for k0 in range(0, total, ticks_per_chunk):
            tt = (np.arange(k0, min(total, k0 + ticks_per_chunk)) * spec.interval_s).astype(float)
            out = self._chunk(tt)
            if first:
                if "job_model" in spec.measurements and self.jobs:
                    out["job_model"] = self.schedule.models(self.profile.model)
                if "scenario_fault" in spec.measurements and self.faults:
                    out["scenario_fault"] = self.ground_truth()
                first = False
            lo = spec.start_ns + int(tt[0] * NS)
            hi = spec.start_ns + int((tt[-1] + spec.interval_s) * NS)
            for m, df in reports.items():
                out[m] = df.filter((pl.col("time") >= lo) & (pl.col("time") < hi))
            yield {m: df for m, df in out.items() if df.height}

    def _job_gpu_tags(self, t: float) -> tuple[list[str], list[str], list[str], NDArray[np.int64]]:
        """Per GPU at time t: job, rank, local_rank tags, and the job index (-1: none/down)."""
        g = self.spec.gpus_per_node
        job = [""] * self.n_gpu
        rank = [""] * self.n_gpu
        local = [""] * self.n_gpu
        jidx = np.full(self.n_gpu, -1)
        for j, jp in enumerate(self.jobs):
            nodes = jp.nodes_at(t)
            if nodes is None:
                continue
            for i, node in enumerate(nodes):
                for lr in range(g):
                    gi = node * g + lr
                    job[gi], rank[gi], local[gi] = jp.spec.name, str(i * g + lr), str(lr)
                    jidx[gi] = j
        return job, rank, local, jidx

    def _chunk(self, tt: NDArray[np.float64]) -> dict[str, pl.DataFrame]:
        spec, prof = self.spec, self.profile
        T, G, g = len(tt), self.n_gpu, spec.gpus_per_node
        job, rank, local, jidx = self._job_gpu_tags(float(tt[0]))
        # Load latent: a job's GPUs share most of it; idle ones have their own.
        zj = self._ar1(self._z_job, T) if len(self.jobs) else np.zeros((T, 0))
        zg = self._ar1(self._z_gpu, T)
        in_job = jidx >= 0
        share = np.where(in_job, JOB_SHARE, 0.0)
        zjob = zj[:, np.clip(jidx, 0, None)] if len(self.jobs) else np.zeros((T, G))
        load = share * zjob + np.sqrt(1 - share**2) * zg
        val: dict[str, NDArray[np.float64]] = {}
        for m, rho in LOAD_CORRELATION.items():
            own = self._ar1(self._z_metric[m], T)
            latent = rho * load + math.sqrt(max(0.0, 1 - rho * rho)) * own
            val[m] = self.cdfs[m].ppf(ndtr(latent))
        util = val["gpu_util_pct"].round(0)
        power = (val["power_w"] * prof.power_scale).round(3)
        temp = val["gpu_temp_c"].round(0)
        sm = np.where(util > 0, prof.sm_max, prof.sm_idle)
        reasons: NDArray[np.int64] = np.where(util == 0, 0x1, 0).astype(np.int64) | np.where(
            power > 0.97 * prof.power_limit, 0x4, 0
        ).astype(np.int64)
        alive = np.ones((T, G), dtype=bool)
        inc = {k: np.zeros((T, G), dtype=np.int64) for k in self._gpu_counters}
        inc["ecc_sbe_volatile_total"] += self.rng.poisson(1e-6 * spec.interval_s, (T, G))
        pending = np.zeros((T, G), dtype=bool)
        failure = np.zeros((T, G), dtype=bool)
        width = np.full((T, G), 16, dtype=np.int64)
        events: list[dict[str, object]] = []
        L = spec.nvlink_links
        nvl_inc = {k: np.zeros((T, max(G * L, 1)), dtype=np.int64) for k in self._nvl_counters}
        link_up = np.ones((T, max(G * L, 1)), dtype=bool)
        H = spec.hcas_per_node
        P = self.n_port
        ib_inc = {k: np.zeros((T, P), dtype=np.int64) for k in self._ib_counters}
        port_up = np.ones((T, P), dtype=bool)
        port_alive = np.ones((T, P), dtype=bool)
        ib_factor = np.ones((T, P))
        dt = spec.interval_s

        chunk = Chunk(
            tt=tt, dt=dt, gpus_per_node=g, hcas_per_node=H, links=L, rng=self.rng,
            switch_of=self.switch_of, jobs=self.jobs, jidx=jidx, power_limit=prof.power_limit,
            util=util, power=power, temp=temp, sm=sm, reasons=reasons, alive=alive, inc=inc,
            pending=pending, failure=failure, width=width, nvl_inc=nvl_inc, link_up=link_up,
            ib_inc=ib_inc, port_up=port_up, port_alive=port_alive, ib_factor=ib_factor,
        )  # fmt: skip
        # Each fault moves the fields of its own signature (simulation.faulttypes); a hung
        # job spins at 100 %.
        for f in self.faults:
            pre = (tt >= f.precursor_start_s) & (tt < f.onset_s)
            on = (tt >= f.onset_s) & (tt < f.end_s)
            onset_tick = (tt <= f.onset_s) & (f.onset_s < tt + dt)
            if not (pre.any() or on.any() or onset_tick.any()):
                continue
            frac = np.clip(
                (tt - f.precursor_start_s) / max(f.onset_s - f.precursor_start_s, 1), 0, 1
            )
            if f.xid and onset_tick.any():
                events.append(self._event(f, f.onset_s))
            of(f).telemetry(chunk, f, Window(pre, on, onset_tick, frac, f.node * g + f.gpu))
        # GPUs of a job that is down between runs (restarting) are idle.
        for jp in self.jobs:
            for ti, t in enumerate(tt):
                if jp.nodes_at(float(t)) is None:
                    last = [r for r in jp.runs if r.start_s <= t] or jp.runs[:1]
                    idle = [n * g + i for n in last[-1].nodes for i in range(g)]
                    util[ti, idle] = 0.0
                    power[ti, idle] = np.minimum(power[ti, idle], 60.0)
        reasons_all = reasons.astype(np.int64)

        out: dict[str, pl.DataFrame] = {}
        time_ns = spec.start_ns + (tt * NS).astype(np.int64)
        if "gpu" in spec.measurements:
            out["gpu"] = self._gpu_frame(
                time_ns,
                alive,
                util,
                power,
                temp,
                val,
                sm,
                reasons_all,
                inc,
                pending,
                failure,
                width,
                job,
                rank,
                local,
            )
        else:
            self._advance_gpu_counters(inc, alive)
        if "gpu_event" in spec.measurements and events:
            out["gpu_event"] = pl.DataFrame(events)
        if (
            "gpu_info" in spec.measurements
            and (info := self._info_frame(tt, time_ns, alive)).height
        ):
            out["gpu_info"] = info
        if "gpu_nvlink" in spec.measurements and L:
            out["gpu_nvlink"] = self._nvlink_frame(
                time_ns, alive, util, nvl_inc, link_up, job, rank, local
            )
        if "ib_port" in spec.measurements:
            node_z = self._node_load(load, share)
            out["ib_port"] = self._ib_frame(time_ns, ib_inc, port_up, port_alive, ib_factor, node_z)
        return out

    def _info_frame(
        self, tt: NDArray[np.float64], time_ns: NDArray[np.int64], alive: NDArray[np.bool_]
    ) -> pl.DataFrame:
        """``gpu_info`` every ``INFO_EVERY_S``, as the agent writes it: every GPU the same
        driver, VBIOS and modes, except where a ``config_drift`` fault is on (its node runs an
        older driver; its GPU has ECC off with ECC on pending a reset)."""
        ticks = np.flatnonzero(tt % INFO_EVERY_S < self.spec.interval_s)
        if not ticks.size:
            return pl.DataFrame()
        g = self.spec.gpus_per_node
        rows = []
        for ti in ticks:
            drift = [f for f in self.faults if of(f).drifts_config and f.active(float(tt[ti]))]
            old = {f.node for f in drift}
            ecc_off = {f.node * g + f.gpu for f in drift}
            for gi in np.flatnonzero(alive[ti]):
                rows.append({
                    "time": int(time_ns[ti]), "cluster": self.spec.cluster,
                    "node": self.node_names[gi // g], "gpu": str(gi % g),
                    "gpu_uuid": self._uuid(int(gi)), "gpu_model": self.profile.model,
                    "driver_version": OLD_DRIVER if gi // g in old else DRIVER,
                    "vbios_version": self.profile.vbios, "persistence_mode_active": True,
                    "ecc_mode_active": gi not in ecc_off, "ecc_mode_pending_active": True,
                    "mig_mode_active": False, "mig_mode_pending_active": False,
                })  # fmt: skip
        return pl.DataFrame(rows)

    def _node_load(
        self, load: NDArray[np.float64], share: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """Each node's mean GPU load latent, rescaled to unit variance (its GPUs share a job
        component, so the mean's variance is share^2 + (1 - share^2) / gpus)."""
        g = self.spec.gpus_per_node
        T = load.shape[0]
        mean = load.reshape(T, -1, g).mean(axis=2)
        s = share.reshape(-1, g).mean(axis=1)
        return np.asarray(mean / np.sqrt(s**2 + (1 - s**2) / g))

    def _event(self, f: Fault, t: float) -> dict[str, object]:
        gi = f.node * self.spec.gpus_per_node + f.gpu
        # the job the GPU had at the agent's last look before the event, as the agent tags it
        job, rank, local, _ = self._job_gpu_tags(max(t - self.spec.interval_s, 0.0))
        return {
            "time": self.spec.start_ns + int(t * NS),
            "cluster": self.spec.cluster,
            "node": self.node_names[f.node],
            "gpu": str(f.gpu),
            "gpu_uuid": self._uuid(gi),
            "job": job[gi],
            "rank": rank[gi],
            "local_rank": local[gi],
            "event": "xid",
            "severity": "critical" if f.fatal else "warning",
            "source": "scenario",
            "xid_code": f.xid,
            # the driver's words for the code, never the scenario's name for the fault
            "message": f"NVRM: Xid (PCI:0000:{f.gpu:02x}:00): {f.xid}, "
            f"{_XID_WORDS.get(f.xid, 'Unknown error')}.",
            "fatal_active": f.fatal,
        }

    def _uuid(self, gi: int) -> str:
        return f"GPU-5e1f{self.seed % 65536:04x}-0000-4000-8000-{gi:012d}"

    def _advance_gpu_counters(
        self, inc: dict[str, NDArray[np.int64]], alive: NDArray[np.bool_]
    ) -> dict[str, NDArray[np.int64]]:
        vals = {}
        for k, a in inc.items():
            cum = self._gpu_counters[k] + np.cumsum(a, axis=0)
            self._gpu_counters[k] = cum[-1]
            vals[k] = cum
        return vals

    def _gpu_frame(
        self,
        time_ns: NDArray[np.int64],
        alive: NDArray[np.bool_],
        util: NDArray[np.float64],
        power: NDArray[np.float64],
        temp: NDArray[np.float64],
        val: dict[str, NDArray[np.float64]],
        sm: NDArray[np.float64],
        reasons: NDArray[np.int64],
        inc: dict[str, NDArray[np.int64]],
        pending: NDArray[np.bool_],
        failure: NDArray[np.bool_],
        width: NDArray[np.int64],
        job: list[str],
        rank: list[str],
        local: list[str],
    ) -> pl.DataFrame:
        spec, prof = self.spec, self.profile
        T, G = util.shape
        g = spec.gpus_per_node
        counters = self._advance_gpu_counters(inc, alive)
        energy = self._energy + np.cumsum(power * spec.interval_s, axis=0)
        self._energy = energy[-1]
        gi = np.arange(G)
        cols: dict[str, object] = {
            "time": np.repeat(time_ns, G),
            "cluster": spec.cluster,
            "node": np.tile(np.array(self.node_names)[gi // g], T),
            "gpu": np.tile((gi % g).astype(str), T),
            "gpu_uuid": np.tile(np.array([self._uuid(int(i)) for i in gi]), T),
            "gpu_model": prof.model,
            "job": np.tile(np.array(job), T),
            "rank": np.tile(np.array(rank), T),
            "local_rank": np.tile(np.array(local), T),
            "gpu_util_pct": util.reshape(-1),
            "mem_util_pct": (util * 0.55).round(0).reshape(-1),
            "mem_used_bytes": (val["mem_used_pct"] / 100 * MEM_TOTAL).astype(np.int64).reshape(-1),
            "mem_total_bytes": np.full(T * G, MEM_TOTAL, dtype=np.int64),
            "sm_clock_mhz": sm.round(0).reshape(-1),
            "mem_clock_mhz": np.full(T * G, prof.mem_clock),
            "sm_clock_max_mhz": np.full(T * G, prof.sm_max),
            "gpu_temp_c": temp.reshape(-1),
            "mem_temp_c": val["mem_temp_c"].round(0).reshape(-1),
            "power_w": power.round(3).reshape(-1),
            "power_limit_w": np.full(T * G, prof.power_limit),
            "energy_j_total": energy.round(3).reshape(-1),
            "pstate_code": np.zeros(T * G, dtype=np.int64),
            "clock_event_reasons_code": reasons.reshape(-1),
            "clock_event_gpu_idle_active": (reasons & 0x1).astype(bool).reshape(-1),
            "clock_event_sw_power_cap_active": (reasons & 0x4).astype(bool).reshape(-1),
            "clock_event_hw_slowdown_active": (reasons & 0x8).astype(bool).reshape(-1),
            "clock_event_sw_thermal_slowdown_active": (reasons & 0x20).astype(bool).reshape(-1),
            "clock_event_hw_thermal_slowdown_active": (reasons & 0x40).astype(bool).reshape(-1),
            "clock_event_hw_power_brake_slowdown_active": (reasons & 0x80).astype(bool).reshape(-1),
            **{k: v.reshape(-1) for k, v in counters.items()},
            "remapped_rows_pending_active": pending.reshape(-1),
            "remapped_rows_failure_active": failure.reshape(-1),
            "pcie_link_gen_code": np.full(T * G, prof.pcie_gen, dtype=np.int64),
            "pcie_link_width_count": width.reshape(-1),
            # as the agent writes them: the most the GPU and its slot allow, asked once
            "pcie_link_width_max_count": np.full(T * G, 16, dtype=np.int64),
            "pcie_link_downtrained_active": (width < 16).reshape(-1),
            "process_count": (util > 0).astype(np.int64).reshape(-1),
        }
        if prof.gpm:
            cols["gpm_sm_util_pct"] = val["gpm_sm_util_pct"].round(2).reshape(-1)
            cols["gpm_sm_occupancy_pct"] = val["gpm_sm_occupancy_pct"].round(2).reshape(-1)
            cols["gpm_tensor_active_pct"] = (val["gpm_sm_util_pct"] * 0.6).round(2).reshape(-1)
        df = pl.DataFrame(cols)
        return df.filter(pl.Series(alive.reshape(-1)))

    def _nvlink_frame(
        self,
        time_ns: NDArray[np.int64],
        alive: NDArray[np.bool_],
        util: NDArray[np.float64],
        inc: dict[str, NDArray[np.int64]],
        link_up: NDArray[np.bool_],
        job: list[str],
        rank: list[str],
        local: list[str],
    ) -> pl.DataFrame:
        spec = self.spec
        L, G, g = spec.nvlink_links, self.n_gpu, spec.gpus_per_node
        T = len(time_ns)
        traffic = (np.repeat(util, L, axis=1) / 100 * 20e9 * spec.interval_s).astype(np.int64)
        inc["tx_bytes_total"] += traffic * link_up
        inc["rx_bytes_total"] += traffic * link_up
        vals = {}
        for k, a in inc.items():
            cum = self._nvl_counters[k] + np.cumsum(a, axis=0)
            self._nvl_counters[k] = cum[-1]
            vals[k] = cum.reshape(-1)
        li = np.arange(G * L)
        gi = li // L
        df = pl.DataFrame(
            {
                "time": np.repeat(time_ns, G * L),
                "cluster": spec.cluster,
                "node": np.tile(np.array(self.node_names)[gi // g], T),
                "gpu": np.tile((gi % g).astype(str), T),
                "gpu_uuid": np.tile(np.array([self._uuid(int(i)) for i in gi]), T),
                "gpu_model": self.profile.model,
                "job": np.tile(np.array(job)[gi], T),
                "rank": np.tile(np.array(rank)[gi], T),
                "local_rank": np.tile(np.array(local)[gi], T),
                "link": np.tile((li % L).astype(str), T),
                "link_up_active": link_up.reshape(-1),
                **vals,
            }
        )
        return df.filter(pl.Series(np.repeat(alive, L, axis=1).reshape(-1)))

    def _ib_frame(
        self,
        time_ns: NDArray[np.int64],
        inc: dict[str, NDArray[np.int64]],
        port_up: NDArray[np.bool_],
        port_alive: NDArray[np.bool_],
        factor: NDArray[np.float64],
        node_z: NDArray[np.float64],
    ) -> pl.DataFrame:
        spec = self.spec
        T, H = len(time_ns), spec.hcas_per_node
        P = self.n_port
        # Per-node traffic from AcmeTrace's IB CDFs (MB/s per node; unit not stated there),
        # its latent tied to the node's GPU load, split evenly over the node's HCAs.
        rates = []
        for i, key in enumerate(("ib_send_mb_per_s", "ib_recv_mb_per_s")):
            own = self._ar1(self._z_ib[i], T)
            latent = 0.6 * node_z + 0.8 * own
            mbps = self.cdfs[key].ppf(ndtr(latent))
            rates.append(np.repeat(mbps, H, axis=1) / H * 1e6)
        up = port_up & port_alive
        xmit = (rates[0] * factor * spec.interval_s * up).astype(np.int64)
        rcv = (rates[1] * factor * spec.interval_s * up).astype(np.int64)
        inc["port_xmit_data_bytes_total"] += xmit
        inc["port_rcv_data_bytes_total"] += rcv
        inc["port_xmit_packets_total"] += xmit // 4096
        inc["port_rcv_packets_total"] += rcv // 4096
        vals = {}
        for k, a in inc.items():
            cum = self._ib_counters[k] + np.cumsum(a, axis=0)
            self._ib_counters[k] = cum[-1]
            vals[k] = cum.reshape(-1)
        pi = np.arange(P)
        df = pl.DataFrame(
            {
                "time": np.repeat(time_ns, P),
                "cluster": spec.cluster,
                "node": np.tile(np.array(self.node_names)[pi // H], T),
                "hca": np.tile(np.array([f"mlx5_{h}" for h in pi % H]), T),
                "port": "1",
                "link_layer": "InfiniBand",
                **vals,
                "state_code": np.where(port_up, 4, 1).astype(np.int64).reshape(-1),
                "phys_state_code": np.where(port_up, 5, 3).astype(np.int64).reshape(-1),
                "rate_gbps": np.full(T * P, IB_RATE_GBPS),
            }
        )
        return df.filter(pl.Series(port_alive.reshape(-1)))


# The tag columns of each generated measurement: the catalogue's, declared there once.
TAGS: dict[str, list[str]] = {m: list(CATALOGUE[m].tags) for m in MEASUREMENTS}
