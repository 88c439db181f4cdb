"""Issue 38: a lesser finding cannot take a critical one's id, and a 409 is "delivered" only
when the engine holds the same content.

The real ``gpuwarden remediate serve`` (bearer + HMAC, acting for real) drains through the
Kubernetes API fake; the poster is the agent's and the analyze service's
:class:`core.poster.FindingPoster`. Every finding is CONSTRUCTED."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.core.finding import Finding
from gpuwarden.core.poster import FindingPoster
from gpuwarden.core.retry import Backoff
from testbed.k8s import FakeKubernetes
from tests.security.names_engine import DRAIN_ON_XID, ServedEngine, xid_finding

BUCKET_NS = 300 * 10**9


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ServedEngine]:
    fake = FakeKubernetes(token="k").start()
    for i in range(4):
        fake.add_node(f"node-{i:03d}")
    (tmp_path / "k8s").write_text("k")
    served = ServedEngine(
        tmp_path,
        'node_adapter = "kubernetes"\ncheckpoint_adapter = "kubernetes"',
        f'[kubernetes]\napi_url = "{fake.url}"\ntoken_file = "{tmp_path}/k8s"\n'
        f"[guards]\nmax_nodes_out = 4\nmax_fraction_out = 1.0\n{DRAIN_ON_XID}",
    )
    try:
        assert served.ready(), served.output()
        yield served
    finally:
        served.stop()
        fake.stop()


def test_an_info_xid_posted_first_cannot_swallow_the_critical_one(engine: ServedEngine) -> None:
    """CONSTRUCTED: ``info`` gpu_xid findings for node-001 GPU 3 in this time bucket and the
    next, posted first; the real critical XID 79 is still received and acted on (drained)."""
    now = time.time_ns()
    next_bucket = (now // BUCKET_NS + 1) * BUCKET_NS  # at most 300 s ahead: within the skew
    for t in (now, next_bucket):
        assert engine.post("/v1/findings", xid_finding("node-001", "info", t))[0] == 202
    status, reply = engine.post("/v1/findings", xid_finding("node-001", "critical", now))
    assert status == 202, reply
    assert reply["results"][0]["verdict"] == "act"
    drained = engine.action_done(node="node-001", action="drain")
    assert drained["outcome"] == "ok", drained


def test_a_409_counts_as_delivered_only_for_the_same_content(
    engine: ServedEngine, tmp_path: Path
) -> None:
    """The engine's 409 says, per finding, whether it holds this very content; the poster
    counts a retry of the same finding as delivered, another finding under the same id not:
    a conflict, logged. Not a failure once the engine holds what this poster delivered under
    that id (2026-11-28: the XID both the NVML events and the kernel log report raised the
    cannot-reach-engine alert on every fatal XID; tests/security/test_fast_path_burst.py)."""
    now = time.time_ns()
    first = xid_finding("node-002", "critical", now)
    assert engine.post("/v1/findings", first)[0] == 202
    same = Finding.from_json(first)  # what a sender whose first try got through retries
    other = Finding.from_json(first | {"evidence": {"xid": 48}})  # one id, other content
    assert other.id == same.id and other.digest != same.digest
    poster = FindingPoster(
        f"http://127.0.0.1:{engine.port}/v1/findings",
        str(tmp_path / "token"),
        secret_file=str(tmp_path / "secret"),
        retry=Backoff(base_s=0.05, max_s=0.2),
    )
    poster.post(same)
    poster.post(other)
    poster.close(timeout_s=60)
    assert (poster.posted, poster.failed, poster.conflicts) == (1, 0, 1)
    verdicts = [r["verdict"] for r in engine.records("decision") if r["finding_id"] == same.id]
    assert verdicts == ["act", "duplicate", "duplicate"]
    engine.action_done(node="node-002", action="drain")  # (it runs after the 202)
    acted = [r for r in engine.records("action") if r.get("node") == "node-002"]
    assert [r["action"] for r in acted] == ["drain"]  # the first one, once
