"""``/metrics`` on the agent, the engine and the analyze service, scraped by a real Prometheus.

Debian's Prometheus 2.42 (REAL) scrapes the three production commands (``gpuwarden agent``,
``gpuwarden remediate serve``, ``gpuwarden analyze run --every``), each started with its
``metrics_listen`` (the engine: its own endpoint, behind its token), and the values are read
back through Prometheus' HTTP API. The agent reads the CONSTRUCTED 8x H100 NVML recording; the
finding posted to the engine is SIMULATED.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.collector.metrics import DCGM, FB_FREE, XID_ERRORS, agent_metrics, gpu_metrics
from gpuwarden.core.metrics import Metric, render
from gpuwarden.core.signing import sign_request
from gpuwarden.core.store.lineprotocol import Point
from testbed.influxd import LocalInfluxd, free_port
from testbed.prometheus import LocalPrometheus, Target, prometheus_binary
from tests.remediation_util import poll, risk
from tests.test_signed_senders import Engine

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "tests/golden/nvml-h100-8gpu/nvml.json"
RULES = ROOT / "deploy/prometheus/gpuwarden.rules.yml"


def rule_metrics() -> set[str]:
    """The gpuwarden metric names the shipped alerting rules' expressions read."""
    rules = yaml.safe_load(RULES.read_text())
    return {
        name
        for group in rules["groups"]
        for rule in group["rules"]
        for name in re.findall(r"\bgpuwarden_[a-z_]+", rule["expr"])
    }


