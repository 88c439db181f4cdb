"""Issue 38, an alert source creates only the kinds its identity allows: Grafana's bearer
token (``alerts_unsigned``) posting a critical ``gpu_xid`` alert must not drain a node.
Before, the one shared token created a finding of any kind and severity.

Against the real ``gpuwarden remediate serve`` (LIVE, Kubernetes fake). The alerts are
CONSTRUCTED in the shape of Grafana's webhook contact point."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.remediation_util import poll
from tests.security.identity_engine import IdentityEngine


def grafana(kind: str, node: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    alert = {
        "status": "firing",
        "labels": {"alertname": kind, "kind": kind, "severity": "critical", "node": node},
        "annotations": {"summary": f"{kind} on {node} (CONSTRUCTED)"},
        "startsAt": now,
        "fingerprint": f"fp-{kind}-{node}",
        "values": {},
    }
    return {"receiver": "gpuwarden", "status": "firing", "alerts": [alert]}


def post(engine: IdentityEngine, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = json.dumps(payload).encode()
    headers = {"Authorization": f"Bearer {engine.bearer('grafana')}"}
    return engine.send("POST", "/v1/alerts/grafana", body, headers)


def test_grafana_creates_only_the_kinds_it_may(engine: IdentityEngine) -> None:
    status, reply = post(engine, grafana("gpu_xid", "node-001"))
    engine.settle()
    assert not engine.cordoned("node-001"), "Grafana's token drained node-001 with a gpu_xid"
    assert status == 403 and "may send the kinds ['fabric_unregistered'] only" in reply["error"]
    assert [r for r in engine.records("finding") if r["kind"] == "gpu_xid"] == []
    status, reply = post(engine, grafana("fabric_unregistered", "node-003"))  # its own kind
    assert status == 202, reply
    poll(lambda: engine.cordoned("node-003"), 60, "node-003 cordoned on Grafana's alert")
