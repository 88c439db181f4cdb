"""InfluxQL for dashboards: queries built from catalogue names, and the Grafana target type.

The foundation SDK has no InfluxDB query type (no build has one), so :class:`InfluxQLTarget`
is the SDK's documented custom ``Dataquery`` variant: Grafana's InfluxDB datasource in raw
InfluxQL mode. :func:`register` teaches the SDK's ``from_json`` to read it back.

Queries are never written as free text. :class:`Select` and :class:`TagValues` take catalogue
names and check them when they are built (a typo fails at import time, not in Grafana), and
pick the aggregation a field's kind allows: ``rate`` (per second, counter resets dropped by
``non_negative_derivative``) only for counters, numeric aggregations only for numbers, and
only ``last``/``first``/``count`` for booleans and strings (InfluxQL cannot average them).

Grafana fills in ``$timeFilter``, ``$__interval`` and the template variables at query time;
:mod:`dashboards.grafana` does the same for tests and the offline renderer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.core.catalogue import CATALOGUE, FieldSpec, FieldType, Kind, Measurement
from gpuwarden.dashboards.errors import CatalogueNameError

DATASOURCE_TYPE = "influxdb"
DATASOURCE_VAR = "datasource"
#: Every panel and variable query goes through the dashboard's datasource variable.
DATASOURCE = model.DataSourceRef(type_val=DATASOURCE_TYPE, uid="${" + DATASOURCE_VAR + "}")

ResultFormat = Literal["time_series", "table"]

_NUMERIC = {FieldType.FLOAT, FieldType.INTEGER}
_ANY_TYPE = ("last", "first", "count")
_NUMERIC_ONLY = ("mean", "max", "min", "sum", "median", "spread")
_FUNCTIONS = (*_ANY_TYPE, *_NUMERIC_ONLY, "rate", "increase", "raw")


def quote(name: str) -> str:
    """An InfluxQL identifier in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def literal(value: bool | int | float | str) -> str:
    """An InfluxQL literal: booleans bare, strings in single quotes with escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _measurement(name: str) -> Measurement:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise CatalogueNameError(f"measurement {name!r} is not in the metric catalogue") from None


def _field(m: Measurement, name: str) -> FieldSpec:
    try:
        return m.fields[name]
    except KeyError:
        raise CatalogueNameError(f"field {name!r} is not in the catalogue for {m.name!r}") from None


def _tag(m: Measurement, name: str) -> None:
    if name not in m.tags:
        raise CatalogueNameError(f"tag {name!r} is not in the catalogue for {m.name!r}")


@dataclass(frozen=True, slots=True)
class Agg:
    """``fn(field) AS alias``. ``rate``: per-second increase of a counter;
    ``increase``: its increase per time bucket; ``raw``: the field itself (no GROUP BY time)."""

    fn: str
    field: str
    alias: str = ""

    @property
    def name(self) -> str:
        return self.alias or self.field

    def render(self) -> str:
        f = quote(self.field)
        if self.fn == "raw":
            expr = f
        elif self.fn == "rate":
            expr = f"non_negative_derivative(max({f}), 1s)"
        elif self.fn == "increase":
            expr = f"non_negative_difference(max({f}))"
        else:
            expr = f"{self.fn}({f})"
        return f"{expr} AS {quote(self.name)}"


@dataclass(frozen=True, slots=True)
class Cond:
    """``"key" op literal``; ``key`` a field or tag of the measurement."""

    key: str
    op: str
    value: bool | int | float | str

    def render(self) -> str:
        return f"{quote(self.key)} {self.op} {literal(self.value)}"


@dataclass(frozen=True)
class Select:
    """One InfluxQL SELECT over one catalogue measurement (or over an inner ``Select``).

    ``filters`` are template variables, each named like the tag it filters (``node`` ->
    ``"node" =~ /^$node$/``); ``every`` groups by ``time($__interval)``.
    """

    measurement: str
    aggs: tuple[Agg, ...]
    filters: tuple[str, ...] = ()
    where: tuple[Cond, ...] = ()
    group_tags: tuple[str, ...] = ()
    every: bool = True
    fill: str = "null"
    order_desc: bool = False
    limit: int | None = None
    inner: Select | None = None
    _types: dict[str, FieldType] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        m = _measurement(self.measurement)
        if not self.aggs:
            raise CatalogueNameError(f"a query on {self.measurement!r} selects nothing")
        if self.inner is not None and self.inner.measurement != self.measurement:
            raise CatalogueNameError("an inner query must read the same measurement")
        known = self.inner.output_types() if self.inner is not None else None
        for key in (*self.filters, *self.group_tags):
            _tag(m, key)
        for c in self.where:
            if c.key not in m.tags:
                _field(m, c.key)
        for a in self.aggs:
            if a.fn not in _FUNCTIONS:
                raise CatalogueNameError(f"unknown aggregation {a.fn!r}")
            if known is not None:
                if a.field not in known:
                    raise CatalogueNameError(f"{a.field!r} is not an output of the inner query")
                ftype, kind = known[a.field], Kind.GAUGE
            elif a.fn == "raw" and a.field in m.tags:  # a tag shown beside the fields
                ftype, kind = FieldType.STRING, Kind.INFO
            else:
                spec = _field(m, a.field)
                ftype, kind = spec.type, spec.kind
            if a.fn in _NUMERIC_ONLY and ftype not in _NUMERIC:
                raise CatalogueNameError(f"{a.fn}() of {ftype} field {a.field!r}")
            if a.fn in ("rate", "increase") and kind is not Kind.COUNTER:
                raise CatalogueNameError(f"{a.fn} of {a.field!r}, which is not a counter")
            if a.fn == "raw" and self.every:
                raise CatalogueNameError(f"raw {a.field!r} cannot be grouped by time")
            if a.fn in ("rate", "increase") and not self.every:
                raise CatalogueNameError(f"{a.fn} of {a.field!r} needs GROUP BY time")
            out = FieldType.FLOAT if a.fn in ("mean", "rate", "median") else ftype
            self._types[a.name] = FieldType.INTEGER if a.fn == "count" else out

    def output_types(self) -> dict[str, FieldType]:
        return dict(self._types)

    def render(self) -> str:
        cols = ", ".join(a.render() for a in self.aggs)
        source = f"({self.inner.render()})" if self.inner is not None else quote(self.measurement)
        where = ["$timeFilter"]
        where += [f"{quote(v)} =~ /^${v}$/" for v in self.filters]
        where += [c.render() for c in self.where]
        q = f"SELECT {cols} FROM {source} WHERE {' AND '.join(where)}"
        group = (["time($__interval)"] if self.every else []) + [quote(t) for t in self.group_tags]
        if group:
            q += " GROUP BY " + ", ".join(group)
        if self.every:
            q += f" fill({self.fill})"
        if self.order_desc:
            q += " ORDER BY time DESC"
        if self.limit is not None:
            q += f" LIMIT {self.limit}"
        return q


class Scope:
    """Queries for one dashboard: each filtered by those of the dashboard's template
    variables that its measurement carries as tags (``node`` applies to ``gpu`` but not to
    ``job_model``)."""

    def __init__(self, *variables: str) -> None:
        self.variables = variables

    def __call__(self, measurement: str, *aggs: Agg | tuple[Agg, ...], **kw: Any) -> Select:
        flat: list[Agg] = []
        for a in aggs:
            flat += [a] if isinstance(a, Agg) else list(a)
        inner = kw.get("inner")
        if inner is None:
            kw["filters"] = filters_for(measurement, self.variables) + tuple(kw.get("filters", ()))
        return Select(measurement, tuple(flat), **kw)

    def latest(
        self,
        measurement: str,
        fields: Sequence[str],
        limit: int = 200,
        where: tuple[Cond, ...] = (),
    ) -> Select:
        """Rows of fields and tags, newest first: for tables and annotations."""
        aggs = tuple(Agg("raw", f) for f in fields)
        return self(measurement, aggs, where=where, every=False, order_desc=True, limit=limit)

    def values(self, measurement: str, key: str) -> TagValues:
        """Tag values narrowed by the variables before ``key`` in this dashboard's order."""
        before = self.variables[: self.variables.index(key)] if key in self.variables else ()
        return TagValues(measurement, key, filters_for(measurement, before))


