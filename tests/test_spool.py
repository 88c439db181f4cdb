"""The on-disk spool: order, persistence across restarts, torn writes, the bound's exact count."""

from __future__ import annotations

import shutil
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.core.errors import SpoolError
from gpuwarden.core.store.spool import Spool


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


# -- write-behind: batches wait in memory while the server keeps up ----------------------------


def _disk_bytes(directory):
    return sum(p.stat().st_size for p in directory.glob("*.seg"))


def test_write_behind_keeps_a_healthy_stream_off_disk(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20, write_behind_s=60.0)
    s.open()
    for i in range(10):
        s.append(f"p{i}".encode(), 1)
        if i % 3 == 2:
            s.commit(s.peek(2))
    assert s.memory_bytes > 0 and s.size_bytes == 0
    assert _drain(s, batch=2) == [b"p6", b"p7", b"p8", b"p9"]
    assert _disk_bytes(tmp_path) == 0 and s.pending_points == 0


def test_a_failed_send_spills_in_order_and_a_killed_writer_loses_nothing(tmp_path):
    s = Spool(tmp_path / "a", max_bytes=1 << 20, write_behind_s=60.0)
    s.open()
    for i in range(5):
        s.append(f"r{i}".encode(), 1)
    s.release(s.peek(2))  # the send failed: everything in memory goes to disk, in order
    assert s.memory_bytes == 0 and s.size_bytes > 0
    s.append(b"r5", 1)  # queues behind the spilled batches on disk, not in memory
    assert s.memory_bytes == 0
    shutil.copytree(tmp_path / "a", tmp_path / "killed")  # the process dies here, unclosed
    (tmp_path / "killed" / "lock").unlink()
    again = Spool(tmp_path / "killed", max_bytes=1 << 20, write_behind_s=60.0)
    again.open()
    assert _drain(again) == [f"r{i}".encode() for i in range(6)]
    assert _drain(s) == [f"r{i}".encode() for i in range(6)]


def test_a_batch_spilled_in_flight_is_settled_by_its_send(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20, write_behind_s=60.0)
    s.open()
    for i in range(4):
        s.append(f"r{i}".encode(), 1)
    inflight = s.peek(2)
    s.spill()  # e.g. it waited too long while its send was slow
    s.commit(inflight)  # ... and then the send succeeded
    assert s.pending_points == 2
    s.close()
    again = Spool(tmp_path, max_bytes=1 << 20, write_behind_s=60.0)
    again.open()
    assert _drain(again) == [b"r2", b"r3"]  # nothing delivered is sent again


def test_write_behind_spills_what_waited_too_long(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20, write_behind_s=0.05)
    s.open()
    s.append(b"old", 1)
    assert s.size_bytes == 0
    time.sleep(0.1)
    s.append(b"new", 1)  # the oldest batch has waited past write_behind_s: both go to disk
    assert s.memory_bytes == 0 and s.size_bytes > 0
    assert _drain(s) == [b"old", b"new"]


def test_write_behind_bound_counts_exactly(tmp_path):
    s = Spool(tmp_path, max_bytes=8192, segment_bytes=1024, write_behind_s=60.0)
    s.open()
    dropped = sum(s.append(b"x" * 100, 3) for _ in range(300))
    assert dropped == s.dropped_points_total > 0
    assert s.pending_points == 900 - dropped
    assert len(_drain(s)) * 3 == 900 - dropped


def test_a_disk_error_while_spilling_keeps_the_batches_in_memory(tmp_path, monkeypatch):
    s = Spool(tmp_path, max_bytes=1 << 20, write_behind_s=60.0)
    s.open()
    for i in range(3):
        s.append(f"r{i}".encode(), 1)
    real_write = s._write
    calls = 0

    def failing(*args):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(28, "No space left on device")
        return real_write(*args)

    monkeypatch.setattr(s, "_write", failing)
    with pytest.raises(OSError):
        s.spill()  # r0 reached the disk, r1 did not
    assert s.pending_points == 3
    monkeypatch.setattr(s, "_write", real_write)
    assert _drain(s) == [b"r0", b"r1", b"r2"]


_OPS = st.lists(
    st.sampled_from(["append", "append", "append", "ok", "fail", "spill", "restart"]),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, batch=st.integers(1, 4), write_behind=st.booleans())
def test_spool_against_a_model(tmp_path_factory, ops, batch, write_behind):
    """Any interleaving of appends, sends that succeed or fail, spills and restarts: what was
    delivered plus what is pending is exactly what was appended, each once, in order."""
    directory = tmp_path_factory.mktemp("spool")
    write_behind_s = 60.0 if write_behind else 0.0
    s = Spool(directory, max_bytes=1 << 20, write_behind_s=write_behind_s)
    s.open()
    appended: list[bytes] = []
    delivered: list[bytes] = []
    for op in ops:
        if op == "append":
            appended.append(str(len(appended)).encode())
            s.append(appended[-1], 1)
        elif op in ("ok", "fail") and (recs := s.peek(batch)):
            if op == "ok":
                delivered.extend(r.payload for r in recs)
                s.commit(recs)
            else:
                s.release(recs)
        elif op == "spill":
            s.spill()
        elif op == "restart":
            s.close()
            s = Spool(directory, max_bytes=1 << 20, write_behind_s=write_behind_s)
            s.open()
    assert s.pending_points == len(appended) - len(delivered)
    assert delivered + _drain(s) == appended


def test_a_spill_the_disk_refuses_is_counted_and_keeps_the_batch(tmp_path, monkeypatch):
    """The agent spills before a kernel-log source saves its cursor (collector.agent); a disk
    that refuses it was not counted in write_errors_total nor logged as the spool's other
    refusals are (found by a review, 2026-11-28). The batch stays in memory, pending."""
    s = Spool(tmp_path, max_bytes=1 << 20, write_behind_s=60.0)
    s.open()
    s.append(b"xid 79", 1)

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s, "_write", full)
    with pytest.raises(OSError):
        s.spill()
    assert s.write_errors_total == 1 and s.pending_points == 1
    monkeypatch.undo()
    s.spill()
    assert s.memory_bytes == 0 and s.pending_points == 1
    s.close()
