"""Panel, variable, link and annotation helpers shared by every gpuwarden dashboard.

Each helper returns a foundation-SDK builder with gpuwarden's conventions applied: the
datasource variable, units from the catalogue mapped to Grafana's unit ids, a description on
every panel, and ``Board`` to lay panels out in rows of 24 columns with unique ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import stat, statetimeline, statushistory, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.core.catalogue import CATALOGUE
from gpuwarden.dashboards.influxql import (
    DATASOURCE,
    DATASOURCE_TYPE,
    DATASOURCE_VAR,
    Agg,
    Cond,
    ResultFormat,
    Scope,
    Select,
    TagValues,
    Target,
)

TAG = "gpuwarden"

#: catalogue unit -> Grafana unit id (ratios become percentunit)
GRAFANA_UNITS = {
    "%": "percent",
    "B": "bytes",
    "B/s": "Bps",
    "MHz": "rotmhz",
    "°C": "celsius",
    "W": "watt",
    "J": "joule",
    "s": "s",
    "Gb/s": "Gbits",
    "FLOP/s": "flops",
    "1/s": "cps",
    "tokens/s": "suffix: tok/s",
    "J/token": "suffix: J/token",
    "J/step": "suffix: J/step",
    "": "none",
}

# what a table of XIDs shows of each (after where and whose: node/GPU, job/rank)
XID_COLUMNS = ("event", "severity", "xid_code", "fatal_active", "message", "resolution")


def unit_of(measurement: str, field: str) -> str:
    spec = CATALOGUE[measurement].fields[field]
    if field.endswith("_ratio"):
        return "percentunit"
    return GRAFANA_UNITS.get(spec.unit, "none")


AnyPanel = cogbuilder.Builder[model.Panel]


def _common(p: Any, title: str, description: str, w: int, h: int) -> Any:
    return p.title(title).description(description).datasource(DATASOURCE).span(w).height(h)


def _add_targets(
    p: Any, queries: Sequence[Select], alias: str | Sequence[str], fmt: ResultFormat
) -> None:
    aliases = [alias] * len(queries) if isinstance(alias, str) else list(alias)
    for i, (q, a) in enumerate(zip(queries, aliases, strict=True)):
        p.with_target(Target(q, chr(ord("A") + i), alias=a, result_format=fmt))


def graph(
    title: str,
    description: str,
    *queries: Select,
    unit: str,
    alias: str | Sequence[str] = "",
    w: int = 12,
    h: int = 8,
    stacked: bool = False,
    bars: bool = False,
    points: bool = False,
) -> timeseries.Panel:
    """A time series panel; ``alias`` names the series (``$tag_node``) as Grafana shows them."""
    p = _common(timeseries.Panel(), title, description, w, h).unit(unit).fill_opacity(10)
    if stacked:
        p = p.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    if bars:
        p = p.draw_style(common.GraphDrawStyle.BARS)
    if points:
        p = p.draw_style(common.GraphDrawStyle.POINTS)
    _add_targets(p, queries, alias, "time_series")
    return p  # type: ignore[no-any-return]


def single(
    title: str,
    description: str,
    query: Select,
    *,
    unit: str,
    w: int = 4,
    h: int = 4,
    thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
) -> stat.Panel:
    """A stat panel: the last value of the query's series."""
    p = _common(stat.Panel(), title, description, w, h).unit(unit)
    steps = [model.Threshold(value=v, color=c) for v, c in thresholds]
    p = p.thresholds(
        db.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(steps)
    ).color_mode(common.BigValueColorMode.BACKGROUND)
    _add_targets(p, [query], "", "time_series")
    return p  # type: ignore[no-any-return]


def grid(title: str, description: str, *queries: Select, w: int = 24, h: int = 8) -> table.Panel:
    """A table of rows (``resultFormat: table``): events, findings, actions."""
    p = _common(table.Panel(), title, description, w, h).filterable(True)
    _add_targets(p, queries, "", "table")
    return p  # type: ignore[no-any-return]


def states(
    title: str,
    description: str,
    *queries: Select,
    alias: str | Sequence[str] = "",
    w: int = 24,
    h: int = 8,
) -> statetimeline.Panel:
    """A state timeline: booleans and enumerations over time, one row per series."""
    p = _common(statetimeline.Panel(), title, description, w, h)
    _add_targets(p, queries, alias, "time_series")
    return p  # type: ignore[no-any-return]


