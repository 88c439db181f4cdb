"""Issue 39, the sink's part: the sender never dies, the spool never desyncs, nothing is lost.

The full disk is real: a size-limited tmpfs this test mounts (root, as CI runs), filled to
ENOSPC by a filler file; the server is the real influxd of the session (stopped and started
again for an outage). Points are generated, numbered by a ``seq`` field and timestamp.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from gpuwarden.core.store.reader import InfluxReader
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.store.transport import Outcome, SendResult, Transport
from testbed.influxd import LocalInfluxd
from tests.full_disk import fill

BASE_NS = 1_700_000_000_000_000_000
SEQ = re.compile(rb"seq=(\d+)i")


class Delivered:
    """A :class:`Transport` that sends through the real one and keeps, in order, the ``seq``
    of every point the server acknowledged (what arrived, and how often)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.name = inner.name
        self.seqs: list[int] = []

    def send(self, body: bytes, points: int) -> SendResult:
        result = self.inner.send(body, points)
        if result.outcome is Outcome.OK:
            self.seqs += [int(m) for m in SEQ.findall(body)]
        return result

    def close(self) -> None:
        self.inner.close()


def lines(start: int, n: int) -> list[str]:
    """Generated points of about 1 KB each, so that a batch of 20 needs new pages on tmpfs
    (a short record could still fit in the last page of a 'full' disk)."""
    pad = "x" * 1000
    return [
        f'seq,writer=w seq={i}i,pad="{pad}" {BASE_NS + i * 1000}' for i in range(start, start + n)
    ]


def stored(influxd: LocalInfluxd, db: str) -> list[int]:
    df = InfluxReader(influxd.url, db).raw('SELECT "seq" FROM "seq"')
    return [int(v) for v in df.get_column("seq").to_list()] if df.height else []


def wait_until(what: object, timeout_s: float = 60.0) -> bool:
    """Polls ``what`` (a callable) until it holds; the timeout is only a hang guard."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


@pytest.mark.influxdb
@pytest.mark.slow
def test_a_full_disk_mid_outage_loses_nothing_and_sends_each_point_once_in_order(
    small_disk: Path, influxd: LocalInfluxd, influx_db: str
) -> None:
    """The server goes down, the spool's disk fills while batches keep coming, the server
    comes back while the disk is still full (the cursor cannot be saved), then space returns.
    Before: the append raised ENOSPC after a short write that the segment's size did not
    count, and the sender died on the cursor's temporary file; points were lost."""
    refused = 0
    batch = 20
    cfg = SinkConfig(
        url=influxd.url,
        database=influx_db,
        spool_dir=str(small_disk / "spool"),
        batch_size=batch,
        flush_interval_s=0.05,
        backoff_base_s=0.02,
        backoff_max_s=0.2,
        timeout_s=2.0,
        spool_write_behind_s=0.5,
        spool_max_bytes=8 * 2**20,
    )
    delivered = Delivered(cfg.make_transport())
    sink = InfluxSink(cfg, delivered)
    seq = 0

    def write(batches: int) -> None:
        nonlocal seq, refused
        for _ in range(batches):
            try:  # as the agent does: a sink that raises is counted and the loop goes on
                sink.write_lines(lines(seq, batch))
            except Exception:
                refused += 1
            seq += batch

    influxd.stop()
    try:
        write(8)  # about 160 KB: spilled to disk once the first send fails
        assert wait_until(lambda: sink.stats().spool_bytes > 100_000)
        filler = fill(small_disk)
        write(8)  # the disk refuses these
        influxd.start()  # back while the disk is still full: no cursor can be saved
        assert wait_until(lambda: sink.stats().spool_points == 0), sink.stats()
        assert sink.stats().spool_write_errors > 0
    finally:
        influxd.start()
    filler.unlink()
    write(4)
    assert sink.flush(timeout_s=60)
    sink.close()
    assert refused == 0
    assert delivered.seqs == list(range(seq))  # in order, each once
    assert sorted(stored(influxd, influx_db)) == list(range(seq))
