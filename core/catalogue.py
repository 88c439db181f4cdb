"""The metric catalogue: every measurement, field and tag gpuwarden writes, declared once.

This is the single source of truth for names, units and types. The agent, analytics,
remediation and dashboards all use these names; tests fail on any field written that is not
declared here or that is written with another type (see :func:`check_point`).

Naming rules (DESIGN.md, "Metric catalogue"):

* snake_case, with the unit in the name: ``power_w``, ``energy_j_total``,
  ``port_xmit_data_bytes_total``. Dimensionless values say what they are: ``_pct`` (0-100),
  ``_ratio`` (0-1), ``_count``; enumerations end in ``_code``; booleans in ``_active``.
* Counters are raw monotonic totals exactly as the hardware reports them and end in
  ``_total``. Rates are computed downstream, which handles resets and the 32-bit saturation
  of legacy InfiniBand counters.
* Tags are low-cardinality: cluster, node, gpu index and uuid, hca, port, job, rank, ...
  Anything unbounded (a pid, a message, an id) is a field.
* Unavailable is not zero: a value the hardware does not support is absent from the point,
  never written as 0 or -1.
"""

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

_GPU_TAGS = ("cluster", "node", "gpu", "gpu_uuid", "gpu_model", "job", "rank", "local_rank")

# NVML clock-event ("throttle") reasons, decoded one boolean each. Bit values from nvml.h.
CLOCK_EVENT_REASONS: Mapping[str, int] = MappingProxyType(
    {
        "gpu_idle": 0x1,
        "applications_clocks_setting": 0x2,
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal_slowdown": 0x20,
        "hw_thermal_slowdown": 0x40,
        "hw_power_brake_slowdown": 0x80,
        "display_clock_setting": 0x100,
    }
)

