"""Dashboards (issue 8): every panel, variable and annotation query of every dashboard runs
against a real influxd holding what gpuwarden writes (tests/dashboard_data.py: a SIMULATED
scenario, the agent over golden inputs, analytics, and stand-ins for issues 6/7) and returns
data; names come from the catalogue; the JSON loads back through the SDK and passes the
structural checks."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.catalogue import CATALOGUE
from collector.localinfluxd import LocalInfluxd
from dashboards.check import catalogue_problems, problems, queries
from dashboards.errors import CatalogueNameError, QueryFailedError
from dashboards.export import encode, generate, load
from dashboards.grafana import ALL, QueryContext, interpolate, referenced_variables
from dashboards.influx import InfluxQLClient
from dashboards.influxql import Agg, Select
from tests.dashboard_data import AGENT_NODE, Dataset
from tests.dashboard_data import load as load_data


@pytest.fixture(scope="module")
def dataset(influxd: LocalInfluxd, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return load_data(influxd, "dashboards", tmp_path_factory.mktemp("dashdata"))


@pytest.fixture(scope="module")
def client(influxd: LocalInfluxd, dataset: Dataset) -> Iterator[InfluxQLClient]:
    c = InfluxQLClient(influxd.url, dataset.database)
    yield c
    c.close()


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    return generate()


def _definitions(board: dict[str, Any]) -> dict[str, tuple[bool, str | None]]:
    return {
        v["name"]: (bool(v.get("multi") or v.get("includeAll")), v.get("allValue"))
        for v in board["templating"]["list"]
        if v.get("type") == "query"
    }


def _context(board: dict[str, Any], ds: Dataset, **values: list[str]) -> QueryContext:
    defs = _definitions(board)
    chosen = {name: values.get(name, [ALL]) for name in defs}
    return QueryContext(ds.start_ms, ds.end_ms, values=chosen, definitions=defs)


def test_every_query_of_every_dashboard_returns_data(
    boards: dict[str, dict[str, Any]], dataset: Dataset, client: InfluxQLClient
) -> None:
    """Must-show 1: walks the generated JSON (targets, variables, annotations); exempts
    nothing. Variables are evaluated in order, as Grafana does, each with "All" selected."""
    empty: list[str] = []
    ran = 0
    for name, board in boards.items():
        ctx = _context(board, dataset)
        for where, query, _alias in queries(board):
            sent = interpolate(query, ctx)
            assert not referenced_variables(sent), f"{name} {where}: left {sent}"
            series = client.series(sent)
            ran += 1
            if where.startswith("variable"):
                found = sum(len(s.values) for s in series)
            else:
                found = sum(s.non_null() for s in series)
            if not found:
                empty.append(f"{name} {where}: {sent}")
    assert ran > 100
    assert not empty, "queries that returned no data:\n" + "\n".join(empty)


def test_variables_narrow_the_panels(
    boards: dict[str, dict[str, Any]], dataset: Dataset, client: InfluxQLClient
) -> None:
    """Selecting two nodes (multi-value, regex-escaped) narrows a panel to exactly them, and
    the gpu variable's values follow the node selection."""
    board = boards["node"]
    ctx = _context(board, dataset, node=["node-005", AGENT_NODE])
    util = next(q for w, q, _ in queries(board) if "gpu_util_pct" in q and "GROUP BY" in q)
    nodes = {s.tags["node"] for s in client.series(interpolate(util, ctx))}
    assert nodes == {"node-005", AGENT_NODE}
    gpu_var = next(v for v in board["templating"]["list"] if v["name"] == "gpu")
    one = _context(board, dataset, node=["node-005"])
    values = [row[1] for s in client.series(interpolate(gpu_var["query"], one)) for row in s.values]
    assert sorted(values, key=int) == [str(i) for i in range(8)]


