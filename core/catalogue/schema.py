"""What a measurement, a field and a tag are (:class:`Measurement`, :class:`FieldSpec`),
the shared tags and value ranges, and the registry the family modules add to in order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class FieldType(StrEnum):
    """InfluxDB field types, named as InfluxQL's ``SHOW FIELD KEYS`` reports them."""

    FLOAT = "float"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    STRING = "string"


class Kind(StrEnum):
    """How a field behaves over time; analytics and dashboards pick rate() or last() by this."""

    GAUGE = "gauge"
    COUNTER = "counter"  # monotonic raw total; may reset (driver reload) or saturate (32-bit IB)
    STATE = "state"  # enumeration or flag
    INFO = "info"  # descriptive text or identifier


class Producer(StrEnum):
    AGENT = "agent"
    REPORTER = "reporter"  # the training-side reporter imported by a training loop
    ANALYTICS = "analytics"
    REMEDIATION = "remediation"
    SCENARIO = "scenario"  # simulated scenarios: the ground truth of what was injected


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    type: FieldType
    unit: str
    kind: Kind
    description: str
    valid: tuple[float, float] | None = None  # physical range of a hardware reading


@dataclass(frozen=True, slots=True)
class Measurement:
    name: str
    producer: Producer
    description: str
    tags: tuple[str, ...]
    fields: Mapping[str, FieldSpec]

    def field(self, name: str) -> FieldSpec:
        try:
            return self.fields[name]
        except KeyError:
            raise KeyError(f"field {name!r} is not in the catalogue for {self.name!r}") from None


# Tags, each described once. Every measurement's tag set is a subset of these.
TAGS: Mapping[str, str] = MappingProxyType(
    {
        "cluster": "cluster name from the agent configuration",
        "node": "host name of the node",
        "gpu": "GPU index on the node as NVML enumerates it (0-based)",
        "gpu_uuid": "GPU UUID (GPU-xxxxxxxx-...), stable across reboots and re-enumeration",
        "gpu_model": "GPU product name, e.g. 'NVIDIA H100 80GB HBM3'",
        "link": "NVLink index on the GPU",
        "hca": "InfiniBand host channel adapter name, e.g. mlx5_0",
        "port": "HCA port number (1-based)",
        "link_layer": "InfiniBand or Ethernet (RoCE)",
        "switch": "switch the port's host hangs off (ToR), from the topology",
        "domain": "power domain: RAPL zone (package-0, dram) or hwmon sensor label",
        "zone": "thermal zone or hwmon chip name",
        "sensor": "sensor label within a zone or chip",
        "source": "which collector or analysis produced the point",
        "job": "scheduler job id (Slurm job id, Kubernetes pod, torchrun run id)",
        "rank": "global rank of the training process",
        "local_rank": "rank within the node",
        "dp_rank": "data-parallel rank",
        "stage": "pipeline-parallel stage",
        "event": "event type: xid, gpu_lost, ecc_dbe, row_remap_failure, link_down, ...",
        "severity": "info, warning, critical",
        "kind": "finding kind, e.g. gpu_xid, straggler, link_congested, failure_risk",
        "horizon": "prediction horizon, e.g. 10m, 1h, 24h",
        "action": "remediation action: notify, checkpoint, cordon, drain, requeue, uncordon",
        "adapter": "remediation adapter name: slurm, kubernetes, torch_elastic, webhook",
        "outcome": "result of a remediation action: ok, failed, dry_run, queued, skipped",
        "policy": "remediation policy name, e.g. fatal-gpu-event",
        "verdict": "outcome of a removal: confirmed, refuted, unknown",
        "sink": "sink name from the agent configuration",
        "nvswitch": "NVSwitch index on the node (nvidia-nvswitchN in the kernel log)",
        "dtype": "training numeric type: bf16, fp16, fp8, tf32, fp32",
        "probe": "gpuwarden check probe: gpu_count, infiniband, disk, dcgm, gpu_matmul, allreduce",
        "status": "a check probe's result: pass, fail, unavailable",
    }
)


def _f(
    name: str,
    type_: FieldType,
    unit: str,
    kind: Kind,
    description: str,
    valid: tuple[float, float] | None = None,
) -> FieldSpec:
    return FieldSpec(name, type_, unit, kind, description, valid)


# Physical ranges of hardware gauges. A reading outside one is a sensor's sentinel (the
# kernel's THERMAL_TEMP_INVALID reads -274 °C; an all-ones 32-bit register read as milliwatts
# is 4.3 MW) or a broken sensor, never a measurement: the agent leaves it out, counts it
# (agent.implausible_total) and says so once (collector/plausible.py). Wide on purpose.
PCT = (0.0, 110.0)  # GPM ratios may read a little over 100 % for a short sample
TEMP = (-40.0, 150.0)  # °C
POWER = (0.0, 50_000.0)  # W: up to a whole node's PSU sensor
CLOCK = (0.0, 20_000.0)  # MHz
MEMORY = (0.0, 2.0**50)  # B
PCIE = (0.0, 1e12)  # B/s: PCIe 6.0 x16 moves ~1.3e11 per direction


F, I, B, S = FieldType.FLOAT, FieldType.INTEGER, FieldType.BOOLEAN, FieldType.STRING  # noqa: E741
G, C, ST, IN = Kind.GAUGE, Kind.COUNTER, Kind.STATE, Kind.INFO

_MEASUREMENTS: list[Measurement] = []


def _m(
    name: str,
    producer: Producer,
    description: str,
    tags: Iterable[str],
    fields: Iterable[FieldSpec],
) -> None:
    field_map = {f.name: f for f in fields}
    _MEASUREMENTS.append(
        Measurement(name, producer, description, tuple(tags), MappingProxyType(field_map))
    )


A, R, AN, RM = Producer.AGENT, Producer.REPORTER, Producer.ANALYTICS, Producer.REMEDIATION
