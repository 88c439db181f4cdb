"""The metric catalogue: every measurement, field and tag gpuwarden writes, declared once.

This is the single source of truth for names, units and types. The agent, analytics,
remediation and dashboards all use these names; tests fail on any field written that is not
declared here or that is written with another type (see :func:`check_point`).

Naming rules (DESIGN.md, "Metric catalogue"):

* snake_case, with the unit in the name: ``power_w``, ``energy_j_total``,
  ``port_xmit_data_bytes_total``. Dimensionless values say what they are: ``_pct`` (0-100),
  ``_ratio`` (0-1), ``_count``; enumerations end in ``_code``; booleans in ``_active``.
* Counters are raw monotonic totals exactly as the hardware reports them and end in
  ``_total``. Rates are computed downstream, which handles resets and the 32-bit saturation
  of legacy InfiniBand counters.
* Tags are low-cardinality: cluster, node, gpu index and uuid, hca, port, job, rank, ...
  Anything unbounded (a pid, a message, an id) is a field.
* Unavailable is not zero: a value the hardware does not support is absent from the point,
  never written as 0 or -1.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# the families register their measurements in this order, which is the catalogue's
# isort: off
from gpuwarden.core.catalogue import gpu  # noqa: F401
from gpuwarden.core.catalogue import node  # noqa: F401
from gpuwarden.core.catalogue import job  # noqa: F401
from gpuwarden.core.catalogue import derived  # noqa: F401

# isort: on
from gpuwarden.core.catalogue.gpu import CLOCK_EVENT_REASONS
from gpuwarden.core.catalogue.schema import (
    _MEASUREMENTS,
    TAGS,
    FieldSpec,
    FieldType,
    Kind,
    Measurement,
    Producer,
)

__all__ = [
    "CATALOGUE",
    "CLOCK_EVENT_REASONS",
    "TAGS",
    "FieldSpec",
    "FieldType",
    "Kind",
    "Measurement",
    "Producer",
    "check_point",
    "field_type_of",
    "measurement",
    "window_extreme",
]

CATALOGUE: Mapping[str, Measurement] = MappingProxyType({m.name: m for m in _MEASUREMENTS})


def measurement(name: str) -> Measurement:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(f"measurement {name!r} is not in the catalogue") from None


def field_type_of(value: object) -> FieldType | None:
    """The InfluxDB type a Python value is written as (bool before int: bool is an int)."""
    if isinstance(value, bool):
        return FieldType.BOOLEAN
    if isinstance(value, int):
        return FieldType.INTEGER
    if isinstance(value, float):
        return FieldType.FLOAT
    if isinstance(value, str):
        return FieldType.STRING
    return None


def window_extreme(m: Measurement, name: str) -> FieldSpec | None:
    """``<gauge>_min`` / ``<gauge>_max``: a gauge's extremes over a window, which an agent
    that aggregates (``[agent] write_every_s``) writes beside the window's mean; same type
    and unit as the gauge."""
    base, _, end = name.rpartition("_")
    spec = m.fields.get(base) if end in ("min", "max") else None
    return spec if spec is not None and spec.kind is Kind.GAUGE else None


def check_point(
    measurement_name: str, tags: Mapping[str, object], fields: Mapping[str, object]
) -> list[str]:
    """Every way a point departs from the catalogue, as readable messages (empty: it conforms)."""
    m = CATALOGUE.get(measurement_name)
    if m is None:
        return [f"measurement {measurement_name!r} is not in the catalogue"]
    problems = [f"{m.name}: tag {k!r} is not declared" for k in tags if k not in m.tags]
    for key, value in fields.items():
        spec = m.fields.get(key) or window_extreme(m, key)
        if spec is None:
            problems.append(f"{m.name}: field {key!r} is not declared")
            continue
        written = field_type_of(value)
        if written is not spec.type:
            problems.append(f"{m.name}.{key}: declared {spec.type}, written as {written}")
    return problems