_gpu_fields = [
    _f(
        "gpu_util_pct",
        F,
        "%",
        G,
        "percent of time a kernel was running (NVML utilization.gpu)",
        PCT,
    ),
    _f("mem_util_pct", F, "%", G, "percent of time device memory was read or written", PCT),
    _f("mem_used_bytes", I, "B", G, "framebuffer memory used", MEMORY),
    _f("mem_total_bytes", I, "B", G, "framebuffer memory total", MEMORY),
    _f(
        "mem_reserved_bytes",
        I,
        "B",
        G,
        "framebuffer memory the driver reserves (not in mem_used_bytes; NVML v2 only)",
        MEMORY,
    ),
    _f("sm_clock_mhz", F, "MHz", G, "current SM clock", CLOCK),
    _f("mem_clock_mhz", F, "MHz", G, "current memory clock", CLOCK),
    _f("graphics_clock_mhz", F, "MHz", G, "current graphics clock", CLOCK),
    _f("sm_clock_max_mhz", F, "MHz", G, "maximum SM clock", CLOCK),
    _f("mem_clock_max_mhz", F, "MHz", G, "maximum memory clock", CLOCK),
    _f("graphics_clock_max_mhz", F, "MHz", G, "maximum graphics clock", CLOCK),
    _f("gpu_temp_c", F, "°C", G, "GPU die temperature", TEMP),
    _f("mem_temp_c", F, "°C", G, "HBM temperature (not on every GPU)", TEMP),
    _f("power_w", F, "W", G, "power draw", POWER),
    _f("power_limit_w", F, "W", G, "enforced power limit", POWER),
    _f("energy_j_total", F, "J", C, "total energy since the driver loaded (counter)"),
    _f("pstate_code", I, "", ST, "performance state P0..P15 (0 is the fastest)"),
    _f("fan_speed_pct", F, "%", G, "fan speed (absent on passively cooled GPUs)", PCT),
    _f("clock_event_reasons_code", I, "", ST, "raw clock-event (throttle) reason bitmask"),
    *[
        _f(f"clock_event_{r}_active", B, "", ST, f"clock-event reason '{r}' is active")
        for r in CLOCK_EVENT_REASONS
    ],
    _f("ecc_sbe_volatile_total", I, "", C, "single-bit ECC errors since the driver loaded"),
    _f("ecc_dbe_volatile_total", I, "", C, "double-bit ECC errors since the driver loaded"),
    _f("ecc_sbe_aggregate_total", I, "", C, "single-bit ECC errors over the GPU's life"),
    _f("ecc_dbe_aggregate_total", I, "", C, "double-bit ECC errors over the GPU's life"),
    _f("retired_pages_sbe_total", I, "", C, "pages retired for SBEs (pre-Ampere)"),
    _f("retired_pages_dbe_total", I, "", C, "pages retired for DBEs (pre-Ampere)"),
    _f("retired_pages_pending_active", B, "", ST, "a page retirement waits for a reset"),
    _f("remapped_rows_correctable_total", I, "", C, "rows remapped for correctable errors"),
    _f("remapped_rows_uncorrectable_total", I, "", C, "rows remapped for uncorrectable errors"),
    _f("remapped_rows_pending_active", B, "", ST, "a row remap waits for a GPU reset"),
    _f("remapped_rows_failure_active", B, "", ST, "a row remap failed: the GPU needs service"),
    _f("pcie_tx_bytes_per_s", F, "B/s", G, "PCIe transmit throughput", PCIE),
    _f("pcie_rx_bytes_per_s", F, "B/s", G, "PCIe receive throughput", PCIE),
    _f("pcie_replay_total", I, "", C, "PCIe replay counter"),
    _f("pcie_link_gen_code", I, "", ST, "current PCIe link generation"),
    _f("pcie_link_width_count", I, "lanes", ST, "current PCIe link width"),
    _f(
        "pcie_link_gen_max_code",
        I,
        "",
        ST,
        "the highest PCIe generation the GPU and its slot allow",
    ),
    _f("pcie_link_width_max_count", I, "lanes", ST, "the widest link the GPU and its slot allow"),
    _f(
        "pcie_link_downtrained_active",
        B,
        "",
        ST,
        "the link runs narrower than the GPU and its "
        "slot allow: a riser, slot or GPU to check; host-device transfers are slower",
    ),
    _f("gpm_sm_util_pct", F, "%", G, "GPM SM utilisation (Hopper+)", PCT),
    _f("gpm_sm_occupancy_pct", F, "%", G, "GPM SM occupancy (Hopper+)", PCT),
    _f(
        "gpm_tensor_active_pct", F, "%", G, "GPM tensor-core activity, any precision (Hopper+)", PCT
    ),
    _f("gpm_dram_bw_util_pct", F, "%", G, "GPM DRAM bandwidth utilisation (Hopper+)", PCT),
    _f("process_count", I, "", G, "compute processes on the GPU"),
    # NVLink fabric (NVSwitch systems, Hopper+): the GPU's registration with Fabric Manager
    _f(
        "fabric_state_code",
        I,
        "",
        ST,
        "fabric registration: 1 not started, 2 in progress, 3 completed (nvmlGpuFabricState_t)",
    ),
    _f(
        "fabric_registered_active",
        B,
        "",
        ST,
        "registration completed without error (false on an NVSwitch system: CUDA "
        "programs fail to start on the GPU until Fabric Manager registers it)",
    ),
    _f("fabric_status_code", I, "", ST, "NVML return code of a completed registration (0 success)"),
    _f("fabric_health_mask_code", I, "", IN, "the driver's fabric health mask, raw"),
    _f("fabric_degraded_bw_active", B, "", ST, "the GPU's NVLink bandwidth is degraded"),
    _f("fabric_route_recovery_active", B, "", ST, "a fabric route recovery is in progress"),
    _f("fabric_route_unhealthy_active", B, "", ST, "a fabric route is unhealthy"),
    _f(
        "fabric_access_timeout_recovery_active", B, "", ST, "recovering from fabric access timeouts"
    ),
]

