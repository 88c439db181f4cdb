"""Checks on generated dashboard JSON that Grafana and the SDK do not make.

The foundation SDK validates almost nothing, and Grafana accepts a dashboard whose panels
overlap, whose queries name a field nobody writes, or whose panels refer to a variable that
does not exist -- the panel is just empty. These checks read the JSON itself (not the Python
that built it), so ``export`` refuses to write a broken dashboard and the tests catch one.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from gpuwarden.core.catalogue import CATALOGUE
from gpuwarden.dashboards.grafana import referenced_variables
from gpuwarden.dashboards.influxql import DATASOURCE_TYPE

GRID_COLUMNS = 24
_IDENT = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FROM = re.compile(r'\bFROM\s+"((?:[^"\\]|\\.)*)"', re.IGNORECASE)
_AS = re.compile(r'\bAS\s+"((?:[^"\\]|\\.)*)"', re.IGNORECASE)
_GROUP_BY = re.compile(
    r"\bGROUP BY (.*?)(?:\s+fill\(|\s+ORDER|\s+LIMIT|\)\s+WHERE|$)", re.IGNORECASE
)
_ALIAS_TOKEN = re.compile(r"\$\{(\w+)\}|\[\[(\w+)\]\]|\$(\w+)")


def panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels folded inside collapsed rows."""
    for p in board.get("panels", []):
        yield p
        yield from p.get("panels", []) or []


