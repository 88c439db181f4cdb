"""An append-only, size-bounded, on-disk spool of encoded batches that survives restarts.

Every batch the sink accepts is appended here; the sender reads from the cursor, sends, and
commits. Data always leaves in the order it came (the spool drains before new data, because
new data queues behind it).

Write-behind (``write_behind_s > 0``, the sink's default): while the server keeps up, a batch
waits in memory and never touches the disk. It is written to disk (*spilled*), together with
every batch behind it, as soon as a send fails, when it has waited ``write_behind_s``, when
the memory it holds passes ``write_behind_bytes``, or on ``close``; and while anything is
pending on disk, new batches go to disk behind it. So an outage of any length and a restart
of the writer lose nothing; a process killed outright (SIGKILL, OOM) can lose the batches
still in memory, at most ``write_behind_s`` of them. ``write_behind_s = 0`` writes every
batch to disk before ``append`` returns, so that even a killed process loses nothing.

Layout of the directory::

    00000000000000000001.seg   records: header <payload_len u32, points u32, appended_at f64,
    00000000000000000002.seg            crc32 u32> then the payload (line protocol bytes)
    cursor.json                {"segment": 1, "offset": 4096, "dropped_points_total": 0}
    lock                       flock'ed by the process that owns the spool

The bound: when an append would take the spool past ``max_bytes``, whole segments are dropped
oldest first and the points they still held are counted exactly in ``dropped_points_total``
(persisted, so the count is a counter across restarts). A batch being sent while its segment is
dropped is not counted twice: it counts as dropped only if that send then fails.

Durability: a batch on disk was written to the OS, so a crash of the process loses nothing
on disk; a crash of the machine can lose what the OS had not yet written, unless ``fsync`` is
on (then every record, the cursor, and the folder after a segment is created or the cursor
renamed, are synced before the call returns).

Failures, none of them fatal:

* A write the disk refuses (ENOSPC, EIO) is cut back to the last whole record (the file is
  truncated to its size before the write, and the in-memory size never moves), and the batch
  stays in memory, in order behind what is on disk, until a later append or a failed send
  writes it out; past ``write_behind_bytes`` in memory, the newest batch is dropped and
  counted in ``dropped_points_total``. A cursor that cannot be saved stays in memory and is
  saved with the next commit (a stale cursor on disk only means re-sending, which is
  harmless). Each failure is counted (``write_errors_total``) and logged once per streak.
* On open (after a crash or a power cut), an unreadable ``cursor.json`` (empty, zero-filled,
  garbage) falls back to the oldest segment: what it re-sends overwrites itself in InfluxDB
  (same series, same timestamp); counted in ``cursor_resets_total``. A damaged stretch of a
  segment is skipped up to the next valid record (a record is valid when its header is sane
  and its payload matches its CRC), so the records after it are kept; the bytes skipped or
  cut off the end are counted in ``cut_bytes_total``. The CRC does not cover ``appended_at``:
  a damaged one is a wrong timestamp on data that is whole, not a loss.

Clocks: ``appended_at`` (in each record's header) is wall time, a timestamp only. Every age
that decides something (how long a batch has waited in memory, how old the oldest pending
batch is for the sink's flush timer) is measured on the monotonic clock, so a wall clock
stepped backwards or forwards changes nothing. A record read back from disk that this process
did not queue counts as queued when the spool opened.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import mmap
import os
import re
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpuwarden.core.errors import SpoolError
from gpuwarden.core.files import write_all

log = logging.getLogger(__name__)

HEADER = struct.Struct("<IIdI")
MEMORY = -1  # Record.segment of a batch held in memory (write-behind); its offset is a sequence
_NONZERO = re.compile(rb"[^\x00]")


@dataclass(frozen=True, slots=True)
class Record:
    segment: int
    offset: int
    end: int
    points: int
    appended_at: float  # wall time: a timestamp, never a timer
    payload: bytes
    queued: float = 0.0  # monotonic: when this process queued it (or opened the spool)


@dataclass(slots=True)
class _Segment:
    seq: int
    size: int
    points: int  # points held in records at or after the cursor (pending)
    gaps: dict[int, int] = field(default_factory=dict)  # damaged stretch: start -> next record


class Spool:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int = 256 * 2**20,
        segment_bytes: int | None = None,
        fsync: bool = False,
        write_behind_s: float = 0.0,
        write_behind_bytes: int | None = None,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_bytes < 4096:
            raise SpoolError(f"spool max_bytes must be at least 4096, got {max_bytes}")
        if segment_bytes is None:
            segment_bytes = max(1024, min(4 * 2**20, max_bytes // 16))
        if not 0 < segment_bytes <= max_bytes // 4:
            raise SpoolError(
                f"segment_bytes ({segment_bytes}) must be at most a quarter of max_bytes"
            )
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        if write_behind_s < 0:
            raise SpoolError(f"write_behind_s must be 0 (off) or positive, got {write_behind_s}")
        self.write_behind_s = write_behind_s
        self.write_behind_bytes = (
            min(32 * 2**20, max_bytes // 4) if write_behind_bytes is None else write_behind_bytes
        )
        self._wall = wall  # timestamps only
        self._monotonic = monotonic  # every age that decides something
        self._opened_at = 0.0
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []  # oldest first; the last is the head
        self._cursor = (0, 0)
        self._dropped_total = 0
        self._inflight: dict[tuple[int, int], int] = {}  # (segment, offset) -> points
        self._orphaned: set[tuple[int, int]] = set()
        self._head: IO[bytes] | None = None
        self._reader: tuple[int, IO[bytes]] | None = None
        self._lockfile: IO[bytes] | None = None
        self._opened = False
        # Payloads appended by this process and not yet committed, so the sender does not
        # read back from disk what it has in memory (bounded; older ones are read from disk).
        self._recent: dict[tuple[int, int], Record] = {}
        self._recent_bytes = 0
        self._recent_max_bytes = min(32 * 2**20, max_bytes // 4)
        # Write-behind: batches in memory, oldest first, none of them on disk yet. While any
        # is here, nothing is pending on disk (they would have been spilled behind it).
        self._staged: deque[Record] = deque()
        self._staged_bytes = 0
        self._staged_points = 0
        self._staged_seq = 0
        # A batch spilled while its send was in flight: its memory id -> its record on disk.
        self._spilled: dict[int, Record] = {}
        self._torn = False  # the head file could not be cut back: the next write rotates
        self._state_dirty = False  # the cursor on disk is behind the one in memory
        self._disk_failing = ""  # the message of the disk failure streak ("" when it works)
        self.write_errors_total = 0  # writes and cursor saves the disk refused
        self.cursor_resets_total = 0  # unreadable cursor.json on open: back to the oldest
        self.cut_bytes_total = 0  # bytes of torn or damaged records skipped or cut on open

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self._opened:
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lockfile = open(self.directory / "lock", "ab")  # noqa: SIM115
            try:
                fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._lockfile.close()
                raise SpoolError(f"spool {self.directory} is in use by another process") from None
            self._opened_at = self._monotonic()
            self._load_state()
            self._opened = True

    def close(self) -> None:
        """Writes what waits in memory and the cursor; a disk that refuses loses only what
        was in memory, and says how much (counted as dropped)."""
        with self._lock:
            if not self._opened:
                return
            try:
                self._spill()
            except OSError as exc:
                self._disk_failed(exc)
                lost = self._staged_points
                log.error("spool: closing with %d points in memory the disk refused (%s); "
                          "counted as dropped", lost, exc)  # fmt: skip
                self._dropped_total += lost
            self._persist()
            for handle in (self._head, self._reader[1] if self._reader else None):
                if handle is not None:
                    handle.close()
            self._head = self._reader = None
            if self._lockfile is not None:
                self._lockfile.close()
            self._opened = False

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:020d}.seg"

    def _read_cursor(self, seqs: list[int]) -> tuple[int, int]:
        """The saved cursor; an unreadable one (a power cut can leave it empty or zero-filled)
        falls back to the oldest segment, counted: re-sent points overwrite themselves."""
        oldest = (seqs[0], 0) if seqs else (1, 0)
        state_path = self.directory / "cursor.json"
        if not state_path.exists():
            return oldest
        try:
            state = json.loads(state_path.read_bytes())
            cursor = (int(state["segment"]), int(state["offset"]))
            dropped = int(state.get("dropped_points_total", 0))
            if cursor[0] < 1 or cursor[1] < 0 or dropped < 0:
                raise ValueError(f"out of range: {state}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.cursor_resets_total += 1
            log.error("spool: unreadable cursor %s (%r); resending from the oldest segment "
                      "(re-sent points overwrite themselves)", state_path, exc)  # fmt: skip
            return oldest
        self._dropped_total = dropped
        return cursor

    def _load_state(self) -> None:
        seqs = sorted(int(p.stem) for p in self.directory.glob("*.seg") if p.stem.isdigit())
        cursor = self._read_cursor(seqs)
        for seq in seqs:  # segments wholly before the cursor were sent: remove leftovers
            if seq < cursor[0]:
                self._path(seq).unlink()
        seqs = [s for s in seqs if s >= cursor[0]]
        if not seqs or seqs[0] != cursor[0]:
            cursor = (seqs[0], 0) if seqs else (max(cursor[0], 1), 0)
        for seq in seqs:
            size = self._path(seq).stat().st_size
            start = 0
            if seq == cursor[0]:
                # a cursor past the end: the file lost a tail that was sent already
                start = min(cursor[1], size)
                cursor = (seq, start)
            points, valid_end, gaps = self._scan(seq, start, size)
            cut = size - valid_end + sum(end - pos for pos, end in gaps.items())
            if cut:
                self.cut_bytes_total += cut
                log.error("spool segment %s: skipped %d bytes of torn or damaged records "
                          "(%d damaged stretches kept out, %d bytes cut off the end)",
                          self._path(seq), cut, len(gaps), size - valid_end)  # fmt: skip
            if valid_end < size:
                with open(self._path(seq), "r+b") as fh:
                    fh.truncate(valid_end)
            self._segments.append(_Segment(seq, valid_end, points, gaps))
        self._cursor = cursor
        if not self._segments:
            self._segments.append(_Segment(cursor[0], 0, 0))
        self._open_head()

    @staticmethod
    def _record_at(data: mmap.mmap, pos: int, size: int, strict: bool) -> tuple[int, int]:
        """(length, points) of the valid record at ``pos``, or (0, 0). ``strict`` (resync
        only) also wants a header that looks like one the spool writes."""
        if pos + HEADER.size > size:
            return 0, 0
        length, points, appended_at, crc = HEADER.unpack_from(data, pos)
        if length == 0 or points == 0 or pos + HEADER.size + length > size:
            return 0, 0
        if strict and not (points <= length and math.isfinite(appended_at)):
            return 0, 0
        if zlib.crc32(data[pos + HEADER.size : pos + HEADER.size + length]) != crc:
            return 0, 0
        return HEADER.size + length, points

    def _scan(self, seq: int, start: int, size: int) -> tuple[int, int, dict[int, int]]:
        """Points in valid records from ``start``, where the valid records end, and the
        damaged stretches in between (start -> the next valid record)."""
        points, pos, end = 0, start, start
        gaps: dict[int, int] = {}
        if size <= start:
            return 0, start, gaps
        with (
            open(self._path(seq), "rb") as fh,
            mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data,
        ):
            while pos < size:
                length, npoints = self._record_at(data, pos, size, strict=False)
                if length:
                    points += npoints
                    pos = end = pos + length
                    continue
                found = self._resync(data, pos + 1, size)
                if found is None:
                    break
                gaps[pos] = found
                pos = found
        return points, end, gaps

    def _resync(self, data: mmap.mmap, pos: int, size: int) -> int | None:
        """The next offset from ``pos`` where a valid record starts (None if none does)."""
        while pos + HEADER.size < size:
            if data[pos : pos + 4] == b"\0\0\0\0":  # a zero length: skip the zeroes at once
                nonzero = _NONZERO.search(data, pos)
                if nonzero is None:
                    return None
                pos = max(pos + 1, nonzero.start() - 3)
                continue
            if self._record_at(data, pos, size, strict=True)[0]:
                return pos
            pos += 1
        return None

    def _open_head(self) -> None:
        head = self._segments[-1]
        self._head = open(self._path(head.seq), "ab", buffering=0)  # noqa: SIM115
        self._torn = False

    def _sync_dir(self) -> None:
        """Makes a file created or renamed in the spool's folder durable (``fsync`` on)."""
        if not self.fsync:
            return
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _save_state(self) -> None:
        state = {
            "segment": self._cursor[0],
            "offset": self._cursor[1],
            "dropped_points_total": self._dropped_total,
        }
        tmp = self.directory / "cursor.json.tmp"
        with open(tmp, "w") as fh:
            json.dump(state, fh)
            if self.fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, self.directory / "cursor.json")
        self._sync_dir()

    def _persist(self) -> None:
        """Saves the cursor (lock held). A disk that refuses leaves it in memory, to be saved
        with the next commit: a cursor on disk that lags only means re-sending."""
        try:
            self._save_state()
        except OSError as exc:
            self._state_dirty = True
            self._disk_failed(exc)
            return
        self._state_dirty = False

    def _disk_failed(self, exc: OSError) -> None:
        """Counts a write the disk refused; logs it when a streak starts or changes."""
        self.write_errors_total += 1
        message = f"{type(exc).__name__}: {exc}"
        if message != self._disk_failing:
            self._disk_failing = message
            log.error("spool %s: the disk refused a write (%s); what it refused waits in memory "
                      "(logged again when the error changes)", self.directory, message)  # fmt: skip

    def _disk_works(self) -> None:
        if self._disk_failing:
            log.warning("spool %s: the disk takes writes again", self.directory)
            self._disk_failing = ""
        if self._state_dirty:
            self._persist()

    # -- writing --------------------------------------------------------------------------

    def append(self, payload: bytes, points: int) -> int:
        """Append one record; returns the points dropped to stay within the bound. A disk that
        refuses the write does not raise: the batch waits in memory (see the module doc)."""
        if not payload or points < 1:
            raise SpoolError("spool: a record needs a payload and at least one point")
        now, queued = self._wall(), self._monotonic()
        with self._lock:
            self._require_open()
            if HEADER.size + len(payload) > self.max_bytes - self.segment_bytes:
                self._dropped_total += points
                self._persist()
                log.error("spool: a %d-byte batch exceeds the bound; dropped", len(payload))
                return points
            if self.write_behind_s > 0 and self._disk_points() == 0:
                stale = self._staged and queued - self._staged[0].queued >= self.write_behind_s
                full = self._staged_bytes + len(payload) > self.write_behind_bytes
                if not stale and not full:
                    self._stage(payload, points, now, queued)
                    return 0
            dropped = 0
            try:
                dropped = self._spill()
                dropped += self._write(payload, points, now, queued)[1]
            except OSError as exc:
                self._disk_failed(exc)
                if self._staged_bytes + len(payload) > self.write_behind_bytes:
                    self._dropped_total += points
                    self._persist()
                    log.error("spool: the disk refuses writes and %d bytes wait in memory: "
                              "dropped the newest %d points", self._staged_bytes,
                              points)  # fmt: skip
                    return dropped + points
                self._stage(payload, points, now, queued)  # behind everything on disk
                return dropped
            self._disk_works()
            return dropped

    def _stage(self, payload: bytes, points: int, now: float, queued: float) -> None:
        self._staged_seq += 1
        seq = self._staged_seq
        self._staged.append(Record(MEMORY, seq, seq, points, now, payload, queued))
        self._staged_bytes += len(payload)
        self._staged_points += points

    def _write(
        self, payload: bytes, points: int, appended_at: float, queued: float
    ) -> tuple[Record, int]:
        """Append one record to the head segment (lock held): the record, and the points
        dropped from the oldest segments to make room for it. A write the disk refuses is cut
        back to the last whole record, and raises."""
        record_size = HEADER.size + len(payload)
        header = HEADER.pack(len(payload), points, appended_at, zlib.crc32(payload))
        dropped = 0
        while self.size_bytes + record_size > self.max_bytes:
            dropped += self._drop_oldest()
        if dropped:
            self._persist()
        head = self._segments[-1]
        if self._torn or (head.size > 0 and head.size + record_size > self.segment_bytes):
            head = self._rotate()
        self._put(head, header, payload)
        record = Record(
            head.seq, head.size, head.size + record_size, points, appended_at, payload, queued
        )
        if self._recent_bytes + len(payload) <= self._recent_max_bytes:
            self._recent[(head.seq, head.size)] = record
            self._recent_bytes += len(payload)
        head.size += record_size
        head.points += points
        return record, dropped

    def _put(self, head: _Segment, header: bytes, payload: bytes) -> None:
        """Writes one whole record at the end of the head file, or nothing: a short or failed
        write (ENOSPC) is truncated back to ``head.size``, the last whole record."""
        assert self._head is not None
        fd = self._head.fileno()
        total = len(header) + len(payload)
        try:
            done = os.writev(fd, [header, payload])
            if done < total:  # a short write: the rest, or the error that stopped it
                write_all(fd, memoryview(header + payload)[done:])
            if self.fsync:
                os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, head.size)
            except OSError as cut:
                log.error("spool: cannot cut %s back to %d bytes (%s); the next record starts "
                          "a new segment", self._path(head.seq), head.size, cut)  # fmt: skip
                self._torn = True
            raise

    def _spill(self) -> int:
        """Write every batch held in memory to disk, in order (lock held). A batch whose send
        is in flight keeps its place: its commit or release is applied to its disk record.
        A write the disk refuses raises, and what was not written stays in memory."""
        dropped = 0
        while self._staged:
            staged = self._staged[0]  # leaves memory only once it is on disk (a write may fail)
            record, lost = self._write(
                staged.payload, staged.points, staged.appended_at, staged.queued
            )
            self._staged.popleft()
            self._staged_bytes -= len(staged.payload)
            self._staged_points -= staged.points
            dropped += lost
            points = self._inflight.pop((MEMORY, staged.offset), None)
            if points is not None:
                self._spilled[staged.offset] = record
                self._inflight[(record.segment, record.offset)] = points
        return dropped

    def spill(self) -> int:
        """Write what waits in memory to disk now; returns points dropped by the bound. A
        write the disk refuses is counted and logged as any (``write_errors_total``), and
        raises."""
        with self._lock:
            self._require_open()
            try:
                dropped = self._spill()
            except OSError as exc:
                self._disk_failed(exc)
                raise
            self._disk_works()
            return dropped

    def _rotate(self) -> _Segment:
        seq = self._segments[-1].seq + 1
        handle = open(self._path(seq), "ab", buffering=0)  # noqa: SIM115
        try:
            self._sync_dir()
        except OSError:
            handle.close()
            raise
        if self._head is not None:
            self._head.close()
        self._head, self._torn = handle, False
        seg = _Segment(seq, 0, 0)
        self._segments.append(seg)
        return seg

    def _drop_oldest(self) -> int:
        if len(self._segments) == 1:
            self._rotate()
        oldest = self._segments.pop(0)
        dropped = 0
        if oldest.points:
            # Count record by record so a batch in flight is settled by its send's outcome.
            inflight_points = 0
            for key, pts in self._inflight.items():
                if key[0] == oldest.seq and key not in self._orphaned:
                    self._orphaned.add(key)
                    inflight_points += pts
            dropped = oldest.points - inflight_points
        self._dropped_total += dropped
        if self._reader is not None and self._reader[0] == oldest.seq:
            self._reader[1].close()
            self._reader = None
        self._path(oldest.seq).unlink(missing_ok=True)
        for key in [k for k in self._recent if k[0] == oldest.seq]:
            self._forget(key)
        self._cursor = (self._segments[0].seq, 0)
        log.warning("spool full: dropped %d unsent points (segment %d)", dropped, oldest.seq)
        return dropped

    # -- reading --------------------------------------------------------------------------

    def peek(self, max_points: int) -> list[Record]:
        """Records from the cursor on, at least one if any is pending, up to ``max_points``."""
        with self._lock:
            self._require_open()
            records: list[Record] = []
            total = 0
            if self._disk_points() == 0:
                for staged in self._staged:
                    if records and total + staged.points > max_points:
                        break
                    records.append(staged)
                    total += staged.points
                return self._mark_inflight(records)
            seq, offset = self._cursor
            for seg in self._segments:
                if seg.seq < seq:
                    continue
                pos = offset if seg.seq == seq else 0
                while (pos := seg.gaps.get(pos, pos)) < seg.size:  # skip a damaged stretch
                    rec = self._read_record(seg.seq, pos)
                    if rec is None:  # corrupt: the rest of this segment is unusable
                        log.error("spool: corrupt record in segment %d at %d", seg.seq, pos)
                        break
                    if records and total + rec.points > max_points:
                        return self._mark_inflight(records)
                    records.append(rec)
                    total += rec.points
                    pos = rec.end
            return self._mark_inflight(records)

    def _mark_inflight(self, records: list[Record]) -> list[Record]:
        for rec in records:
            self._inflight[(rec.segment, rec.offset)] = rec.points
        return records

    def _read_record(self, seq: int, offset: int) -> Record | None:
        cached = self._recent.get((seq, offset))
        if cached is not None:
            return cached
        if self._reader is None or self._reader[0] != seq:
            if self._reader is not None:
                self._reader[1].close()
            self._reader = (seq, open(self._path(seq), "rb"))  # noqa: SIM115
        fh = self._reader[1]
        fh.seek(offset)
        header = fh.read(HEADER.size)
        if len(header) < HEADER.size:
            return None
        length, points, appended_at, crc = HEADER.unpack(header)
        payload = fh.read(length)
        if len(payload) < length or zlib.crc32(payload) != crc:
            return None
        end = offset + HEADER.size + length
        return Record(seq, offset, end, points, appended_at, payload, self._opened_at)

    def _forget(self, key: tuple[int, int]) -> None:
        rec = self._recent.pop(key, None)
        if rec is not None:
            self._recent_bytes -= len(rec.payload)

    def commit(self, records: list[Record]) -> None:
        """The records were delivered (or definitively rejected): move the cursor past them."""
        with self._lock:
            self._require_open()
            live = []
            for rec in self._on_disk(records, delivered=True):
                key = (rec.segment, rec.offset)
                self._inflight.pop(key, None)
                self._forget(key)
                if key in self._orphaned:
                    self._orphaned.discard(key)  # its segment was dropped; it was delivered
                else:
                    live.append(rec)
            if not live:
                return
            last = live[-1]
            if (last.segment, last.end) <= self._cursor:
                return
            for seg in self._segments:
                for rec in live:
                    if rec.segment == seg.seq:
                        seg.points -= rec.points
            self._cursor = (last.segment, last.end)
            while len(self._segments) > 1 and (
                self._segments[0].seq < last.segment
                or (self._segments[0].seq == last.segment and last.end >= self._segments[0].size)
            ):
                gone = self._segments.pop(0)
                if self._reader is not None and self._reader[0] == gone.seq:
                    self._reader[1].close()
                    self._reader = None
                self._path(gone.seq).unlink(missing_ok=True)
            if self._segments[0].seq != last.segment:
                self._cursor = (self._segments[0].seq, 0)
            self._persist()

    def _on_disk(self, records: list[Record], delivered: bool) -> list[Record]:
        """The disk records of a sent batch (lock held). Batches still in memory are settled
        here: gone once delivered, otherwise still first in line. Spilled ones translate."""
        disk = []
        for rec in records:
            if rec.segment != MEMORY:
                disk.append(rec)
            elif (spilled := self._spilled.pop(rec.offset, None)) is not None:
                disk.append(spilled)
            else:
                self._inflight.pop((MEMORY, rec.offset), None)
                if delivered:
                    self._staged.remove(rec)  # the first one: a sent batch leads the line
                    self._staged_bytes -= len(rec.payload)
                    self._staged_points -= rec.points
        return disk

    def release(self, records: list[Record]) -> int:
        """The send failed and will be retried from the cursor. Returns points now lost
        (records whose segment was dropped while they were in flight). What waits in memory
        is spilled to disk: a server that does not take data may not come back soon."""
        with self._lock:
            lost = 0
            for rec in self._on_disk(records, delivered=False):
                key = (rec.segment, rec.offset)
                self._inflight.pop(key, None)
                if key in self._orphaned:
                    self._orphaned.discard(key)
                    lost += rec.points
            if lost:
                self._dropped_total += lost
                self._persist()
            if self._opened:
                try:
                    self._spill()  # its drops are counted where the bound drops them
                except OSError as exc:  # the disk is full: what waits stays in memory
                    self._disk_failed(exc)
                else:
                    self._disk_works()
            return lost

    # -- state ----------------------------------------------------------------------------

    def _require_open(self) -> None:
        if not self._opened:
            raise SpoolError(f"spool {self.directory} is not open")

    @property
    def size_bytes(self) -> int:
        """Bytes on disk (what the bound limits)."""
        return sum(s.size for s in self._segments)

    @property
    def memory_bytes(self) -> int:
        """Bytes of batches waiting in memory (write-behind)."""
        return self._staged_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes not yet delivered: on disk from the cursor on (with headers), and in memory."""
        if not self._segments:
            return self._staged_bytes
        return self.size_bytes - self._cursor[1] + self._staged_bytes

    def _disk_points(self) -> int:
        return sum(s.points for s in self._segments)

    @property
    def pending_points(self) -> int:
        return self._disk_points() + self._staged_points

    @property
    def dropped_points_total(self) -> int:
        return self._dropped_total

    def oldest_pending_at(self) -> float | None:
        """When the oldest undelivered batch was appended, wall time: a timestamp to show,
        never a timer (None if nothing is pending)."""
        rec = self._oldest_pending()
        return rec.appended_at if rec else None

    def oldest_queued(self) -> float | None:
        """When the oldest undelivered batch was queued, on the monotonic clock (a batch on
        disk that this process did not queue: when the spool opened); None if none is."""
        rec = self._oldest_pending()
        return rec.queued if rec else None

    def _oldest_pending(self) -> Record | None:
        with self._lock:
            if not self._opened or self.pending_points == 0:
                return None
            if self._disk_points() == 0:
                return self._staged[0] if self._staged else None
            seq, offset = self._cursor
            for seg in self._segments:
                if seg.seq >= seq and seg.points:
                    pos = offset if seg.seq == seq else 0
                    return self._read_record(seg.seq, seg.gaps.get(pos, pos))
            return None
