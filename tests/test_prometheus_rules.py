"""The shipped Prometheus alerting rules for gpuwarden's own services
(``deploy/prometheus/gpuwarden.rules.yml``) and the example configurations beside them.

Checked with Prometheus' and Alertmanager's own tools (Debian's ``prometheus`` 2.42 and
``prometheus-alertmanager`` 0.25, REAL): ``promtool check rules`` and ``check config``,
``amtool check-config``, and ``promtool test rules``, which evaluates every rule over
CONSTRUCTED series: each alert fires on its fault, with the labels a route needs, and not on the
healthy case next to it, nor before its ``for``. tests/test_prometheus.py loads the same file
into a real Prometheus scraping the three real services (every metric named is exported, no
alert on a healthy stack, a refused request raises its alert).
"""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy/prometheus"
RULES = DEPLOY / "gpuwarden.rules.yml"

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None or shutil.which("amtool") is None,
    reason="needs Debian's prometheus and prometheus-alertmanager",
)

E, A, N = "e:9470", "a:9471", "gpu-node-001:9466"  # instances: engine, analyze, an agent
ENGINE = {"job": "gpuwarden-remediate", "instance": E}
ANALYZE = {"job": "gpuwarden-analyze", "instance": A}
AGENT = {"job": "gpuwarden-agent", "instance": N}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