def agg(fn: str, *fields: str) -> tuple[Agg, ...]:
    """The same aggregation over several fields, each keeping its catalogue name."""
    return tuple(Agg(fn, f) for f in fields)


@dataclass(frozen=True)
class TagValues:
    """``SHOW TAG VALUES FROM "m" WITH KEY = "tag"`` narrowed by other template variables."""

    measurement: str
    key: str
    filters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        m = _measurement(self.measurement)
        for t in (self.key, *self.filters):
            _tag(m, t)

    def render(self) -> str:
        q = f"SHOW TAG VALUES FROM {quote(self.measurement)} WITH KEY = {quote(self.key)}"
        if self.filters:
            q += " WHERE " + " AND ".join(f"{quote(v)} =~ /^${v}$/" for v in self.filters)
        return q


class InfluxQLTarget(cogvariants.Dataquery):
    """A Grafana InfluxDB target in raw InfluxQL mode (``rawQuery: true``)."""

    def __init__(
        self,
        ref_id: str,
        query: str,
        result_format: ResultFormat = "time_series",
        alias: str = "",
        hide: bool = False,
        datasource_uid: str = "",
    ) -> None:
        self.ref_id = ref_id
        self.query = query
        self.result_format = result_format
        self.alias = alias
        self.hide = hide
        self.datasource_uid = datasource_uid  # alert rules name the datasource, not a variable

    def to_json(self) -> dict[str, object]:
        uid = self.datasource_uid or DATASOURCE.uid
        out: dict[str, object] = {
            "datasource": {"type": DATASOURCE_TYPE, "uid": uid},
            "query": self.query,
            "rawQuery": True,
            "refId": self.ref_id,
            "resultFormat": self.result_format,
        }
        if self.alias:
            out["alias"] = self.alias
        if self.hide:
            out["hide"] = True
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        fmt = data.get("resultFormat", "time_series")
        uid = str((data.get("datasource") or {}).get("uid", DATASOURCE.uid))
        if fmt not in ("time_series", "table"):
            raise ValueError(f"resultFormat {fmt!r} is not one gpuwarden writes")
        return cls(
            str(data["refId"]),
            str(data["query"]),
            fmt,
            str(data.get("alias", "")),
            bool(data.get("hide", False)),
            "" if uid == DATASOURCE.uid else uid,
        )


