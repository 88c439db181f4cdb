"""Issue 38, signatures cover method, path and query: an operator's signed ``POST
/v1/undo/node-001`` (refused: gpuwarden had not taken node-001 out) replayed on
``/v1/undo/node-002`` must not put node-002 back. Before, the HMAC covered timestamp and body
only, and a refused request was not remembered: the replay uncordoned node-002.

Against the real ``gpuwarden remediate serve`` (LIVE, Kubernetes fake). CONSTRUCTED findings."""

from __future__ import annotations

import json

from tests.security.identity_engine import IdentityEngine


def test_an_undo_signed_for_one_node_does_not_undo_another(engine: IdentityEngine) -> None:
    engine.drained_by_its_agent("node-002")
    body = json.dumps({"force": False}).encode()
    captured = engine.signed("alice", "POST", "/v1/undo/node-001", body)
    status, reply = engine.send("POST", "/v1/undo/node-001", body, captured)
    assert status == 409, reply  # node-001 was not taken out by gpuwarden
    status, reply = engine.send("POST", "/v1/undo/node-002", body, captured)  # the replay
    engine.settle()
    assert engine.cordoned("node-002"), "the replayed signature uncordoned node-002"
    assert status == 401 and "does not match the request" in reply["error"]
    query = engine.send("POST", "/v1/undo/node-001?node=node-002", body, captured)
    assert query[0] == 401  # the query is covered too
