"""Dashboards without Grafana: every panel drawn as a PNG from the same queries, on one HTML
page per dashboard (``gpuwarden dashboards render``).

The queries are the dashboard JSON's own, interpolated as Grafana would (``dashboards.grafana``)
with every variable on "All". Drawing is matplotlib's: time series as lines, bars or points,
stats as a number, tables as a table, state timelines and the heatmaps (status history) as
coloured bands. It is a faithful preview of what each panel queries and shows, not a pixel
copy of Grafana.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from gpuwarden.dashboards.check import panels
from gpuwarden.dashboards.grafana import ALL, QueryContext, interpolate, legend
from gpuwarden.dashboards.influx import InfluxQLClient, Series

PX_PER_COLUMN = 64
PX_PER_ROW = 34
DPI = 100
MAX_LEGEND = 10
MAX_TABLE_ROWS = 14


@dataclass
class Line:
    label: str
    times: list[datetime]
    values: list[float | None]
    ref: str


@dataclass
class Rendered:
    panel_id: int
    title: str
    png: str
    series: int
    points: int


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v)):
        return float(v)
    return None


def fmt(value: float | None, unit: str) -> str:
    """A value in a panel's unit, roughly as Grafana writes it."""
    if value is None:
        return "No data"
    if unit == "percentunit":
        return f"{value * 100:.1f} %"
    if unit == "percent":
        return f"{value:.1f} %"
    scaled = {"bytes": ("B", 1024), "Bps": ("B/s", 1024), "watt": ("W", 1000)}.get(unit)
    if scaled:
        suffix, base = scaled
        for prefix in ("", "K", "M", "G", "T"):
            if abs(value) < base or prefix == "T":
                sep = "i" if base == 1024 and prefix else ""
                return f"{value:.3g} {prefix}{sep}{suffix}"
            value /= base
    if unit.startswith("suffix: "):
        return f"{value:.3g} {unit[8:]}"
    units = {"celsius": "°C", "s": "s", "rotmhz": "MHz", "flops": "FLOP/s", "cps": "/s"}
    return f"{value:.4g} {units.get(unit, '')}".strip()


def _lines(
    client: InfluxQLClient, panel: dict[str, Any], ctx: QueryContext
) -> tuple[list[Line], list[Series]]:
    lines: list[Line] = []
    raw: list[Series] = []
    for t in panel.get("targets", []):
        for s in client.series(interpolate(t["query"], ctx)):
            raw.append(s)
            times = [datetime.fromtimestamp(row[0] / 1000, UTC) for row in s.values]
            for i, col in enumerate(s.columns[1:], start=1):
                values = [_num(row[i]) for row in s.values]
                if any(v is not None for v in values):
                    label = legend(t.get("alias", ""), s.name, col, s.tags)
                    lines.append(Line(label, times, values, t["refId"]))
    return lines, raw


def _figure(panel: dict[str, Any]) -> tuple[Figure, Any]:
    g = panel["gridPos"]
    size = (g["w"] * PX_PER_COLUMN / DPI, max(2.0, g["h"] * PX_PER_ROW / DPI))
    fig, ax = plt.subplots(figsize=size, dpi=DPI)
    ax.set_title(panel.get("title", ""), fontsize=9, loc="left")
    return fig, ax


def _unit(panel: dict[str, Any]) -> str:
    return str(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "none"))


def _draw_timeseries(ax: Any, panel: dict[str, Any], lines: list[Line]) -> None:
    style = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("drawStyle")
    for i, line in enumerate(lines):
        label = line.label if i < MAX_LEGEND else None
        xs = [t for t, v in zip(line.times, line.values, strict=True) if v is not None]
        ys = [v for v in line.values if v is not None]
        if style == "bars":
            ax.bar(xs, ys, width=0.0008, label=label)
        elif style == "points" or (line.ref != "A" and "STRAGGLER" in line.label):
            ax.plot(
                xs, ys, "o", markersize=5, color="red" if line.ref != "A" else None, label=label
            )
        else:
            ax.plot(
                line.times, [math.nan if v is None else v for v in line.values], lw=1, label=label
            )
    unit = _unit(panel)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v, unit)))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
    ax.tick_params(labelsize=7)
    if lines:
        extra = f" (+{len(lines) - MAX_LEGEND} more)" if len(lines) > MAX_LEGEND else ""
        ax.legend(
            fontsize=6, loc="upper left", title=f"{len(lines)} series{extra}", title_fontsize=6
        )


