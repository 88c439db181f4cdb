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


def test_lines_pushed_out_of_a_full_queue_while_a_batch_is_in_flight_are_not_newer_ones() -> None:
    """Found by the review of the above (2026-11-28): a full queue drops its oldest lines,
    which may be the batch being sent; once it was sent, as many lines were taken off the
    queue as the batch held: newer lines, never sent, and close() said all was sent."""
    import re
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[int] = []
    first, release = threading.Event(), threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            if not first.is_set():
                first.set()
                release.wait(30)
            got.extend(int(m) for m in re.findall(r"step_index=(\d+)i", body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rep = Reporter("j1", 0, url=f"http://127.0.0.1:{server.server_address[1]}",
                       max_queue=10, heartbeat_s=0)  # fmt: skip
        _queue_steps(rep, 10)  # one batch of steps 0..9
        assert first.wait(30), "the batch in flight"
        for i in range(10, 15):  # the queue is full: 0..4 (in flight) leave it
            rep.step(i, 1.0, tokens=1, samples=1)
        release.set()
        assert rep.close(timeout_s=30)
    finally:
        server.shutdown()
    assert sorted(got) == list(range(15)) and (rep.sent, rep.dropped) == (15, 0)
