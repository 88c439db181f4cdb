"""Issue 39: the spool after a power cut, and its clocks.

A power cut (fsync is off by default, the folder was not synced) can leave any file of the
spool truncated or zero-filled at any offset. Opening never fails, every record still whole
on disk and not yet delivered is delivered, in order, once; what was cut is counted. Spools
are written by the spool itself; the damage and the clock readings are CONSTRUCTED.
"""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.store.spool import HEADER, Spool
from testbed.influxd import LocalInfluxd


def _drain(spool: Spool) -> list[bytes]:
    out: list[bytes] = []
    while recs := spool.peek(3):
        out += [r.payload for r in recs]
        spool.commit(recs)
    return out


def _records(directory: Path) -> list[tuple[str, int, bytes]]:
    """(file, offset, bytes) of every record in the (undamaged) segments."""
    found = []
    for path in sorted(directory.glob("*.seg")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            length = struct.unpack_from("<I", data, pos)[0]
            found.append((path.name, pos, data[pos : pos + HEADER.size + length]))
            pos += HEADER.size + length
    return found


_DAMAGE = st.lists(
    st.tuples(
        st.integers(0, 10),  # which file: a segment (by rank) or, past the last, cursor.json
        st.sampled_from(["truncate", "zero"]),
        st.floats(0.0, 1.0),  # where, as a fraction of the file's size
        st.integers(1, 300),  # how many bytes to zero-fill
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(damage=_DAMAGE, sent=st.integers(0, 30), total=st.integers(1, 40))
def test_a_power_cut_anywhere_loses_nothing_whole_and_counts_what_it_cut(
    tmp_path_factory: pytest.TempPathFactory,
    damage: list[tuple[int, str, float, int]],
    sent: int,
    total: int,
) -> None:
    """Before: a zero-filled or truncated cursor.json raised SpoolError on open (the agent
    crash-looped), and every record after a damaged one in a segment was dropped uncounted."""
    directory = tmp_path_factory.mktemp("spool")
    s = Spool(directory, max_bytes=1 << 20, segment_bytes=200)
    s.open()
    for i in range(total):
        s.append(f"m v={i}i {i}".encode() + b" " * (i % 7), 1)
    delivered = _drain_some(s, min(sent, total))
    s.close()
    records = _records(directory)
    pending = {rec for rec in records if _seq(rec) >= delivered}
    files = [*sorted(directory.glob("*.seg")), directory / "cursor.json"]
    for which, kind, where, length in damage:
        path = files[min(which, len(files) - 1)]
        if not path.exists():
            continue
        data = bytearray(path.read_bytes())
        at = int(where * len(data))
        if kind == "truncate":
            del data[at:]
        else:
            data[at : at + length] = bytes(len(data[at : at + length]))
        path.write_bytes(bytes(data))
    after = {p.name: p.read_bytes() for p in directory.glob("*.seg")}

    def whole(rec: tuple[str, int, bytes]) -> bool:
        """Its bytes are all there, but for appended_at (a timestamp the CRC does not cover:
        damaged, it is a wrong time on whole data, not a loss)."""
        name, offset, raw = rec
        now = after.get(name, b"")[offset : offset + len(raw)]
        return len(now) == len(raw) and now[:8] + now[16:] == raw[:8] + raw[16:]

    again = Spool(directory, max_bytes=1 << 20, segment_bytes=200)
    again.open()  # never fails
    got = [int(p.split(b"v=")[1].split(b"i")[0]) for p in _drain(again)]
    assert got == sorted(set(got))  # in order, none twice
    wanted = sorted(_seq(rec) for rec in pending if whole(rec))
    assert set(wanted) <= set(got)  # every whole record not yet delivered is delivered
    if again.cursor_resets_total == 0:
        assert all(n >= delivered for n in got)  # a cursor that survived resends nothing
    damaged_in_place = [
        rec for rec in pending if not whole(rec) and rec[1] < len(after.get(rec[0], b""))
    ]
    if damaged_in_place:
        assert again.cut_bytes_total > 0  # what was cut is counted
    again.append(b"m v=999i 999", 1)  # and the spool goes on: a new record is delivered
    assert _drain(again) == [b"m v=999i 999"]
    again.close()


def _seq(rec: tuple[str, int, bytes]) -> int:
    return int(rec[2][HEADER.size :].split(b"v=")[1].split(b"i")[0])


def _drain_some(spool: Spool, n: int) -> int:
    done = 0
    while done < n and (recs := spool.peek(1)):
        spool.commit(recs)
        done += len(recs)
    return done


def test_an_empty_cursor_falls_back_to_the_oldest_segment(tmp_path: Path) -> None:
    """CONSTRUCTED: the zero-length cursor.json a power cut leaves. Before: SpoolError."""
    s = Spool(tmp_path, max_bytes=1 << 20)
    s.open()
    for i in range(3):
        s.append(f"r{i}".encode(), 1)
    s.commit(s.peek(1))
    s.close()
    (tmp_path / "cursor.json").write_bytes(b"")
    again = Spool(tmp_path, max_bytes=1 << 20)
    again.open()
    assert again.cursor_resets_total == 1
    assert _drain(again) == [b"r0", b"r1", b"r2"]  # r0 again: it overwrites itself


def test_records_after_a_damaged_one_are_kept_and_the_damage_counted(tmp_path: Path) -> None:
    """CONSTRUCTED: the middle record's payload zero-filled. Before: r2 was cut with it."""
    s = Spool(tmp_path, max_bytes=1 << 20)
    s.open()
    for i in range(3):
        s.append(f"record {i}".encode(), 1)
    s.close()
    (seg,) = tmp_path.glob("*.seg")
    data = bytearray(seg.read_bytes())
    middle = HEADER.size + len(b"record 0") + HEADER.size
    data[middle : middle + 4] = bytes(4)
    seg.write_bytes(bytes(data))
    again = Spool(tmp_path, max_bytes=1 << 20)
    again.open()
    assert _drain(again) == [b"record 0", b"record 2"]
    assert again.cut_bytes_total == HEADER.size + len(b"record 1")


def test_write_behind_ages_run_on_the_monotonic_clock(tmp_path: Path) -> None:
    """CONSTRUCTED clocks: the wall clock steps back an hour while 6 s pass; a batch that
    waited past write_behind_s (5 s) is spilled. Then it steps forward an hour while 0.1 s
    passes: nothing is spilled early."""
    wall, mono = [1_700_000_000.0], [100.0]
    s = Spool(tmp_path / "a", max_bytes=1 << 20, write_behind_s=5.0,
              wall=lambda: wall[0], monotonic=lambda: mono[0])  # fmt: skip
    s.open()
    s.append(b"first", 1)
    wall[0] -= 3600
    mono[0] += 6
    s.append(b"second", 1)
    assert s.memory_bytes == 0 and s.size_bytes > 0  # both went to disk
    t = Spool(tmp_path / "b", max_bytes=1 << 20, write_behind_s=5.0,
              wall=lambda: wall[0], monotonic=lambda: mono[0])  # fmt: skip
    t.open()
    t.append(b"first", 1)
    wall[0] += 7200
    mono[0] += 0.1
    t.append(b"second", 1)
    assert t.size_bytes == 0 and t.memory_bytes == len(b"firstsecond")


def test_a_spool_written_an_hour_ahead_is_sent_on_the_flush_timer(
    tmp_path: Path, influxd: LocalInfluxd, influx_db: str
) -> None:
    """CONSTRUCTED: a spool left by a writer whose wall clock ran an hour ahead (then the
    clock was stepped back). Before: the flush timer read a negative age and waited an hour."""
    spool = tmp_path / "spool"
    spool.mkdir()
    payload = b"seq,writer=w seq=1i 1700000000000000000"
    header = HEADER.pack(len(payload), 1, time.time() + 3600, zlib.crc32(payload))
    (spool / f"{1:020d}.seg").write_bytes(header + payload)
    sink = InfluxSink(SinkConfig(url=influxd.url, database=influx_db, spool_dir=str(spool),
                                 flush_interval_s=0.1, batch_size=1000))  # fmt: skip
    sink.start()
    deadline = time.monotonic() + 60  # a hang guard: it is due 0.1 s after start
    while sink.stats().spool_points and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sink.stats().spool_points == 0 and sink.stats().points_written == 1
    sink.close()