def _draw_stat(ax: Any, panel: dict[str, Any], lines: list[Line]) -> None:
    ax.axis("off")
    values = [next((v for v in reversed(line.values) if v is not None), None) for line in lines]
    shown = fmt(values[0] if values else None, _unit(panel))
    ax.text(0.5, 0.4, shown, ha="center", va="center", fontsize=20, transform=ax.transAxes)


def _draw_table(ax: Any, raw: list[Series]) -> None:
    """Rows of every series, the series' tags (GROUP BY) as leading columns."""
    ax.axis("off")
    if not raw:
        ax.text(0.5, 0.5, "No data", ha="center", transform=ax.transAxes)
        return
    tag_keys = sorted({k for s in raw for k in s.tags})
    cols = [*tag_keys, *raw[0].columns]
    rows: list[list[str]] = []
    total = 0
    for s in raw:
        total += len(s.values)
        for row in s.values:
            if len(rows) >= MAX_TABLE_ROWS:
                break
            cells = [s.tags.get(k, "") for k in tag_keys]
            for c, cell in zip(s.columns, row, strict=True):
                v = cell
                if c == "time" and isinstance(cell, int):
                    v = datetime.fromtimestamp(cell / 1000, UTC).strftime("%m-%d %H:%M:%S")
                cells.append("" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)))
            rows.append([c[:38] for c in cells])
    t = ax.table(cellText=rows, colLabels=cols, loc="upper left", cellLoc="left")
    t.auto_set_font_size(False)
    t.set_fontsize(6)
    ax.text(0, -0.02, f"{total} rows", fontsize=6, transform=ax.transAxes)


def _draw_bands(ax: Any, panel: dict[str, Any], lines: list[Line], heat: bool) -> None:
    """One band per series; colour by value (state timeline) or on a scale (heatmap)."""
    shown = lines[:30]
    finite = [v for line in shown for v in line.values if v is not None]
    hi = max(finite, default=1.0) or 1.0
    cmap = plt.get_cmap("RdYlGn_r" if heat else "tab10")
    for row, line in enumerate(shown):
        spans: list[tuple[float, float]] = []
        colours: list[Any] = []
        run_start: datetime | None = None
        run_value: float | None = None
        for i, (t, v) in enumerate([*zip(line.times, line.values, strict=True), (None, None)]):
            if v == run_value and t is not None:
                continue
            if run_start is not None and run_value is not None:  # close the run of equal values
                end = t if t is not None else line.times[i - 1]
                width = max((end - run_start).total_seconds(), 1.0) / 86400
                spans.append((float(mdates.date2num(run_start)), width))  # type: ignore[no-untyped-call]
                colours.append(cmap(run_value / hi) if heat else cmap(int(run_value) % 10))
            run_start, run_value = t, v
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours)
    ax.set_yticks(range(len(shown)), [line.label[:40] for line in shown], fontsize=6)
    ax.xaxis_date()
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
    ax.tick_params(axis="x", labelsize=7)
    if heat:
        unit = _unit(panel)
        ax.text(1.0, 1.02, f"max {fmt(hi, unit)}", fontsize=6, ha="right", transform=ax.transAxes)


def render_panel(
    client: InfluxQLClient, panel: dict[str, Any], ctx: QueryContext, path: Path
) -> Rendered:
    lines, raw = _lines(client, panel, ctx)
    fig, ax = _figure(panel)
    kind = panel.get("type")
    draw: dict[str, Callable[[], None]] = {
        "timeseries": lambda: _draw_timeseries(ax, panel, lines),
        "stat": lambda: _draw_stat(ax, panel, lines),
        "table": lambda: _draw_table(ax, raw),
        "state-timeline": lambda: _draw_bands(ax, panel, lines, heat=False),
        "status-history": lambda: _draw_bands(ax, panel, lines, heat=True),
    }
    draw.get(str(kind), lambda: _draw_timeseries(ax, panel, lines))()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    points = sum(s.non_null() for s in raw)
    return Rendered(int(panel["id"]), str(panel.get("title", "")), path.name, len(raw), points)


