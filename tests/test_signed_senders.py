"""Every sender signs as its own identity: the agent's fast path and the analyze service post
findings to a real ``gpuwarden remediate serve`` with identities (issue 38), through their
production commands; with the wrong key, the engine refuses them and nothing is acted on.
``remediate pending`` / ``undo`` sign as the operator identity. An agent of a family
(``node = "*"``) signs with the key ``remediate agent-key`` derives for its node.

The engine runs dry (``dry_run = true``) against the Kubernetes fake; the agent reads a
CONSTRUCTED kernel-log line (NVIDIA's XID format, XID 79, no timestamp so it is read as now);
the analyze service reads the SIMULATED ``fleet-tour`` scenario replayed into a real influxd,
whose spare node runs an older driver (a ``config_drift`` finding)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.remediation.audit import read_records
from gpuwarden.remediation.cli import main as remediate
from gpuwarden.simulation.cli import stream_scenario
from gpuwarden.simulation.spec import load_spec
from testbed.influxd import LocalInfluxd, free_port
from testbed.k8s import FakeKubernetes
from tests.remediation_util import poll

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "t0ken-for-tests"
XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n"
IDENTITIES = """
[[identity]]
name = "node-001"
kind = "agent"
node = "node-001"
secret_file = "{tmp}/key-node-001"

[[identity]]
name = "agents"
kind = "agent"
node = "*"
secret_file = "{tmp}/key-agents"

[[identity]]
name = "analyze"
kind = "analytics"
secret_file = "{tmp}/key-analyze"

[[identity]]
name = "alice"
kind = "operator"
secret_file = "{tmp}/key-alice"
"""


class Engine:
    """``gpuwarden remediate serve`` with signatures required, in dry run."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        (tmp / "token").write_text(TOKEN + "\n")
        for name in ("node-001", "agents", "analyze", "alice"):
            (tmp / f"key-{name}").write_text(f"the-key-of-{name}\n")
        (tmp / "wrong").write_text("not-the-key\n")
        self.fake = FakeKubernetes(token="k").start()
        for i in range(4):
            self.fake.add_node(f"node-{i:03d}")
        (tmp / "k8s").write_text("k")
        self.config = tmp / "remediation.toml"
        self.config.write_text(
            f'[engine]\nlisten = "127.0.0.1:{self.port}"\ntoken_file = "{tmp}/token"\n'
            f'audit_log = "{tmp}/audit.jsonl"\noperator_identity = "alice"\n'
            f'operator_secret_file = "{tmp}/key-alice"\n'
            'dry_run = true\nnode_adapter = "kubernetes"\ncheckpoint_adapter = "kubernetes"\n'
            f'[kubernetes]\napi_url = "{self.fake.url}"\ntoken_file = "{tmp}/k8s"\n'
            + IDENTITIES.format(tmp=tmp)
        )
        self.url = f"http://127.0.0.1:{self.port}/v1/findings"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(self.config),
             "serve"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        poll(lambda: remediate(["--config", str(self.config), "pending"]) == 0, 30, "the engine")

    def findings(self) -> list[dict]:
        return [r for r in read_records(self.tmp / "audit.jsonl") if r["event"] == "finding"]

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.fake.stop()
        return self.proc.stdout.read().decode() if self.proc.stdout else ""


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine(tmp_path)
    try:
        yield e
    finally:
        if e.proc.poll() is None:
            e.proc.kill()
            e.fake.stop()


def agent_once(
    tmp: Path, engine: Engine, key: str, identity: str = "node-001", node: str = "node-001"
) -> subprocess.CompletedProcess[str]:
    (tmp / "kmsg.log").write_text(XID79)
    config = tmp / f"agent-{identity.replace('/', '-')}-{key}.toml"
    config.write_text(
        f'[agent]\ncluster = "c"\nnode = "{node}"\nsources = ["xid"]\n'
        f'kmsg = "{tmp}/kmsg.log"\nremediation_url = "{engine.url}"\n'
        f'remediation_identity = "{identity}"\n'
        f'remediation_hmac_secret_file = "{tmp}/{key}"\n[xid]\nlookback_s = 0.0\n'
    )
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "agent", "--config", str(config), "--once"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_agents_fast_path_signs(engine: Engine, tmp_path: Path) -> None:
    wrong = agent_once(tmp_path, engine, "wrong")
    assert wrong.returncode == 0, wrong.stderr
    assert "refused finding" in wrong.stderr and "HTTP 401" in wrong.stderr
    assert engine.findings() == []  # the engine acted on nothing unsigned
    done = agent_once(tmp_path, engine, "key-node-001")
    assert done.returncode == 0, done.stderr
    found = poll(engine.findings, 30, "the agent's finding in the audit")
    assert [(f["kind"], f["source"], f["subject"]["node"], f["via"]) for f in found] == [
        ("gpu_xid", "agent", "node-001", "http, signed by node-001")
    ]
    log = engine.stop()
    assert "refused POST /v1/findings: 401 signature does not match the request" in log


