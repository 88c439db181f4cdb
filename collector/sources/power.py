"""Host power: RAPL zones (``<sysfs>/class/powercap/intel-rapl*``) and hwmon power/energy.

RAPL's ``energy_uj`` wraps to zero at ``max_energy_range_uj`` (every few minutes to an hour on
a busy socket). Unlike the other counters this one is unwrapped here, because only the agent
knows the range: ``energy_j_total`` adds ``max_energy_range_uj`` at each wrap, so it only ever
falls when the agent restarts (which downstream rate code treats as a reset). hwmon power is in
microwatts (``power*_input`` or ``power*_average``), hwmon energy in microjoules (a counter).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpuwarden.collector.sources.base import FileReader, SourceContext, hwmon_chips, parse_int
from gpuwarden.core.store.lineprotocol import Point


@dataclass(frozen=True)
class RaplZone:
    domain: str
    energy_path: str
    max_range_uj: int | None


def discover_rapl(root: str, files: FileReader) -> list[RaplZone]:
    zones: list[RaplZone] = []
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("intel-rapl:"))
    except OSError:
        return zones
    by_id: dict[str, str] = {}
    for entry in sorted(names, key=lambda n: (n.count(":"), n)):
        path = os.path.join(root, entry)
        name = (files.read(os.path.join(path, "name")) or entry).strip()
        zone_id = entry.removeprefix("intel-rapl:")
        parent = by_id.get(zone_id.rsplit(":", 1)[0]) if ":" in zone_id else None
        domain = f"{parent}/{name}" if parent else name
        by_id[zone_id] = domain
        max_range = parse_int(files.read(os.path.join(path, "max_energy_range_uj")))
        zones.append(RaplZone(domain, os.path.join(path, "energy_uj"), max_range))
    return zones


class RaplUnwrapper:
    """Turns a wrapping ``energy_uj`` into a total that only grows (pure, stateful)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._offset: dict[str, int] = {}

    def total_uj(self, domain: str, raw: int, max_range: int | None) -> int:
        last = self._last.get(domain)
        if last is not None and raw < last and max_range:
            self._offset[domain] = self._offset.get(domain, 0) + max_range
        self._last[domain] = raw
        return raw + self._offset.get(domain, 0)


def discover_hwmon_power(root: str, files: FileReader) -> list[tuple[str, str, str]]:
    """(domain, kind 'power'|'energy', path) for every hwmon power or energy sensor."""
    sensors: list[tuple[str, str, str]] = []
    for chip_name, path, entries in hwmon_chips(root, files):
        for entry in entries:
            for kind, suffixes in (("power", ("_input", "_average")), ("energy", ("_input",))):
                if entry.startswith(kind) and entry.endswith(suffixes):
                    stem = entry.rsplit("_", 1)[0]
                    if (
                        kind == "power"
                        and entry.endswith("_average")
                        and (f"{stem}_input" in entries)
                    ):
                        continue  # prefer the instantaneous reading
                    label = files.read(os.path.join(path, f"{stem}_label"))
                    domain = f"{chip_name}/{(label or stem).strip()}"
                    sensors.append((domain, kind, os.path.join(path, entry)))
    return sensors


class PowerSource:
    name = "power"

    def __init__(self, context: SourceContext, settings: dict[str, Any]) -> None:
        self.context = context
        self.rapl = bool(settings.get("rapl", True))
        self.hwmon = bool(settings.get("hwmon", True))
        self._files = FileReader()
        self._zones: list[RaplZone] | None = None
        self._sensors: list[tuple[str, str, str]] = []
        self._unwrap = RaplUnwrapper()
        self._tags: dict[tuple[str, str], dict[str, str]] = {}
        self.bad_values = 0

    def _discover(self) -> None:
        sysfs = self.context.sysfs / "class"
        self._zones = discover_rapl(str(sysfs / "powercap"), self._files) if self.rapl else []
        if self.hwmon:
            self._sensors = discover_hwmon_power(str(sysfs / "hwmon"), self._files)

    def _point(self, domain: str, source: str, fields: dict[str, Any], now_ns: int) -> Point:
        tags = self._tags.get((domain, source))
        if tags is None:
            tags = self.context.base_tags() | {"domain": domain, "source": source}
            self._tags[(domain, source)] = tags
        return Point("host_power", tags, fields, now_ns)

    def collect(self, now_ns: int) -> list[Point]:
        if self._zones is None:
            self._discover()
        assert self._zones is not None
        points = []
        for zone in self._zones:
            raw = parse_int(self._files.read(zone.energy_path))
            if raw is None or raw < 0:
                self.bad_values += 1
                continue
            total = self._unwrap.total_uj(zone.domain, raw, zone.max_range_uj)
            points.append(self._point(zone.domain, "rapl", {"energy_j_total": total / 1e6}, now_ns))
        for domain, kind, path in self._sensors:
            value = parse_int(self._files.read(path))
            if value is None or value < 0:
                self.bad_values += 1
                continue
            field = {"power": "power_w", "energy": "energy_j_total"}[kind]
            points.append(self._point(domain, "hwmon", {field: value / 1e6}, now_ns))
        return points

    def close(self) -> None:
        self._files.close()
