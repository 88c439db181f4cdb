"""The on-disk spool: order, persistence across restarts, torn writes, the bound's exact count."""

from __future__ import annotations

import pytest

from collector.errors import SpoolError
from collector.spool import Spool


def _drain(spool, batch=1000):
    out: list[bytes] = []
    while recs := spool.peek(batch):
        out.extend(r.payload for r in recs)
        spool.commit(recs)
    return out


def test_fifo_and_commit(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20)
    s.open()
    for i in range(10):
        s.append(f"p{i}".encode(), 2)
    first = s.peek(5)
    assert [r.payload for r in first] == [b"p0", b"p1"]  # 2 points each, at most 5: two records
    s.commit(first)
    assert s.pending_points == 16
    assert _drain(s) == [f"p{i}".encode() for i in range(2, 10)]
    assert s.pending_points == 0


def test_survives_restart_without_resending_committed(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20)
    s.open()
    for i in range(5):
        s.append(f"r{i}".encode(), 1)
    s.commit(s.peek(2))
    s.close()
    again = Spool(tmp_path, max_bytes=1 << 20)
    again.open()
    assert again.pending_points == 3
    assert _drain(again) == [b"r2", b"r3", b"r4"]


def test_torn_tail_is_cut_off(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20)
    s.open()
    s.append(b"whole", 1)
    s.close()
    seg = next(tmp_path.glob("*.seg"))
    with open(seg, "ab") as fh:
        fh.write(b"\x10\x00\x00\x00garbage")  # a crash in the middle of the next append
    again = Spool(tmp_path, max_bytes=1 << 20)
    again.open()
    assert again.pending_points == 1
    assert _drain(again) == [b"whole"]
    again.append(b"after", 1)
    assert _drain(again) == [b"after"]


def test_bound_drops_oldest_and_counts_exactly(tmp_path):
    s = Spool(tmp_path, max_bytes=8192, segment_bytes=1024)
    s.open()
    payload = b"x" * 100  # 120 bytes with the header
    appended = 0
    dropped = 0
    for _ in range(300):
        dropped += s.append(payload, 3)
        appended += 3
    assert s.size_bytes <= 8192
    assert dropped == s.dropped_points_total > 0
    assert appended - dropped == s.pending_points
    kept = len(_drain(s)) * 3
    assert kept == appended - dropped
    s.close()
    again = Spool(tmp_path, max_bytes=8192, segment_bytes=1024)
    again.open()
    assert again.dropped_points_total == dropped  # a counter across restarts


def test_inflight_batch_in_a_dropped_segment_counts_by_its_outcome(tmp_path):
    s = Spool(tmp_path, max_bytes=8192, segment_bytes=1024)
    s.open()
    s.append(b"a" * 100, 5)
    inflight = s.peek(5)
    for _ in range(100):
        s.append(b"b" * 100, 1)  # overflows: the in-flight record's segment goes
    before = s.dropped_points_total
    assert s.release(inflight) == 5  # the send failed: those 5 are lost, and now counted
    assert s.dropped_points_total == before + 5

    t = Spool(tmp_path / "t", max_bytes=8192, segment_bytes=1024)
    t.open()
    t.append(b"a" * 100, 5)
    inflight = t.peek(5)
    for _ in range(100):
        t.append(b"b" * 100, 1)
    before = t.dropped_points_total
    t.commit(inflight)  # the send succeeded: delivered, not dropped
    assert t.dropped_points_total == before
    assert t.pending_points + t.dropped_points_total == 100


def test_one_owner_at_a_time(tmp_path):
    s = Spool(tmp_path)
    s.open()
    with pytest.raises(SpoolError, match="in use"):
        Spool(tmp_path).open()


def test_bound_validated_at_construction(tmp_path):
    with pytest.raises(SpoolError):
        Spool(tmp_path, max_bytes=100)
    with pytest.raises(SpoolError):
        Spool(tmp_path, max_bytes=8192, segment_bytes=8192)
