"""Issue 38, an accepted signature is remembered before anything is acted on, for its whole
validity window, across restarts. Before, it was remembered only after a successful answer
and forgotten on restart: a captured ``undo`` that had been refused (409) uncordoned the node
once gpuwarden had taken it out, and one captured before a restart did so again after it.

Against the real ``gpuwarden remediate serve`` (LIVE, Kubernetes fake). CONSTRUCTED findings."""

from __future__ import annotations

import json

from gpuwarden.core.signing import SIGNATURE_HEADER
from tests.remediation_util import poll
from tests.security.identity_engine import IdentityEngine


def test_a_refused_request_replayed_later_is_a_replay(engine: IdentityEngine) -> None:
    body = json.dumps({"force": False}).encode()
    captured = engine.signed("alice", "POST", "/v1/undo/node-002", body)
    status, reply = engine.send("POST", "/v1/undo/node-002", body, captured)
    assert status == 409, reply  # not taken out (yet)
    engine.drained_by_its_agent("node-002")
    status, reply = engine.send("POST", "/v1/undo/node-002", body, captured)  # the replay
    engine.settle()
    assert engine.cordoned("node-002"), "the replayed undo uncordoned node-002"
    assert status == 409 and "replayed request" in reply["error"]


def test_a_signature_is_remembered_across_a_restart(engine: IdentityEngine) -> None:
    engine.drained_by_its_agent("node-002")
    body = json.dumps({"force": True}).encode()
    captured = engine.signed("alice", "POST", "/v1/undo/node-002", body)
    status, reply = engine.send("POST", "/v1/undo/node-002", body, captured)
    assert status == 202, reply
    poll(lambda: not engine.cordoned("node-002"), 60, "node-002 back in service")
    engine.drained_by_its_agent("node-002", gpu="5")  # it fails again
    engine.stop()
    engine.start()
    status, reply = engine.send("POST", "/v1/undo/node-002", body, captured)  # the replay
    engine.settle()
    assert engine.cordoned("node-002"), "the undo replayed after a restart uncordoned node-002"
    assert status == 409 and "replayed request" in reply["error"]


def test_a_padded_signature_is_no_new_signature(engine: IdentityEngine) -> None:
    """Found in review: the replay memory keyed on the header's text after ``v2=``, while the
    check parsed the fields, so ``,x=1`` after a captured header verified and was 'new' each
    time. A header must now be exactly what the signer writes."""
    engine.drained_by_its_agent("node-002")
    body = json.dumps({"force": True}).encode()
    captured = engine.signed("alice", "POST", "/v1/undo/node-002", body)
    status, _ = engine.send("POST", "/v1/undo/node-002", body, captured)
    assert status == 202
    poll(lambda: not engine.cordoned("node-002"), 60, "node-002 back in service")
    engine.drained_by_its_agent("node-002", gpu="5")  # it fails again
    for pad in (",x=1", ",x=2", ","):
        padded = {**captured}
        padded[SIGNATURE_HEADER] = captured[SIGNATURE_HEADER] + pad
        status, reply = engine.send("POST", "/v1/undo/node-002", body, padded)
        assert status == 401 and "malformed" in reply["error"], (pad, status, reply)
    engine.settle()
    assert engine.cordoned("node-002"), "a padded replay uncordoned node-002"
