"""Issue 7, must-show 5 (endpoint security), the webhook adapter, the CLI and the sample config.

All findings here are SIMULATED; the HTTP servers are real, on loopback.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.signing import SIGNATURE_HEADER, sign, sign_request, verify_signature
from gpuwarden.remediation.adapters.webhook import WebhookAdapter
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.cli import main as remediate
from gpuwarden.remediation.config import defaults, load_config
from gpuwarden.remediation.engine import Engine, EngineClosedError, EngineSettings
from gpuwarden.remediation.model import Action, ActionKind
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from gpuwarden.remediation.server import Endpoint, make_server
from testbed.alertmanager import LocalAlertmanager, alertmanager_binary
from testbed.k8s import FakeKubernetes
from tests.remediation_util import RecordingAdapter, risk

ROOT = Path(__file__).parent.parent
TOKEN = "t0ken-for-tests"
SECRET = b"hmac-secret"


class Running:
    def __init__(
        self,
        tmp: Path,
        secret: bytes = b"",
        alerts_unsigned: bool = False,
        quotas: dict[str, float] | None = None,
    ) -> None:
        self.sched = RecordingAdapter("slurm", {f"gpu0{i}": "gpu" for i in range(1, 9)})
        self.notes = RecordingAdapter("webhook")
        self.audit = AuditLog(tmp / "audit.jsonl")
        settings = EngineSettings(dry_run=False, max_nodes_out=4, max_fraction_out=1.0)
        self.engine = Engine(
            load_policies(DEFAULT_POLICIES),
            {"slurm": self.sched, "webhook": self.notes},
            self.audit,
            settings,
        )
        self.endpoint = Endpoint(
            self.engine,
            TOKEN,
            secret=secret,
            max_body_bytes=64 * 1024,
            alerts_unsigned=alerts_unsigned,
            quotas_per_min=quotas,
        )
        self.server = make_server(self.endpoint, "127.0.0.1", 0)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = json.loads(resp.read() or b"{}")
        conn.close()
        return resp.status, data

    def post(self, path: str, payload: Any, **headers: str) -> tuple[int, dict[str, Any]]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        return self.request("POST", path, body, auth | headers)

    def acted(self) -> list[dict[str, Any]]:
        self.engine.wait(10)
        return [r for r in read_records(self.audit.path) if r["event"] == "action"]

    def close(self) -> None:
        self.server.shutdown()
        self.engine.close()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path)
    yield r
    r.close()


def test_a_good_finding_is_accepted_and_acted_on(running: Running) -> None:
    status, data = running.post("/v1/findings", risk("gpu02").to_json())
    assert status == 202 and data["results"][0]["verdict"] == "act"
    assert [r["action"] for r in running.acted()] == ["notify", "checkpoint", "drain", "requeue"]


def test_the_legacy_shared_credential_has_a_quota(tmp_path: Path) -> None:
    """Issue 38: without identities, the one shared token had no quota at all (every sender
    holds it, so one leaked copy could post without bound). Now it has the fleet's
    (``quota_shared_per_min``, default 6,000): past it, 429 with Retry-After and nothing of
    the request is acted on."""
    r = Running(tmp_path, quotas={"shared": 3.0})
    try:
        answers = [r.post("/v1/findings", risk(f"gpu0{i}").to_json())[0] for i in range(1, 6)]
    finally:
        r.close()
    assert answers == [202, 202, 202, 429, 429]
    decided = [x for x in read_records(tmp_path / "audit.jsonl") if x["event"] == "finding"]
    assert len(decided) == 3
    # the fleet's bucket is spent: an operator's undo on the same credential still goes
    # through (review: it got 429 and the operator was locked out)
    r = Running(tmp_path / "again", quotas={"shared": 1.0})
    try:
        assert r.post("/v1/findings", risk("gpu02").to_json())[0] == 202
        assert r.post("/v1/findings", risk("gpu03").to_json())[0] == 429
        status, reply = r.post("/v1/undo/gpu02", {})
    finally:
        r.close()
    assert status == 202, reply  # (before: 429, over the quota)
    assert defaults()["engine"]["quota_shared_per_min"] == 6000.0


def test_a_finding_sent_while_the_engine_shuts_down_is_refused_and_not_lost(
    running: Running, tmp_path: Path
) -> None:
    """503, nothing recorded: the same finding sent to the restarted engine is acted on (had
    it been marked seen first, the retry would have been dropped as a duplicate)."""
    running.engine.close()
    status, data = running.post("/v1/findings", risk("gpu03").to_json())
    assert status == 503 and "closed" in data["error"]
    with pytest.raises(EngineClosedError):
        running.engine.undo("gpu03", force=True)
    assert [r for r in read_records(running.audit.path) if r["event"] == "finding"] == []
    again = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": running.sched, "webhook": running.notes},
        AuditLog(running.audit.path),
        EngineSettings(dry_run=False, max_nodes_out=4, max_fraction_out=1.0),
    )
    try:
        assert again.submit(risk("gpu03")).verdict == "act"
    finally:
        again.close()


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing 'Authorization: Bearer <token>'"),
        ({"Authorization": "Bearer wrong"}, "wrong token"),
        ({"Authorization": f"Basic {TOKEN}"}, "missing 'Authorization: Bearer <token>'"),
    ],
)
def test_unauthenticated_requests_are_refused(
    running: Running, headers: dict[str, str], message: str
) -> None:
    body = json.dumps(risk("gpu02").to_json()).encode()
    status, data = running.request("POST", "/v1/findings", body, headers)
    assert (status, data["error"]) == (401, message)
    assert running.request("GET", "/v1/pending", None, headers)[0] == 401
    assert running.acted() == []


def test_refusals_are_all_counted_and_logged_at_most_ten_a_minute(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    """A sender refused 6,000 times a minute (a quota spent, a wrong key) wrote 6,000 WARNING
    lines (left open by the fourth review). Each refusal is still counted in the metrics."""
    from gpuwarden.remediation.clock import Clock
    from tests.remediation_util import HandClock

    hand = HandClock()
    running.endpoint.clock = Clock(wall=time.time, mono=hand.mono)
    caplog.set_level("WARNING", logger="gpuwarden.remediation")
    for _ in range(30):
        assert running.request("GET", "/v1/pending", None, {})[0] == 401
    said = [r.getMessage() for r in caplog.records if "refused GET" in r.getMessage()]
    assert len(said) == 10 and running.endpoint.rejected[401] == 30
    hand.advance(61)
    assert running.request("GET", "/v1/pending", None, {})[0] == 401
    said = [r.getMessage() for r in caplog.records if "refused GET" in r.getMessage()]
    assert len(said) == 11 and "(20 more 401s not logged in the minute before)" in said[-1]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "body is not JSON"),
        (b"\xff\xfe", 400, "body is not JSON"),
        (b'{"kind": "failure_risk"}', 422, "not a finding: malformed finding"),
        (b'"a string"', 422, "not a finding"),
        (b"[]", 422, "send 1 to 1000 findings"),
    ],
)
def test_malformed_requests_are_refused(
    running: Running, body: bytes, status: int, message: str
) -> None:
    got, data = running.post("/v1/findings", body)
    assert got == status and message in data["error"]
    assert running.acted() == []


def test_a_finding_whose_id_was_tampered_with_is_refused(running: Running) -> None:
    data = risk("gpu02").to_json() | {"subject": {"node": "gpu07", "cluster": "test"}}
    status, reply = running.post("/v1/findings", data)
    assert status == 422 and "does not match its content" in reply["error"]
    assert running.acted() == []


def test_one_bad_finding_in_a_batch_means_none_is_acted_on(running: Running) -> None:
    stale = risk("gpu03", t_ns=time.time_ns() - 7200 * 10**9).to_json()
    status, data = running.post("/v1/findings", [risk("gpu02").to_json(), stale])
    assert status == 422 and "stale" in data["error"]
    assert running.acted() == []


def test_oversized_and_lengthless_requests_are_refused(running: Running) -> None:
    big = json.dumps([risk(f"gpu0{i % 8 + 1}").to_json() for i in range(400)]).encode()
    status, data = running.post("/v1/findings", big)
    assert status == 413 and "exceeds max_body_bytes=65536" in data["error"]
    # a client announcing a huge body is refused before anything is read
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
    conn.putrequest("POST", "/v1/findings")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Length", str(10**9))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
    conn.putrequest("POST", "/v1/findings")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.endheaders()
    assert conn.getresponse().status == 411
    conn.close()
    assert running.acted() == []


def test_replayed_and_stale_requests_are_refused(running: Running) -> None:
    body = json.dumps(risk("gpu04").to_json()).encode()
    assert running.post("/v1/findings", body)[0] == 202
    before = running.acted()
    status, data = running.post("/v1/findings", body)  # the same request again
    assert status == 409 and "already received" in data["error"]
    old = risk("gpu05", t_ns=time.time_ns() - 7200 * 10**9)
    status, data = running.post("/v1/findings", old.to_json())
    assert status == 422 and "stale, not acted on" in data["error"]
    future = risk("gpu05", t_ns=time.time_ns() + 3600 * 10**9)
    assert running.post("/v1/findings", future.to_json())[0] == 422
    assert running.acted() == before
    stats = running.request("GET", "/v1/stats", None, {"Authorization": f"Bearer {TOKEN}"})[1]
    assert stats["rejected"] == {"409": 1, "422": 2}


def test_signed_requests_replays_and_forgeries(tmp_path: Path) -> None:
    """The legacy shared secret (no identities): the request signature (method, path, query,
    timestamp, body; :func:`sign_request`), fresh and never seen before."""
    r = Running(tmp_path, secret=SECRET)
    try:
        body = json.dumps(risk("gpu06").to_json()).encode()
        assert r.post("/v1/findings", body)[1]["error"] == f"missing {SIGNATURE_HEADER}"
        signed = sign_request(SECRET, "POST", "/v1/findings", body)
        assert r.post("/v1/findings", body, **signed)[0] == 202
        status, data = r.post("/v1/findings", body, **signed)
        assert status == 409 and "replayed request" in data["error"]
        other = json.dumps(risk("gpu07").to_json()).encode()
        status, data = r.post("/v1/findings", other, **signed)
        assert status == 401 and "does not match" in data["error"]
        old = sign_request(SECRET, "POST", "/v1/findings", other, t=int(time.time()) - 3600)
        status, data = r.post("/v1/findings", other, **old)
        assert status == 401 and "off (tolerance 300 s)" in data["error"]
        body_v1 = json.dumps(risk("gpu08").to_json()).encode()  # the body-only scheme of old
        status, data = r.post("/v1/findings", body_v1, **{SIGNATURE_HEADER: sign(SECRET, body_v1)})
        assert status == 401 and "malformed" in data["error"]
        assert [a["node"] for a in r.acted()] == ["gpu06"] * 4
    finally:
        r.close()


def test_grafana_webhook_payload_becomes_findings(running: Running) -> None:
    """The shape Grafana's webhook contact point posts (labels from our alert rules)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    payload = {
        "receiver": "gpuwarden",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "labels": {
                    "alertname": "High predicted failure risk",
                    "kind": "failure_risk",
                    "severity": "warning",
                    "source": "gpuwarden",
                    "cluster": "test",
                    "node": "gpu08",
                    "grafana_folder": "gpuwarden",
                },
                "annotations": {"summary": "gpu08: the predictor expects a hardware fault"},
                "startsAt": now,
                "fingerprint": "abc123",
                "values": {"B": 0.91, "C": 1},
            },
            {"status": "resolved", "labels": {"alertname": "x"}, "startsAt": now},
        ],
    }
    status, data = running.post("/v1/alerts/grafana", payload)
    assert status == 202 and [r["verdict"] for r in data["results"]] == ["act"]
    acted = running.acted()
    assert {a["node"] for a in acted} == {"gpu08"} and len(acted) == 4
    assert running.post("/v1/alerts/grafana", {"no": "alerts"})[0] == 422