def context_for(
    board: dict[str, Any], from_ms: int, to_ms: int, min_interval_ms: int = 10_000
) -> QueryContext:
    defs = {
        v["name"]: (bool(v.get("multi") or v.get("includeAll")), v.get("allValue"))
        for v in board.get("templating", {}).get("list", [])
        if v.get("type") == "query"
    }
    values = {n: [ALL] for n in defs}
    return QueryContext(
        from_ms, to_ms, min_interval_ms=min_interval_ms, values=values, definitions=defs
    )


def render_board(
    client: InfluxQLClient,
    name: str,
    board: dict[str, Any],
    from_ms: int,
    to_ms: int,
    out: Path,
    label: str,
    min_interval_ms: int = 10_000,
) -> list[Rendered]:
    """``out/<name>.html`` and its PNGs under ``out/<name>/``; ``min_interval_ms`` is the
    datasource's "Min time interval" (the collection interval)."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    ctx = context_for(board, from_ms, to_ms, min_interval_ms)
    parts = [
        f"<h1>{html.escape(board['title'])}</h1>",
        f"<p class=label>{html.escape(label)}</p>",
        f"<p>{html.escape(board.get('description', ''))}</p>",
    ]
    done: list[Rendered] = []
    open_row = False
    for p in panels(board):
        if p.get("type") == "row":
            parts.append(("</div>" if open_row else "") + f"<h2>{html.escape(p['title'])}</h2>")
            parts.append("<div class=row>")
            open_row = True
            continue
        r = render_panel(client, p, ctx, folder / f"panel-{p['id']}.png")
        done.append(r)
        width = 100 * p["gridPos"]["w"] / 24
        queries = "<br>".join(html.escape(t["query"]) for t in p.get("targets", []))
        parts.append(
            f"<figure style='width:{width:.2f}%'><img src='{name}/{r.png}' "
            f"alt='{html.escape(r.title)}'><figcaption>{html.escape(p.get('description', ''))}"
            f" <em>({r.series} series, {r.points} values)</em><details><summary>InfluxQL"
            f"</summary><code>{queries}</code></details></figcaption></figure>"
        )
    if open_row:
        parts.append("</div>")
    (out / f"{name}.html").write_text(_page(board["title"], parts), encoding="utf-8")
    return done


_STYLE = (
    "body{font-family:sans-serif;margin:1em 2em;color:#222}"
    ".row{display:flex;flex-wrap:wrap}figure{margin:0;padding:4px;box-sizing:border-box}"
    "img{width:100%;border:1px solid #ddd}figcaption{font-size:11px;color:#555}"
    ".label{background:#fff3cd;padding:4px 8px;display:inline-block}"
    "code{font-size:10px;white-space:pre-wrap}"
)


def _page(title: str, parts: Sequence[str]) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def render_all(
    client: InfluxQLClient,
    boards: dict[str, dict[str, Any]],
    from_ms: int,
    to_ms: int,
    out: Path,
    label: str,
    min_interval_ms: int = 10_000,
) -> dict[str, list[Rendered]]:
    """Every dashboard, and ``out/index.html`` linking them."""
    out.mkdir(parents=True, exist_ok=True)
    done = {
        n: render_board(client, n, b, from_ms, to_ms, out, label, min_interval_ms)
        for n, b in boards.items()
    }
    items = "".join(
        f"<li><a href='{n}.html'>{html.escape(boards[n]['title'])}</a> ({len(r)} panels)</li>"
        for n, r in done.items()
    )
    (out / "index.html").write_text(
        _page(
            "gpuwarden dashboards",
            [
                f"<h1>gpuwarden dashboards</h1><p class=label>"
                f"{html.escape(label)}</p><ul>{items}</ul>"
            ],
        ),
        encoding="utf-8",
    )
    return done
