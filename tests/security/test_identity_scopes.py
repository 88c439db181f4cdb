"""Issue 38, identities: one compromised node's credential cannot approve plans, ``undo
--force`` another node, nor report another node; the audit names who signed, never a header.

Against the real ``gpuwarden remediate serve`` (LIVE, Kubernetes fake; see identity_engine).
Before identities every sender held the one shared token and secret: each of these went
through. Every finding is CONSTRUCTED."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.remediation_util import poll
from tests.security.identity_engine import IdentityEngine, xid


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[IdentityEngine]:
    e = IdentityEngine(tmp_path, 'approval = ["drain"]')
    try:
        yield e
    finally:
        e.close()


def waiting_plan(engine: IdentityEngine, node: str) -> str:
    status, reply = engine.post(node, "/v1/findings", xid(node))
    assert status == 202 and reply["results"][0]["verdict"] == "approval", reply
    return str(reply["results"][0]["finding_id"])


def test_an_agent_cannot_approve_a_plan(engine: IdentityEngine) -> None:
    plan = waiting_plan(engine, "node-002")
    status, reply = engine.post("node-001", f"/v1/approve/{plan}", {})
    engine.settle()
    assert not engine.cordoned("node-002"), "node-001's agent approved node-002's drain"
    assert status == 403 and "may not approve plans" in reply["error"]
    assert engine.records("approval") == []


def test_an_agent_cannot_undo_force_another_node(engine: IdentityEngine) -> None:
    """node-003 was cordoned by an administrator (not by gpuwarden): ``undo --force`` from
    node-001's agent must not put it back."""
    engine.fake.nodes["node-003"]["spec"]["unschedulable"] = True
    status, reply = engine.post("node-001", "/v1/undo/node-003", {"force": True})
    engine.settle()
    assert engine.cordoned("node-003"), "node-001's agent uncordoned node-003"
    assert status == 403 and "may not undo" in reply["error"]


def test_an_agent_speaks_for_its_own_node_only(engine: IdentityEngine) -> None:
    bad = xid("node-002")
    status, reply = engine.post("node-001", "/v1/findings", bad)
    engine.settle()
    assert not engine.records("approval") and engine.fake.nodes["node-002"]["spec"] == {}
    assert [r for r in engine.records("finding") if r["subject"]["node"] == "node-002"] == []
    assert status == 403 and "speaks for node node-001 only, not node-002" in reply["error"]
    assert waiting_plan(engine, "node-001")  # its own node: taken, and waits for approval


def test_the_audit_names_who_signed_not_a_header(engine: IdentityEngine) -> None:
    plan = waiting_plan(engine, "node-002")
    body = b"{}"
    headers = engine.signed("alice", "POST", f"/v1/approve/{plan}", body)
    status, reply = engine.send(
        "POST", f"/v1/approve/{plan}", body, headers | {"X-Gpuwarden-User": "mallory"}
    )
    assert status == 202, reply
    poll(lambda: engine.cordoned("node-002"), 60, "node-002 drained once approved")
    assert [r["by"] for r in engine.records("approval")] == ["alice"]
