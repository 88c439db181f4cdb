"""Temperatures: thermal zones (``<sysfs>/class/thermal/thermal_zone*``) and hwmon ``temp*``.

Values are millidegrees Celsius in sysfs and written in °C. A zone's critical trip point
(``trip_point_N_type == critical``) and a hwmon sensor's ``temp*_crit`` become ``crit_temp_c``.
"""

from __future__ import annotations

import os
from typing import Any

from gpuwarden.collector.sources.base import FileReader, SourceContext, hwmon_chips, parse_int
from gpuwarden.core.store.lineprotocol import Point

Sensor = tuple[str, str, str, str, str | None]  # zone, sensor, source, temp path, crit path


def discover_zones(root: str, files: FileReader) -> list[Sensor]:
    sensors: list[Sensor] = []
    try:
        zones = sorted(
            (z for z in os.listdir(root) if z.startswith("thermal_zone")),
            key=lambda z: (len(z), z),
        )
    except OSError:
        return sensors
    for zone in zones:
        path = os.path.join(root, zone)
        kind = (files.read(os.path.join(path, "type")) or zone).strip()
        crit = None
        for i in range(16):
            trip = files.read(os.path.join(path, f"trip_point_{i}_type"))
            if trip is None:
                break
            if trip.strip() == "critical":
                crit = os.path.join(path, f"trip_point_{i}_temp")
                break
        sensors.append((zone, kind, "thermal_zone", os.path.join(path, "temp"), crit))
    return sensors


def discover_hwmon_temps(root: str, files: FileReader) -> list[Sensor]:
    sensors: list[Sensor] = []
    for zone, path, entries in hwmon_chips(root, files):
        for entry in entries:
            if entry.startswith("temp") and entry.endswith("_input"):
                stem = entry.removesuffix("_input")
                label = files.read(os.path.join(path, f"{stem}_label"))
                crit = f"{stem}_crit"
                sensors.append(
                    (
                        zone,
                        (label or stem).strip(),
                        "hwmon",
                        os.path.join(path, entry),
                        os.path.join(path, crit) if crit in entries else None,
                    )
                )
    return sensors


class ThermalSource:
    name = "thermal"

    def __init__(self, context: SourceContext, settings: dict[str, Any]) -> None:
        self.context = context
        self.zones = bool(settings.get("thermal_zones", True))
        self.hwmon = bool(settings.get("hwmon", True))
        self._files = FileReader()
        self._sensors: list[Sensor] | None = None
        self._tags: dict[tuple[str, str, str], dict[str, str]] = {}
        self.bad_values = 0

    def collect(self, now_ns: int) -> list[Point]:
        if self._sensors is None:
            sysfs = self.context.sysfs / "class"
            self._sensors = []
            if self.zones:
                self._sensors += discover_zones(str(sysfs / "thermal"), self._files)
            if self.hwmon:
                self._sensors += discover_hwmon_temps(str(sysfs / "hwmon"), self._files)
        points = []
        for zone, sensor, source, temp_path, crit_path in self._sensors:
            temp = parse_int(self._files.read(temp_path))
            if temp is None:
                self.bad_values += 1
                continue
            fields: dict[str, Any] = {"temp_c": temp / 1000}
            crit = parse_int(self._files.read(crit_path)) if crit_path else None
            if crit is not None and crit > 0:
                fields["crit_temp_c"] = crit / 1000
            key = (zone, sensor, source)
            tags = self._tags.get(key)
            if tags is None:
                tags = self.context.base_tags() | {"zone": zone, "sensor": sensor, "source": source}
                self._tags[key] = tags
            points.append(Point("thermal", tags, fields, now_ns))
        return points

    def close(self) -> None:
        self._files.close()
