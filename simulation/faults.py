"""Which faults happen when: the scenario file's, and faults drawn from the real StepFun process.

Every fault type (:mod:`simulation.faulttypes`) owns its defaults and its telemetry signature
(the catalogue fields it moves), a precursor where the failure mode has one, an onset, and a
repair time; this module decides *which* faults happen *when*, and resolves each into a
:class:`~simulation.faulttypes.Fault`.

The StepFun process (InfiniteHBD trace, 584 faults on 400 servers over 349 days) is replayed,
not re-invented: a random subset of its servers is mapped onto the simulated nodes (so a server
that failed repeatedly stays a "lemon" here), a random window of its timeline is taken and
compressed by ``compression``, and each fault's class and description decide its type.
"""

from __future__ import annotations

import numpy as np

from gpuwarden.core.faulttrace import STEPFUN_DAYS, STEPFUN_SERVERS, FaultRecord, stepfun_faults
from gpuwarden.simulation.faulttypes import DAY, DEFAULTS, REGISTRY, Fault, FaultDefaults, draw_xid
from gpuwarden.simulation.spec import FaultSpec, ScenarioSpec


def resolve(
    spec: FaultSpec,
    index: int,
    duration_s: float,
    rng: np.random.Generator,
    origin: str = "scenario file",
) -> Fault:
    kind = REGISTRY[spec.type]
    d = kind.defaults
    pre = d.precursor_s if spec.precursor_s < 0 else spec.precursor_s
    pre = min(pre, spec.at_s)
    dur = spec.duration_s or d.duration_s or duration_s
    xid = kind.choose_xid(spec.xid, rng)
    fatal = kind.is_fatal(xid)
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
            xid = draw_xid(rng, (48, 63, 64, 74, 79))
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


__all__ = ["DEFAULTS", "Fault", "FaultDefaults", "resolve", "resolve_all", "stepfun_process"]
