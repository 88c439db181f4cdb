"""The GPU measurements (NVML, the kernel log's GPU and NVSwitch events)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwarden.core.catalogue.schema import (
    CLOCK,
    IN,
    MEMORY,
    PCIE,
    PCT,
    POWER,
    ST,
    TEMP,
    A,
    B,
    C,
    F,
    G,
    I,
    S,
    _f,
    _m,
)

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
