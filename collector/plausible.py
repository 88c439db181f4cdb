"""Readings that cannot be true are left out, counted and said once.

Sensors lie in known ways: a disabled thermal zone reads the kernel's THERMAL_TEMP_INVALID
(-274 °C), a register that reads all ones becomes 4.3 MW when taken as milliwatts, a failing
sensor sticks at its maximum. Written as data, one such value wrecks a dashboard's axis, a
job's energy and the predictor's features for that GPU. Each hardware gauge in the catalogue
carries a physical range (:attr:`core.catalogue.FieldSpec.valid`, deliberately wide);
:class:`Screen` removes a field outside it from its point, keeps every other field, counts it
per source (``agent.implausible_total``) and logs the first one of each measurement and field
with its value and tags. Counters are not screened: their resets and wraps are handled
downstream, where the previous value is known.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from gpuwarden.core.catalogue import CATALOGUE, Measurement
from gpuwarden.core.store.lineprotocol import Point

log = logging.getLogger(__name__)


class Screen:
    def __init__(self, catalogue: Mapping[str, Measurement] = CATALOGUE) -> None:
        self.ranges: dict[str, tuple[tuple[str, float, float], ...]] = {}
        for m in catalogue.values():
            ranges = tuple((f.name, *f.valid) for f in m.fields.values() if f.valid)
            if ranges:
                self.ranges[m.name] = ranges
        self._said: set[tuple[str, str]] = set()

    def __call__(self, points: list[Point]) -> int:
        """Removes the implausible fields of ``points`` in place (and a point left with no
        field); returns how many fields."""
        dropped = emptied = 0
        for point in points:
            ranges = self.ranges.get(point.measurement)
            if ranges is None:
                continue
            fields = point.fields
            bad = [
                (name, low, high)
                for name, low, high in ranges
                if (value := fields.get(name)) is not None and not low <= value <= high  # type: ignore[operator]
            ]
            if bad:
                dropped += len(bad)
                for name, low, high in bad:
                    self._say(point, name, low, high)
                names = {name for name, _, _ in bad}
                point.fields = {k: v for k, v in fields.items() if k not in names}
                emptied += not point.fields
        if emptied:  # a point with nothing left is not a point
            points[:] = [p for p in points if p.fields]
        return dropped

    def _say(self, point: Point, name: str, low: float, high: float) -> None:
        key = (point.measurement, name)
        if key in self._said:
            return
        self._said.add(key)
        value = point.fields[name]
        shown = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)
        where = ",".join(f"{k}={v}" for k, v in sorted(point.tags.items()))
        log.warning(
            "%s.%s = %s (%s) is outside its physical range %g..%g: left out and counted in "
            "agent.implausible_total (said once per field)",
            point.measurement,
            name,
            shown,
            where,
            low,
            high,
        )
