"""How the sink treats each answer a server can give (driven by a scripted loopback server)."""

from __future__ import annotations

import base64
import time

import pytest

from gpuwarden.core.errors import SinkError
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.store.transport import Outcome, classify, parse_retry_after
from testbed.influxd import free_port
from tests.remediation_util import poll
from tests.scripted_server import Reply, ScriptedServer


def _lines(n, start=0):
    return [f"m,t=a v={i}i {i}" for i in range(start, start + n)]


def _sink(url, tmp_path, **kw):
    cfg = dict(
        url=url,
        database="db",
        spool_dir=str(tmp_path / "spool"),
        flush_interval_s=0.05,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        park_interval_s=0.2,
    )
    cfg.update(kw)
    return InfluxSink(SinkConfig(**cfg))


def test_429_waits_for_retry_after_then_delivers(tmp_path):
    with ScriptedServer([Reply(429, '{"error":"slow down"}', {"Retry-After": "1"})]) as srv:
        sink = _sink(srv.url, tmp_path)
        sink.write_lines(_lines(10))
        assert sink.flush(timeout_s=10)
        sink.close()
    (t0, *_), (t1, *_) = srv.requests
    assert t1 - t0 >= 0.95  # Retry-After honoured (not the 10-50 ms backoff)
    assert srv.bodies()[0] == srv.bodies()[1]
    assert sink.stats().points_written == 10 and sink.stats().retries == 1


def test_5xx_retried_with_backoff_until_accepted(tmp_path):
    replies = [Reply(500, "boom"), Reply(502), Reply(503, "", {"Retry-After": "0"})]
    with ScriptedServer(replies) as srv:
        sink = _sink(srv.url, tmp_path)
        sink.write_lines(_lines(7))
        assert sink.flush(timeout_s=10)
        sink.close()
    assert len(srv.requests) == 4
    assert sink.stats().retries == 3 and sink.stats().points_written == 7


def test_partial_write_keeps_good_lines_and_reports_bad(tmp_path):
    msg = (
        '{"error":"partial write: unable to parse \'m,t= v=1\': missing tag value\\n'
        "unable to parse 'm v=x': invalid boolean dropped=1\"}"
    )
    with ScriptedServer([Reply(400, msg)]) as srv:
        sink = _sink(srv.url, tmp_path)
        sink.write_lines(_lines(10))
        assert sink.flush(timeout_s=10)
        sink.close()
    assert len(srv.requests) == 1  # a 400 is never retried
    stats = sink.stats()
    assert (stats.points_written, stats.points_rejected) == (7, 3)
    assert "missing tag value" in stats.last_error


