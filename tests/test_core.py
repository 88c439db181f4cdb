"""The shared floor (core/): the retry policy every sender uses, the findings poster (retried
and signed), time parsing, the v2 write path's missing-library error, and the error tree."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from gpuwarden.core.errors import (
    ConfigError,
    GpuwardenError,
    LineProtocolError,
    SinkError,
    SpoolError,
    StoreError,
)
from gpuwarden.core.poster import FindingPoster
from gpuwarden.core.retry import Backoff
from gpuwarden.core.signing import IDENTITY_HEADER, SIGNATURE_HEADER, verify_request
from gpuwarden.core.timeparse import duration_arg, parse_duration_s, parse_iso, parse_when
from tests.remediation_util import risk
from tests.scripted_server import Reply, ScriptedServer

# -- the retry policy ---------------------------------------------------------------------------


def test_backoff_doubles_to_its_bound_with_full_jitter() -> None:
    b = Backoff(base_s=0.5, max_s=4.0)
    assert [b.bound(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    rng = random.Random(7)
    waits = [b.delay(3, rng=rng) for _ in range(2000)]
    assert 0.0 <= min(waits) < 0.1 and 1.9 < max(waits) <= 2.0  # uniform over [0, 2]
    steady = Backoff(base_s=0.5, max_s=30.0, jitter=False)
    assert [steady.delay(n) for n in (1, 2, 7, 8)] == [0.5, 1.0, 30.0, 30.0]


def test_backoff_honours_retry_after_up_to_its_cap() -> None:
    b = Backoff(retry_after_max_s=60.0)
    assert b.delay(1, retry_after_s=12.5) == 12.5
    assert b.delay(1, retry_after_s=86_400.0) == 60.0  # a receiver cannot park us for a day
    assert b.delay(1, retry_after_s=-5.0) == 0.0


def test_backoff_counts_tries() -> None:
    assert not Backoff(attempts=0).exhausted(10_000)  # no limit: the sink spools instead
    assert [Backoff(attempts=3).exhausted(n) for n in (1, 2, 3)] == [False, False, True]


def test_the_urllib3_retry_keeps_the_policy() -> None:
    class Answer:  # what urllib3's Retry reads of a response
        def __init__(self, retry_after: str) -> None:
            self.headers = {"Retry-After": retry_after}

    r = Backoff(base_s=0.5, max_s=8.0, attempts=4, retry_after_max_s=60).urllib3_retry()
    assert r.total == 3 and r.allowed_methods is None  # POST is retried too
    assert r.status_forcelist == {429, 500, 502, 503, 504}
    assert r.get_retry_after(Answer("3600")) == 60  # capped
    assert r.get_retry_after(Answer("7")) == 7
    assert r.new(total=2).get_retry_after(Answer("3600")) == 60  # and stays capped per try


# -- the findings poster ------------------------------------------------------------------------

FAST = Backoff(base_s=0.01, max_s=0.05)


def test_the_poster_retries_server_failures_then_delivers() -> None:
    with ScriptedServer([Reply(503), Reply(500)], default=Reply(202)) as srv:
        poster = FindingPoster(f"{srv.url}/v1/findings", retry=FAST)
        poster.post(risk("gpu01"))
        poster.close(timeout_s=30)
        assert (poster.posted, poster.failed, poster.retries) == (1, 0, 2)
        assert len(srv.requests) == 3
        assert json.loads(srv.bodies()[-1])["subject"]["node"] == "gpu01"


def test_the_poster_waits_out_an_engine_that_is_down() -> None:
    """Findings posted while nothing listens are delivered, in order, once the engine is up:
    an engine restart loses none of the fast path's findings."""
    from testbed.influxd import free_port
    from tests.remediation_util import poll

    port = free_port()
    poster = FindingPoster(f"http://127.0.0.1:{port}/v1/findings", retry=FAST)
    for node in ("gpu01", "gpu02"):
        poster.post(risk(node))
    poll(lambda: poster.retries >= 3, 30, "failed tries while the engine is down")
    with ScriptedServer([], default=Reply(202), port=port) as srv:
        poll(lambda: poster.posted == 2, 30, "delivery once the engine is up")
        poster.close(timeout_s=30)
        assert [json.loads(b)["subject"]["node"] for b in srv.bodies()] == ["gpu01", "gpu02"]
    assert poster.failed == 0


def test_the_poster_gives_up_on_refusals_age_and_close() -> None:
    result = {"finding_id": "x", "verdict": "duplicate", "same_content": True}
    same = json.dumps({"error": "dup", "results": [result]})
    with ScriptedServer([Reply(400), Reply(409, same), Reply(409)]) as srv:
        poster = FindingPoster(srv.url, retry=FAST)
        poster.post(risk("gpu01"))  # 400: refused for good, not retried
        poster.post(risk("gpu02"))  # 409, same content: the engine has it already
        poster.post(risk("gpu03"))  # 409 that does not say so: not delivered (a conflict)
        poster.close(timeout_s=30)
        assert (poster.posted, poster.failed, len(srv.requests)) == (1, 2, 3)
        assert poster.conflicts == 1
    with ScriptedServer([], default=Reply(503)) as srv:
        old = risk("gpu01", t_ns=time.time_ns() - 7200 * 10**9)  # older than max_age_s
        poster = FindingPoster(srv.url, retry=FAST, max_age_s=3600)
        poster.post(old)
        poster.close(timeout_s=30)
        assert (poster.posted, poster.failed, len(srv.requests)) == (0, 1, 1)
    poster = FindingPoster("http://127.0.0.1:9/v1/findings", retry=FAST)  # nobody listens
    poster.post(risk("gpu01"))
    poster.close(timeout_s=0.5)  # still failing at close: given up (it went to InfluxDB too)
    assert (poster.posted, poster.failed) == (0, 1)


