"""Fault types, each owning its whole signature, found by name in one registry.

A fault type says, in one class: its defaults (precursor, duration, severity, whether it is
fatal) and the signature text the ground truth carries; which XID it raises; what it does to
the telemetry of a chunk (:meth:`FaultType.telemetry`: exactly the catalogue fields of its
signature, moved in place on the chunk's arrays); how it slows the ranks of a job
(:meth:`FaultType.slowdown`); and what it does to a job (stop it, hang it, take its node
down). The generator and the job timeline ask the registry; neither names a fault type.

Adding a fault type is a class here with ``@register``. The order of registration is the
order scenario errors list the types in.

Every draw a signature makes comes from the chunk's generator, in the order the faults are
listed, so a (scenario, seed) pair gives the same telemetry whatever else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from gpuwarden.simulation.calibration import summit_xid_weights

DAY = 86_400.0
IB_RATE_GBPS = 200.0
FLAP_PERIOD_S = 600.0
FLAP_DOWN_S = 60.0


@dataclass(frozen=True)
class FaultDefaults:
    precursor_s: float
    duration_s: float
    severity: float
    fatal: bool
    signature: str


@dataclass(frozen=True)
class Fault:
    """A resolved injected fault: absolute offsets in seconds from the scenario start."""

    fault_id: str
    type: str
    node: int
    gpu: int
    hca: int
    link: int
    stage: int
    job: str
    precursor_start_s: float
    onset_s: float
    end_s: float
    severity: float
    xid: int
    fatal: bool
    origin: str

    def active(self, t: float) -> bool:
        return self.onset_s <= t < self.end_s


@dataclass
class Chunk:
    """One chunk of ticks as arrays that signatures move in place: ``T`` ticks by ``G`` GPUs,
    ``G * L`` NVLinks, ``P`` ports. Counter arrays hold this chunk's increments."""

    tt: NDArray[np.float64]
    dt: float
    gpus_per_node: int
    hcas_per_node: int
    links: int
    rng: np.random.Generator
    switch_of: list[str]
    jobs: list[Any]  # JobPlan, by job index
    jidx: NDArray[np.int64]  # each GPU's job index, -1 for none
    power_limit: float
    util: NDArray[np.float64]
    power: NDArray[np.float64]
    temp: NDArray[np.float64]
    sm: NDArray[np.float64]
    reasons: NDArray[np.int64]
    alive: NDArray[np.bool_]
    inc: dict[str, NDArray[np.int64]]
    pending: NDArray[np.bool_]
    failure: NDArray[np.bool_]
    width: NDArray[np.int64]
    nvl_inc: dict[str, NDArray[np.int64]]
    link_up: NDArray[np.bool_]
    ib_inc: dict[str, NDArray[np.int64]]
    port_up: NDArray[np.bool_]
    port_alive: NDArray[np.bool_]
    ib_factor: NDArray[np.float64]


@dataclass(frozen=True)
class Window:
    """Where a fault is in a chunk: per tick, in its precursor, on, or at its onset tick; how
    far through the precursor (0 to 1); and the index of its GPU."""

    pre: NDArray[np.bool_]
    on: NDArray[np.bool_]
    onset_tick: NDArray[np.bool_]
    frac: NDArray[np.float64]
    gi: int


@dataclass(frozen=True)
class Ranks:
    """A job's ranks: the node index, the GPU and the pipeline stage of each."""

    node: NDArray[np.int64]
    gpu: NDArray[np.int64]
    stage: NDArray[np.int64]


class FaultType:
    name: ClassVar[str]
    defaults: ClassVar[FaultDefaults]
    #: the ground truth names the GPU (``gpu``) or the port (``hca``, ``port``) it hits
    gpu_scoped: ClassVar[bool] = False
    port_scoped: ClassVar[bool] = False
    #: the job stays on its GPUs making no progress until the fault ends (NCCL hang)
    hangs: ClassVar[bool] = False
    #: the node reports another configuration in ``gpu_info`` while the fault is on
    drifts_config: ClassVar[bool] = False
    #: the scenario file must name the job it hits (``job = ...``)
    needs_job: ClassVar[bool] = False
    #: what a straggler this fault slows should be blamed on (the attribution's vocabulary:
    #: gpu, pcie, power, nic, stage); None for a fault that slows no rank
    cause: ClassVar[str | None] = None

    def choose_xid(self, given: int, rng: np.random.Generator) -> int:
        """The XID the fault raises at onset (0: none); ``given`` is the scenario file's."""
        return given

    def is_fatal(self, xid: int) -> bool:
        return self.defaults.fatal

    def stops(self, f: Fault, job: str, nodes: list[int]) -> bool:
        """Whether ``f`` stops (or hangs) ``job`` running on ``nodes``."""
        return f.fatal and f.node in nodes

    def downs_node(self, f: Fault) -> bool:
        """Whether ``f`` takes its node out while it lasts (a restart avoids the node)."""
        return f.fatal

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        """Move the fields of this fault's signature in chunk ``c`` (nothing by default)."""

    def slowdown(self, f: Fault, job: str, ranks: Ranks, switch_of: list[str]) -> Any:
        """A boolean mask of the ranks ``f`` slows by its severity (None: none)."""
        return None