_ib_counter_names = [
    ("symbol_error_total", "minor link errors (symbol errors) on the physical lane"),
    ("link_error_recovery_total", "successful link error recoveries"),
    ("link_downed_total", "times the link went down after failed recovery"),
    ("port_rcv_errors_total", "received packets with errors"),
    ("port_rcv_remote_physical_errors_total", "received packets marked with EBP"),
    ("port_rcv_switch_relay_errors_total", "received packets discarded for relay errors"),
    ("port_xmit_discards_total", "outbound packets discarded (port down or congestion)"),
    ("port_xmit_constraint_errors_total", "packets not transmitted for constraints"),
    ("port_rcv_constraint_errors_total", "packets received and discarded for constraints"),
    ("local_link_integrity_errors_total", "local physical errors over threshold"),
    ("excessive_buffer_overrun_errors_total", "consecutive flow-control update overruns"),
    ("vl15_dropped_total", "VL15 packets dropped for lack of buffers"),
    ("port_rcv_discards_total", "received packets discarded"),
    ("port_xmit_wait_total", "ticks with data to send but no credits (congestion)"),
    ("port_xmit_packets_total", "packets transmitted"),
    ("port_rcv_packets_total", "packets received"),
    ("port_unicast_xmit_packets_total", "unicast packets transmitted"),
    ("port_unicast_rcv_packets_total", "unicast packets received"),
    ("port_multicast_xmit_packets_total", "multicast packets transmitted"),
    ("port_multicast_rcv_packets_total", "multicast packets received"),
    # hw_counters (mlx5): RoCE congestion control and transport errors
    ("np_cnp_sent_total", "congestion notification packets sent (notification point)"),
    ("rp_cnp_handled_total", "CNPs handled (reaction point)"),
    ("rp_cnp_ignored_total", "CNPs ignored"),
    ("np_ecn_marked_roce_packets_total", "RoCE packets received with ECN marks"),
    ("out_of_sequence_total", "out-of-sequence packets received"),
    ("packet_seq_err_total", "NAK sequence errors received"),
    ("local_ack_timeout_err_total", "local ACK timeouts (retransmissions)"),
    ("implied_nak_seq_err_total", "implied NAK sequence errors"),
    ("rnr_nak_retry_err_total", "RNR NAK retries exceeded"),
    ("duplicate_request_total", "duplicate requests received"),
    ("req_cqe_error_total", "requester completion-queue errors"),
    ("resp_cqe_error_total", "responder completion-queue errors"),
]

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