def heat(
    title: str,
    description: str,
    query: Select,
    *,
    unit: str,
    alias: str = "",
    w: int = 24,
    h: int = 10,
) -> statushistory.Panel:
    """A heatmap with one row per series (a status history with a continuous colour scale):
    e.g. congestion per switch over time."""
    p = _common(statushistory.Panel(), title, description, w, h).unit(unit).min(0)
    p = p.color_scheme(db.FieldColor().mode(model.FieldColorModeId.CONTINUOUS_GR_YL_RD)).show_value(
        common.VisibilityMode.NEVER
    )
    _add_targets(p, [query], alias, "time_series")
    return p  # type: ignore[no-any-return]


def variable(name: str, label: str, query: TagValues, description: str) -> db.QueryVariable:
    """A multi-value template variable from tag values, "All" (``.*``) selected by default."""
    return (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query(query.render())
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )


#: variable -> (the measurement its values come from, label, description)
VARIABLE_SOURCES = {
    "cluster": ("gpu", "Cluster", "Clusters that have reported GPU metrics"),
    "node": ("gpu", "Node", "GPU nodes of the selected clusters"),
    "gpu": ("gpu", "GPU", "GPU indexes on the selected nodes"),
    "job": ("job_step", "Job", "Training jobs that report steps (the gpuwarden reporter)"),
    "hca": ("ib_port", "HCA", "InfiniBand/RoCE adapters on the selected nodes"),
    "switch": ("congestion", "Switch", "Leaf (ToR) switches, from the topology file"),
}


def variables_for(scope: Scope) -> list[db.QueryVariable]:
    """One template variable per name in ``scope``, each narrowed by the ones before it."""
    out = []
    for name in scope.variables:
        measurement, label, description = VARIABLE_SOURCES[name]
        out.append(variable(name, label, scope.values(measurement, name), description))
    return out


def datasource_variable() -> db.DatasourceVariable:
    return (
        db.DatasourceVariable(DATASOURCE_VAR)
        .label("InfluxDB")
        .type(DATASOURCE_TYPE)
        .description("The InfluxDB (InfluxQL) datasource gpuwarden writes to")
    )


class InfluxAnnotation(model.AnnotationQuery):
    """An InfluxQL annotation: markers from a query's rows, title/text/tags from its columns.

    The SDK's ``AnnotationQuery`` has no field for a datasource query (its ``target`` models
    only the built-in Grafana datasource), so the InfluxDB keys are added here; they are in
    the legacy top-level form that Grafana's InfluxDB datasource still reads and migrates.
    The SDK's ``from_json`` drops them on the way back: tests/test_dashboards.py says so.
    """

    def __init__(self, name: str, query: Select, color: str, text: str, tags: str) -> None:
        super().__init__(name=name, datasource=DATASOURCE, enable=True, icon_color=color)
        self.query = query.render()
        self.text_column = text
        self.tags_column = tags

    def to_json(self) -> dict[str, object]:
        out = super().to_json()
        out.update(query=self.query, textColumn=self.text_column, tagsColumn=self.tags_column)
        return out


class _Built(cogbuilder.Builder[model.AnnotationQuery]):
    def __init__(self, a: model.AnnotationQuery) -> None:
        self._a = a

    def build(self) -> model.AnnotationQuery:
        return self._a


def annotation(name: str, query: Select, color: str, text: str, tags: str) -> _Built:
    return _Built(InfluxAnnotation(name, query, color, text, tags))


def marks(
    scope: Scope,
    name: str,
    measurement: str,
    text: str,
    tags: str,
    color: str,
    where: tuple[Cond, ...] = (),
) -> _Built:
    """Annotations from a measurement's rows: the ``text`` field as the marker's text, the
    ``tags`` tag as its tags (findings, XIDs, remediation actions)."""
    query = scope(measurement, Agg("raw", text), Agg("raw", tags), where=where, every=False)
    return annotation(name, query, color, text=text, tags=tags)


def board(
    uid: str,
    title: str,
    description: str,
    rows: Sequence[tuple[str, Sequence[AnyPanel]]],
    *,
    scope: Scope,
    annotations: Sequence[_Built] = (),
    time_from: str = "now-6h",
) -> model.Dashboard:
    """A dashboard: rows of panels (ids 1, 2, ... in reading order), the datasource variable
    first, links to every other gpuwarden dashboard, refresh every minute."""
    d = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .editable()
        .time(time_from, "now")
        .refresh("1m")
        .timezone("utc")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .with_variable(datasource_variable())
        .link(
            db.DashboardLink("gpuwarden")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for v in variables_for(scope):
        d = d.with_variable(v)
    for a in annotations:
        d = d.annotation(a)
    next_id = 1
    for row_title, panels in rows:  # an open row: its panels follow it at the top level
        d = d.with_row(db.Row(row_title).id(next_id))
        next_id += 1
        for p in panels:
            d = d.with_panel(p.id(next_id))  # type: ignore[attr-defined]
            next_id += 1
    return d.build()
