"""InfluxDB line protocol: exact escaping, typed fields, NaN/inf never written.

Escaping follows what InfluxDB 1.x parses (checked against the Debian package's 1.6.7):

* measurement: ``,`` and space are escaped with a backslash;
* tag keys, tag values and field keys: ``,``, ``=`` and space are escaped; any other backslash
  is literal (so ``a\\,b`` is written ``a\\\\,b``);
* string field values are double-quoted with ``"`` and ``\\`` escaped; newlines are literal.

Some names have no representation at all, and the encoder raises :class:`LineProtocolError`
for them rather than writing something that reads back different: an empty name, a newline
in a name (it would end the line), a trailing backslash (it would escape the separator), a
measurement starting with ``#`` (a comment line) or with a tab or NUL (InfluxDB skips them at
the start of a line, so the name would lose them), a field key starting with a tab or NUL (it
skips them before the field set too), and the key ``time``. An empty tag value
means "no tag" and is left out. Where the points come from outside the code (a job's
environment, a hardware answer: the agent's sink), ``encode_points(..., drop_unencodable=True)``
drops such a point instead and counts it (``EncodeStats.points_unencodable``), so that one bad
value never stops a writer.

Values: ``int`` is written with the ``i`` suffix (and must fit in int64), ``bool`` as
``true``/``false``, ``float`` in its shortest round-trip form. A non-finite float or an
out-of-range integer is never written: the field is dropped and counted, and a point left
with no fields is dropped and counted (:class:`EncodeStats`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpuwarden.core.errors import LineProtocolError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

FieldValue = float | int | bool | str


class Precision(StrEnum):
    """Timestamp precision of the written lines (the ``precision`` query parameter)."""

    S = "s"
    MS = "ms"
    US = "us"
    NS = "ns"

    @property
    def ns_per_unit(self) -> int:
        return _NS_PER_UNIT[self]


_NS_PER_UNIT = {Precision.S: 10**9, Precision.MS: 10**6, Precision.US: 10**3, Precision.NS: 1}

_MEASUREMENT_ESCAPES = str.maketrans({",": r"\,", " ": r"\ "})
_KEY_ESCAPES = str.maketrans({",": r"\,", " ": r"\ ", "=": r"\="})
_STRING_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"'})


@dataclass(slots=True)
class Point:
    measurement: str
    tags: Mapping[str, str]
    fields: Mapping[str, FieldValue]
    time_ns: int


@dataclass(slots=True)
class EncodeStats:
    """What the encoder wrote and what it refused to write."""

    points_in: int = 0
    points_out: int = 0
    fields_dropped: int = 0
    points_dropped: int = 0
    points_unencodable: int = 0
    """points with a name or value the line protocol cannot carry (``drop_unencodable``)"""
    reasons: dict[str, int] = field(default_factory=dict)

    def drop_field(self, reason: str) -> None:
        self.fields_dropped += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def add(self, other: EncodeStats) -> None:
        self.points_in += other.points_in
        self.points_out += other.points_out
        self.fields_dropped += other.fields_dropped
        self.points_dropped += other.points_dropped
        self.points_unencodable += other.points_unencodable
        for k, v in other.reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + v


def check_name(name: str, what: str) -> None:
    """Raise if ``name`` cannot be written as a measurement, tag key/value or field key."""
    if not name:
        raise LineProtocolError(f"{what} must not be empty")
    if "\n" in name or "\r" in name:
        raise LineProtocolError(f"{what} {name!r} contains a line break")
    if name.endswith("\\"):
        raise LineProtocolError(f"{what} {name!r} ends with a backslash, which would escape")
    if what != "tag value" and name == "time":
        raise LineProtocolError(f"{what} 'time' is reserved by InfluxDB")


def escape_measurement(name: str) -> str:
    check_name(name, "measurement")
    if name.startswith("#"):
        raise LineProtocolError(f"measurement {name!r} starts with '#', a comment line")
    if name.startswith(("\t", "\x00")):
        raise LineProtocolError(
            f"measurement {name!r} starts with a tab or NUL, which InfluxDB skips at line start"
        )
    return name.translate(_MEASUREMENT_ESCAPES)


def escape_key(name: str, what: str = "key") -> str:
    check_name(name, what)
    if what == "field key" and name.startswith(("\t", "\x00")):
        # the field set follows a space, and InfluxDB skips tabs and NULs after it too: the
        # first field's key would lose them (it stores "\tx" as "x", "\t" as "")
        raise LineProtocolError(
            f"field key {name!r} starts with a tab or NUL, which InfluxDB skips before the fields"
        )
    return name.translate(_KEY_ESCAPES)


def escape_string(value: str) -> str:
    return '"' + value.translate(_STRING_ESCAPES) + '"'


def format_field_value(value: FieldValue, stats: EncodeStats | None = None) -> str | None:
    """The value as line protocol, or None (counted in ``stats``) if it must not be written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return f"{value}i"
        if stats is not None:
            stats.drop_field("int64 overflow")
        return None
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        if stats is not None:
            stats.drop_field("nan" if math.isnan(value) else "inf")
        return None
    if isinstance(value, str):
        return escape_string(value)
    raise LineProtocolError(f"unsupported field value type {type(value).__name__}: {value!r}")