def test_auth_error_parks_without_dropping(tmp_path):
    replies = [Reply(401, '{"error":"authorization failed"}')] * 2
    with ScriptedServer(replies) as srv:
        sink = _sink(srv.url, tmp_path, username="u", password="p")
        sink.write_lines(_lines(5))
        assert sink.flush(timeout_s=10)
        sink.close()
    assert len(srv.requests) == 3
    gaps = [b[0] - a[0] for a, b in zip(srv.requests, srv.requests[1:], strict=False)]
    assert min(gaps) >= 0.19  # parked for park_interval_s, not hammered
    assert srv.requests[0][2]["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
    assert sink.stats().points_written == 5 and sink.stats().points_rejected == 0


def test_token_auth_and_query_parameters(tmp_path):
    with ScriptedServer([]) as srv:
        sink = _sink(srv.url, tmp_path, token="s3cret", retention_policy="week", precision="s")
        sink.write_lines(["m v=1i 1"])
        assert sink.flush(timeout_s=10)
        sink.close()
    _, path, headers, _ = srv.requests[0]
    assert path == "/write?db=db&precision=s&rp=week"
    assert headers["Authorization"] == "Token s3cret"


def test_connection_refused_spools_then_drains_in_order(tmp_path):
    port = free_port()  # nothing listens here yet
    sink = _sink(f"http://127.0.0.1:{port}", tmp_path, batch_size=5)
    sink.write_lines(_lines(12))
    # waited for, not slept for: the sender has tried and spooled all twelve
    poll(lambda: sink.stats().spool_points == 12 and sink.stats().retries >= 1, 10,
         "the failed try to spool the twelve points")  # fmt: skip
    sink.write_lines(_lines(3, start=12))
    with ScriptedServer([], port=port) as srv:
        assert sink.flush(timeout_s=20)
        sink.close()
    sent = b"\n".join(srv.bodies()).decode().splitlines()
    assert sent == _lines(15)  # all of it, in the order written
    assert all(len(b.splitlines()) <= 5 for b in srv.bodies())  # batched by size


def test_batches_by_age_when_below_size(tmp_path):
    with ScriptedServer([]) as srv:
        sink = _sink(srv.url, tmp_path, batch_size=1000, flush_interval_s=0.3)
        written = time.monotonic()
        sink.write_lines(_lines(3))
        deadline = time.monotonic() + 5
        while not srv.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(srv.requests) == 1
        # neither full nor old before 0.3 s: sent when old (the server's clock, so a slow
        # machine can only make it later; a check after a 0.1 s sleep raced a stall)
        assert srv.requests[0][0] - written >= 0.3
        sink.close()


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (204, Outcome.OK),
        (429, Outcome.RETRY),
        (500, Outcome.RETRY),
        (503, Outcome.RETRY),
        (400, Outcome.REJECTED),
        (401, Outcome.PARK),
        (403, Outcome.PARK),
        (404, Outcome.PARK),
        (413, Outcome.PARK),
        (422, Outcome.REJECTED),
    ],
)
def test_classification(status, outcome):
    assert classify(status, "", 10).outcome is outcome


def test_v2_partial_write_message_counts_lines():
    msg = '{"code":"invalid","message":"partial write error (2 written): line 3: bad; line 5: bad"}'
    result = classify(400, msg, 4)
    assert result.outcome is Outcome.PARTIAL and result.rejected_points == 2


def test_retry_after_http_date():
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10)
    assert parse_retry_after("soon") is None


def test_config_is_validated_at_construction(tmp_path):
    with pytest.raises(SinkError):
        SinkConfig(api="v3")  # type: ignore[arg-type]
    with pytest.raises(SinkError):
        SinkConfig(api="v2")
    with pytest.raises(SinkError, match="unknown"):
        SinkConfig.from_mapping({"urll": "x"})


def test_backpressure_holds_the_writer_while_the_server_refuses(tmp_path):
    """With backpressure on (replays), a writer that outruns the server waits instead of
    filling the spool; it resumes when the server answers, and nothing is lost."""
    import threading

    replies = [Reply(503, "", {"Retry-After": "1"})] * 2
    with ScriptedServer(replies) as srv:
        sink = _sink(srv.url, tmp_path, batch_size=100, backpressure_bytes=4000)
        written = []

        def writer():
            for k in range(20):
                sink.write_lines(_lines(100, start=100 * k))
                written.append(k)

        t = threading.Thread(target=writer)
        t.start()
        time.sleep(0.3)  # the server is still answering 503: the writer must be held
        held_at = len(written)
        assert held_at < 20
        assert sink.stats().spool_bytes < 4000 + 2 * len("\n".join(_lines(100, 1900)))
        t.join(30)
        assert not t.is_alive()
        assert sink.flush(timeout_s=10)
        sink.close()
    got = sorted(
        int(line.split(" ")[-1]) for body in srv.bodies()[2:] for line in body.decode().split("\n")
    )
    assert got == list(range(2000))
    assert sink.stats().points_dropped == 0


def test_backpressure_bound_must_fit_under_the_spool_bound(tmp_path):
    with pytest.raises(SinkError, match="backpressure_bytes"):
        _sink("http://127.0.0.1:1", tmp_path, spool_max_bytes=10_000, backpressure_bytes=20_000)