def test_queries_use_catalogue_names_only(boards: dict[str, dict[str, Any]]) -> None:
    """Must-show 2, on the JSON itself; and the check can fail."""
    for name, board in boards.items():
        for where, query, _ in queries(board):
            assert catalogue_problems(query) == [], f"{name} {where}: {query}"
    assert catalogue_problems('SELECT mean("gpu_utilisation") FROM "gpu"')
    assert catalogue_problems('SELECT mean("power_w") FROM "gpus"')
    assert not catalogue_problems('SELECT mean("power_w") AS "w" FROM "gpu" WHERE "node" = \'a"b\'')
    with pytest.raises(CatalogueNameError, match="gpu_utilisation"):
        Select("gpu", (Agg("mean", "gpu_utilisation"),))
    with pytest.raises(CatalogueNameError, match="not a counter"):
        Select("gpu", (Agg("rate", "power_w"),))
    with pytest.raises(CatalogueNameError, match="boolean"):
        Select("gpu", (Agg("mean", "clock_event_gpu_idle_active"),))


def test_node_dashboard_shows_every_agent_field(boards: dict[str, dict[str, Any]]) -> None:
    text = " ".join(q for _, q, _ in queries(boards["node"]))
    for m in ("gpu", "gpu_nvlink", "gpu_process", "gpu_event", "host_power", "thermal"):
        missing = [f for f in CATALOGUE[m].fields if f'"{f}"' not in text]
        assert not missing, f"{m}: {missing}"


def _diff(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                yield f"{path}.{k}"
            else:
                yield from _diff(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield path


def test_json_loads_back_through_the_sdk(boards: dict[str, dict[str, Any]]) -> None:
    """Must-show 3: every dashboard survives from_json -> to_json. What changes is listed
    exactly: the SDK adds an empty ``custom`` to field defaults, and drops the InfluxDB keys
    of annotations (its AnnotationQuery has no field for a datasource query)."""
    for name, board in boards.items():
        back = json.loads(encode(load(board)))
        changed = set(_diff(board, back))
        allowed = {
            p
            for p in changed
            if p.endswith(".fieldConfig.defaults.custom")
            or (
                p.startswith(".annotations.list[")
                and p.rsplit(".", 1)[1] in ("query", "textColumn", "tagsColumn")
            )
        }
        assert changed == allowed, f"{name}: {sorted(changed - allowed)}"
        targets = [t for p in back["panels"] for t in p.get("targets", [])]
        assert targets and all(t["rawQuery"] and t["query"] for t in targets)
        assert problems({**back, "annotations": board["annotations"]}) == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda b: b["panels"][2].update(id=b["panels"][1]["id"]), "used more than once"),
        (lambda b: b["panels"][1]["gridPos"].update(x=20, w=8), "outside the 24-column grid"),
        (lambda b: b["panels"][2]["gridPos"].update(x=0, y=1), "overlaps panel"),
        (lambda b: b["panels"][1]["datasource"].update(uid="nope"), "does not resolve"),
        (
            lambda b: b["panels"][1]["targets"][0].update(
                query='SELECT 1 FROM "gpu" WHERE "node" =~ /^$rack$/'
            ),
            "$rack is not a variable",
        ),
        (
            lambda b: b["panels"][1]["targets"][0].update(alias="$tag_switch"),
            "does not group by 'switch'",
        ),
        (
            lambda b: b["templating"]["list"][1].update(
                query='SHOW TAG VALUES FROM "gpu" WITH KEY = "node" WHERE "x" =~ /$gpu/'
            ),
            "not defined before it",
        ),
    ],
)
def test_structural_checks_catch_broken_json(
    boards: dict[str, dict[str, Any]], mutate: Any, expected: str
) -> None:
    """Must-show 3's checks, each shown to fail on a dashboard broken on purpose."""
    board = copy.deepcopy(boards["fleet"])
    assert problems(board) == []
    mutate(board)
    found = problems(board)
    assert any(expected in p for p in found), found


def test_influxdb_errors_are_clear(influxd: LocalInfluxd, dataset: Dataset) -> None:
    c = InfluxQLClient(influxd.url, dataset.database)
    with pytest.raises(QueryFailedError, match="query: SELEKT"):
        c.series("SELEKT 1")
    c.close()
    with pytest.raises(QueryFailedError, match="unreachable"):
        InfluxQLClient("http://127.0.0.1:9", "x", timeout_s=2).series("SHOW DATABASES")


def test_export_writes_checked_json(tmp_path: Path, boards: dict[str, dict[str, Any]]) -> None:
    assert len(boards) == 6
    assert len({b["uid"] for b in boards.values()}) == 6
