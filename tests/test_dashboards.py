"""Dashboards (issue 8): every panel, variable and annotation query of every dashboard runs
against a real influxd holding what gpuwarden writes (tests/dashboard_data.py: a SIMULATED
scenario, the agent over golden inputs, analytics, the failure predictor and the remediation
engine) and returns data; names come from the catalogue; the JSON loads back through the SDK
and passes the structural checks."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.core.catalogue import CATALOGUE
from gpuwarden.dashboards.alerts import rule_specs, rules_file
from gpuwarden.dashboards.check import catalogue_problems, problems, queries
from gpuwarden.dashboards.cli import main as dashboards_cli
from gpuwarden.dashboards.config import DEFAULTS as DASHBOARD_DEFAULTS
from gpuwarden.dashboards.config import load_config as load_dashboards_config
from gpuwarden.dashboards.errors import CatalogueNameError, QueryFailedError
from gpuwarden.dashboards.export import encode, generate, load
from gpuwarden.dashboards.grafana import ALL, QueryContext, interpolate, referenced_variables
from gpuwarden.dashboards.influx import InfluxQLClient
from gpuwarden.dashboards.influxql import Agg, Select
from gpuwarden.dashboards.render import render_all
from testbed.influxd import LocalInfluxd
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
    for m in (
        "gpu",
        "gpu_nvlink",
        "gpu_process",
        "gpu_info",
        "gpu_event",
        "nvswitch_event",
        "host_power",
        "thermal",
    ):
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


def test_every_dashboard_renders_to_png_panels(
    boards: dict[str, dict[str, Any]], dataset: Dataset, client: InfluxQLClient, tmp_path: Path
) -> None:
    """Must-show 4: an HTML page per dashboard with one PNG per panel, from the same queries;
    every panel drew data, and the page says what the data is."""
    label = "SIMULATED: scenario fleet-tour (tests/dashboard_data.py)"
    done = render_all(client, boards, dataset.start_ms, dataset.end_ms, tmp_path, label, 30_000)
    assert set(done) == set(boards)
    for name, rendered in done.items():
        page = (tmp_path / f"{name}.html").read_text()
        assert label in page
        n_panels = sum(1 for p in boards[name]["panels"] if p["type"] != "row")
        assert len(rendered) == n_panels
        for r in rendered:
            png = (tmp_path / name / r.png).read_bytes()
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000, (name, r.title)
            assert r.points > 0, (name, r.title)
            assert f"{name}/{r.png}" in page
    assert "fleet.html" in (tmp_path / "index.html").read_text()


def _series_values(client: InfluxQLClient, query: str, end_ms: int, window_s: int):
    ctx = QueryContext(end_ms - window_s * 1000, end_ms)
    return {
        tuple(sorted(s.tags.items())): s.values[-1][1]
        for s in client.series(interpolate(query, ctx))
    }


def test_alert_rules_fire_where_the_scenario_put_the_faults(
    dataset: Dataset, client: InfluxQLClient
) -> None:
    """Each rule's query runs on the real InfluxDB; evaluated as Grafana's reduce(last) and
    threshold would, the fatal-XID rule fires for the XID 64 and XID 79 nodes of the SIMULATED
    scenario (and the REAL XID 119 log's node) and nowhere else; the fatal-SXid rule for the
    node given a CONSTRUCTED fatal SXid."""
    cfg = load_dashboards_config(environ={})
    doc = rules_file(cfg)
    rules = {r["uid"]: r for r in doc["groups"][0]["rules"]}
    assert len(rules) == len(rule_specs(cfg)) >= 10
    for r in rules.values():
        model_ = r["data"][0]["model"]
        assert r["data"][0]["datasourceUid"] == model_["datasource"]["uid"] == "gpuwarden-influxdb"
        assert catalogue_problems(model_["query"]) == []
        assert [d["refId"] for d in r["data"]] == ["A", "B", "C"] and r["condition"] == "C"
    fatal = rules["gw-fatal-xid"]
    values = _series_values(client, fatal["data"][0]["model"]["query"], dataset.end_ms, 3600)
    firing = {dict(k)["node"] for k, v in values.items() if v > 0}
    assert firing == {"node-007", "node-014", AGENT_NODE}
    sxid = rules["gw-fatal-sxid"]["data"][0]["model"]["query"]
    values = _series_values(client, sxid, dataset.end_ms, 3600)
    assert {dict(k)["node"] for k, v in values.items() if v > 0} == {AGENT_NODE}  # the fatal one
    hot = rules["gw-gpu-hot"]["data"][0]["model"]["query"]
    temps = _series_values(client, hot, dataset.end_ms, 3600)
    assert temps and all(v < cfg["alerts"]["gpu_temp_c"] for v in temps.values())
    implausible = rules["gw-sensor-implausible"]["data"][0]["model"]["query"]
    grown = _series_values(client, implausible, dataset.end_ms, 3600)
    assert grown and all(v == 0 for v in grown.values())  # the agent's sensors tell no lies
    fabric = rules["gw-fabric-unregistered"]["data"][0]["model"]["query"]
    registered = _series_values(client, fabric, dataset.end_ms, 3600)
    assert registered == {}  # the agent's H100s are registered (the scenario's have no fabric)
    downtrained = rules["gw-pcie-downtrained"]["data"][0]["model"]["query"]
    assert _series_values(client, downtrained, dataset.end_ms, 3600) == {}


@pytest.mark.parametrize(
    ("case", "uid", "step", "firing"),
    [
        # GPU 1 is still registering with the NVLink fabric at the last step
        ("nvml-driver-reload", "gw-fabric-unregistered", 2, {"1": 1}),
        # GPU 5's PCIe link runs at x8 of x16 (both steps)
        ("nvml-a100-8gpu", "gw-pcie-downtrained", 1, {"5": 2}),
    ],
)
def test_a_gpu_rule_fires_for_exactly_the_gpu_in_trouble(
    influxd: LocalInfluxd, influx_db: str, tmp_path: Path, case: str, uid: str, step: int,
    firing: dict[str, int],
) -> None:  # fmt: skip
    """A CONSTRUCTED golden case, written as the agent writes it: the rule's query counts the
    troubled GPU and no other (on the dashboards' dataset neither rule counts anything: the
    test above)."""
    from tests.test_golden import GOLDEN, STEP_NS, T0, run_case

    steps = run_case(GOLDEN / case, tmp_path)
    influxd.write(influx_db, "\n".join(line for lines in steps for line in lines))
    rules = rules_file(load_dashboards_config(environ={}))["groups"][0]["rules"]
    query = next(r for r in rules if r["uid"] == uid)["data"][0]["model"]["query"]
    client = InfluxQLClient(influxd.url, influx_db)
    try:
        values = _series_values(client, query, (T0 + step * STEP_NS) // 10**6 + 1, 300)
    finally:
        client.close()
    assert {dict(k)["gpu"]: v for k, v in values.items()} == firing


def test_export_writes_dashboards_and_provisioning(tmp_path: Path) -> None:
    assert dashboards_cli(["export", "--out", str(tmp_path)]) == 0
    boards = sorted((tmp_path / "dashboards").glob("*.json"))
    assert len(boards) == 6
    for path in boards:
        assert problems(json.loads(path.read_text())) == []
    prov = tmp_path / "provisioning"
    ds = yaml.safe_load((prov / "datasources/gpuwarden.yaml").read_text())["datasources"][0]
    rules = yaml.safe_load((prov / "alerting/gpuwarden-rules.yaml").read_text())
    provider = yaml.safe_load((prov / "dashboards/gpuwarden.yaml").read_text())["providers"][0]
    contacts = yaml.safe_load((prov / "alerting/gpuwarden-contact-points.yaml").read_text())
    assert ds["type"] == "influxdb" and ds["jsonData"]["timeInterval"] == "10s"
    uids = {d["datasourceUid"] for g in rules["groups"] for r in g["rules"] for d in r["data"]}
    assert uids == {ds["uid"], "__expr__"}
    assert Path(provider["options"]["path"]) == (tmp_path / "dashboards").resolve()
    receivers = {c["name"] for c in contacts["contactPoints"]}
    routed = {
        r["notification_settings"]["receiver"]
        for g in rules["groups"]
        for r in g["rules"]
        if "notification_settings" in r
    }
    assert routed <= receivers and "policies" not in contacts  # tests/test_grafana_routing.py


def test_dashboards_sample_config_equals_defaults() -> None:
    path = Path(__file__).parent.parent / "config/dashboards.sample.toml"
    assert load_dashboards_config(path, environ={}) == DASHBOARD_DEFAULTS
    cfg = load_dashboards_config(path, environ={"GPUWARDEN_GRAFANA_FOLDER": "ops"})
    assert cfg["grafana"]["folder"] == "ops"


class FakeGrafana:
    """Loopback stand-in for the Grafana HTTP API calls ``push`` makes: checks the bearer
    token, keeps what it was sent, answers 404 for unknown datasources and alert rules."""

    def __init__(self, token: str) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.rules: set[str] = set()
        self.contact_points: dict[str, Any] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((self.command, self.path, body))
                if self.headers.get("Authorization") != f"Bearer {token}":
                    status, out = 401, {"message": "invalid API key"}
                elif self.command == "GET" or (
                    self.command == "PUT"
                    and self.path.rsplit("/", 1)[1] not in fake.rules | set(fake.contact_points)
                ):
                    status, out = 404, {"message": "not found"}
                else:
                    if self.command == "POST" and "alert-rules" in self.path and body:
                        fake.rules.add(body["uid"])
                    if self.command == "POST" and "contact-points" in self.path and body:
                        fake.contact_points[body["uid"]] = body
                    status, out = 200, {"status": "success"}
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _reply  # noqa: N815 (http.server's names)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_push_upserts_everything_and_reports_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    grafana = FakeGrafana("s3cret")
    try:
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        hook = tmp_path / "hook-token"
        hook.write_text("engine-token\n")
        conf = tmp_path / "d.toml"
        conf.write_text(f'[grafana]\ntoken_file = "{token}"\n'
                        f'[alerts]\nwebhook_token_file = "{hook}"\n')  # fmt: skip
        monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
        for _ in range(2):  # the second push updates what the first created
            assert dashboards_cli(["--config", str(conf), "push", "--url", grafana.url]) == 0
        dashboards = [b for m, p, b in grafana.requests if p == "/api/dashboards/db"]
        assert len(dashboards) == 12 and all(b["overwrite"] for b in dashboards)
        assert {b["dashboard"]["uid"] for b in dashboards} == {
            f"gpuwarden-{n}" for n in ("fleet", "node", "job", "fabric", "power", "health")
        }
        creates = [p for m, p, _ in grafana.requests if m == "POST" and "alert-rules" in p]
        updates = [p for m, p, _ in grafana.requests if m == "PUT" and "alert-rules" in p]
        assert len(creates) == len(grafana.rules) and len(updates) == 2 * len(grafana.rules)
        # the contact point carries the token itself (the API does not read $__file{}), and
        # the notification policy tree is never written: a PUT of it replaces the whole tree
        (webhook,) = grafana.contact_points.values()
        assert webhook["settings"]["authorization_credentials"] == "engine-token"
        assert not [p for _, p, _ in grafana.requests if "/policies" in p]
        monkeypatch.setenv("GRAFANA_TOKEN", "wrong")
        assert dashboards_cli(["--config", str(conf), "push", "--url", grafana.url]) == 2
        assert "HTTP 401 (check the token" in capsys.readouterr().err
    finally:
        grafana.close()
    monkeypatch.delenv("GRAFANA_TOKEN")
    assert dashboards_cli(["push", "--url", "http://127.0.0.1:9"]) == 2
    assert "no Grafana token" in capsys.readouterr().err


def test_fatal_event_panels_count_events_without_an_xid(
    boards: dict[str, dict[str, Any]], influxd: LocalInfluxd, influx_db: str
) -> None:
    """A lost GPU (the agent's gpu_lost, from the nvml-gpu-lost golden case) has no xid_code;
    the health board's fatal-event panels count it all the same."""
    golden = Path(__file__).parent / "golden" / "nvml-gpu-lost"
    line = next(
        ln
        for f in sorted(golden.glob("expected-*.lp"))
        for ln in f.read_text().splitlines()
        if ln.startswith("gpu_event,") and "event=gpu_lost" in ln
    )
    at_ms = int(line.rsplit(" ", 1)[1]) // 10**6
    influxd.write(influx_db, line)
    board = boards["health"]
    defs = _definitions(board)
    ctx = QueryContext(at_ms - 60_000, at_ms + 60_000, values={n: [ALL] for n in defs},
                       definitions=defs)  # fmt: skip
    client = InfluxQLClient(influxd.url, influx_db)
    try:
        counted = {
            where: sum(v for s in client.series(interpolate(q, ctx)) for _, v in s.values if v)
            for where, q, _ in queries(board)
            if '"gpu_event"' in q and "count(" in q
        }
    finally:
        client.close()
    assert len(counted) == 2 and all(n == 1 for n in counted.values()), counted


def test_the_outcome_panels_show_what_a_real_engine_decided(
    influxd: LocalInfluxd, influx_db: str, tmp_path: Path
) -> None:
    """Issue 41: the health board's outcome panels query what the engine writes. Two outcomes
    from a real engine (tests/dashboard_data.py ``_outcomes``: a drain confirmed by a failed
    check, a cordon refuted by an operator) go through the sink into a database of their own;
    each outcome panel's query returns them, by verdict. (The whole data set, with the same
    two outcomes, is what test_every_query_of_every_dashboard_returns_data runs against.)"""
    from gpuwarden.core.store.sink import InfluxSink, SinkConfig
    from tests.dashboard_data import _outcomes

    end_s = 1_767_574_800.0
    sink = InfluxSink(SinkConfig(url=influxd.url, database=influx_db,
                                 spool_dir=str(tmp_path / "spool")))  # fmt: skip
    assert _outcomes(["node-000", "node-001"], end_s, tmp_path, sink, "twin") == 2
    assert sink.close(timeout_s=60)
    board = generate()["health"]
    ds = Dataset(influx_db, int((end_s - 3600) * 1000), int(end_s * 1000), "twin")
    ctx = _context(board, ds)
    panels = {"'Action outcomes'", "'Outcomes and their evidence'"}
    ran = 0
    client = InfluxQLClient(influxd.url, influx_db)
    try:
        for where, query, _ in queries(board):
            if not any(p in where for p in panels):
                continue
            series = client.series(interpolate(query, ctx))
            ran += 1
            assert sum(s.non_null() for s in series) > 0, where
            text = json.dumps([s.values for s in series]) + json.dumps([s.tags for s in series])
            if "evidence" in where:
                assert "confirmed" in text and "refuted" in text and "false_alarm" in text
    finally:
        client.close()
    assert ran == 2