def parse(body: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus' own parser (prometheus_client's) over a /metrics body: sample name ->
    [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


# -- the exposition, CONSTRUCTED ---------------------------------------------------------------


def test_gpu_points_become_dcgm_exporters_metrics_in_its_units() -> None:
    tags = {"cluster": "c", "node": "n1", "gpu": "3", "gpu_uuid": "GPU-abc",
            "gpu_model": "NVIDIA H100 80GB HBM3", "job": "4242", "rank": "7"}  # fmt: skip
    fields: dict[str, Any] = {"gpu_util_pct": 97.0, "mem_used_bytes": 3 * 2**30,
                              "energy_j_total": 12.5, "power_w": 650.25,
                              "ecc_dbe_volatile_total": 0,
                              "fabric_registered_active": True}  # fmt: skip
    body, content_type = render(gpu_metrics([Point("gpu", tags, fields, 0)], "n1"))
    assert content_type.startswith("text/plain; version=0.0.4")
    got = parse(body)
    labels = {"gpu": "3", "UUID": "GPU-abc", "device": "nvidia3", "Hostname": "n1",
              "modelName": "NVIDIA H100 80GB HBM3", "job": "4242", "rank": "7"}  # fmt: skip
    assert got["DCGM_FI_DEV_GPU_UTIL"] == [(labels, 97.0)]
    assert got["DCGM_FI_DEV_FB_USED"] == [(labels, 3072.0)]  # MiB
    assert got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"] == [(labels, 12500.0)]  # mJ
    assert got["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total"] == [(labels, 0.0)]
    # unanswered fields are absent, never 0; booleans are not counters
    assert "DCGM_FI_DEV_GPU_TEMP" not in got and len(got) == 5


def test_label_values_are_escaped() -> None:
    body, _ = render([Metric.one("m", "h", 1.0, source='a"b\\c\nd')])
    (labels, value), *_ = parse(body)["m"]
    assert labels == {"source": 'a"b\\c\nd'} and value == 1.0


# -- a real Prometheus scraping the production commands ---------------------------------------


class Services:
    def __init__(self, tmp: Path, influxd: LocalInfluxd) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.engine = Engine(tmp)
        influxd.create_database("scraped")
        self.agent_port, self.analyze_port = free_port(), free_port()
        agent = tmp / "agent.toml"
        agent.write_text(
            f'[agent]\ncluster = "c"\nnode = "node-0"\ninterval_s = 0.5\nsources = ["nvml"]\n'
            f'reporter_listen = ""\nmetrics_listen = "127.0.0.1:{self.agent_port}"\n'
            f'[nvml]\nbackend = "recorded"\nrecording = "{H100}"\nloop = true\nevents = "poll"\n'
            f'jobmap_dir = "{tmp}/jobs"\npod_resources_socket = "{tmp}/no-kubelet.sock"\n'
            f'[sink]\nurl = "{influxd.url}"\ndatabase = "scraped"\nspool_dir = "{tmp}/spool"\n'
        )
        analytics = tmp / "analytics.toml"
        analytics.write_text(
            f'[influxdb]\nurl = "{influxd.url}"\ndatabase = "scraped"\n'
            f'[analysis]\nwindow_s = 60\nwrite_back = false\nspool_dir = "{tmp}/aspool"\n'
            f'metrics_listen = "127.0.0.1:{self.analyze_port}"\n'
        )
        for argv in (
            ["agent", "--config", str(agent)],
            ["analyze", "run", "--config", str(analytics), "--every", "2s", "--local"],
        ):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gpuwarden", *argv],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            )

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.engine.proc.poll() is None:
            self.engine.stop()


@pytest.fixture
def services(tmp_path: Path, influxd: LocalInfluxd) -> Iterator[Services]:
    s = Services(tmp_path, influxd)
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.influxdb
@pytest.mark.skipif(prometheus_binary() is None, reason="needs Debian's prometheus")
def test_a_real_prometheus_scrapes_the_agent_the_engine_and_the_analyze_service(
    services: Services, tmp_path: Path
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", services.engine.port, timeout=10)
    # two risks on a pool of four nodes: max_fraction_out (0.1) lets one node out, the second
    # waits (blast_radius). The analyze service's own identity signs each finding
    # (tests/test_signed_senders.py)
    for node in ("node-001", "node-002"):
        body = json.dumps(risk(node).to_json()).encode()
        headers = {"Content-Type": "application/json",
                   **sign_request(b"the-key-of-analyze", "POST", "/v1/findings", body,
                                  "analyze")}  # fmt: skip
        conn.request("POST", "/v1/findings", body, headers)
        assert conn.getresponse().status == 202
    conn.request("GET", "/metrics")  # no token: refused, and counted
    assert conn.getresponse().status == 401
    # the job names deploy/prometheus/prometheus.example.yml gives them, which the shipped
    # alerting rules select on
    jobs = {"gpuwarden-agent", "gpuwarden-remediate", "gpuwarden-analyze"}
    targets = [
        Target("gpuwarden-agent", f"127.0.0.1:{services.agent_port}"),
        Target("gpuwarden-remediate", f"127.0.0.1:{services.engine.port}",
               str(tmp_path / "token")),
        Target("gpuwarden-analyze", f"127.0.0.1:{services.analyze_port}"),
    ]  # fmt: skip
    with LocalPrometheus(tmp_path / "prometheus", targets, [str(RULES)]) as prom:

        def every_target_up() -> list[dict[str, Any]] | None:
            up = prom.query("up == 1")
            return up if {r["metric"]["job"] for r in up} == jobs else None

        poll(every_target_up, 90, "Prometheus to scrape all three targets")

        def value(promql: str) -> float | None:
            r = prom.query(promql)
            return float(r[0]["value"][1]) if r else None

        assert poll(lambda: value("gpuwarden_engine_findings_total"), 30, "findings") == 2.0
        refused = value('gpuwarden_engine_requests_refused_total{status="401"}')
        assert refused is not None and refused >= 1.0
        assert poll(lambda: value("gpuwarden_analyze_runs_total"), 60, "an analysis") >= 1.0
        assert value("gpuwarden_analyze_run_failures_total") == 0.0
        assert value('gpuwarden_agent_source_up{source="nvml"}') == 1.0
        util = prom.query("DCGM_FI_DEV_GPU_UTIL")
        assert sorted(r["metric"]["gpu"] for r in util) == [str(g) for g in range(8)]
        assert {r["metric"]["Hostname"] for r in util} == {"node-0"}
        assert {r["metric"]["modelName"] for r in util} == {"NVIDIA H100 80GB HBM3"}
        written = poll(
            lambda: value("gpuwarden_agent_sink_points_written_total"), 30, "the agent's writes"
        )
        assert written > 0
        # the shipped alerting rules: every metric they name is exported (a renamed metric
        # would leave its rule silent for ever; a family without samples yet, a policy's
        # precision before any outcome, counts), and none fires on this healthy stack ...
        token = (tmp_path / "token").read_text().strip()
        exported: set[str] = set()
        for port, auth in (
            (services.agent_port, {}),
            (services.analyze_port, {}),
            (services.engine.port, {"Authorization": f"Bearer {token}"}),
        ):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics", headers=auth)
            exposition = conn.getresponse().read().decode()
            exported |= set(re.findall(r"^# TYPE (\S+)", exposition, re.MULTILINE))
        assert rule_metrics() - exported == set(), "the rules name metrics nothing exports"
        since = prom.now()
        poll(lambda: min(prom.evaluated()) > since or None, 30, "the rules evaluated")
        raised = {a["labels"]["alertname"]: a for a in prom.alerts()}
        # the second risk posted above waits (for room, or an operator): that one is raised,
        # pending its 15 minutes; nothing else
        assert value("gpuwarden_engine_plans_pending") == 1.0
        assert raised.pop("GpuwardenPlansWaiting")["state"] == "pending"
        assert raised == {}, "an alert on a healthy stack"
        # ... and one fault raises its alert: the first request the engine refuses as not
        # allowed (an alert on a counter's increase needs the series at 0 before it: the
        # engine shows the statuses the rules watch from the start): the analyze service
        # asking for an operator's undo
        conn = http.client.HTTPConnection("127.0.0.1", services.engine.port, timeout=10)
        undo = sign_request(b"the-key-of-analyze", "POST", "/v1/undo/node-001", b"", "analyze")
        conn.request("POST", "/v1/undo/node-001", b"", undo)
        assert conn.getresponse().status == 403

        def refusing() -> list[dict[str, Any]] | None:
            return [a for a in prom.alerts() if a["state"] == "firing"] or None

        (alert,) = poll(refusing, 60, "the refused request's alert")
        assert alert["labels"]["alertname"] == "GpuwardenEngineRefusingSenders"
        assert alert["labels"]["status"] == "403"
        assert alert["labels"]["component"] == "gpuwarden"
        assert alert["annotations"]["summary"] == (
            f"gpuwarden's engine on 127.0.0.1:{services.engine.port} refused requests (403)"
        )
    # the agent's own exposition agrees with what it wrote: one cycle, read directly
    conn = http.client.HTTPConnection("127.0.0.1", services.agent_port, timeout=10)
    conn.request("GET", "/metrics")
    got = parse(conn.getresponse().read())
    derived = {FB_FREE[0], XID_ERRORS[0]}  # from several fields, or from events
    assert {name for name, _, _, _ in DCGM.values()} | derived >= {
        n.removesuffix("_total") for n in got if n.startswith("DCGM_")
    }
    assert got["gpuwarden_agent_cycles_total"][0][1] > 0


def test_agent_metrics_show_a_failing_source() -> None:
    from gpuwarden.collector.agent import SourceHealth

    class FakeAgent:
        def __init__(self) -> None:
            self.cycles, self.skipped_ticks, self.interval_s, self.node = 12, 1, 10.0, "n1"
            self.sink_errors = 2
            self.health = {"nvml": SourceHealth(errors=3, failing="gone", failed_cycles=3),
                           "xid": SourceHealth(points=2)}  # fmt: skip
            self.last_points: list[Point] = []
            self.last_xid: dict[str, int] = {}

    got = parse(render(agent_metrics(FakeAgent(), lambda: {"spool_bytes": 5}, gpu=True))[0])
    assert got["gpuwarden_agent_source_up"] == [({"source": "nvml"}, 0.0), ({"source": "xid"}, 1.0)]
    assert got["gpuwarden_agent_source_errors_total"][0] == ({"source": "nvml"}, 3.0)
    assert got["gpuwarden_agent_sink_spool_bytes"] == [({}, 5.0)]
    assert got["gpuwarden_agent_skipped_ticks_total"] == [({}, 1.0)]
    assert got["gpuwarden_agent_sink_errors_total"] == [({}, 2.0)]
    # no fast path: its counters at 0; with one, what it delivered and what it could not
    assert got["gpuwarden_agent_findings_failed_total"] == [({}, 0.0)]
    poster = SimpleNamespace(posted=7, failed=2, merged=1999)
    body = render(agent_metrics(FakeAgent(), None, gpu=False, poster=poster))[0]
    got = parse(body)
    assert got["gpuwarden_agent_findings_posted_total"] == [({}, 7.0)]
    assert got["gpuwarden_agent_findings_failed_total"] == [({}, 2.0)]
    assert got["gpuwarden_agent_findings_merged_total"] == [({}, 1999.0)]
