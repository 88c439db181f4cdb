"""What Grafana does to a query before InfluxDB sees it, for tests and the offline renderer.

This models Grafana's InfluxDB (InfluxQL) datasource, so a query can be run here exactly as
Grafana would run it, without a Grafana server (none is packaged for these machines):

* ``$timeFilter`` -> ``time >= <from>ms and time <= <to>ms``;
* ``$__interval`` -> the time range divided by the panel's resolution, rounded to a "nice"
  step as Grafana's ``roundInterval`` does (the step table here is ours, so an interval can
  differ from Grafana's by one step), never below the datasource's minimum interval;
  ``$__interval_ms`` the same in milliseconds;
* template variables (``$name``, ``${name}``, ``[[name]]``): a variable that is neither multi
  nor include-all is inserted as it is; otherwise each value is regex-escaped, several become
  ``(a|b|c)``, and "All" becomes the variable's custom all value (``.*`` here) unescaped --
  InfluxDB and Prometheus datasources format multi-values for regex matching this way;
* legends from ``alias`` (``$tag_<key>``, ``$col``, ``$m``), or ``measurement.column {tags}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

ALL = "$__all"

# (upper bound, step) in ms: an interval below the bound rounds to the step.
_STEPS_MS = (
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1_500, 1_000),
    (3_500, 2_000),
    (7_500, 5_000),
    (12_500, 10_000),
    (17_500, 15_000),
    (25_000, 20_000),
    (45_000, 30_000),
    (90_000, 60_000),
    (210_000, 120_000),
    (450_000, 300_000),
    (750_000, 600_000),
    (1_050_000, 900_000),
    (1_500_000, 1_200_000),
    (2_700_000, 1_800_000),
    (5_400_000, 3_600_000),
    (9_000_000, 7_200_000),
    (16_200_000, 10_800_000),
    (32_400_000, 21_600_000),
    (86_400_000, 43_200_000),
    (604_800_000, 86_400_000),
)


def round_interval(ms: float) -> int:
    for upper, step in _STEPS_MS:
        if ms < upper:
            return step
    return 604_800_000


def format_duration(ms: int) -> str:
    """``30000`` -> ``30s``; the largest unit that divides it (ms, s, m, h, d)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def parse_duration(text: str) -> int:
    """``10s`` -> 10000 (ms); the datasource's minimum interval is written this way."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a Grafana duration such as 10s, 5m, 1h")
    size = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[m.group(2)]
    return int(m.group(1)) * size


@dataclass(frozen=True)
class QueryContext:
    """A time range (ms since the epoch), a resolution and the variables' selected values."""

    from_ms: int
    to_ms: int
    max_data_points: int = 1000
    min_interval_ms: int = 10_000
    values: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: per variable: (multi or include-all, custom all value)
    definitions: Mapping[str, tuple[bool, str | None]] = field(default_factory=dict)

    @property
    def interval_ms(self) -> int:
        raw = (self.to_ms - self.from_ms) / max(1, self.max_data_points)
        return max(round_interval(raw), self.min_interval_ms)


_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}/]")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def escape_regex(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), value)


def format_value(values: Sequence[str], multi_or_all: bool, all_value: str | None) -> str:
    if list(values) == [ALL]:
        if all_value is not None:
            return all_value
        raise ValueError("'All' needs the variable's values (no custom all value)")
    if not multi_or_all:
        return values[0] if values else ""
    escaped = [escape_regex(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def interpolate(query: str, ctx: QueryContext) -> str:
    """The query as Grafana sends it to InfluxDB. Unknown ``$names`` stay as they are (Grafana
    leaves them too, and InfluxDB then fails: the tests catch that)."""
    interval = ctx.interval_ms
    fixed = {
        "timeFilter": f"time >= {ctx.from_ms}ms and time <= {ctx.to_ms}ms",
        "__interval": format_duration(interval),
        "__interval_ms": str(interval),
    }

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in fixed:
            return fixed[name]
        if name in ctx.values:
            multi, all_value = ctx.definitions.get(name, (True, None))
            return format_value(ctx.values[name], multi, all_value)
        return m.group(0)

    return _VARIABLE.sub(sub, query)


def referenced_variables(text: str) -> set[str]:
    """Names a query, title or link refers to, without Grafana's built-ins."""
    names = {m.group(1) or m.group(2) or m.group(3) for m in _VARIABLE.finditer(text)}
    return {n for n in names if not n.startswith("__") and n != "timeFilter"}


def legend(alias: str, measurement: str, column: str, tags: Mapping[str, str]) -> str:
    """A series' name as Grafana's InfluxDB datasource shows it."""
    if not alias:
        base = f"{measurement}.{column}"
        if tags:
            base += " {" + ", ".join(f"{k}: {v}" for k, v in sorted(tags.items())) + "}"
        return base

    def sub(m: re.Match[str]) -> str:
        key = m.group(1) or m.group(2) or m.group(3)
        if key.startswith("tag_"):
            return tags.get(key[4:], "")
        return {"col": column, "m": measurement, "measurement": measurement}.get(key, m.group(0))

    return re.sub(r"\$\{(\w+)\}|\[\[(\w+)\]\]|\$(\w+)", sub, alias)
