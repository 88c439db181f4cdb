"""Fault types, their defaults, and faults drawn from the real StepFun process.

Every fault has a documented telemetry signature (the catalogue fields it moves), a precursor
where the failure mode has one, an onset, and a repair time. The signatures are applied in
:mod:`simulation.generator`; this module decides *which* faults happen *when*.

The StepFun process (InfiniteHBD trace, 584 faults on 400 servers over 349 days) is replayed,
not re-invented: a random subset of its servers is mapped onto the simulated nodes (so a server
that failed repeatedly stays a "lemon" here), a random window of its timeline is taken and
compressed by ``compression``, and each fault's class and description decide its type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.faulttrace import STEPFUN_DAYS, STEPFUN_SERVERS, FaultRecord, stepfun_faults
from simulation.calibration import summit_xid_weights
from simulation.spec import FaultSpec, ScenarioSpec


@dataclass(frozen=True)
class FaultDefaults:
    precursor_s: float
    duration_s: float
    severity: float
    fatal: bool
    signature: str


DAY = 86_400.0

DEFAULTS: dict[str, FaultDefaults] = {
    "xid79": FaultDefaults(
        0, 6 * 3600, 1.0, True, "gpu_event xid 79; the GPU's gpu/gpu_nvlink points stop"
    ),
    "ecc_row_remap": FaultDefaults(
        7200,
        DAY,
        1.0,
        True,
        "precursor: ecc_sbe_volatile_total growth accelerates, remapped_rows_correctable_total "
        "steps, remapped_rows_pending_active; onset: gpu_event xid 48/63/64/94/95, "
        "ecc_dbe_volatile_total +1, remapped_rows_uncorrectable_total +1, "
        "remapped_rows_failure_active (xid 64/95)",
    ),
    "nvlink_crc_storm": FaultDefaults(
        1800,
        12 * 3600,
        1.0,
        True,
        "precursor: gpu_nvlink crc_flit_errors_total/replay_errors_total grow on one link; "
        "onset: gpu_event xid 74, link_up_active false, recovery_errors_total +1",
    ),
    "pcie_replay": FaultDefaults(
        3600,
        0,
        0.15,
        False,
        "pcie_replay_total growth; onset: pcie_link_width_count 16 -> 8, the rank slows",
    ),
    "thermal_slowdown": FaultDefaults(
        1200,
        0,
        0.3,
        False,
        "precursor: gpu_temp_c climbs; onset: clock_event_sw/hw_thermal_slowdown_active, "
        "sm_clock_mhz down by severity, the rank slows",
    ),
    "power_brake": FaultDefaults(
        0,
        0,
        0.5,
        False,
        "every GPU of the node: clock_event_hw_power_brake_slowdown_active, sm_clock_mhz and "
        "power_w down, the node's ranks slow",
    ),
    "ib_flap": FaultDefaults(
        3600,
        4 * 3600,
        1.0,
        True,
        "precursor: ib_port symbol_error_total grows, link_error_recovery_total steps; onset: "
        "link_downed_total +1 per flap, state_code 1 / phys_state_code 3 while down, "
        "traffic stops while down",
    ),
    "tor_congestion": FaultDefaults(
        0,
        0,
        0.4,
        False,
        "every port under one ToR: port_xmit_wait_total and CNP counters climb, "
        "np_ecn_marked_roce_packets_total grows, those nodes' ranks slow",
    ),
    "slow_gpu": FaultDefaults(
        0, 0, 0.25, False, "sm_clock_mhz and power_w down on one GPU; its rank's step_time_s up"
    ),
    "slow_stage": FaultDefaults(
        0, 0, 0.3, False, "every rank of one pipeline stage: step_time_s up (no hardware cause)"
    ),
    "hang": FaultDefaults(
        0,
        1800,
        1.0,
        True,
        "job_step points stop; the job's GPUs show gpu_util_pct 100 at low power_w (NCCL "
        "spinning), but GPU `gpu` of node `node`, if the job runs there, is idle (the rank that "
        "never reached the collective)",
    ),
    "node_down": FaultDefaults(0, DAY, 1.0, True, "every point from the node stops"),
    "config_drift": FaultDefaults(
        0,
        0,
        1.0,
        False,
        "gpu_info (every 600 s): the node's GPUs report an older driver_version; GPU `gpu` has "
        "ecc_mode_active false with ecc_mode_pending_active true (set up unlike the fleet)",
    ),
}


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


def _draw_xid(rng: np.random.Generator, among: tuple[int, ...]) -> int:
    weights = summit_xid_weights()
    codes = [c for c in among if c in weights]
    if not codes:
        return among[0]
    w = np.array([weights[c] for c in codes], dtype=float)
    return int(rng.choice(codes, p=w / w.sum()))


def resolve(
    spec: FaultSpec,
    index: int,
    duration_s: float,
    rng: np.random.Generator,
    origin: str = "scenario file",
) -> Fault:
    d = DEFAULTS[spec.type]
    pre = d.precursor_s if spec.precursor_s < 0 else spec.precursor_s
    pre = min(pre, spec.at_s)
    dur = spec.duration_s or d.duration_s or duration_s
    xid = spec.xid
    if spec.type == "ecc_row_remap" and not xid:
        xid = _draw_xid(rng, (48, 63, 64))
    fatal = d.fatal and not (spec.type == "ecc_row_remap" and xid == 63)
    xid = xid or {"xid79": 79, "nvlink_crc_storm": 74}.get(spec.type, 0)
    return Fault(
        fault_id=f"f{index:04d}-{spec.type}",
        type=spec.type,
        node=spec.node,
        gpu=spec.gpu,
        hca=spec.hca,
        link=spec.link,
        stage=spec.stage,
        job=spec.job,
        precursor_start_s=spec.at_s - pre,
        onset_s=spec.at_s,
        end_s=min(spec.at_s + dur, float(duration_s)),
        severity=d.severity if spec.severity < 0 else spec.severity,
        xid=xid,
        fatal=fatal,
        origin=origin,
    )


def stepfun_type(rec: FaultRecord, rng: np.random.Generator) -> tuple[str, int]:
    """Map a StepFun fault (Class, Desc) to a fault type and the XID it raises, if any."""
    c, d = rec.klass, rec.desc
    if c == "GPU":
        if "ECC" in d:
            return "ecc_row_remap", 48 if "DBE" in d else 63
        if d in ("GPU device unknow error", "GPU Lost", "GPU device not found"):
            return "xid79", 79
        if d == "nvidia-smi Timeout":
            return "xid79", 79
        if d == "GPU xid Error":
            xid = _draw_xid(rng, (48, 63, 64, 74, 79))
            kind = {74: "nvlink_crc_storm", 79: "xid79"}.get(xid, "ecc_row_remap")
            return kind, xid
        if "PCI link width" in d:
            return "pcie_replay", 0
        if "Temperature" in d:
            return "thermal_slowdown", 0
        if "P2P" in d:
            return "nvlink_crc_storm", 74
        return "xid79", 79
    if c == "Fan":
        return "thermal_slowdown", 0
    if c == "Power Supply":
        return "power_brake", 0
    if c in ("Parameter Plane Cable", "NIC") or "Optical" in d:
        return "ib_flap", 0
    return "node_down", 0


def stepfun_process(
    scenario: ScenarioSpec, compression: float, start_s: float, rng: np.random.Generator
) -> list[tuple[FaultSpec, str]]:
    """Faults from a random window of the real StepFun trace, mapped onto this cluster."""
    records = stepfun_faults()
    servers = sorted({r.node for r in records})
    # The trace lists only servers that failed; the rest of its 400 never did.
    pool = servers + [f"never-failed-{i}" for i in range(STEPFUN_SERVERS - len(servers))]
    chosen = rng.choice(len(pool), size=min(scenario.nodes, len(pool)), replace=False)
    node_of = {pool[i]: k for k, i in enumerate(chosen)}
    window_d = (scenario.duration_s - start_s) * compression / DAY
    w0 = float(rng.uniform(0.0, max(0.0, STEPFUN_DAYS - window_d)))
    out: list[tuple[FaultSpec, str]] = []
    for rec in sorted(records, key=lambda r: r.start_d):
        if rec.node not in node_of or not w0 <= rec.start_d < w0 + window_d:
            continue
        kind, xid = stepfun_type(rec, rng)
        at = start_s + (rec.start_d - w0) * DAY / compression
        repair = max(60.0, (rec.end_d - rec.start_d) * DAY / compression)
        spec = FaultSpec(
            type=kind,
            at_s=round(at),
            node=node_of[rec.node],
            gpu=int(rng.integers(scenario.gpus_per_node)),
            hca=int(rng.integers(scenario.hcas_per_node)),
            duration_s=round(repair),
            xid=xid if kind == "ecc_row_remap" else 0,
        )
        out.append((spec, f"StepFun: {rec.level} / {rec.klass} / {rec.desc}"))
    return out


def resolve_all(scenario: ScenarioSpec, rng: np.random.Generator) -> list[Fault]:
    specs: list[tuple[FaultSpec, str]] = [(f, "scenario file") for f in scenario.faults]
    if scenario.stepfun is not None:
        specs += stepfun_process(
            scenario, scenario.stepfun.compression, scenario.stepfun.start_s, rng
        )
    ordered = sorted(specs, key=lambda p: p[0].at_s)
    return [
        resolve(fs, i, scenario.duration_s, rng, origin) for i, (fs, origin) in enumerate(ordered)
    ]