_m("gpu", A, "one point per GPU per cycle from NVML", _GPU_TAGS, _gpu_fields)
_m(
    "gpu_nvlink",
    A,
    "per-link NVLink state and counters",
    (*_GPU_TAGS, "link"),
    [
        _f("link_up_active", B, "", ST, "the link is up"),
        _f("crc_flit_errors_total", I, "", C, "flow-control digit CRC errors"),
        _f("crc_data_errors_total", I, "", C, "data CRC errors"),
        _f("replay_errors_total", I, "", C, "replays"),
        _f("recovery_errors_total", I, "", C, "link recoveries"),
        _f("tx_bytes_total", I, "B", C, "bytes transmitted"),
        _f("rx_bytes_total", I, "B", C, "bytes received"),
    ],
)
_m(
    "gpu_process",
    A,
    "compute processes on each GPU and the job they belong to",
    _GPU_TAGS,
    [
        _f("pid", I, "", IN, "process id (a field: unbounded cardinality)"),
        _f("used_mem_bytes", I, "B", G, "GPU memory used by the process", MEMORY),
    ],
)
_m(
    "gpu_info",
    A,
    "what each GPU is and how it is set up, at agent start and every [nvml] info_every_s",
    ("cluster", "node", "gpu", "gpu_uuid", "gpu_model"),
    [
        _f("serial", S, "", IN, "the board's serial number (what an RMA asks for)"),
        _f("vbios_version", S, "", IN, "VBIOS version"),
        _f("driver_version", S, "", IN, "NVIDIA driver version"),
        _f("persistence_mode_active", B, "", ST, "persistence mode is on"),
        _f("ecc_mode_active", B, "", ST, "ECC is on"),
        _f("ecc_mode_pending_active", B, "", ST, "ECC will be on after the next GPU reset"),
        _f("mig_mode_active", B, "", ST, "MIG mode is on"),
        _f("mig_mode_pending_active", B, "", ST, "MIG mode will be on after the next GPU reset"),
    ],
)
_m(
    "gpu_event",
    A,
    "GPU events: XIDs (NVML event set or kernel log), a GPU lost, new uncorrectable ECC errors, "
    "a failed row remap; tagged with the job the GPU (or the process the XID names) had when it "
    "happened",
    (
        *("cluster", "node", "gpu", "gpu_uuid", "job", "rank", "local_rank"),
        *("event", "severity", "source"),
    ),
    [
        _f("xid_code", I, "", ST, "XID number"),
        _f("message", S, "", IN, "the event text (kernel log line or NVML description)"),
        _f("resolution", S, "", IN, "NVIDIA's recommended resolution from the XID catalogue"),
        _f("fatal_active", B, "", ST, "the event counts as a hardware failure"),
        _f("pid", I, "", IN, "process named in the event, if any"),
    ],
)
_m(
    "nvswitch_event",
    A,
    "NVSwitch errors (SXid) from the kernel log; a fatal one stops NVLink for the node's GPUs",
    ("cluster", "node", "nvswitch", "event", "severity", "source"),
    [
        _f("sxid_code", I, "", ST, "SXid number"),
        _f("fatal_active", B, "", ST, "the driver calls the error fatal"),
        _f("link_index", I, "", IN, "the switch port (link) the error names, where it names one"),
        _f("pci_bus_id", S, "", IN, "the switch's PCI address"),
        _f("message", S, "", IN, "the kernel log line from the switch name on"),
    ],
)
_m(
    "os_event",
    A,
    "OS and storage faults from the kernel log (NFS server not responding, Lustre errors, hung "
    "tasks, soft lockups, NVMe errors, OOM kills) and their recoveries; a line that names a "
    "process is tagged with its job",
    (
        *("cluster", "node", "job", "rank", "local_rank"),
        *("event", "severity", "source"),
    ),
    [
        _f("key", S, "", IN, "what the line is about: a server, a Lustre target, a device"),
        _f("message", S, "", IN, "the kernel log line from the rule's match on"),
        _f("pid", I, "", IN, "process named in the line, if any"),
    ],
)
_m(
    "node_os",
    A,
    "The host's own health: tasks blocked in uninterruptible sleep (D state) and the EDAC "
    "memory controllers' error counts",
    ("cluster", "node"),
    [
        _f("procs_blocked_count", I, "", G, "tasks in uninterruptible sleep now (/proc/stat)"),
        _f("edac_ce_total", I, "", C, "corrected memory errors, all memory controllers (EDAC)"),
        _f("edac_ue_total", I, "", C, "uncorrected memory errors, all memory controllers (EDAC)"),
    ],
)
_m(
    "node_check",
    A,
    "gpuwarden check's probes (gpu_count, infiniband, disk, dcgm, gpu_matmul, allreduce), one "
    "point per probe per run: pass, fail or unavailable, and why",
    ("cluster", "node", "probe", "status"),
    [
        _f("passed_active", B, "", ST, "the probe did not fail (pass or unavailable)"),
        _f("duration_s", F, "s", G, "how long the probe took"),
        _f("detail", S, "", IN, "what the probe found, in words"),
    ],
)
_m(
    "ib_port",
    A,
    "InfiniBand/RoCE port counters from sysfs, raw totals as the hardware gives them",
    ("cluster", "node", "hca", "port", "link_layer"),
    [
        *[_f(n, I, "", C, d) for n, d in _ib_counter_names],
        _f("port_xmit_data_bytes_total", I, "B", C, "bytes sent (sysfs counts 4-byte words)"),
        _f("port_rcv_data_bytes_total", I, "B", C, "bytes received (sysfs counts 4-byte words)"),
        _f("state_code", I, "", ST, "logical port state (4 = ACTIVE)"),
        _f("phys_state_code", I, "", ST, "physical port state (5 = LinkUp)"),
        _f("rate_gbps", F, "Gb/s", G, "link rate"),
    ],
)
_m(
    "host_power",
    A,
    "host power domains: RAPL zones and hwmon power/energy sensors",
    ("cluster", "node", "domain", "source"),
    [
        _f("energy_j_total", F, "J", C, "energy counter (RAPL wraps at max_energy_range_uj)"),
        _f("power_w", F, "W", G, "power (hwmon power sensors)", POWER),
    ],
)
_m(
    "thermal",
    A,
    "thermal zones and hwmon temperature sensors",
    ("cluster", "node", "zone", "sensor", "source"),
    [
        _f("temp_c", F, "°C", G, "temperature", TEMP),
        _f("crit_temp_c", F, "°C", G, "critical trip point, where reported"),
    ],
)
_m(
    "job_step",
    R,
    "one point per training step per rank, from the training-side reporter",
    ("cluster", "node", "job", "rank"),
    [
        _f("step_index", I, "", ST, "step number"),
        _f(
            "step_time_s",
            F,
            "s",
            G,
            "the rank's own time for the step (up to its gradient collective); the wall time "
            "of a synchronous step is equal on all ranks and cannot show who is slow",
        ),
        _f("tokens_count", I, "", G, "tokens processed in the step by this rank"),
        _f("samples_count", I, "", G, "samples processed in the step by this rank"),
        _f("loss_ratio", F, "", G, "training loss (dimensionless), where reported"),
    ],
)
_m(
    "job_heartbeat",
    R,
    "every few seconds from each rank's reporter thread, whatever its training loop does: "
    "a rank that stops stepping but still beats is alive and stuck (a hang), not gone",
    ("cluster", "node", "job", "rank"),
    [
        _f("step_index", I, "", ST, "the last step the rank reported"),
        _f("since_step_s", F, "s", G, "time since the rank last reported a step (or started)"),
        _f(
            "in_step_active",
            B,
            "",
            ST,
            "the rank is inside a timed step (computing, or waiting in its collectives); "
            "false: between steps (data loading, checkpointing, evaluation)",
        ),
    ],
)
_m(
    "job_checkpoint",
    R,
    "one point per checkpoint a rank saves, from the training-side reporter: what a save "
    "costs the job and how often it saves, from which analytics advises the interval",
    ("cluster", "node", "job", "rank"),
    [
        _f("step_index", I, "", ST, "the step the checkpoint holds"),
        _f("save_s", F, "s", G, "training time the save held up (the blocking part of it)"),
        _f("interval_s", F, "s", G, "the job's checkpoint interval at the time"),
    ],
)
_m(
    "job_model",
    R,
    "the model shape of a job, reported once at start; MFU is computed from it",
    ("cluster", "job", "dtype"),
    [
        _f("params_count", I, "", IN, "parameters (N)"),
        _f("layers_count", I, "", IN, "layers (L)"),
        _f("hidden_size_count", I, "", IN, "hidden size (H)"),
        _f("heads_count", I, "", IN, "attention heads"),
        _f("seq_len_tokens", I, "tokens", IN, "sequence length (T)"),
        _f("world_size_count", I, "", IN, "ranks in the job"),
        _f("tensor_parallel_count", I, "", IN, "tensor-parallel size (ranks per TP group)"),
        _f("pipeline_parallel_count", I, "", IN, "pipeline-parallel stages"),
        _f("recompute_active", B, "", IN, "activation recomputation is on (for HFU)"),
        _f("recompute_selective_active", B, "", IN, "only the attention scores are recomputed"),
        _f("recompute_layers_count", I, "", IN, "layers fully recomputed (absent: all)"),
        _f("vocab_size_count", I, "", IN, "vocabulary size (the token table and LM head)"),
        _f("tied_head_active", B, "", IN, "the LM head shares the token embedding's weight"),
        _f(
            "embedding_params_count",
            I,
            "",
            IN,
            "parameters of the input embedding tables (token + position) inside params_count",
        ),
        _f("gpu_model", S, "", IN, "GPU product name as the job sees it"),
    ],
)
_m(
    "agent",
    A,
    "agent self-metrics: per source and cycle, how long it took and whether it worked",
    ("cluster", "node", "source"),
    [
        _f("collect_duration_s", F, "s", G, "wall time of the source's collection"),
        _f("collect_success_active", B, "", ST, "the collection succeeded"),
        _f("points_count", I, "", G, "points the source produced"),
        _f("errors_total", I, "", C, "collection errors since start"),
        _f(
            "implausible_total",
            I,
            "",
            C,
            "readings left out since start as physically impossible (sensor sentinels)",
        ),
        _f("cycle_lag_s", F, "s", G, "how late the cycle started against its schedule"),
        _f("sink_errors_total", I, "", C, "cycles whose points the sink refused (raised)"),
    ],
)
_m(
    "sink",
    A,
    "sink self-metrics: what was written, spooled, retried, rejected and dropped",
    ("cluster", "node", "sink"),
    [
        _f("points_written_total", I, "", C, "points the server acknowledged"),
        _f("points_rejected_total", I, "", C, "points the server refused (400, partial write)"),
        _f("points_invalid_total", I, "", C, "points dropped by the encoder (no valid field)"),
        _f("fields_invalid_total", I, "", C, "fields dropped by the encoder (NaN, inf)"),
        _f(
            "points_unencodable_total",
            I,
            "",
            C,
            "points dropped by the encoder: a name or tag value line protocol cannot carry",
        ),
        _f("points_dropped_total", I, "", C, "points dropped because the spool was full"),
        _f("spool_bytes", I, "B", G, "bytes held in the on-disk spool"),
        _f("spool_memory_bytes", I, "B", G, "bytes of batches waiting in memory (write-behind)"),
        _f("spool_points_count", I, "", G, "points not yet delivered, in memory or on disk"),
        _f("batches_sent_total", I, "", C, "batches acknowledged"),
        _f("retries_total", I, "", C, "send attempts that were retried"),
        _f("send_duration_s", F, "s", G, "duration of the last successful send"),
        _f("sender_errors_total", I, "", C, "failures the sender survived (it backed off)"),
        _f(
            "spool_write_errors_total",
            I,
            "",
            C,
            "spool writes and cursor saves the disk refused (the data waited in memory)",
        ),
        _f(
            "spool_cursor_resets_total",
            I,
            "",
            C,
            "unreadable spool cursors on open: resent from the oldest segment",
        ),
        _f(
            "spool_cut_bytes_total",
            I,
            "B",
            C,
            "bytes of torn or damaged spool records skipped or cut on open",
        ),
    ],
)
_m(
    "finding",
    AN,
    "findings from analytics and the agent's event rules (the Finding contract)",
    (
        "cluster",
        "node",
        "gpu",
        "hca",
        "port",
        "switch",
        "job",
        "rank",
        "kind",
        "severity",
        "source",
    ),
    [
        _f("finding_id", S, "", IN, "stable id for de-duplication"),
        _f("probability_ratio", F, "", G, "probability, for predictions"),
        _f("confidence_ratio", F, "", G, "confidence, for detections"),
        _f("summary", S, "", IN, "one line a person can read"),
        _f("evidence_json", S, "", IN, "the numbers that led to the finding, as JSON"),
    ],
)
_m(
    "mfu",
    AN,
    "model FLOPs utilisation and goodput per job",
    ("cluster", "job", "gpu_model", "dtype", "source"),
    [
        _f("mfu_ratio", F, "", G, "model FLOPs utilisation (PaLM appendix B)"),
        _f("hfu_ratio", F, "", G, "hardware FLOPs utilisation (with recomputation)"),
        _f("model_flops_per_s", F, "FLOP/s", G, "achieved model FLOP/s per GPU"),
        _f("tokens_per_s", F, "tokens/s", G, "job throughput"),
        _f("goodput_ratio", F, "", G, "productive time over elapsed time (ETTR)"),
        _f("estimate_active", B, "", ST, "telemetry-only estimate (from GPM tensor activity)"),
        _f(
            "tensor_active_ratio",
            F,
            "",
            G,
            "GPM tensor-core activity of the job's GPUs while it stepped (the estimate)",
        ),
        _f("model_flops_per_token", F, "FLOP", G, "model FLOPs per token (forward + backward)"),
        _f(
            "flops_assumed_active",
            B,
            "",
            ST,
            "the FLOPs per token rest on an assumption (the job did not report its embeddings)",
        ),
        _f("flops_assumption", S, "", IN, "what the FLOPs per token assumed, for a person"),
    ],
)
_m(
    "straggler",
    AN,
    "ranks, stages or workers persistently slower than their peers",
    ("cluster", "job", "node", "rank", "dp_rank", "stage", "kind"),
    [
        _f("slowdown_ratio", F, "", G, "step time over the peer median"),
        _f("step_time_s", F, "s", G, "the rank's step time"),
        _f("peer_median_step_time_s", F, "s", G, "median step time of its peers"),
        _f("persistence_ratio", F, "", G, "fraction of the window the rank was slow"),
        _f("cause", S, "", IN, "attributed cause: gpu, pcie, nic, link, stage, imbalance, unknown"),
    ],
)
_m(
    "congestion",
    AN,
    "per-port congestion and error rates computed from the counters",
    ("cluster", "node", "hca", "port", "switch"),
    [
        _f("xmit_util_ratio", F, "", G, "transmit throughput over link rate"),
        _f("rcv_util_ratio", F, "", G, "receive throughput over link rate"),
        _f("xmit_wait_ratio", F, "", G, "fraction of time in xmit_wait"),
        _f("cnp_per_s", F, "1/s", G, "CNPs sent and handled per second"),
        _f("ecn_marked_per_s", F, "1/s", G, "ECN-marked packets per second"),
        _f("symbol_errors_per_s", F, "1/s", G, "symbol errors per second"),
        _f("score_ratio", F, "", G, "congestion score used for ranking"),
    ],
)
_m(
    "energy",
    AN,
    "energy per job",
    ("cluster", "job"),
    [
        _f("energy_j", F, "J", G, "energy used in the window"),
        _f("j_per_token", F, "J/token", G, "energy per token"),
        _f("j_per_step", F, "J/step", G, "energy per step"),
        _f("power_w", F, "W", G, "mean power of the job's GPUs"),
    ],
)
_m(
    "failure_risk",
    AN,
    "predicted probability that a GPU or node fails within the horizon",
    ("cluster", "node", "gpu", "horizon"),
    [
        _f("probability_ratio", F, "", G, "calibrated probability of failure within horizon"),
        _f("threshold_ratio", F, "", G, "the model's operating threshold for alerts"),
        _f("alert_active", B, "", ST, "the probability is at or above the threshold"),
        _f("model_version", S, "", IN, "the model that scored it"),
    ],
)
_m(
    "badput",
    AN,
    "per job and analysis window: the time that did not train the model, by cause "
    "(analytics.badput); straggler and mixed_config are inside the productive steps' time",
    ("cluster", "job", "source"),
    [
        _f("elapsed_s", F, "s", G, "the job's first step to its last in the window"),
        _f("productive_s", F, "s", G, "time of the steps it kept"),
        _f("checkpoint_s", F, "s", G, "training time its checkpoint saves held up"),
        _f("recompute_s", F, "s", G, "steps run again after a restart rolled them back"),
        _f("restart_s", F, "s", G, "no step at all: failures, requeue, start-up, loading"),
        _f("hang_s", F, "s", G, "hung at the window's end: its silence so far"),
        _f("straggler_s", F, "s", G, "steps slowed by a straggling rank: what fixing it gives"),
        _f("mixed_config_s", F, "s", G, "the same, for ranks on nodes set up unlike the fleet"),
    ],
)
_m(
    "checkpoint_advice",
    AN,
    "per job that reports its checkpoint saves: the interval that minimises its expected "
    "waste (Young/Daly) from its save time and the fleet's failure rate, against its own",
    ("cluster", "job"),
    [
        _f("advised_interval_s", F, "s", G, "checkpoint interval advised"),
        _f("current_interval_s", F, "s", G, "the job's interval now"),
        _f("save_s", F, "s", G, "median training time a save holds up"),
        _f("mtbf_s", F, "s", G, "the job's mean time between failures (its nodes, the fleet)"),
        _f("waste_current_ratio", F, "", G, "expected share of wall time lost at the current"),
        _f("waste_advised_ratio", F, "", G, "expected share of wall time lost at the advised"),
        _f("history_weight_ratio", F, "", G, "how much of the rate is fleet history, not prior"),
    ],
)
_m(
    "remediation_action",
    RM,
    "actions the remediation engine decided and took, with their outcome (audit trail)",
    ("cluster", "node", "job", "action", "adapter", "outcome"),
    [
        _f("finding_id", S, "", IN, "the finding that led to the action"),
        _f("action_id", S, "", IN, "idempotency key of the action"),
        _f("dry_run_active", B, "", ST, "the action was only simulated"),
        _f("duration_s", F, "s", G, "how long the action took"),
        _f("message", S, "", IN, "what happened, for a person"),
    ],
)
_m(
    "remediation_outcome",
    RM,
    "whether each node the engine took out needed it (confirmed, refuted, unknown), one point "
    "per plan once known",
    ("cluster", "node", "policy", "kind", "verdict"),
    [
        _f("finding_id", S, "", IN, "the finding whose plan took the node out (the plan id)"),
        _f("action_id", S, "", IN, "the plan's cordon/drain and requeue action ids, commas"),
        _f("after_removal_s", F, "s", G, "from the removal to the verdict"),
        _f("message", S, "", IN, "the evidence that decided it, for a person"),
    ],
)
_m(
    "scenario_fault",
    Producer.SCENARIO,
    "SIMULATED ground truth: the faults a scenario injected, one point per phase change",
    ("cluster", "node", "gpu", "hca", "port", "job", "kind", "source"),
    [
        _f("fault_id", S, "", IN, "id of the injected fault, unique within the scenario"),
        _f("phase_code", I, "", ST, "1 precursor starts, 2 onset, 3 repaired"),
        _f("fatal_active", B, "", ST, "the fault takes the GPU, node or job down"),
        _f("xid_code", I, "", ST, "the XID the onset raises, if any"),
        _f("summary", S, "", IN, "what was injected, for a person"),
    ],
)