REGISTRY: dict[str, FaultType] = {}


def register(cls: type[FaultType]) -> type[FaultType]:
    REGISTRY[cls.name] = cls()
    return cls


def draw_xid(rng: np.random.Generator, among: tuple[int, ...]) -> int:
    """One of ``among``, weighted by how often the REAL Summit fleet logged each XID."""
    weights = summit_xid_weights()
    codes = [c for c in among if c in weights]
    if not codes:
        return among[0]
    w = np.array([weights[c] for c in codes], dtype=float)
    return int(rng.choice(codes, p=w / w.sum()))


def _one_gpu(f: Fault, ranks: Ranks) -> Any:
    return (ranks.node == f.node) & (ranks.gpu == f.gpu)


@register
class Xid79(FaultType):
    name = "xid79"
    defaults = FaultDefaults(
        0, 6 * 3600, 1.0, True, "gpu_event xid 79; the GPU's gpu/gpu_nvlink points stop"
    )
    gpu_scoped = True

    def choose_xid(self, given: int, rng: np.random.Generator) -> int:
        return given or 79

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        c.alive[np.ix_(w.on, np.array([w.gi]))] = False


@register
class EccRowRemap(FaultType):
    name = "ecc_row_remap"
    defaults = FaultDefaults(
        7200,
        DAY,
        1.0,
        True,
        "precursor: ecc_sbe_volatile_total growth accelerates, remapped_rows_correctable_total "
        "steps, remapped_rows_pending_active; onset: gpu_event xid 48/63/64/94/95, "
        "ecc_dbe_volatile_total +1, remapped_rows_uncorrectable_total +1, "
        "remapped_rows_failure_active (xid 64/95)",
    )
    gpu_scoped = True

    def choose_xid(self, given: int, rng: np.random.Generator) -> int:
        return given or draw_xid(rng, (48, 63, 64))

    def is_fatal(self, xid: int) -> bool:
        return self.defaults.fatal and xid != 63  # a corrected-and-remapped error

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        tt, dt, gi, pre = c.tt, c.dt, w.gi, w.pre
        rate = 0.01 * np.exp(5.0 * w.frac)  # SBE/s, x150 over the precursor
        c.inc["ecc_sbe_volatile_total"][:, gi] += c.rng.poisson(rate * dt * pre)
        for q in (0.3, 0.6, 0.85):
            mark = f.precursor_start_s + q * (f.onset_s - f.precursor_start_s)
            hit = (tt <= mark) & (mark < tt + dt) & pre
            c.inc["remapped_rows_correctable_total"][hit, gi] += 1
        c.pending[
            (tt >= f.precursor_start_s + 0.6 * (f.onset_s - f.precursor_start_s)) & (tt < f.end_s),
            gi,
        ] = True
        if f.xid != 63:
            c.inc["ecc_dbe_volatile_total"][w.onset_tick, gi] += 1
            c.inc["remapped_rows_uncorrectable_total"][w.onset_tick, gi] += 1
        if f.xid in (64, 95):
            c.failure[w.on, gi] = True


@register
class NvlinkCrcStorm(FaultType):
    name = "nvlink_crc_storm"
    defaults = FaultDefaults(
        1800,
        12 * 3600,
        1.0,
        True,
        "precursor: gpu_nvlink crc_flit_errors_total/replay_errors_total grow on one link; "
        "onset: gpu_event xid 74, link_up_active false, recovery_errors_total +1",
    )
    gpu_scoped = True

    def choose_xid(self, given: int, rng: np.random.Generator) -> int:
        return given or 74

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        L = c.links  # noqa: N806
        if not L:
            return
        li = w.gi * L + min(f.link, L - 1)
        rate = 0.05 * np.exp(6.0 * w.frac)
        both = w.pre | w.on
        c.nvl_inc["crc_flit_errors_total"][:, li] += c.rng.poisson(rate * c.dt * both)
        c.nvl_inc["replay_errors_total"][:, li] += c.rng.poisson(0.3 * rate * c.dt * both)
        c.nvl_inc["recovery_errors_total"][w.onset_tick, li] += 1
        c.link_up[w.on, li] = False


