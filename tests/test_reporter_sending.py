"""How the training-side reporter sends through its node's relay when the relay says "not so
much" or "not now". Found re-reading the relay's limits (2026-11-28): the reporter batched
5,000 lines whatever their size, and took any 4xx but 429 as final, so a backlog of a job with a
long Kubernetes name (over the relay's 1 MiB) or a batch over a lowered
``[agent] reporter_lines_per_s`` bucket (413) was dropped whole; and it retried a 429 at its
own pace (0.5 s, 1 s, 2 s ...), not after the relay's ``Retry-After``. The steps are
CONSTRUCTED; the relay is the agent's own, over real HTTP.
"""

from __future__ import annotations

from gpuwarden.collector.jobside.reporter import MAX_BATCH_BYTES, Reporter
from gpuwarden.collector.relay import MAX_BODY, ReporterRelay
from tests.test_relay import Lines

#: a pod name as Kubernetes allows it (a namespace of 63, a name of 253 characters)
LONG_JOB = f"{'n' * 63}/{'p' * 200}"


def _reporter(relay: ReporterRelay, job: str) -> Reporter:
    host, port = relay.address
    return Reporter(job, 0, url=f"http://{host}:{port}", flush_interval_s=0.01, heartbeat_s=0)


def _queue_steps(rep: Reporter, n: int) -> None:
    """Queue ``n`` steps before the sender thread takes any (a backlog, as after an outage):
    the sender waits for the reporter's lock, held here."""
    with rep._cond:
        for i in range(n):
            rep.step(i, 1.0, tokens=4096, samples=1)


def test_a_backlog_larger_than_the_relay_takes_is_sent_in_parts_not_dropped() -> None:
    assert MAX_BATCH_BYTES < MAX_BODY
    sink = Lines()
    relay = ReporterRelay("127.0.0.1:0", sink)
    relay.start()
    try:
        rep = _reporter(relay, LONG_JOB)
        _queue_steps(rep, 5000)  # about 1.6 MB of line protocol
        assert rep.flush(timeout_s=60), rep.last_error
        rep.close()
        assert (rep.dropped, relay.refused) == (0, 0), rep.last_error
        assert len(sink.lines) == 5000
    finally:
        relay.close()


def test_a_batch_over_the_jobs_bucket_is_halved_and_a_429_waits_for_retry_after() -> None:
    """50 lines a second: a bucket of 3,000. 3,100 queued lines: the first batch is over the
    bucket (413), half of it goes (1,450 left), the other half is over what is left (429,
    Retry-After 5), and goes once the bucket holds it, 5 s later: two refusals, none
    dropped. (Before: all 3,100 dropped on the 413; with the 413 passed, its own 0.5 s, 1 s,
    2 s ... backoff met a 429 three times before the bucket held the rest.)"""
    sink = Lines()
    relay = ReporterRelay("127.0.0.1:0", sink, lines_per_s=50)
    relay.start()
    try:
        rep = _reporter(relay, "j1")
        _queue_steps(rep, 3100)
        assert rep.flush(timeout_s=60), rep.last_error
        rep.close()
        assert rep.dropped == 0, rep.last_error
        assert len(sink.lines) == 3100
        assert relay.refused == 2, rep.last_error
    finally:
        relay.close()