# (alert, the input series, [(minute, the labels each firing alert has; [] = none fires)])
# Each case pairs the fault with what must not fire: the healthy series beside it, or the
# fault before its `for` has passed.
CASES: list[tuple[str, list[dict[str, str]], list[tuple[int, list[dict[str, str]]]]]] = [
    ("GpuwardenEngineDown",
     [series("up", ENGINE, "1 1 0x20"), series("up", {**ENGINE, "instance": "ok:9470"}, "1x22")],
     [(5, []), (8, [ENGINE])]),
    ("GpuwardenEngineActionFailed",
     [series("gpuwarden_engine_actions_total", {**ENGINE, "action": "drain", "outcome": "failed"},
             "0 0 1 1"),
      series("gpuwarden_engine_actions_total", {**ENGINE, "action": "cordon", "outcome": "ok"},
             "0 1 2 3"),
      series("gpuwarden_engine_actions_total", {**ENGINE, "action": "notify", "outcome": "failed"},
             "0 1 2 3")],
     [(1, []), (3, [{"instance": E, "action": "drain"}])]),
    ("GpuwardenPlanFailed",
     [series("gpuwarden_engine_decisions_total", {**ENGINE, "verdict": "failed"}, "0 0 1 1"),
      series("gpuwarden_engine_decisions_total", {**ENGINE, "verdict": "act"}, "0 1 2 3")],
     [(1, []), (3, [{"instance": E}])]),
    ("GpuwardenUnknownNodes",
     [series("gpuwarden_engine_decisions_total", {**ENGINE, "verdict": "unknown_node"},
             "0 0 1 1"),
      series("gpuwarden_engine_decisions_total", {**ENGINE, "verdict": "failed"}, "0 1 2 3")],
     [(1, []), (3, [{"instance": E}])]),
    ("GpuwardenNotifyFailed",
     [series("gpuwarden_engine_actions_total", {**ENGINE, "action": "notify", "outcome": "timeout"},
             "0 0 1 1"),
      series("gpuwarden_engine_actions_total", {**ENGINE, "action": "drain", "outcome": "failed"},
             "0 1 2 3")],
     [(1, []), (3, [{"instance": E}])]),
    ("GpuwardenEngineNotAccepting",
     [series("gpuwarden_engine_requests_refused_total", {**ENGINE, "status": "503"}, "0 0 2 2"),
      series("gpuwarden_engine_requests_refused_total", {**ENGINE, "status": "401"}, "0 5 9 9")],
     [(1, []), (3, [{"instance": E}])]),
    ("GpuwardenEngineRefusingSenders",
     [series("gpuwarden_engine_requests_refused_total", {**ENGINE, "status": "403"}, "0 0 1 1"),
      series("gpuwarden_engine_requests_refused_total", {**ENGINE, "status": "503"}, "0 5 9 9")],
     [(1, []), (3, [{"instance": E, "status": "403"}])]),
    ("GpuwardenPlansWaiting",
     [series("gpuwarden_engine_plans_pending", ENGINE, "0 2x30")],
     [(10, []), (20, [ENGINE])]),
    ("GpuwardenNodeHoldEnded",
     [series("gpuwarden_engine_nodes_held", {**ENGINE, "state": "ended"}, "0 1x150"),
      series("gpuwarden_engine_nodes_held", {**ENGINE, "state": "holding"}, "3x150")],
     [(60, []), (130, [{**ENGINE, "state": "ended"}])]),
    ("GpuwardenPolicyDemoted",
     [series("gpuwarden_policy_demoted", {**ENGINE, "policy": "xid-fatal"}, "0 0 1"),
      series("gpuwarden_policy_demoted", {**ENGINE, "policy": "straggler"}, "0 0 0")],
     [(1, []), (2, [{**ENGINE, "policy": "xid-fatal"}])]),
    ("GpuwardenAnalyzeDown",
     [series("up", ANALYZE, "1 0x20")],
     [(4, []), (7, [ANALYZE])]),
    ("GpuwardenAnalyzeStale",  # succeeds every minute (the value is the time), then stops at 5m
     [series("gpuwarden_analyze_last_success_timestamp_seconds", ANALYZE, "0+60x5 300x40"),
      series("gpuwarden_analyze_last_success_timestamp_seconds", {**ANALYZE, "instance": "b"},
             "0+60x45")],
     [(22, []), (27, [ANALYZE])]),
    ("GpuwardenAnalyzeFailing",
     [series("gpuwarden_analyze_run_failures_total", ANALYZE, "0 0 1 1"),
      series("gpuwarden_analyze_runs_total", ANALYZE, "0 1 2 3")],
     [(1, []), (3, [ANALYZE])]),
    ("GpuwardenAgentDown",
     [series("up", AGENT, "1 0x20")],
     [(4, []), (7, [AGENT])]),
    ("GpuwardenAgentSourceFailing",
     [series("gpuwarden_agent_source_up", {**AGENT, "source": "xid"}, "1 0x20"),
      series("gpuwarden_agent_source_up", {**AGENT, "source": "nvml"}, "1x21")],
     [(8, []), (12, [{**AGENT, "source": "xid"}])]),
    ("GpuwardenAgentCannotReachEngine",
     [series("gpuwarden_agent_findings_failed_total", AGENT, "0 0 1 1"),
      series("gpuwarden_agent_findings_posted_total", AGENT, "0 1 2 3")],
     [(1, []), (3, [AGENT])]),
    ("GpuwardenAgentLosingPoints",
     [series("gpuwarden_agent_sink_points_dropped_total", AGENT, "0 0 5 5"),
      series("gpuwarden_agent_sink_points_written_total", AGENT, "0 9 19 29")],
     [(1, []), (3, [AGENT])]),
    ("GpuwardenAgentSpoolUnwritable",
     [series("gpuwarden_agent_sink_spool_write_errors_total", AGENT, "0 0 1 1")],
     [(1, []), (3, [AGENT])]),
    ("GpuwardenAgentCannotSend",  # nothing written while points wait; beside it an agent that
     # writes with points waiting (a backlog draining), and one with nothing to send
     [series("gpuwarden_agent_sink_points_written_total", AGENT, "0x40"),
      series("gpuwarden_agent_sink_spool_points_count", AGENT, "0 100x40"),
      series("gpuwarden_agent_sink_points_written_total", {**AGENT, "instance": "b"}, "0+50x40"),
      series("gpuwarden_agent_sink_spool_points_count", {**AGENT, "instance": "b"}, "0 900x40"),
      series("gpuwarden_agent_sink_points_written_total", {**AGENT, "instance": "c"}, "0x40"),
      series("gpuwarden_agent_sink_spool_points_count", {**AGENT, "instance": "c"}, "0x40"),
      # one that writes every other sample, points waiting between (as the live test's agent
      # looked to Prometheus in its first seconds: increase() over two equal samples was 0)
      series("gpuwarden_agent_sink_points_written_total", {**AGENT, "instance": "d"},
             " ".join(str(5 * (i // 2)) for i in range(41))),
      series("gpuwarden_agent_sink_spool_points_count", {**AGENT, "instance": "d"}, "100x40")],
     # nothing written in the last 15 min, for 5 min: from 20 min after the agent started
     [(5, []), (19, []), (21, [AGENT]), (25, [AGENT])]),
]  # fmt: skip


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_shipped_rule_has_a_case_and_says_where_to_route_it() -> None:
    shipped = rules()
    assert sorted(r["alert"] for r in shipped) == sorted(name for name, _, _ in CASES)
    for r in shipped:  # the example Alertmanager route keys on component; pagers on severity
        assert r["labels"]["component"] == "gpuwarden", r["alert"]
        assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
    # the operator's page lists each one with its severity
    page = (ROOT / "docs/DASHBOARDS.md").read_text().partition("## Alerts about gpuwarden")[2]
    for r in shipped:
        row = next(line for line in page.splitlines() if f"`{r['alert']}`" in line)
        assert f"| {r['labels']['severity']} |" in row, row


def test_the_rules_and_the_example_configurations_pass_prometheus_own_checks(
    tmp_path: Path,
) -> None:
    run(["promtool", "check", "rules", str(RULES)])
    # the example names credential files under /etc: promtool checks they exist, so the
    # check runs on a copy whose paths lead to files made here
    config = (DEPLOY / "prometheus.example.yml").read_text()
    for path in ("/etc/prometheus/gpuwarden-engine.token", "/etc/prometheus/gpuwarden-ca.pem"):
        assert path in config
        made = tmp_path / Path(path).name
        made.write_text("x\n")
        config = config.replace(path, str(made))
    (tmp_path / "prometheus.yml").write_text(config)
    shutil.copy(RULES, tmp_path / RULES.name)
    out = run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")])
    assert "19 rules found" in out, out  # the rule file it names was found and read
    # the Kubernetes way to find the agents, commented out in the example, keeps the
    # DaemonSet's pods by the label and port name the DaemonSet has (Debian's promtool is
    # built without Kubernetes service discovery: not checked by promtool)
    commented = config.partition("  # On Kubernetes, instead:")[2]
    k8s = yaml.safe_load("\n".join(line.replace("  # ", "", 1)
                                   for line in commented.splitlines()[2:]))  # fmt: skip
    keep = next(r for r in k8s[0]["relabel_configs"] if r.get("action") == "keep")
    label, port = keep["regex"].split(";")
    docs = {d["kind"]: d for d in yaml.safe_load_all(
        (ROOT / "deploy/kubernetes/agent-daemonset.yaml").read_text())}  # fmt: skip
    pod = docs["DaemonSet"]["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == label
    assert keep["source_labels"][0] == "__meta_kubernetes_pod_label_app_kubernetes_io_name"
    (agent,) = pod["spec"]["containers"]
    assert {"name": port, "containerPort": 9466} in agent["ports"]
    assert 'metrics_listen = "0.0.0.0:9466"' in docs["ConfigMap"]["data"]["agent.toml"]
    run(["amtool", "check-config", str(DEPLOY / "alertmanager.example.yml")])


def test_each_alert_fires_on_its_fault_and_not_on_the_healthy_case(tmp_path: Path) -> None:
    assert unit_test(tmp_path, CASES)


def unit_test(tmp_path: Path, cases: list[Any]) -> bool:
    """``promtool test rules`` over the shipped rules with ``cases`` (as :data:`CASES`)."""
    # promtool compares annotations too, all or nothing: the test reads a copy without them
    # (their templates are checked by `check rules`, and one is expanded by a real Prometheus
    # in tests/test_prometheus.py)
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for r in group["rules"]:
            r.pop("annotations")
    (tmp_path / "rules.yml").write_text(json.dumps(doc))
    by_name = {r["alert"]: r for r in rules()}
    tests = []
    for name, inputs, checks in cases:
        tests.append({
            "interval": "1m",
            "input_series": inputs,
            "alert_rule_test": [
                {"eval_time": f"{minute}m", "alertname": name,
                 "exp_alerts": [{"exp_labels": {**labels, **by_name[name]["labels"]}}
                                for labels in firing]}
                for minute, firing in checks
            ],
        })  # fmt: skip
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yml").write_text(json.dumps(spec))
    out = run(["promtool", "test", "rules", str(tmp_path / "test.yml")])
    assert "SUCCESS" in out, out
    return True


def _sink_readings(url: str, spool: Path) -> dict[str, int | float]:
    """What the REAL sink exports after a minute's points sent to ``url`` (the series the
    agent's /metrics shows as ``gpuwarden_agent_sink_<field>``)."""
    from gpuwarden.core.store.sink import InfluxSink, SinkConfig

    config = SinkConfig(url=url, spool_dir=str(spool), timeout_s=2.0, flush_interval_s=0.05,
                        backoff_base_s=0.05, backoff_max_s=0.1)  # fmt: skip
    sink = InfluxSink(config)
    try:
        sink.write_lines(
            [f"gpu,node=n power_w={i} {1_700_000_000 + i}000000000" for i in range(60)]
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (sink.parked or sink.stats().retries >= 3):
            time.sleep(0.05)
        return sink.stats().fields()
    finally:
        sink.close(timeout_s=0.5)


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_cannot_send_fires_on_what_the_real_sink_exports(tmp_path: Path) -> None:
    """Found by a review as a new operator (2026-11-28): the rule watched
    ``sender_errors_total``, which counts only exceptions inside the sender. A wrong token
    (401: the sender parks) or a dead InfluxDB (refused: retries) never moved it, and the first
    alert came when the 256 MiB spool was full, about 12 h later. The series here are the
    REAL sink's readings against a REAL refused port and a REAL HTTP server answering 401."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        refused = _sink_readings("http://127.0.0.1:9", tmp_path / "a")  # nothing listens
        parked = _sink_readings(f"http://127.0.0.1:{server.server_address[1]}", tmp_path / "b")
    finally:
        server.shutdown()
    inputs, firing = [], []
    for instance, got in (("refused:9466", refused), ("parked:9466", parked)):
        assert got["sender_errors_total"] == 0  # what the rule watched: it never moved
        assert got["spool_points_count"] > 0 and got["points_written_total"] == 0
        labels = {**AGENT, "instance": instance}
        inputs += [
            series("gpuwarden_agent_sink_points_written_total", labels,
                   f"{got['points_written_total']}x40"),
            series("gpuwarden_agent_sink_spool_points_count", labels,
                   f"{got['spool_points_count']}x40"),
        ]  # fmt: skip
        firing.append(labels)
    assert unit_test(tmp_path, [("GpuwardenAgentCannotSend", inputs, [(25, firing)])])


def test_a_rule_that_fires_on_the_healthy_case_fails_the_unit_test(tmp_path: Path) -> None:
    """The unit test can fail: the engine-down rule made to fire on `up == 1` is caught."""
    broken = RULES.read_text().replace('up{job="gpuwarden-remediate"} == 0',
                                       'up{job="gpuwarden-remediate"} == 1')  # fmt: skip
    assert broken != RULES.read_text()
    doc = yaml.safe_load(broken)
    rule = next(r for g in doc["groups"] for r in g["rules"] if r["alert"] == "GpuwardenEngineDown")
    rule.pop("annotations")
    doc["groups"] = [{"name": "one", "rules": [rule]}]
    (tmp_path / "rules.yml").write_text(json.dumps(doc))
    name, inputs, checks = CASES[0]
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": inputs,
        "alert_rule_test": [{"eval_time": f"{checks[0][0]}m", "alertname": name,
                             "exp_alerts": []}],
    }]}  # fmt: skip
    (tmp_path / "test.yml").write_text(json.dumps(spec))
    got = subprocess.run(["promtool", "test", "rules", str(tmp_path / "test.yml")],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert got.returncode != 0 and "FAILED" in got.stdout + got.stderr


def run(argv: list[str]) -> str:
    got = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert got.returncode == 0, f"{' '.join(argv)}:\n{got.stdout}{got.stderr}"
    return got.stdout + got.stderr