def test_the_poster_signs_and_authenticates(tmp_path: Path) -> None:
    """The request signature covers method, path, query, identity and body; each try is
    signed afresh (a nonce of its own)."""
    (tmp_path / "token").write_text("t0ken\n")
    (tmp_path / "secret").write_bytes(b"s3cret\n")
    with ScriptedServer([], default=Reply(202)) as srv:
        poster = FindingPoster(
            srv.url + "/v1/findings?x=1",
            str(tmp_path / "token"),
            secret_file=str(tmp_path / "secret"),
            identity="node-001",
            retry=FAST,
        )
        poster.post(risk("gpu01"))
        poster.close(timeout_s=30)
        _, _, headers, body = srv.requests[0]
    assert headers["Authorization"] == "Bearer t0ken"
    assert headers[IDENTITY_HEADER] == "node-001"
    signature = headers[SIGNATURE_HEADER]
    target = "/v1/findings?x=1"
    assert verify_request(b"s3cret", signature, "POST", target, body, "node-001") > 0
    for wrong in [
        (b"other", "POST", target, body, "node-001"),
        (b"s3cret", "PUT", target, body, "node-001"),
        (b"s3cret", "POST", "/v1/undo/gpu01", body, "node-001"),
        (b"s3cret", "POST", "/v1/findings?x=2", body, "node-001"),
        (b"s3cret", "POST", target, body + b" ", "node-001"),
        (b"s3cret", "POST", target, body, "node-002"),
    ]:
        with pytest.raises(ValueError, match="does not match"):
            verify_request(wrong[0], signature, *wrong[1:])


# -- time ---------------------------------------------------------------------------------------


def test_times_parse_as_operators_type_them() -> None:
    assert parse_when("2026-11-01T00:00:00Z") == 1_793_491_200 * 10**9  # date -u -d ... +%s
    assert parse_when("2026-11-01T00:00:00") == parse_when("2026-11-01T01:00:00+01:00")
    assert abs(parse_when("now") - time.time_ns()) < 60 * 10**9
    assert parse_iso("2026-11-01T00:00:00").utcoffset() is not None  # naive means UTC
    with pytest.raises(ValueError):
        parse_when("yesterday")


def test_durations_parse_with_or_without_a_unit() -> None:
    assert [parse_duration_s(t) for t in ("60", "60s", "5m", "1.5h", "1d")] == [
        60.0,
        60.0,
        300.0,
        5400.0,
        86400.0,
    ]
    with pytest.raises(ValueError, match="not a duration: '5 minutes'"):
        parse_duration_s("5 minutes")
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=r"e\.g\. 60s, 5m"):
        duration_arg("soon")


# -- errors -------------------------------------------------------------------------------------


def test_v2_without_influxdb_client_is_a_clear_configuration_error(monkeypatch) -> None:
    import importlib.util

    from gpuwarden.core.store import transport

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "influxdb_client" else real(name, *a),
    )
    with pytest.raises(SinkError, match=r"gpuwarden\[v2\]"):
        transport.V2Transport("http://127.0.0.1:8086", org="o", bucket="b")


def test_one_error_tree() -> None:
    from gpuwarden.analytics.errors import AnalyticsError
    from gpuwarden.analytics.mfu import UnknownGpuError
    from gpuwarden.collector.errors import CollectorError
    from gpuwarden.collector.sources.base import SourceError
    from gpuwarden.core.finding import FindingError
    from gpuwarden.core.store.reader import QueryError
    from gpuwarden.core.store.trace import TraceError
    from gpuwarden.dashboards.errors import DashboardError
    from gpuwarden.remediation.engine import EngineClosedError
    from gpuwarden.remediation.errors import RemediationError
    from gpuwarden.remediation.model import AdapterError
    from gpuwarden.remediation.policy import PolicyError
    from gpuwarden.simulation.errors import SimulationError
    from gpuwarden.simulation.spec import ScenarioError
    from testbed.errors import InfluxdError, TestbedError
    from testbed.slurm import SlurmError

    for root in (
        ConfigError,
        StoreError,
        CollectorError,
        AnalyticsError,
        RemediationError,
        DashboardError,
        SimulationError,
        TestbedError,
        FindingError,
    ):
        assert issubclass(root, GpuwardenError), root
    for err, parent in (
        (LineProtocolError, StoreError),
        (SinkError, StoreError),
        (SpoolError, StoreError),
        (TraceError, StoreError),
        (QueryError, StoreError),
        (SourceError, CollectorError),
        (UnknownGpuError, AnalyticsError),
        (AdapterError, RemediationError),
        (PolicyError, RemediationError),
        (EngineClosedError, RemediationError),
        (ScenarioError, SimulationError),
        (InfluxdError, TestbedError),
        (SlurmError, TestbedError),
    ):
        assert issubclass(err, parent), (err, parent)
    # the builtins callers caught before still catch them
    assert issubclass(LineProtocolError, ValueError) and issubclass(PolicyError, ValueError)
    assert issubclass(AdapterError, RuntimeError) and issubclass(QueryError, RuntimeError)
