"""Found in review (issue 38, "a malformed request gets a 4xx, never a dropped connection"):
JSON numbers Python parses as infinity, and JSON nested deeper than the parser recurses,
raised OverflowError and RecursionError past every handler, so the engine dropped the
connection with no answer; and a sender's own ``bucket_s`` could claim the id a later window
of the usual one will have. Against the real ``gpuwarden remediate serve``; CONSTRUCTED
bodies."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gpuwarden.core.finding import Finding, FindingError, Severity
from tests.security.identity_engine import IdentityEngine


def xid(node: str = "node-001") -> dict[str, object]:
    return Finding(kind="gpu_xid", subject={"cluster": "c", "node": node, "gpu": "0"},
                   severity=Severity.CRITICAL, time_ns=time.time_ns(), evidence={"xid": 79},
                   source="agent").to_json()  # fmt: skip


def post_raw(engine: IdentityEngine, body: bytes) -> tuple[int, dict[str, Any]]:
    """``body`` as node-001's agent signs it (a valid signature: only the body is hostile)."""
    return engine.send("POST", "/v1/findings", body,
                       engine.signed("node-001", "POST", "/v1/findings", body))  # fmt: skip


@pytest.mark.parametrize("field", ["time_ns", "bucket_s"])
def test_an_infinite_number_is_a_4xx(engine: IdentityEngine, field: str) -> None:
    finding = xid()
    finding.pop("id")
    text = json.dumps(finding).replace(f'"{field}": {finding[field]}', f'"{field}": Infinity')
    body = text.encode()
    status, reply = post_raw(engine, body)
    assert status == 422 and "not a finding" in reply["error"], (status, reply)


def test_json_nested_too_deep_is_a_4xx(engine: IdentityEngine) -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    status, reply = post_raw(engine, body)
    assert status == 400 and "not JSON" in reply["error"], (status, reply)


def test_a_bucket_of_its_own_cannot_claim_another_windows_id() -> None:
    """With ``bucket_s`` 299 a sender reached the id the usual 300 s bucket gives a window
    about 68 days later; the id now covers the bucket's width, and widths are bounded."""
    t300 = 1_800_000_000 * 1_000_000_000
    bucket = t300 // (300 * 1_000_000_000)
    t299 = bucket * 299 * 1_000_000_000  # the same bucket number with 299 s buckets
    common = {"kind": "gpu_xid", "subject": {"node": "n1", "gpu": "0"},
              "severity": Severity.CRITICAL}  # fmt: skip
    real = Finding(time_ns=t300, bucket_s=300, **common)  # type: ignore[arg-type]
    claim = Finding(time_ns=t299, bucket_s=299, **common)  # type: ignore[arg-type]
    assert real.id != claim.id
    with pytest.raises(FindingError, match="bucket_s"):
        Finding(time_ns=t300, bucket_s=10**9, **common)  # type: ignore[arg-type]
