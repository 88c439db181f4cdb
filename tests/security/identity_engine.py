"""A real ``gpuwarden remediate --config X serve`` with identities, LIVE (``dry_run = false``)
against the Kubernetes fake (nodes ``node-001`` to ``node-004``), for the identity tests of
issue 38: an operator ``alice``, the agents of ``node-001`` and ``node-002`` (each its own
key), the analyze service ``analyze`` and Grafana (``grafana``, alerts of the kind
``fabric_unregistered`` only, on its bearer token: ``alerts_unsigned = true``).

Each client holds what that sender holds in a deployment and nothing more. The code before
issue 38 knew no identities (``sign_request`` did not exist): there every sender held the one
shared token and secret, and the engine is configured so (``LEGACY``); the attacks are the same
requests, and the assertions the same, so each test shows what that code let through.

Every finding and alert these tests post is CONSTRUCTED."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuwarden.core import signing
from gpuwarden.remediation.audit import read_records
from testbed.influxd import free_port
from testbed.k8s import FakeKubernetes
from tests.remediation_util import poll

ROOT = Path(__file__).resolve().parent.parent.parent
#: the code before issue 38's identities: one token and one secret for every caller
LEGACY = not hasattr(signing, "sign_request")
TOKEN = "t0ken-for-tests"
SHARED = b"the-shared-secret"
IDENTITIES = {
    "alice": ('kind = "operator"', "key-of-alice"),
    "node-001": ('kind = "agent"\nnode = "node-001"', "key-of-node-001"),
    "node-002": ('kind = "agent"\nnode = "node-002"', "key-of-node-002"),
    "analyze": ('kind = "analytics"', "key-of-analyze"),
    "grafana": ('kind = "alerts"\nkinds = ["fabric_unregistered"]', "key-of-grafana"),
}
NODES = ("node-001", "node-002", "node-003", "node-004")


class IdentityEngine:
    """The engine as its own process; ``engine_keys`` and ``guard_keys`` are more ``[engine]``
    and ``[guards]`` settings."""

    def __init__(self, tmp: Path, engine_keys: str = "", guard_keys: str = "") -> None:
        self.tmp = tmp
        self.port = free_port()
        self.fake = FakeKubernetes(token="k").start()
        for node in NODES:
            self.fake.add_node(node)
        (tmp / "k8s").write_text("k")
        (tmp / "token").write_text(TOKEN + "\n")
        (tmp / "shared").write_text(SHARED.decode() + "\n")
        self.audit = tmp / "audit.jsonl"
        if LEGACY:
            who = f'hmac_secret_file = "{tmp}/shared"\n'
        else:
            tables = []
            for name, (scope, key) in IDENTITIES.items():
                (tmp / f"key-{name}").write_text(key + "\n")
                tables.append(
                    f'[[identity]]\nname = "{name}"\n{scope}\nsecret_file = "{tmp}/key-{name}"\n'
                )
            (tmp / "identities.toml").write_text("\n".join(tables))
            who = f'identities_file = "{tmp}/identities.toml"\n'
        self.config = tmp / "remediation.toml"
        self.config.write_text(
            f'[engine]\nlisten = "127.0.0.1:{self.port}"\ntoken_file = "{tmp}/token"\n{who}'
            f'audit_log = "{self.audit}"\ndry_run = false\nworkers = 1\n'
            'node_adapter = "kubernetes"\ncheckpoint_adapter = "kubernetes"\n'
            f"alerts_unsigned = true\ntick_s = 0.2\n{engine_keys}\n"
            "[guards]\nmax_nodes_out = 4\nmax_fraction_out = 1.0\ncooldown_s = 0.0\n"
            f"{guard_keys}\n"
            f'[kubernetes]\napi_url = "{self.fake.url}"\ntoken_file = "{tmp}/k8s"\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.log = (self.tmp / "engine.log").open("a")
        proc = self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(self.config),
             "serve"],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        poll(lambda: proc.poll() is not None or self._healthy(), 60, "the engine to start")
        assert proc.poll() is None, self.output()

    def _healthy(self) -> bool:
        try:
            return self.send("GET", "/healthz", b"", {})[0] == 200
        except OSError:
            return False

    # -- clients ------------------------------------------------------------------------------

    def signed(self, who: str, method: str, path: str, body: bytes) -> dict[str, str]:
        """The headers ``who`` signs ``method path`` with: its own key (or, before identities,
        the shared token and secret every sender held)."""
        if LEGACY:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            if method == "POST":
                headers[signing.SIGNATURE_HEADER] = signing.sign(SHARED, body)
            return headers
        return signing.sign_request(IDENTITIES[who][1].encode(), method, path, body, who)

    def send(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        data = json.loads(resp.read() or b"{}")
        conn.close()
        return resp.status, data

    def post(self, who: str, path: str, payload: Any) -> tuple[int, dict[str, Any]]:
        body = json.dumps(payload).encode()
        return self.send("POST", path, body, self.signed(who, "POST", path, body))

    def bearer(self, who: str) -> str:
        """What an alert source sends as its bearer token (before: the shared token)."""
        return TOKEN if LEGACY else IDENTITIES[who][1]

    # -- the world ----------------------------------------------------------------------------

    def cordoned(self, node: str) -> bool:
        return bool(self.fake.nodes[node]["spec"].get("unschedulable"))

    def records(self, event: str) -> list[dict[str, Any]]:
        return [r for r in read_records(self.audit) if r.get("event") == event]

    def drained_by_its_agent(self, node: str, gpu: str = "3") -> None:
        """``node``'s own agent reports a fatal XID; gpuwarden drains the node."""
        status, reply = self.post(node, "/v1/findings", xid(node, gpu))
        assert status == 202, reply
        poll(lambda: self.cordoned(node), 60, f"{node} drained")

    def settle(self) -> None:
        """Wait until every plan decided so far has run (one worker: plans run in order): a
        notification about node-004 from the operator is the last in line."""
        finding = {**xid("node-004"), "kind": "hung_task", "severity": "warning"}
        finding["summary"] = "settle marker (CONSTRUCTED)"
        status, reply = self.post("alice", "/v1/findings", finding)
        assert status == 202, reply
        fid = reply["results"][0]["finding_id"]
        poll(
            lambda: any(r.get("finding_id") == fid for r in self.records("action")),
            60,
            "the marker's notification",
        )

    def output(self) -> str:
        return (self.tmp / "engine.log").read_text()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def close(self) -> None:
        self.stop()
        self.fake.stop()


def xid(node: str, gpu: str = "3") -> dict[str, Any]:
    """A CONSTRUCTED critical gpu_xid (XID 79) about ``node``, as its agent posts it."""
    return {
        "kind": "gpu_xid",
        "subject": {"cluster": "c", "node": node, "gpu": gpu},
        "severity": "critical",
        "time_ns": time.time_ns(),
        "evidence": {"xid": 79},
        "confidence": 1.0,
        "summary": "XID 79: GPU has fallen off the bus (CONSTRUCTED)",
        "source": "agent",
    }


def healthy(node: str) -> dict[str, Any]:
    """A CONSTRUCTED node_healthy for ``node`` with a passing check run just now."""
    return {
        "kind": "node_healthy",
        "subject": {"cluster": "c", "node": node},
        "severity": "info",
        "time_ns": time.time_ns(),
        "evidence": {"check": "pass", "checked_ns": time.time_ns()},
        "confidence": 1.0,
        "summary": f"{node} passed its check (CONSTRUCTED)",
        "source": "agent",
    }