def test_an_agent_of_a_family_signs_with_its_derived_key(engine: Engine, tmp_path: Path) -> None:
    """``agents/node-003`` signs with the key ``remediate agent-key agents node-003`` prints;
    the master key itself, or node-002's key, is refused."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert remediate(["--config", str(engine.config), "agent-key", "agents", "node-003"]) == 0
    (tmp_path / "key-node-003").write_text(printed.getvalue())
    with contextlib.redirect_stdout(io.StringIO()) as other:
        remediate(["--config", str(engine.config), "agent-key", "agents", "node-002"])
    (tmp_path / "key-node-002").write_text(other.getvalue())
    for key in ("key-agents", "key-node-002"):
        refused = agent_once(tmp_path, engine, key, "agents/node-003", "node-003")
        assert "HTTP 401" in refused.stderr, refused.stderr
    assert engine.findings() == []
    done = agent_once(tmp_path, engine, "key-node-003", "agents/node-003", "node-003")
    assert done.returncode == 0, done.stderr
    found = poll(engine.findings, 30, "the agent's finding in the audit")
    assert [(f["subject"]["node"], f["via"]) for f in found] == [
        ("node-003", "http, signed by agents/node-003")
    ]
    engine.stop()


def test_the_analyze_service_signs(engine: Engine, tmp_path: Path, influxd: LocalInfluxd) -> None:
    influxd.create_database("signed")
    spec = load_spec("fleet-tour")
    end_ns = __import__("time").time_ns() - 60 * 10**9
    shift = end_ns - (spec.start_ns + spec.duration_s * 10**9)
    stream_scenario(spec, 1, influxd.url, "signed", tmp_path / "spool", shift_ns=shift)

    def analyze(secret: str) -> subprocess.CompletedProcess[str]:
        config = tmp_path / f"analytics-{secret}.toml"
        config.write_text(
            f'[influxdb]\nurl = "{influxd.url}"\ndatabase = "signed"\n'
            f"[analysis]\nwindow_s = {spec.duration_s + 120}\nwrite_back = false\n"
            f'[findings]\nurl = "{engine.url}"\nidentity = "analyze"\n'
            f'hmac_secret_file = "{tmp_path}/{secret}"\n'
        )
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", "analyze", "run", "--config", str(config),
             "--local"],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip

    wrong = analyze("wrong")
    assert wrong.returncode == 0, wrong.stderr
    assert "HTTP 401" in wrong.stderr and engine.findings() == []
    done = analyze("key-analyze")
    assert done.returncode == 0, done.stderr
    found = poll(engine.findings, 30, "the analyze service's findings in the audit")
    assert {f["source"] for f in found} == {"analytics"}
    assert "config_drift" in {f["kind"] for f in found}
    engine.stop()


def test_operator_commands_sign(engine: Engine) -> None:
    """``undo`` is a POST: signed as the operator identity (``operator_identity``), it is
    answered (409: gpuwarden did not take that node out); the same request with the bearer
    token alone is refused (401)."""
    import http.client

    assert remediate(["--config", str(engine.config), "undo", "node-002"]) == 1
    conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=10)
    conn.request("POST", "/v1/undo/node-002", b"", {"Authorization": f"Bearer {TOKEN}"})
    assert conn.getresponse().status == 401
    log = engine.stop()
    assert "refused POST /v1/undo/node-002: 409" in log
    assert "refused POST /v1/undo/node-002: 401 a bearer token alone reads /metrics" in log


def test_a_signature_is_spent_before_the_engine_acts(tmp_path) -> None:
    """The engine remembers a signature before it acts (issue 38): the same signed request,
    refused with 503 (the engine was shutting down), is a replay when sent again (409); the
    sender's retry, signed afresh (a nonce of its own), goes through."""
    import json

    from gpuwarden.core.signing import sign_request
    from gpuwarden.remediation.engine import EngineClosedError
    from gpuwarden.remediation.server import Endpoint
    from tests.remediation_util import risk

    class ClosingOnce:
        def __init__(self) -> None:
            self.calls = 0
            self.policies: list[object] = []

        def submit(self, finding, via="api"):
            self.calls += 1
            if self.calls == 1:
                raise EngineClosedError("closing")
            return type("D", (), {"verdict": "act", "why": ""})()

    engine = ClosingOnce()
    endpoint = Endpoint(engine, TOKEN, secret=b"s")  # type: ignore[arg-type]
    body = json.dumps(risk("node-001").to_json()).encode()

    def post(signed: dict[str, str]) -> int:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Length": str(len(body))}
        status, _ = endpoint.handle("POST", "/v1/findings", headers | signed, lambda n: body)
        return int(status)

    first = sign_request(b"s", "POST", "/v1/findings", body)
    assert post(first) == 503
    assert post(first) == 409  # the same signature again: spent
    assert post(sign_request(b"s", "POST", "/v1/findings", body)) == 202  # signed afresh
    assert engine.calls == 2