@register
class PcieReplay(FaultType):
    name = "pcie_replay"
    cause = "pcie"
    defaults = FaultDefaults(
        3600,
        0,
        0.15,
        False,
        "pcie_replay_total growth; onset: pcie_link_width_count 16 -> 8, the rank slows",
    )
    gpu_scoped = True

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        rate = 0.1 * np.exp(4.0 * w.frac)
        c.inc["pcie_replay_total"][:, w.gi] += c.rng.poisson(rate * c.dt * (w.pre | w.on))
        c.width[w.on, w.gi] = 8

    def slowdown(self, f: Fault, job: str, ranks: Ranks, switch_of: list[str]) -> Any:
        return _one_gpu(f, ranks)


@register
class ThermalSlowdown(FaultType):
    name = "thermal_slowdown"
    cause = "gpu"
    defaults = FaultDefaults(
        1200,
        0,
        0.3,
        False,
        "precursor: gpu_temp_c climbs; onset: clock_event_sw/hw_thermal_slowdown_active, "
        "sm_clock_mhz down by severity, the rank slows",
    )
    gpu_scoped = True

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        gi, on = w.gi, w.on
        c.temp[:, gi] = np.where(w.pre, c.temp[:, gi] + 30 * w.frac, c.temp[:, gi])
        c.temp[on, gi] = np.maximum(c.temp[on, gi], 89.0)
        c.sm[on, gi] *= 1 - f.severity
        c.reasons[on, gi] |= 0x20 | 0x40

    def slowdown(self, f: Fault, job: str, ranks: Ranks, switch_of: list[str]) -> Any:
        return _one_gpu(f, ranks)


@register
class PowerBrake(FaultType):
    name = "power_brake"
    cause = "power"
    defaults = FaultDefaults(
        0,
        0,
        0.5,
        False,
        "every GPU of the node: clock_event_hw_power_brake_slowdown_active, sm_clock_mhz and "
        "power_w down, the node's ranks slow",
    )

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        g = c.gpus_per_node
        cols = np.arange(f.node * g, f.node * g + g)
        c.sm[np.ix_(w.on, cols)] *= 1 - f.severity
        c.power[np.ix_(w.on, cols)] *= 1 - f.severity
        c.reasons[np.ix_(w.on, cols)] |= 0x80 | 0x8

    def slowdown(self, f: Fault, job: str, ranks: Ranks, switch_of: list[str]) -> Any:
        return ranks.node == f.node


@register
class IbFlap(FaultType):
    name = "ib_flap"
    defaults = FaultDefaults(
        3600,
        4 * 3600,
        1.0,
        True,
        "precursor: ib_port symbol_error_total grows, link_error_recovery_total steps; onset: "
        "link_downed_total +1 per flap, state_code 1 / phys_state_code 3 while down, "
        "traffic stops while down",
    )
    port_scoped = True

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        pi = f.node * c.hcas_per_node + f.hca
        dt, on = c.dt, w.on
        rate = 0.5 * np.exp(5.0 * w.frac)
        c.ib_inc["symbol_error_total"][:, pi] += c.rng.poisson(rate * dt * (w.pre | on))
        c.ib_inc["link_error_recovery_total"][:, pi] += c.rng.poisson(
            0.002 * np.exp(5.0 * w.frac) * dt * w.pre
        )
        since = c.tt - f.onset_s
        down = on & ((since % FLAP_PERIOD_S) < FLAP_DOWN_S)
        flap_start = on & ((since % FLAP_PERIOD_S) < dt)
        c.ib_inc["link_downed_total"][flap_start, pi] += 1
        c.port_up[down, pi] = False