def queries(board: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, query, alias) for every panel target, variable query and annotation query."""
    for p in panels(board):
        for t in p.get("targets", []) or []:
            yield (
                f"panel {p.get('id')} {p.get('title')!r} target {t.get('refId')}",
                str(t.get("query", "")),
                str(t.get("alias", "")),
            )
    for v in board.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            yield f"variable {v.get('name')!r}", str(v.get("query", "")), ""
    for a in board.get("annotations", {}).get("list", []):
        if "query" in a:
            yield f"annotation {a.get('name')!r}", str(a["query"]), ""


def catalogue_problems(query: str) -> list[str]:
    """Names in an InfluxQL query that the metric catalogue does not declare.

    Every double-quoted identifier must be a catalogue measurement, a field or tag of a
    measurement the query reads, or an alias the query itself declares with ``AS``."""
    sources = [m.replace('\\"', '"') for m in _FROM.findall(query)]
    problems = [f"measurement {m!r} is not in the catalogue" for m in sources if m not in CATALOGUE]
    known: set[str] = set(sources)
    for m in sources:
        if m in CATALOGUE:
            known |= set(CATALOGUE[m].fields) | set(CATALOGUE[m].tags)
    known |= set(_AS.findall(query))
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", query)  # string literals are not names
    for name in _IDENT.findall(text):
        if name not in known:
            problems.append(f"{name!r} is not a catalogue field or tag of {sources}")
    if not sources:
        problems.append("the query reads no catalogue measurement")
    return problems


def _group_tags(query: str) -> set[str]:
    tags: set[str] = set()
    for clause in _GROUP_BY.findall(query):
        tags |= set(_IDENT.findall(clause))
    show = re.search(r'WITH KEY = "(\w+)"', query)
    if show:
        tags.add(show.group(1))
    return tags


def _alias_problems(alias: str, query: str) -> list[str]:
    out = []
    grouped = _group_tags(query)
    for m in _ALIAS_TOKEN.finditer(alias):
        token = m.group(1) or m.group(2) or m.group(3)
        if token.startswith("tag_"):
            if token[4:] not in grouped:
                out.append(f"alias uses ${token} but the query does not group by {token[4:]!r}")
        elif token not in ("col", "m", "measurement"):
            out.append(f"alias uses ${token}, which Grafana's InfluxDB alias does not know")
    return out


def _grid_problems(board: Mapping[str, Any]) -> list[str]:
    out = []
    taken: dict[tuple[int, int], Any] = {}
    for p in board.get("panels", []):
        g = p.get("gridPos") or {}
        name = f"panel {p.get('id')} {p.get('title')!r}"
        pos = [g.get(k) for k in ("x", "y", "w", "h")]
        if not all(isinstance(v, int) for v in pos):
            out.append(f"{name}: gridPos {g} is incomplete")
            continue
        x, y, w, h = (int(v) for v in pos)  # type: ignore[arg-type]
        if x < 0 or y < 0 or w < 1 or h < 1 or x + w > GRID_COLUMNS:
            out.append(f"{name}: gridPos {g} is outside the {GRID_COLUMNS}-column grid")
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                other = taken.setdefault((cx, cy), p.get("id"))
                if other != p.get("id"):
                    out.append(f"{name} overlaps panel {other}")
                    break
            else:
                continue
            break
    return out


def _datasource_problems(board: Mapping[str, Any], known_uids: set[str]) -> list[str]:
    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}

    def resolves(ref: Any) -> bool:
        if not isinstance(ref, dict) or ref.get("type") != DATASOURCE_TYPE:
            return False
        uid = str(ref.get("uid", ""))
        m = re.fullmatch(r"\$\{(\w+)\}|\$(\w+)", uid)
        if m:
            var = variables.get(m.group(1) or m.group(2)) or {}
            return bool(var.get("type") == "datasource" and var.get("query") == DATASOURCE_TYPE)
        return uid in known_uids

    out = []
    for p in panels(board):
        if p.get("type") == "row":
            continue
        name = f"panel {p.get('id')} {p.get('title')!r}"
        if not resolves(p.get("datasource")):
            out.append(f"{name}: datasource {p.get('datasource')} does not resolve")
        for t in p.get("targets", []) or []:
            if not resolves(t.get("datasource", p.get("datasource"))):
                out.append(f"{name} target {t.get('refId')}: datasource does not resolve")
    for v in variables.values():
        if v.get("type") == "query" and not resolves(v.get("datasource")):
            out.append(f"variable {v.get('name')!r}: datasource does not resolve")
    for a in board.get("annotations", {}).get("list", []):
        if "query" in a and not resolves(a.get("datasource")):
            out.append(f"annotation {a.get('name')!r}: datasource does not resolve")
    return out


def _variable_problems(board: Mapping[str, Any]) -> list[str]:
    out = []
    defined: list[str] = []
    for v in board.get("templating", {}).get("list", []):
        name = str(v.get("name"))
        for ref in sorted(referenced_variables(str(v.get("query", "")))):
            if ref not in defined:
                out.append(f"variable {name!r} uses ${ref}, not defined before it")
        defined.append(name)
    texts = [(f"panel {p.get('id')}", str(p.get("title", ""))) for p in panels(board)]
    texts += [(w, q) for w, q, _ in queries(board) if not w.startswith("variable")]
    for where, text in texts:
        for ref in sorted(referenced_variables(text) - set(defined)):
            out.append(f"{where}: ${ref} is not a variable of this dashboard")
    return out


def problems(board: Mapping[str, Any], known_uids: Collection[str] = ()) -> list[str]:
    """Every structural and catalogue problem of one dashboard's JSON, one line each."""
    title = board.get("title", "?")
    out: list[str] = []
    ids = [p.get("id") for p in panels(board)]
    for i in sorted({i for i in ids if ids.count(i) > 1}, key=str):
        out.append(f"panel id {i} is used more than once")
    if any(not isinstance(i, int) for i in ids):
        out.append("a panel has no integer id")
    out += _grid_problems(board)
    out += _datasource_problems(board, set(known_uids))
    out += _variable_problems(board)
    for where, query, alias in queries(board):
        if not query.strip():
            out.append(f"{where}: empty query")
            continue
        out += [f"{where}: {p}" for p in catalogue_problems(query)]
        out += [f"{where}: {p}" for p in _alias_problems(alias, query)]
    return [f"{title}: {p}" for p in out]


def problems_across(boards: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Problems of each dashboard, plus uids or titles used twice."""
    out = [p for b in boards.values() for p in problems(b)]
    for key in ("uid", "title"):
        seen = [b.get(key) for b in boards.values()]
        out += [f"dashboard {key} {v!r} is used twice" for v in set(seen) if seen.count(v) > 1]
    return out