CATALOGUE: Mapping[str, Measurement] = MappingProxyType({m.name: m for m in _MEASUREMENTS})


def measurement(name: str) -> Measurement:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(f"measurement {name!r} is not in the catalogue") from None


def field_type_of(value: object) -> FieldType | None:
    """The InfluxDB type a Python value is written as (bool before int: bool is an int)."""
    if isinstance(value, bool):
        return FieldType.BOOLEAN
    if isinstance(value, int):
        return FieldType.INTEGER
    if isinstance(value, float):
        return FieldType.FLOAT
    if isinstance(value, str):
        return FieldType.STRING
    return None


def window_extreme(m: Measurement, name: str) -> FieldSpec | None:
    """``<gauge>_min`` / ``<gauge>_max``: a gauge's extremes over a window, which an agent
    that aggregates (``[agent] write_every_s``) writes beside the window's mean; same type
    and unit as the gauge."""
    base, _, end = name.rpartition("_")
    spec = m.fields.get(base) if end in ("min", "max") else None
    return spec if spec is not None and spec.kind is Kind.GAUGE else None


def check_point(
    measurement_name: str, tags: Mapping[str, object], fields: Mapping[str, object]
) -> list[str]:
    """Every way a point departs from the catalogue, as readable messages (empty: it conforms)."""
    m = CATALOGUE.get(measurement_name)
    if m is None:
        return [f"measurement {measurement_name!r} is not in the catalogue"]
    problems = [f"{m.name}: tag {k!r} is not declared" for k in tags if k not in m.tags]
    for key, value in fields.items():
        spec = m.fields.get(key) or window_extreme(m, key)
        if spec is None:
            problems.append(f"{m.name}: field {key!r} is not declared")
            continue
        written = field_type_of(value)
        if written is not spec.type:
            problems.append(f"{m.name}.{key}: declared {spec.type}, written as {written}")
    return problems
