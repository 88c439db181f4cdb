"""Issue 38, evidence that returns a node to service comes from that node's own identity: a
forged ``node_healthy`` (a passing check run just now) for a node gpuwarden drained, sent by
another node's agent, the analyze service or an operator, must not uncordon it. Before, any
holder of the shared credential did.

Against the real ``gpuwarden remediate serve`` (LIVE, Kubernetes fake, ``return_requires =
"check"``). Every finding is CONSTRUCTED."""

from __future__ import annotations

import pytest

from tests.remediation_util import poll
from tests.security.identity_engine import IdentityEngine, healthy


@pytest.mark.parametrize("forger", ["node-001", "analyze", "alice"])
def test_a_forged_node_healthy_does_not_uncordon(engine: IdentityEngine, forger: str) -> None:
    engine.drained_by_its_agent("node-002")
    status, reply = engine.post(forger, "/v1/findings", healthy("node-002"))
    engine.settle()
    assert engine.cordoned("node-002"), f"{forger}'s node_healthy uncordoned node-002"
    assert status == 403 and "only the node's own agent may send it" in reply["error"]
    status, reply = engine.post("node-002", "/v1/findings", healthy("node-002"))  # its own
    assert status == 202, reply
    poll(lambda: not engine.cordoned("node-002"), 60, "node-002 back once its agent says so")
