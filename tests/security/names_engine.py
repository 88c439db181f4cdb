"""A real ``gpuwarden remediate --config X serve`` for the names-are-data tests: bearer token and
HMAC signatures required (the legacy shared-secret mode: these tests are about names, not
identities; tests/security/identity_engine.py has those); findings are posted signed, over
loopback HTTP.

Every finding these tests post is CONSTRUCTED (hand-made subjects, some of them hostile)."""

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

from gpuwarden.core.signing import sign_request
from gpuwarden.remediation.audit import read_records
from testbed.influxd import free_port
from tests.remediation_util import poll

ROOT = Path(__file__).resolve().parent.parent.parent
TOKEN = "t0ken-for-tests"
SECRET = b"the-shared-secret"


class ServedEngine:
    """The engine as its own process; ``extra`` is TOML appended to a config that sets the
    endpoint, credentials, audit log and ``dry_run = false``, one worker (plans run in the
    order they were decided) and an ``[engine]`` section still open for more keys."""

    def __init__(self, tmp: Path, engine_keys: str = "", extra: str = "") -> None:
        self.tmp = tmp
        self.port = free_port()
        (tmp / "token").write_text(TOKEN + "\n")
        (tmp / "secret").write_text(SECRET.decode() + "\n")
        self.audit = tmp / "audit.jsonl"
        self.config = tmp / "remediation.toml"
        self.config.write_text(
            f'[engine]\nlisten = "127.0.0.1:{self.port}"\ntoken_file = "{tmp}/token"\n'
            f'hmac_secret_file = "{tmp}/secret"\naudit_log = "{self.audit}"\n'
            f"dry_run = false\nworkers = 1\n{engine_keys}\n{extra}\n"
        )
        self.log = (tmp / "engine.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(self.config),
             "serve"],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    def ready(self) -> bool:
        """Serving (True), or exited (False): waits for one or the other."""
        poll(lambda: self.proc.poll() is not None or self._healthy(), 60, "the engine to start")
        return self.proc.poll() is None

    def _healthy(self) -> bool:
        try:
            return self.request("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        data = json.loads(resp.read() or b"{}")
        conn.close()
        return resp.status, data

    def post(self, path: str, payload: Any) -> tuple[int, dict[str, Any]]:
        body = json.dumps(payload).encode()
        headers = {
            "Authorization": f"Bearer {TOKEN}",
            "Content-Type": "application/json",
            **sign_request(SECRET, "POST", path, body),
        }
        return self.request("POST", path, body, headers)

    def records(self, event: str) -> list[dict[str, Any]]:
        return [r for r in read_records(self.audit) if r.get("event") == event]

    def action_done(self, node: str = "", job: str = "", action: str = "") -> dict[str, Any]:
        """The first action record on ``node`` (or ``job``; of kind ``action`` if given), once
        one is written."""

        def found() -> dict[str, Any] | None:
            for r in self.records("action"):
                if action and r.get("action") != action:
                    continue
                if (node and r.get("node") == node) or (job and r.get("job") == job):
                    return r
            return None

        return poll(found, 120, f"an action on {node or job}")

    def output(self) -> str:
        return (self.tmp / "engine.log").read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def xid_finding(node: str, severity: str = "critical", t_ns: int | None = None) -> dict[str, Any]:
    """A CONSTRUCTED gpu_xid finding (XID 79) as the agent's fast path posts it."""
    return {
        "kind": "gpu_xid",
        "subject": {"cluster": "c", "node": node, "gpu": "3"},
        "severity": severity,
        "time_ns": time.time_ns() if t_ns is None else t_ns,
        "evidence": {"xid": 79},
        "confidence": 1.0,
        "summary": "XID 79: GPU has fallen off the bus (CONSTRUCTED)",
        "source": "agent",
    }


DRAIN_ON_XID = """
[[policy]]
name = "drain-on-xid"
kinds = ["gpu_xid"]
min_severity = "critical"
requires = ["node"]
actions = ["drain"]
"""