@register
class TorCongestion(FaultType):
    name = "tor_congestion"
    cause = "nic"
    defaults = FaultDefaults(
        0,
        0,
        0.4,
        False,
        "every port under one ToR: port_xmit_wait_total and CNP counters climb, "
        "np_ecn_marked_roce_packets_total grows, those nodes' ranks slow",
    )

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        H = c.hcas_per_node  # noqa: N806
        sw = c.switch_of[f.node]
        ports = np.array(
            [n * H + h for n, s in enumerate(c.switch_of) if s == sw for h in range(H)]
        )
        on, dt = w.on, c.dt
        sel = np.ix_(on, ports)
        n_on, n_p = int(on.sum()), len(ports)
        # xmit_wait ticks are 8 bytes of lost send opportunity (NVIDIA, ibdiagnet
        # "congestion assessment"): half the severity of the link's bandwidth is lost.
        c.ib_inc["port_xmit_wait_total"][sel] += c.rng.poisson(
            0.5 * f.severity * IB_RATE_GBPS * 1e9 / 64 * dt, (n_on, n_p)
        )
        c.ib_inc["np_cnp_sent_total"][sel] += c.rng.poisson(2e4 * f.severity * dt, (n_on, n_p))
        c.ib_inc["rp_cnp_handled_total"][sel] += c.rng.poisson(2e4 * f.severity * dt, (n_on, n_p))
        c.ib_inc["np_ecn_marked_roce_packets_total"][sel] += c.rng.poisson(
            5e4 * f.severity * dt, (n_on, n_p)
        )
        c.ib_factor[sel] *= 1 - 0.5 * f.severity

    def slowdown(self, f: Fault, job: str, ranks: Ranks, switch_of: list[str]) -> Any:
        sw = switch_of[f.node]
        under = [i for i, s in enumerate(switch_of) if s == sw]
        return np.isin(ranks.node, under)


@register
class SlowGpu(FaultType):
    name = "slow_gpu"
    cause = "gpu"
    defaults = FaultDefaults(
        0, 0, 0.25, False, "sm_clock_mhz and power_w down on one GPU; its rank's step_time_s up"
    )
    gpu_scoped = True

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        c.sm[w.on, w.gi] *= 1 - 0.6 * f.severity
        c.power[w.on, w.gi] *= 1 - 0.5 * f.severity

    def slowdown(self, f: Fault, job: str, ranks: Ranks, switch_of: list[str]) -> Any:
        return _one_gpu(f, ranks)


@register
class SlowStage(FaultType):
    name = "slow_stage"
    cause = "stage"
    defaults = FaultDefaults(
        0, 0, 0.3, False, "every rank of one pipeline stage: step_time_s up (no hardware cause)"
    )
    needs_job = True

    def slowdown(self, f: Fault, job: str, ranks: Ranks, switch_of: list[str]) -> Any:
        return ranks.stage == f.stage if f.job == job else None


@register
class Hang(FaultType):
    name = "hang"
    defaults = FaultDefaults(
        0,
        1800,
        1.0,
        True,
        "job_step points stop; the job's GPUs show gpu_util_pct 100 at low power_w (NCCL "
        "spinning), but GPU `gpu` of node `node`, if the job runs there, is idle (the rank that "
        "never reached the collective)",
    )
    hangs = True
    needs_job = True

    def stops(self, f: Fault, job: str, nodes: list[int]) -> bool:
        return f.job == job

    def downs_node(self, f: Fault) -> bool:
        return False  # the node is fine; the job is stuck

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        on, gi = w.on, w.gi
        for j, jp in enumerate(c.jobs):
            if jp.spec.name == f.job:
                cols = np.nonzero(c.jidx == j)[0]
                c.util[np.ix_(on, cols)] = 100.0
                c.power[np.ix_(on, cols)] = 0.3 * c.power_limit
                if gi in cols:  # the rank that never reached the collective: idle
                    c.util[on, gi] = 0.0
                    c.power[on, gi] = 0.15 * c.power_limit


@register
class NodeDown(FaultType):
    name = "node_down"
    defaults = FaultDefaults(0, DAY, 1.0, True, "every point from the node stops")

    def telemetry(self, c: Chunk, f: Fault, w: Window) -> None:
        g, H = c.gpus_per_node, c.hcas_per_node  # noqa: N806
        cols = np.array(range(f.node * g, f.node * g + g))
        c.alive[np.ix_(w.on, cols)] = False
        c.port_alive[np.ix_(w.on, np.arange(f.node * H, f.node * H + H))] = False


@register
class ConfigDrift(FaultType):
    name = "config_drift"
    defaults = FaultDefaults(
        0,
        0,
        1.0,
        False,
        "gpu_info (every 600 s): the node's GPUs report an older driver_version; GPU `gpu` has "
        "ecc_mode_active false with ecc_mode_pending_active true (set up unlike the fleet)",
    )
    drifts_config = True


FAULT_TYPES: tuple[str, ...] = tuple(REGISTRY)
DEFAULTS: dict[str, FaultDefaults] = {name: t.defaults for name, t in REGISTRY.items()}


def of(f: Fault) -> FaultType:
    """The type of a resolved fault."""
    return REGISTRY[f.type]