class Target(cogbuilder.Builder[cogvariants.Dataquery]):
    """Builder for :class:`InfluxQLTarget`, for the SDK's ``with_target``."""

    def __init__(
        self,
        query: Select | TagValues,
        ref_id: str = "A",
        *,
        alias: str = "",
        result_format: ResultFormat = "time_series",
        datasource_uid: str = "",
    ) -> None:
        self._target = InfluxQLTarget(
            ref_id, query.render(), result_format, alias, datasource_uid=datasource_uid
        )

    def build(self) -> cogvariants.Dataquery:
        return self._target


def targets(*queries: Select, alias: str = "") -> list[Target]:
    """Several queries as targets A, B, C, ... on one panel."""
    return [Target(q, chr(ord("A") + i), alias=alias) for i, q in enumerate(queries)]


def register() -> None:
    """Let the SDK's ``Dashboard.from_json`` read our targets back (idempotent)."""
    cogruntime.register_dataquery_variant(
        cogruntime.DataqueryConfig(DATASOURCE_TYPE, InfluxQLTarget.from_json)
    )


def filters_for(measurement: str, wanted: Sequence[str]) -> tuple[str, ...]:
    """The template variables among ``wanted`` that ``measurement`` carries as tags."""
    tags = _measurement(measurement).tags
    return tuple(v for v in wanted if v in tags)
