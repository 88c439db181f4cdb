"""A simulated node's sysfs: InfiniBand ports from the scenario, host power and temperatures.

Port counters are the scenario's ``ib_port`` telemetry written back as the kernel exposes them
(the inverse of :mod:`collector.sources.infiniband`: ``port_xmit_data``/``port_rcv_data`` in
4-byte words, ``state`` as ``4: ACTIVE``, ``rate`` as ``200 Gb/sec (4X HDR)``). The scenario
has no host power or temperature, so those files carry CONSTRUCTED steady values (RAPL energy
counting up at a constant 350 W a socket), enough for the agent's power and thermal sources to
read a plausible node. Files are rewritten in place, keeping their inode, as sysfs does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwarden.collector.sources.infiniband import COUNTERS, WORD_COUNTERS

#: catalogue field -> sysfs counter file (the agent's table, read backwards)
FILES = {field: name for name, field in COUNTERS.items()}
STATES = {4: "4: ACTIVE", 1: "1: DOWN", 2: "2: INIT", 3: "3: ARMED"}
PHYS_STATES = {5: "5: LinkUp", 3: "3: Disabled", 2: "2: Polling"}
SOCKETS = 2
RAPL_WRAP_UJ = 262_143_328_850


def _write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:  # in place: the same inode, like sysfs
        f.write(f"{value}\n")


def write_ports(sysfs: Path, ports: Mapping[str, Mapping[str, Any]]) -> None:
    """One node's ports: ``hca`` -> its ``ib_port`` row of this tick."""
    for hca, row in ports.items():
        port = sysfs / "class" / "infiniband" / hca / "ports" / str(row.get("port", "1"))
        for field, value in row.items():
            name = FILES.get(field)
            if name is None or value is None:
                continue
            n = int(value) // 4 if name in WORD_COUNTERS else int(value)
            sub = "hw_counters" if name.startswith(("np_", "rp_")) else "counters"
            _write(port / sub / name, n)
        state = int(row.get("state_code", 4))
        _write(port / "state", STATES.get(state, f"{state}: UNKNOWN"))
        phys = int(row.get("phys_state_code", 5))
        _write(port / "phys_state", PHYS_STATES.get(phys, f"{phys}: Unknown"))
        rate = float(row.get("rate_gbps", 200.0))
        _write(port / "rate", f"{rate:g} Gb/sec (4X HDR)")
        _write(port / "link_layer", str(row.get("link_layer", "InfiniBand")))


def write_host(sysfs: Path, elapsed_s: float) -> None:
    """CONSTRUCTED host power and temperatures, ``elapsed_s`` into the run."""
    powercap = sysfs / "class" / "powercap"
    for s in range(SOCKETS):
        zone = powercap / f"intel-rapl:{s}"
        _write(zone / "name", f"package-{s}")
        _write(zone / "energy_uj", int(elapsed_s * 350e6 + s) % RAPL_WRAP_UJ)
        _write(zone / "max_energy_range_uj", RAPL_WRAP_UJ)
    hwmon = sysfs / "class" / "hwmon"
    _write(hwmon / "hwmon0" / "name", "acpi_power_meter")
    _write(hwmon / "hwmon0" / "power1_average", 6_200_000_000)
    for s in range(SOCKETS):
        chip = hwmon / f"hwmon{s + 1}"
        _write(chip / "name", "coretemp")
        _write(chip / "temp1_input", 52_000)
        _write(chip / "temp1_label", f"Package id {s}")
        _write(chip / "temp1_crit", 100_000)
    thermal = sysfs / "class" / "thermal"
    for z in range(SOCKETS):
        zone = thermal / f"thermal_zone{z}"
        _write(zone / "type", "x86_pkg_temp")
        _write(zone / "temp", 51_000)
        _write(zone / "trip_point_0_type", "critical")
        _write(zone / "trip_point_0_temp", 105_000)