_FIELD_KEYS: dict[str, str] = {}
_SERIES: dict[tuple[object, ...], str] = {}
_SERIES_MAX = 100_000  # distinct series cached; the cache starts over past it


def _series_key(measurement: str, tags: Mapping[str, str]) -> str:
    parts = [escape_measurement(measurement)]
    for key in sorted(tags):  # sorted tags are what InfluxDB indexes fastest
        value = tags[key]
        if value == "":
            continue
        parts.append(f",{escape_key(key, 'tag key')}={escape_key(value, 'tag value')}")
    return "".join(parts)


def encode_point(
    point: Point, precision: Precision = Precision.NS, stats: EncodeStats | None = None
) -> str | None:
    """One line without the trailing newline, or None if the point has no writable field.

    The escaped series key (measurement and tags) and escaped field keys are cached: an agent
    writes the same few hundred series every cycle, and escaping is most of the cost."""
    if stats is None:
        stats = EncodeStats()
    stats.points_in += 1
    cache_key = (point.measurement, *point.tags.items())
    series = _SERIES.get(cache_key)
    if series is None:
        series = _series_key(point.measurement, point.tags)
        if len(_SERIES) >= _SERIES_MAX:
            _SERIES.clear()
        _SERIES[cache_key] = series
    fields = []
    for key, value in point.fields.items():
        escaped = _FIELD_KEYS.get(key)
        if escaped is None:
            escaped = escape_key(key, "field key")
            if len(_FIELD_KEYS) < _SERIES_MAX:
                _FIELD_KEYS[key] = escaped
        kind = type(value)
        if kind is float and math.isfinite(value):  # type: ignore[arg-type]
            fields.append(f"{escaped}={value!r}")
        elif kind is int and INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
            fields.append(f"{escaped}={value}i")
        else:
            text = format_field_value(value, stats)
            if text is not None:
                fields.append(f"{escaped}={text}")
    if not fields:
        stats.points_dropped += 1
        return None
    stats.points_out += 1
    timestamp = point.time_ns // precision.ns_per_unit
    return f"{series} {','.join(fields)} {timestamp}"


def encode_points(
    points: Iterable[Point],
    precision: Precision = Precision.NS,
    stats: EncodeStats | None = None,
    *,
    drop_unencodable: bool = False,
) -> list[str]:
    """The points' lines. A point that cannot be written raises :class:`LineProtocolError`, or
    with ``drop_unencodable`` is left out and counted (``stats.points_unencodable``, reason
    ``unencodable``): for writers that must go on whatever their points carry."""
    if stats is None:
        stats = EncodeStats()
    lines = []
    for p in points:
        try:
            line = encode_point(p, precision, stats)
        except LineProtocolError:
            if not drop_unencodable:
                raise
            stats.points_unencodable += 1
            stats.reasons["unencodable"] = stats.reasons.get("unencodable", 0) + 1
            continue
        if line is not None:
            lines.append(line)
    return lines
