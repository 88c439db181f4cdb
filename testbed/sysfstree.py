"""Builds a CONSTRUCTED sysfs tree of a GPU node (HCAs, RAPL, hwmon, thermal zones).

For tests, the agent benchmark and demos where no real node is at hand: the file names,
formats and units are those the kernel exposes (mlx5 ``counters/`` and ``hw_counters/``,
``intel-rapl:N``, ``hwmonN``, ``thermal_zoneN``); the values are plausible, not measured.
:func:`advance` moves the counters on, as time passing would.
"""

from __future__ import annotations

from pathlib import Path

IB_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped", "port_xmit_wait", "port_xmit_packets",
    "port_rcv_packets", "unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets",
    "multicast_rcv_packets", "port_xmit_data", "port_rcv_data",
)  # fmt: skip
HW_COUNTERS = (
    "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored", "np_ecn_marked_roce_packets",
    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "implied_nak_seq_err",
    "rnr_nak_retry_err", "duplicate_request", "req_cqe_error", "resp_cqe_error",
)  # fmt: skip


def _write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:  # in place: the same inode, like sysfs
        f.write(f"{value}\n")


def hca_port(sysfs: Path, hca: str, port: int = 1) -> Path:
    return sysfs / "class" / "infiniband" / hca / "ports" / str(port)


def build_node_tree(sysfs: Path, hcas: int = 8, sockets: int = 2, step: int = 0) -> None:
    """Write (or rewrite, for ``step``) a node's tree under ``sysfs``."""
    for h in range(hcas):
        port = hca_port(sysfs, f"mlx5_{h}")
        for i, name in enumerate(IB_COUNTERS):
            big = name.startswith(("port_xmit", "port_rcv", "unicast", "multicast"))
            value = (10**9 + h * 10**7) * (step + 1) + i if big else step % 3
            _write(port / "counters" / name, value)
        for name in HW_COUNTERS:
            _write(port / "hw_counters" / name, step * (h + 1))
        _write(port / "state", "4: ACTIVE")
        _write(port / "phys_state", "5: LinkUp")
        _write(port / "rate", "400 Gb/sec (4X NDR)")
        _write(port / "link_layer", "InfiniBand")
    powercap = sysfs / "class" / "powercap"
    for s in range(sockets):
        zone = powercap / f"intel-rapl:{s}"
        _write(zone / "name", f"package-{s}")
        _write(zone / "energy_uj", (step * 2_500_000_000 + s) % 262_143_328_850)
        _write(zone / "max_energy_range_uj", 262_143_328_850)
        dram = powercap / f"intel-rapl:{s}:0"
        _write(dram / "name", "dram")
        _write(dram / "energy_uj", step * 300_000_000 % 65_712_999_613)
        _write(dram / "max_energy_range_uj", 65_712_999_613)
    hwmon = sysfs / "class" / "hwmon"
    _write(hwmon / "hwmon0" / "name", "acpi_power_meter")
    _write(hwmon / "hwmon0" / "power1_average", 6_200_000_000 + step * 1_000_000)
    for s in range(sockets):
        chip = hwmon / f"hwmon{s + 1}"
        _write(chip / "name", "coretemp")
        _write(chip / "temp1_input", 52_000 + step * 100)
        _write(chip / "temp1_label", f"Package id {s}")
        _write(chip / "temp1_crit", 100_000)
    thermal = sysfs / "class" / "thermal"
    for z in range(sockets):
        zone = thermal / f"thermal_zone{z}"
        _write(zone / "type", "x86_pkg_temp")
        _write(zone / "temp", 51_000 + step * 100)
        _write(zone / "trip_point_0_type", "critical")
        _write(zone / "trip_point_0_temp", 105_000)


def advance(sysfs: Path, step: int, hcas: int = 8, sockets: int = 2) -> None:
    build_node_tree(sysfs, hcas, sockets, step)
