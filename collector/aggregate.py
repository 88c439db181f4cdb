"""Collect often, write less: the agent's optional aggregation (``[agent] write_every_s``).

At 1 Hz an agent writes every reading; across 100k GPUs that is millions of fields a second,
more than one InfluxDB node takes (docs/SCALE.md). With ``write_every_s`` set (say 10 with
``interval_s = 1``), the agent still reads the hardware every second but writes each series
once per window, from the readings of that window:

* a **gauge** field (catalogue kind ``gauge``: utilisation, power, temperature, clocks) gets the
  window's **mean** under its own name, so dashboards and analytics read the same field, plus
  ``<field>_min`` and ``<field>_max``, so a spike between two writes is still seen;
* every other field (counters, states, info) gets its **last** value: a counter's last value
  is exact, and rates over windows still come out right;
* an integer gauge's mean is rounded to an integer: InfluxDB 1.x refuses a float into a field
  that holds integers (a field type conflict), and the type must not depend on this setting.

The point is stamped with the window's last reading. Events (XIDs, SXids, OS events, GPU
events), findings, the agent's own health and anything not in ``measurements`` go out at once,
unaggregated: an event must never wait, nor be averaged away. What is held when the agent stops
is written then (``close``), so a stop loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuwarden.core.catalogue import CATALOGUE, Kind
from gpuwarden.core.store.lineprotocol import Point

NS = 1_000_000_000
DEFAULT_MEASUREMENTS = ("gpu", "gpu_nvlink", "ib_port", "power", "thermal", "node_os")


def gauges(measurement: str) -> frozenset[str]:
    m = CATALOGUE.get(measurement)
    if m is None:
        return frozenset()
    return frozenset(f.name for f in m.fields.values() if f.kind is Kind.GAUGE)


class Window:
    """The readings of one series within the current window."""

    __slots__ = ("count", "last", "maxs", "mins", "sums", "tags", "time_ns")

    def __init__(self, point: Point) -> None:
        self.tags = point.tags
        self.count: dict[str, int] = {}
        self.sums: dict[str, float] = {}
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        self.last: dict[str, Any] = {}
        self.time_ns = point.time_ns

    def add(self, point: Point, gauge: frozenset[str]) -> None:
        self.time_ns = point.time_ns
        for name, value in point.fields.items():
            if name in gauge and isinstance(value, int | float) and not isinstance(value, bool):
                self.count[name] = self.count.get(name, 0) + 1
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.mins[name] = min(self.mins.get(name, value), value)
                self.maxs[name] = max(self.maxs.get(name, value), value)
            else:
                self.last[name] = value

    def point(self, measurement: str) -> Point:
        fields: dict[str, Any] = dict(self.last)
        for name, n in self.count.items():
            mean = self.sums[name] / n
            fields[name] = round(mean) if isinstance(self.mins[name], int) else mean
            fields[f"{name}_min"] = self.mins[name]
            fields[f"{name}_max"] = self.maxs[name]
        return Point(measurement, self.tags, fields, self.time_ns)


class AggregatingSink:
    """Wraps the agent's sink: points of ``measurements`` are held and written once per
    ``window_s`` as described above; the rest pass straight through."""

    def __init__(
        self,
        sink: Any,
        window_s: float,
        measurements: Iterable[str] = DEFAULT_MEASUREMENTS,
    ) -> None:
        if window_s <= 0:
            raise ValueError("write_every_s must be positive")
        self.sink = sink
        self.window_ns = int(window_s * NS)
        self.gauge = {m: gauges(m) for m in measurements}
        self.windows: dict[tuple[str, tuple[tuple[str, str], ...]], Window] = {}
        self.started_ns: int | None = None
        self.points_in = 0
        self.points_out = 0

    def persist(self) -> None:
        """What the inner sink holds, on disk (events pass through at once: see above)."""
        persist = getattr(self.sink, "persist", None)
        if persist is not None:
            persist()

    def write_points(self, points: Iterable[Point]) -> None:
        points = list(points)
        self.points_in += len(points)
        now = [p for p in points if p.measurement not in self.gauge]
        held = [p for p in points if p.measurement in self.gauge]
        if held:
            t = max(p.time_ns for p in held)
            if self.started_ns is not None and t - self.started_ns >= self.window_ns:
                now += self._drain()  # this cycle starts the next window
                self.started_ns = None
            if self.started_ns is None:
                self.started_ns = t
            for p in held:
                key = (p.measurement, tuple(sorted(p.tags.items())))
                window = self.windows.get(key)
                if window is None:
                    window = self.windows[key] = Window(p)
                window.add(p, self.gauge[p.measurement])
        self.points_out += len(now)
        if now:
            self.sink.write_points(now)

    def _drain(self) -> list[Point]:
        out = [w.point(key[0]) for key, w in self.windows.items()]
        self.windows.clear()
        return out

    def close(self, timeout_s: float = 10.0) -> bool:
        held = self._drain()
        self.points_out += len(held)
        if held:
            self.sink.write_points(held)
        return bool(self.sink.close(timeout_s))

    def __getattr__(self, name: str) -> Any:  # the sink's counters and the rest
        return getattr(self.sink, name)
