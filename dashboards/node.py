"""Node & GPU: every field the agent collects for a node's GPUs, NVLinks, host power and
thermal zones (a test checks that none is missing), XIDs as annotations.

Panels that mix generations select the fields of both in one query: retired pages (before
Ampere) and remapped rows (Ampere and newer) share a panel, so one of the two is always
empty -- NVML reports the other as not supported and the agent leaves it out.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.core.catalogue import CATALOGUE
from gpuwarden.dashboards.influxql import Agg, Scope, Select, agg
from gpuwarden.dashboards.panels import XID_COLUMNS, AnyPanel, board, graph, grid, marks, states

UID = "gpuwarden-node"
S = Scope("cluster", "node", "gpu")
PER_GPU = "$tag_node/$tag_gpu $col"


def _clock_events() -> list[str]:
    return [f for f in CATALOGUE["gpu"].fields if f.startswith("clock_event_") and "active" in f]


def _gpu_panels() -> list[tuple[str, list[AnyPanel]]]:
    g = ("node", "gpu")
    use: list[AnyPanel] = [
        graph(
            "Utilisation",
            "NVML GPU (kernel running) and memory-controller utilisation",
            S("gpu", agg("mean", "gpu_util_pct", "mem_util_pct"), group_tags=g),
            unit="percent",
            alias=PER_GPU,
        ),
        graph(
            "GPM (Hopper and newer)",
            "SM activity and occupancy, tensor-core activity and DRAM bandwidth from GPU "
            "Performance Monitoring; empty before Hopper",
            S(
                "gpu",
                agg(
                    "mean",
                    "gpm_sm_util_pct",
                    "gpm_sm_occupancy_pct",
                    "gpm_tensor_active_pct",
                    "gpm_dram_bw_util_pct",
                ),
                group_tags=g,
            ),
            unit="percent",
            alias=PER_GPU,
        ),
        graph(
            "Framebuffer memory",
            "Memory used, the total, and what the driver reserves (NVML v2; not in used)",
            S(
                "gpu",
                agg("max", "mem_used_bytes", "mem_total_bytes", "mem_reserved_bytes"),
                group_tags=g,
            ),
            unit="bytes",
            alias=PER_GPU,
        ),
        graph(
            "Processes",
            "Compute processes on each GPU",
            S("gpu", Agg("max", "process_count"), group_tags=g),
            unit="none",
            alias=PER_GPU,
        ),
    ]
    clocks: list[AnyPanel] = [
        graph(
            "Clocks",
            "SM, memory and graphics clocks against their maxima",
            S(
                "gpu",
                agg(
                    "mean",
                    "sm_clock_mhz",
                    "mem_clock_mhz",
                    "graphics_clock_mhz",
                    "sm_clock_max_mhz",
                    "mem_clock_max_mhz",
                    "graphics_clock_max_mhz",
                ),
                group_tags=g,
            ),
            unit="rotmhz",
            alias=PER_GPU,
        ),
        states(
            "Performance state",
            "P-state (0 = maximum performance)",
            S("gpu", Agg("last", "pstate_code"), group_tags=g),
            alias="$tag_node/$tag_gpu",
            w=12,
        ),
        states(
            "Clock-event (throttle) reasons",
            "Each reason NVML reports for running below the maximum clock, decoded, and the "
            "raw bitmask",
            S("gpu", agg("last", *_clock_events(), "clock_event_reasons_code"), group_tags=g),
            alias=PER_GPU,
            h=12,
        ),
    ]
    thermal: list[AnyPanel] = [
        graph(
            "Temperature and fan",
            "GPU and HBM temperature; fan speed where the board has a fan (SXM boards do not)",
            S("gpu", agg("max", "gpu_temp_c", "mem_temp_c", "fan_speed_pct"), group_tags=g),
            unit="celsius",
            alias=PER_GPU,
        ),
        graph(
            "Power",
            "Board power against the enforced limit; and power from the energy counter",
            S("gpu", agg("mean", "power_w", "power_limit_w"), group_tags=g),
            S("gpu", Agg("rate", "energy_j_total", "power_from_energy_w"), group_tags=g),
            unit="watt",
            alias=PER_GPU,
        ),
    ]
    memory: list[AnyPanel] = [
        graph(
            "ECC errors per second",
            "Volatile (since driver load) single- and double-bit ECC errors, per second",
            S("gpu", agg("rate", "ecc_sbe_volatile_total", "ecc_dbe_volatile_total"), group_tags=g),
            unit="cps",
            alias=PER_GPU,
        ),
        graph(
            "ECC, retired pages and remapped rows (totals)",
            "Lifetime counts: aggregate ECC, retired pages (before Ampere), remapped rows "
            "(Ampere and newer)",
            S(
                "gpu",
                agg(
                    "last",
                    "ecc_sbe_aggregate_total",
                    "ecc_dbe_aggregate_total",
                    "retired_pages_sbe_total",
                    "retired_pages_dbe_total",
                    "remapped_rows_correctable_total",
                    "remapped_rows_uncorrectable_total",
                ),
                group_tags=g,
            ),
            unit="none",
            alias=PER_GPU,
        ),
        states(
            "Pending retirement and remap failure",
            "A pending page retirement or row remap needs a GPU reset; a remap failure means "
            "the GPU should leave service",
            S(
                "gpu",
                agg(
                    "last",
                    "retired_pages_pending_active",
                    "remapped_rows_pending_active",
                    "remapped_rows_failure_active",
                ),
                group_tags=g,
            ),
            alias=PER_GPU,
        ),
    ]
    pcie: list[AnyPanel] = [
        graph(
            "PCIe throughput",
            "Transmit and receive, as NVML samples them",
            S("gpu", agg("mean", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"), group_tags=g),
            unit="Bps",
            alias=PER_GPU,
        ),
        graph(
            "PCIe replays and link",
            "Replays per second (link-level retransmissions), the negotiated link and the "
            "most the GPU and its slot allow (GPUs lower the generation themselves when idle)",
            S("gpu", Agg("rate", "pcie_replay_total", "pcie_replays_per_s"), group_tags=g),
            S(
                "gpu",
                agg(
                    "last",
                    "pcie_link_gen_code",
                    "pcie_link_gen_max_code",
                    "pcie_link_width_count",
                    "pcie_link_width_max_count",
                ),
                group_tags=g,
            ),
            unit="none",
            alias=PER_GPU,
        ),
        states(
            "PCIe link trained down",
            "True while a GPU's link runs narrower than the GPU and its slot allow: check the "
            "riser, slot and GPU (host-device transfers are slower)",
            S("gpu", Agg("last", "pcie_link_downtrained_active"), group_tags=g),
            alias=PER_GPU,
        ),
    ]
    return [
        ("GPU utilisation", use),
        ("Clocks and throttling", clocks),
        ("Thermal and power", thermal),
        ("Memory errors", memory),
        ("PCIe", pcie),
    ]


def _link_rate(*fields: str) -> Select:
    """Per-link rates summed per GPU (max() across links of a counter would be meaningless)."""
    inner = S("gpu_nvlink", agg("rate", *fields), group_tags=("node", "gpu", "link"))
    return S("gpu_nvlink", agg("sum", *fields), inner=inner, group_tags=("node", "gpu"))


def build() -> model.Dashboard:
    nvlink: list[AnyPanel] = [
        graph(
            "NVLink throughput",
            "All links of each GPU, bytes per second",
            _link_rate("tx_bytes_total", "rx_bytes_total"),
            unit="Bps",
            alias=PER_GPU,
        ),
        graph(
            "NVLink errors per second",
            "CRC (flit and data), replay and recovery errors, all links of each GPU",
            _link_rate(
                "crc_flit_errors_total",
                "crc_data_errors_total",
                "replay_errors_total",
                "recovery_errors_total",
            ),
            unit="cps",
            alias=PER_GPU,
        ),
        states(
            "NVLink fabric registration and health",
            "NVSwitch systems (Hopper+): registered (true) once Fabric Manager has added the "
            "GPU to the fabric; until then CUDA programs fail to start on it. Health bits the "
            "driver reports (degraded bandwidth, route recovery or unhealthy, access-timeout "
            "recovery) are true when something is wrong",
            S(
                "gpu",
                agg(
                    "last",
                    "fabric_registered_active",
                    "fabric_degraded_bw_active",
                    "fabric_route_recovery_active",
                    "fabric_route_unhealthy_active",
                    "fabric_access_timeout_recovery_active",
                ),
                group_tags=("node", "gpu"),
            ),
            alias=PER_GPU,
        ),
        grid(
            "NVLink fabric registration codes",
            "Per GPU, last: state (1 not started, 2 in progress, 3 completed), the NVML return "
            "code of a completed registration (0 success) and the raw health mask",
            S(
                "gpu",
                agg("last", "fabric_state_code", "fabric_status_code", "fabric_health_mask_code"),
                group_tags=("node", "gpu"),
                every=False,
            ),
            h=6,
        ),
        states(
            "NVLink state",
            "Each link up (true) or down",
            S("gpu_nvlink", Agg("last", "link_up_active"), group_tags=("node", "gpu", "link")),
            alias="$tag_node/$tag_gpu link $tag_link",
            h=12,
        ),
    ]
    events: list[AnyPanel] = [
        grid(
            "GPU events (XID)",
            "Newest first, with NVIDIA's recommended resolution from the XID catalogue, and "
            "the job and rank the GPU (or the process the XID names) had when it happened",
            S.latest(
                "gpu_event",
                ("node", "gpu", "job", "rank", *XID_COLUMNS, "pid", "source"),
                limit=500,
            ),
        ),
        grid(
            "NVSwitch errors (SXid)",
            "Newest first; a fatal SXid stops NVLink through that switch, so the node's GPUs "
            "need a reset",
            S.latest(
                "nvswitch_event",
                (
                    "node",
                    "nvswitch",
                    "severity",
                    "sxid_code",
                    "fatal_active",
                    "link_index",
                    "pci_bus_id",
                    "message",
                    "source",
                ),
                limit=500,
            ),
        ),
        grid(
            "GPU inventory",
            "Per GPU, as the agent last read it: serial number (for an RMA), VBIOS and driver "
            "versions, and persistence, ECC and MIG modes (pending: after the next GPU reset)",
            S(
                "gpu_info",
                agg(
                    "last",
                    "serial",
                    "vbios_version",
                    "driver_version",
                    "persistence_mode_active",
                    "ecc_mode_active",
                    "ecc_mode_pending_active",
                    "mig_mode_active",
                    "mig_mode_pending_active",
                ),
                group_tags=("node", "gpu"),
                every=False,
            ),
            h=6,
        ),
        grid(
            "GPU processes",
            "Processes on the GPUs, the job each belongs to, and their memory",
            S.latest(
                "gpu_process", ("node", "gpu", "job", "rank", "pid", "used_mem_bytes"), limit=500
            ),
        ),
    ]
    host: list[AnyPanel] = [
        graph(
            "Host power by domain",
            "RAPL package/DRAM and hwmon power readings",
            S("host_power", Agg("mean", "power_w"), group_tags=("node", "domain", "source")),
            S(
                "host_power",
                Agg("rate", "energy_j_total", "power_from_energy_w"),
                group_tags=("node", "domain", "source"),
            ),
            unit="watt",
            alias="$tag_node $tag_domain ($tag_source) $col",
        ),
        graph(
            "Host thermal zones",
            "Temperatures and their critical trip points",
            S(
                "thermal",
                agg("max", "temp_c", "crit_temp_c"),
                group_tags=("node", "zone", "sensor"),
            ),
            unit="celsius",
            alias="$tag_node $tag_zone/$tag_sensor $col",
        ),
    ]
    rows: list[tuple[str, list[AnyPanel]]] = [
        *_gpu_panels(),
        ("NVLink", nvlink),
        ("Events and processes", events),
        ("Host", host),
    ]
    return board(
        UID,
        "gpuwarden / Node and GPU",
        "Every GPU, NVLink, host power and thermal field the agent collects",
        rows,
        scope=S,
        annotations=[
            marks(S, "XIDs", "gpu_event", "message", "event", "red"),
            marks(S, "NVSwitch SXids", "nvswitch_event", "message", "event", "purple"),
            marks(S, "Findings", "finding", "summary", "kind", "orange"),
        ],
    )
