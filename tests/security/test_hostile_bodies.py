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

from gpuwarden.core.finding import MAX_EVIDENCE_DEPTH, Finding, FindingError, Severity
from tests.security.identity_engine import IdentityEngine, healthy
from tests.security.identity_engine import xid as xid_of


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


# -- found in review, 2026-11-28: numbers and depth that passed the parser --------------------


def test_a_huge_integer_in_evidence_cannot_stop_the_engine(engine: IdentityEngine) -> None:
    """A node's own agent drained its node, then said it is healthy with ``checked_ns`` =
    10**400 (valid JSON, an int to Python): the request's connection was dropped, the record
    journaled, and the next tick raised OverflowError (``checked / 1e9``) and ended the engine,
    at every start after too. Now refused at the door (422), and the engine goes on."""
    engine.drained_by_its_agent("node-001")
    bad = {**healthy("node-001"), "evidence": {"check": "pass", "checked_ns": 10**400}}
    status, reply = engine.post("node-001", "/v1/findings", bad)
    assert status == 422 and "64 bits" in reply["error"], (status, reply)
    engine.settle()  # a tick later, it still answers and acts
    assert engine.proc is not None and engine.proc.poll() is None, engine.output()
    engine.stop()
    engine.start()  # and it starts again on its journal
    status, _ = engine.post("node-002", "/v1/findings", xid_of("node-002"))
    assert status == 202


@pytest.mark.parametrize(
    ("field", "value"),
    [("time_ns", 10**400), ("time_ns", -(2**64)), ("evidence", 10**30)],
    ids=["time_ns-huge", "time_ns-hugely-negative", "evidence-huge"],
)
def test_a_number_beyond_64_bits_is_a_4xx(engine: IdentityEngine, field: str, value: int) -> None:
    """``time_ns`` of 10**400 raised OverflowError in the freshness check (no answer)."""
    finding = xid()
    finding.pop("id")
    finding[field] = {"n": value} if field == "evidence" else value
    status, reply = post_raw(engine, json.dumps(finding).encode())
    assert status == 422 and "not a finding" in reply["error"], (status, reply)


def test_evidence_nested_past_the_bound_is_a_4xx_and_journals_nothing(
    engine: IdentityEngine,
) -> None:
    """Evidence 980 levels deep passed ``json.loads``, then broke the journal's ``json.dumps``
    (no answer) or, a level less, was journaled and broke its readers, which skipped the rest
    of the batch they read (other senders' records with it)."""
    finding = xid()
    finding.pop("id")
    deep: object = 1
    for _ in range(MAX_EVIDENCE_DEPTH + 1):
        deep = [deep]
    finding["evidence"] = {"xid": 79, "deep": deep}
    status, reply = post_raw(engine, json.dumps(finding).encode())
    assert status == 422 and "nested deeper" in reply["error"], (status, reply)
    assert not any("deep" in (r.get("evidence") or {}) for r in engine.records("finding"))
    ok: object = 1
    for _ in range(MAX_EVIDENCE_DEPTH - 2):  # within the bound: taken
        ok = [ok]
    finding["evidence"] = {"xid": 79, "deep": ok}
    status, reply = post_raw(engine, json.dumps(finding).encode())
    assert status == 202, reply


def test_a_content_length_of_unicode_digits_is_a_400_at_the_relay() -> None:
    """``"\\xb2"`` (superscript two, a latin-1 header byte) passed ``str.isdigit`` and then
    ``int()`` raised ValueError in the relay's handler: no answer."""
    import io
    from email.message import Message

    from gpuwarden.collector.relay import read_body

    for raw in ("\xb2", "\u0663", "1\xb9"):  # superscript two, Arabic-Indic three, 1 and ¹
        headers = Message()
        headers["Content-Length"] = raw
        body, status, why = read_body(headers, io.BytesIO(b"x"))
        assert (body, status) == (None, 400) and "not a number" in why, raw


def test_a_senders_text_reaches_slack_as_text_not_markup() -> None:
    """A summary with ``<!channel>`` paged the whole room and ``<url|label>`` showed a link
    under a label the sender chose; a subject value is the sender's too."""
    from gpuwarden.remediation.adapters.webhook import slack_body
    from gpuwarden.remediation.engine.decide import EngineSettings, action_for
    from gpuwarden.remediation.model import ActionKind

    summary = "<!channel> run <https://evil.example/fix.sh|docs.internal> & go"
    f = Finding(kind="gpu_xid", subject={"node": "gpu07", "gpu": "0"},
                severity=Severity.CRITICAL, time_ns=time.time_ns(), source="agent",
                summary=summary)  # fmt: skip
    body = slack_body(action_for(ActionKind.NOTIFY, f, EngineSettings()), time.time())
    text = body["text"]
    assert "<" not in text and ">" not in text
    assert "&lt;!channel&gt; run &lt;https://evil.example/fix.sh|docs.internal&gt; &amp; go" in text