def _am_alert(node: str, **labels: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "labels": {"alertname": "GpuFellOffTheBus", "kind": "gpu_lost", "severity": "critical",
                   "cluster": "test", "node": node, **labels},
        "annotations": {"summary": f"{node}: a GPU fell off the bus"},
        "startsAt": now,
        "generatorURL": "http://prometheus.example/graph",
    }  # fmt: skip


def test_alertmanager_webhook_payload_becomes_findings(running: Running) -> None:
    """Alertmanager's webhook shape (version 4), as its documentation gives it; a dcgm-exporter
    alert names its host ``Hostname``, a node-exporter one only ``instance``."""
    payload = {
        "version": "4",
        "groupKey": '{}:{alertname="GpuFellOffTheBus"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "gpuwarden",
        "groupLabels": {"alertname": "GpuFellOffTheBus"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example",
        "alerts": [
            {**_am_alert("gpu05"), "status": "firing", "fingerprint": "f1"},
            {**_am_alert("x"), "status": "resolved", "fingerprint": "f2"},
        ],
    }
    status, data = running.post("/v1/alerts/alertmanager", payload)
    assert status == 202 and [r["verdict"] for r in data["results"]] == ["act"]
    acted = running.acted()
    assert [(a["node"], a["action"]) for a in acted if a["action"] == "drain"] == [
        ("gpu05", "drain")
    ]
    dcgm = _am_alert("", Hostname="gpu06") | {"status": "firing"}
    dcgm["labels"].pop("node")
    assert running.post("/v1/alerts/alertmanager", payload | {"alerts": [dcgm]})[0] == 202
    by_instance = _am_alert("", instance="gpu07:9100") | {"status": "firing"}
    by_instance["labels"].pop("node")
    assert running.post("/v1/alerts/alertmanager", payload | {"alerts": [by_instance]})[0] == 202
    drained = {a["node"] for a in running.acted() if a["action"] == "drain"}
    assert drained == {"gpu05", "gpu06", "gpu07"}
    findings = [r for r in read_records(running.audit.path) if r["event"] == "finding"]
    assert {f["source"] for f in findings} == {"alertmanager"}
    status, data = running.post("/v1/alerts/alertmanager", payload | {"version": "3"})
    assert status == 422 and "version '3'" in data["error"]
    assert running.post("/v1/alerts/alertmanager", {"version": "4"})[0] == 422


@pytest.mark.skipif(alertmanager_binary() is None, reason="needs prometheus-alertmanager")
@pytest.mark.parametrize("alerts_unsigned", [True, False])
def test_a_real_alertmanager_drives_the_engine(tmp_path: Path, alerts_unsigned: bool) -> None:
    """Debian's Alertmanager 0.25 (REAL) posts a pushed alert to the engine, which requires
    signatures: taken on the bearer token where ``alerts_unsigned`` says so, else refused (401)
    and nothing acted on. The alert itself is SIMULATED."""
    r = Running(tmp_path, secret=SECRET, alerts_unsigned=alerts_unsigned)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    url = f"http://127.0.0.1:{r.port}/v1/alerts/alertmanager"
    try:
        with LocalAlertmanager(tmp_path / "am", url, token) as am:
            am.post_alerts([_am_alert("gpu04")])
            # until the drain is on record, or the request refused: the finding's count goes up
            # before its plan starts, so engine.wait() just after it may find nothing to wait
            # for (CI, 2026-11-27: the drain was on record 6 ms after the finding, acted() saw none)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                records = read_records(r.audit.path)
                if r.endpoint.rejected or any(x.get("action") == "drain" for x in records):
                    break
                time.sleep(0.1)
            if alerts_unsigned:
                drained = [a for a in r.acted() if a["action"] == "drain"]
                assert [a["node"] for a in drained] == ["gpu04"], am.log()[-2000:]
                (f,) = [x for x in read_records(r.audit.path) if x["event"] == "finding"]
                assert (f["source"], f["via"]) == ("alertmanager", "http")
                assert f["summary"] == "gpu04: a GPU fell off the bus"
            else:
                assert r.endpoint.rejected.get(401), am.log()[-2000:]
                assert r.acted() == [] and r.engine.stats.findings == 0
    finally:
        r.close()


def test_operator_endpoints(running: Running) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    running.post("/v1/findings", risk("gpu02").to_json())
    running.acted()
    status, _ = running.post("/v1/undo/gpu02", {})
    assert status == 202
    assert running.engine.wait(10)  # the uncordon runs on the engine's pool
    assert running.sched.out == set()
    assert running.post("/v1/undo/gpu03", {})[0] == 409
    assert running.post("/v1/approve/0123456789abcdef", {})[0] == 404
    assert running.request("GET", "/v1/pending", None, auth) == (200, {"pending": [], "held": []})
    assert running.request("GET", "/healthz")[0] == 200
    assert running.request("DELETE", "/v1/findings", None, auth)[0] == 405


# -- webhooks ---------------------------------------------------------------------------------


class Receiver:
    """A loopback webhook receiver: fails the first ``fail`` requests with ``status``."""

    def __init__(self, fail: int = 0, status: int = 500) -> None:
        self.bodies: list[tuple[str, bytes, str]] = []
        self.keys: list[str] = []  # each request's Idempotency-Key
        self.fail, self.status = fail, status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.bodies.append((self.path, body, self.headers.get(SIGNATURE_HEADER, "")))
                receiver.keys.append(self.headers.get("Idempotency-Key", ""))
                code = receiver.status if receiver.fail > 0 else 200
                receiver.fail -= 1
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def note(severity: str) -> Action:
    return Action(
        ActionKind.NOTIFY,
        "webhook",
        node="gpu02",
        finding_id="f" * 24,
        reason="gpuwarden: gpu02 at risk",
        severity=severity,
        params={"kind": "failure_risk", "subject": {"cluster": "c", "node": "gpu02"}},
    )


def test_webhooks_are_signed_shaped_routed_and_retried(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    rx = Receiver(fail=2)
    slack = tmp_path / "slack-url"  # a Slack URL is a credential: kept in a file
    slack.write_text(f"{rx.url}/slack\n")
    hook = WebhookAdapter(
        generic_url=f"{rx.url}/generic",
        slack_url_file=str(slack),
        alertmanager_url=f"{rx.url}/api/v2/alerts",
        secret_file=str(secret),
        backoff_s=0.01,
    )
    outcome = hook.perform(note("critical"))
    assert outcome.ok and outcome.details["targets"] == {
        "generic": "ok",
        "slack": "ok",
        "alertmanager": "ok",
    }
    by_path = {p: (json.loads(b), s, b) for p, b, s in rx.bodies}
    assert len(rx.bodies) == 5  # the generic one failed twice (500) and was retried
    # at least once (a retry, a plan resumed after a crash): one key per notification, so a
    # receiver can drop a second delivery
    assert set(rx.keys) == {note("critical").id}
    generic, signature, raw = by_path["/generic"]
    assert verify_signature(SECRET, signature, raw) > 0
    assert generic["finding_id"] == "f" * 24 and generic["subject"]["node"] == "gpu02"
    assert by_path["/slack"][0]["text"].startswith("[CRITICAL]")
    alert = by_path["/api/v2/alerts"][0][0]
    assert alert["labels"] == {
        "alertname": "gpuwarden_failure_risk",
        "severity": "critical",
        "cluster": "c",
        "node": "gpu02",
    }
    rx.bodies.clear()
    assert hook.perform(note("info")).ok and [p for p, _, _ in rx.bodies] == ["/generic"]
    rx.server.shutdown()


def test_webhook_client_errors_are_not_retried() -> None:
    rx = Receiver(fail=10, status=400)
    outcome = WebhookAdapter(generic_url=rx.url, backoff_s=0.01).perform(note("warning"))
    assert outcome.status == "failed" and outcome.details["targets"] == {"generic": "HTTP 400"}
    assert len(rx.bodies) == 1
    rx.server.shutdown()
    gone = WebhookAdapter(generic_url="http://127.0.0.1:9", attempts=2, backoff_s=0.01)
    assert "gave up after 2 attempts" in gone.perform(note("info")).message


# -- configuration and CLI --------------------------------------------------------------------


def test_sample_config_equals_defaults() -> None:
    path = ROOT / "config/remediation.sample.toml"
    config = load_config(path, environ={})
    assert config.sections == defaults()
    assert [p.to_mapping() for p in config.policies] == [
        p.to_mapping() for p in load_policies(DEFAULT_POLICIES)
    ]
    raw = tomllib.loads(path.read_text())
    for section, values in defaults().items():
        assert set(raw[section]) == set(values), section


def test_bad_configuration_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[engine]\nnode_adapter = "pbs"\n')
    assert remediate(["--config", str(bad), "audit", "--log", str(tmp_path / "none")]) == 2
    bad.write_text('[[policy]]\nname = "x"\nkinds = ["a"]\nactions = ["reboot"]\n')
    with pytest.raises(Exception, match="'reboot' is not a valid ActionKind"):
        load_config(bad, environ={})


def test_apply_and_audit_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    findings = tmp_path / "findings.jsonl"
    findings.write_text(
        "\n".join(json.dumps(f.to_json()) for f in (risk("gpu02"), risk("gpu02"), risk("gpu03")))
        + "\n{}\n"
    )
    audit = tmp_path / "audit.jsonl"
    hook = Receiver()
    monkeypatch.setenv("GPUWARDEN_ENGINE_AUDIT_LOG", str(audit))
    monkeypatch.setenv("GPUWARDEN_WEBHOOK_GENERIC_URL", hook.url)
    # the node actions go to a (fake) Kubernetes cluster, chosen by environment overrides
    fake = FakeKubernetes(token="k").start()
    for i in range(1, 9):
        fake.add_node(f"gpu0{i}")
    (tmp_path / "k8s-token").write_text("k")
    monkeypatch.setenv("GPUWARDEN_ENGINE_NODE_ADAPTER", "kubernetes")
    monkeypatch.setenv("GPUWARDEN_ENGINE_CHECKPOINT_ADAPTER", "kubernetes")
    monkeypatch.setenv("GPUWARDEN_KUBERNETES_API_URL", fake.url)
    monkeypatch.setenv("GPUWARDEN_KUBERNETES_TOKEN_FILE", str(tmp_path / "k8s-token"))
    monkeypatch.setenv("GPUWARDEN_GUARDS_MAX_FRACTION_OUT", "0.5")
    assert remediate(["apply", str(findings)]) == 1  # one line was not a finding
    out = capsys.readouterr()
    verdicts = [line.split()[3] for line in out.out.splitlines()]
    assert verdicts == ["dry_run", "duplicate", "dry_run"]
    assert "#4: not a finding" in out.err
    assert remediate(["audit", "--node", "gpu02"]) == 0
    table = capsys.readouterr().out
    assert "drain" in table and "dry_run" in table and "gpu03" not in table
    assert remediate(["audit", "--json"]) == 0
    records = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {r["event"] for r in records} == {"finding", "decision", "action"}
    assert all(r["dry_run"] for r in records if r["event"] == "action" and r["action"] != "notify")
    assert len(hook.bodies) == 2  # notifications are sent in dry-run too
    assert all(not n["spec"].get("unschedulable") for n in fake.nodes.values())
    hook.server.shutdown()
    fake.stop()


def test_serve_as_a_process_with_the_agents_fast_path(tmp_path: Path) -> None:
    """``gpuwarden remediate serve`` as operators run it; the agent's own poster sends to it;
    its remediation_action events land in a real influxd; SIGTERM stops it cleanly."""
    import os
    import signal
    import subprocess
    import sys

    from gpuwarden.core.poster import FindingPoster
    from testbed.influxd import LocalInfluxd, free_port
    from tests.remediation_util import poll

    port = free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")
    fake = FakeKubernetes(token="k").start()
    for i in range(1, 5):
        fake.add_node(f"gpu0{i}")
    (tmp_path / "k8s").write_text("k")
    with LocalInfluxd(tmp_path / "influxd") as influxd:
        influxd.create_database("gpuwarden")
        config = tmp_path / "remediation.toml"
        config.write_text(
            f'[engine]\nlisten = "127.0.0.1:{port}"\ntoken_file = "{tmp_path}/token"\n'
            f'audit_log = "{tmp_path}/audit.jsonl"\ndry_run = false\n'
            'node_adapter = "kubernetes"\ncheckpoint_adapter = "kubernetes"\ntick_s = 0.2\n'
            f'[guards]\nmax_fraction_out = 0.5\n[kubernetes]\napi_url = "{fake.url}"\n'
            f'token_file = "{tmp_path}/k8s"\n[influxdb]\nurl = "{influxd.url}"\n'
            f'spool_dir = "{tmp_path}/spool"\n'
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden.remediation.cli", "--config", str(config), "serve"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            poll(lambda: remediate(["--config", str(config), "pending"]) == 0, 30, "the endpoint")
            poster = FindingPoster(f"http://127.0.0.1:{port}/v1/findings", str(tmp_path / "token"))
            finding = risk("gpu03")
            poster.post(finding)
            poster.post(finding)  # the same finding again: not sent twice (merged)
            poster.close(timeout_s=30)
            assert (poster.posted, poster.failed, poster.merged) == (1, 0, 1)
            # an agent restarted sends it again: 409, the same content, counted as delivered
            again = FindingPoster(f"http://127.0.0.1:{port}/v1/findings", str(tmp_path / "token"))
            again.post(finding)
            again.close(timeout_s=30)
            assert (again.posted, again.failed) == (1, 0)
            poll(lambda: fake.nodes["gpu03"]["spec"].get("unschedulable"), 30, "gpu03 cordoned")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            fake.stop()
        log = proc.stdout.read().decode() if proc.stdout else ""
        assert "LIVE" in log and "refused POST /v1/findings: 409" in log
        q = 'SELECT "message" FROM "remediation_action" WHERE "node" = \'gpu03\' GROUP BY "outcome"'
        series = json.loads(influxd.query(q, "gpuwarden"))["results"][0]["series"]
        counts = {s["tags"]["outcome"]: len(s["values"]) for s in series}
        assert counts == {"ok": 2, "skipped": 2}  # notify + drain; no checkpoint/requeue on k8s


def test_the_engine_says_its_connection_caps_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review item 9: behind a TLS proxy or NAT every sender is one peer, so the per-peer cap
    would throttle the whole fleet; the engine says both caps when it starts, and where to
    raise the per-peer one."""
    with caplog.at_level("INFO", logger="gpuwarden.remediation.server"):
        r = Running(tmp_path)  # the defaults: 128 in all, a quarter of them per peer
        try:
            extra = make_server(Endpoint(r.engine, TOKEN), "127.0.0.1", 0, max_connections=64,
                                max_connections_per_peer=64)  # fmt: skip
            extra.server_close()
        finally:
            r.close()
    said = [m for m in caplog.messages if "connections at once" in m]
    assert len(said) == 2, caplog.messages
    assert "at most 128 connections at once, at most 32 of them from one peer" in said[0]
    assert "at most 64 connections at once, at most 64 of them from one peer" in said[1]
    assert "behind a TLS proxy or NAT every sender is that one peer" in said[0]
    assert "max_connections_per_peer" in said[0]
