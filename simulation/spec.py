"""Scenario specifications: TOML files describing a simulated cluster, its jobs and its faults.

The named library lives in ``simulation/library/``; ``gpuwarden replay list`` shows it.
A spec is data only; :mod:`simulation.generator` turns it into telemetry.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwarden.core.timeparse import parse_iso
from gpuwarden.simulation.errors import SimulationError
from gpuwarden.simulation.faulttypes import FAULT_TYPES, REGISTRY


class ScenarioError(SimulationError):
    """A scenario file is malformed or asks for something the generator cannot do."""


MEASUREMENTS = (
    "gpu",
    "gpu_info",
    "gpu_nvlink",
    "gpu_event",
    "ib_port",
    "job_step",
    "job_heartbeat",
    "job_model",
    "scenario_fault",
)


@dataclass(frozen=True)
class JobSpec:
    name: str
    nodes: int
    tp: int = 8
    pp: int = 1
    step_time_s: float = 6.0
    step_jitter_ratio: float = 0.02
    tokens_per_step: int = 4 * 2**20
    report_every_steps: int = 1
    checkpoint_interval_s: float = 1800.0
    restart_s: float = 600.0
    params_count: int = 70_000_000_000
    layers_count: int = 80
    hidden_size_count: int = 8192
    heads_count: int = 64
    seq_len_tokens: int = 4096
    dtype: str = "bf16"
    recompute_active: bool = False


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault. ``at_s`` is the onset (seconds after the scenario start); a
    precursor, where the type has one, runs for ``precursor_s`` before it; the fault lasts
    ``duration_s`` after onset (repair time; 0 = to the end of the scenario)."""

    type: str
    at_s: float
    node: int = 0
    gpu: int = 0
    hca: int = 0
    link: int = 0
    stage: int = 0
    job: str = ""
    precursor_s: float = -1.0  # -1: the type's default
    duration_s: float = 0.0
    severity: float = -1.0  # -1: the type's default
    xid: int = 0  # ecc_row_remap: which XID the onset raises (0: drawn from the real mix)


@dataclass(frozen=True)
class StepfunSpec:
    """Faults drawn from the StepFun process (InfiniteHBD trace): arrivals, type mix and
    repair times, scaled to this cluster's size and compressed in time by ``compression``."""

    compression: float = 1.0
    start_s: float = 0.0


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    description: str = ""
    cluster: str = "sim"
    nodes: int = 16
    gpus_per_node: int = 8
    hcas_per_node: int = 8
    nvlink_links: int = 0
    gpu_model: str = "A100"
    duration_s: int = 3600
    interval_s: int = 1
    start: str = "2026-01-05T00:00:00Z"
    measurements: tuple[str, ...] = MEASUREMENTS
    jobs: tuple[JobSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    stepfun: StepfunSpec | None = None

    @property
    def start_ns(self) -> int:
        return int(parse_iso(self.start).timestamp()) * 1_000_000_000

    def validate(self) -> ScenarioSpec:
        where = f"scenario {self.name!r}"
        if self.nodes < 1 or self.gpus_per_node < 1 or self.hcas_per_node < 1:
            raise ScenarioError(f"{where}: nodes, gpus_per_node and hcas_per_node must be >= 1")
        if self.interval_s < 1 or self.duration_s < self.interval_s:
            raise ScenarioError(f"{where}: need interval_s >= 1 and duration_s >= interval_s")
        if self.gpu_model not in ("A100", "H100"):
            raise ScenarioError(f"{where}: gpu_model must be 'A100' or 'H100'")
        unknown = set(self.measurements) - set(MEASUREMENTS)
        if unknown:
            raise ScenarioError(f"{where}: unknown measurements {sorted(unknown)}")
        used = 0
        for job in self.jobs:
            if job.nodes < 1 or job.tp < 1 or job.pp < 1:
                raise ScenarioError(f"{where}: job {job.name!r}: nodes, tp, pp must be >= 1")
            world = job.nodes * self.gpus_per_node
            if world % (job.tp * job.pp):
                raise ScenarioError(
                    f"{where}: job {job.name!r}: {world} ranks do not split into "
                    f"tp={job.tp} x pp={job.pp}"
                )
            used += job.nodes
        if used > self.nodes:
            raise ScenarioError(f"{where}: jobs need {used} nodes, the cluster has {self.nodes}")
        names = {j.name for j in self.jobs}
        for f in self.faults:
            if f.type not in FAULT_TYPES:
                raise ScenarioError(f"{where}: unknown fault type {f.type!r}; one of {FAULT_TYPES}")
            if not 0 <= f.at_s <= self.duration_s:
                raise ScenarioError(f"{where}: fault {f.type} at_s={f.at_s} is outside the run")
            if not 0 <= f.node < self.nodes or not 0 <= f.gpu < self.gpus_per_node:
                raise ScenarioError(f"{where}: fault {f.type} names node/gpu outside the cluster")
            if not 0 <= f.hca < self.hcas_per_node:
                raise ScenarioError(f"{where}: fault {f.type} names hca {f.hca}")
            if REGISTRY[f.type].needs_job and f.job not in names:
                raise ScenarioError(f"{where}: fault {f.type} needs job = one of {sorted(names)}")
        if self.stepfun is not None and self.stepfun.compression <= 0:
            raise ScenarioError(f"{where}: stepfun.compression must be > 0")
        return self


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {sorted(unknown)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def parse_spec(data: dict[str, Any], default_name: str = "scenario") -> ScenarioSpec:
    data = dict(data)
    name = str(data.pop("name", default_name))
    jobs = tuple(_build(JobSpec, j, f"{name}: job") for j in data.pop("jobs", []))
    faults = tuple(_build(FaultSpec, f, f"{name}: fault") for f in data.pop("faults", []))
    sf = data.pop("stepfun", None)
    stepfun = _build(StepfunSpec, sf, f"{name}: stepfun") if sf is not None else None
    if "measurements" in data:
        data["measurements"] = tuple(data["measurements"])
    spec = _build(
        ScenarioSpec,
        {**data, "name": name, "jobs": jobs, "faults": faults, "stepfun": stepfun},
        name,
    )
    return spec.validate()  # type: ignore[no-any-return]


def load_spec(path_or_name: str | Path) -> ScenarioSpec:
    """A TOML file, or the name of a scenario in the shipped library."""
    path = Path(path_or_name)
    if path.suffix == ".toml" or path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(f"cannot read scenario {path}: {exc}") from None
        default = path.stem
    else:
        res = resources.files("gpuwarden.simulation.library").joinpath(f"{path_or_name}.toml")
        if not res.is_file():
            raise ScenarioError(
                f"no scenario {str(path_or_name)!r}; the library has {library_names()}"
            )
        text, default = res.read_text(encoding="utf-8"), str(path_or_name)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"scenario {path_or_name}: {exc}") from None
    return parse_spec(data, default)


def library_names() -> list[str]:
    lib = resources.files("gpuwarden.simulation.library")
    return sorted(p.name[:-5] for p in lib.iterdir() if p.name.endswith(".toml"))
