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
on. A torn record at the end of the newest segment (a crash mid-append) is
cut off on open.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpuwarden.core.errors import SpoolError

log = logging.getLogger(__name__)

HEADER = struct.Struct("<IIdI")
MEMORY = -1  # Record.segment of a batch held in memory (write-behind); its offset is a sequence


@dataclass(frozen=True, slots=True)
class Record:
    segment: int
    offset: int
    end: int
    points: int
    appended_at: float
    payload: bytes


@dataclass(slots=True)
class _Segment:
    seq: int
    size: int
    points: int  # points held in records at or after the cursor (pending)


class Spool:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int = 256 * 2**20,
        segment_bytes: int | None = None,
        fsync: bool = False,
        write_behind_s: float = 0.0,
        write_behind_bytes: int | None = None,
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
            self._load_state()
            self._opened = True

    def close(self) -> None:
        with self._lock:
            if not self._opened:
                return
            self._spill()
            self._save_state()
            for handle in (self._head, self._reader[1] if self._reader else None):
                if handle is not None:
                    handle.close()
            self._head = self._reader = None
            if self._lockfile is not None:
                self._lockfile.close()
            self._opened = False

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:020d}.seg"

    def _load_state(self) -> None:
        seqs = sorted(int(p.stem) for p in self.directory.glob("*.seg") if p.stem.isdigit())
        state_path = self.directory / "cursor.json"
        if state_path.exists():
            try:
                state = json.loads(state_path.read_text())
                cursor = (int(state["segment"]), int(state["offset"]))
                self._dropped_total = int(state.get("dropped_points_total", 0))
            except (ValueError, KeyError, TypeError) as exc:
                raise SpoolError(f"corrupt spool state {state_path}: {exc!r}") from exc
        else:
            cursor = (seqs[0], 0) if seqs else (1, 0)
        for seq in seqs:  # segments wholly before the cursor were sent: remove leftovers
            if seq < cursor[0]:
                self._path(seq).unlink()
        seqs = [s for s in seqs if s >= cursor[0]]
        if not seqs or seqs[0] != cursor[0]:
            cursor = (seqs[0], 0) if seqs else (max(cursor[0], 1), 0)
        self._cursor = cursor
        for seq in seqs:
            start = cursor[1] if seq == cursor[0] else 0
            points, valid_end = self._scan(seq, start)
            size = self._path(seq).stat().st_size
            if valid_end < size:
                log.warning(
                    "spool segment %s: cutting %d bytes of torn or corrupt records",
                    self._path(seq),
                    size - valid_end,
                )
                with open(self._path(seq), "r+b") as fh:
                    fh.truncate(valid_end)
                size = valid_end
            self._segments.append(_Segment(seq, size, points))
        if not self._segments:
            self._segments.append(_Segment(cursor[0], 0, 0))
        self._open_head()

    def _scan(self, seq: int, start: int) -> tuple[int, int]:
        """Points in valid records from ``start``, and where the valid records end."""
        points, pos = 0, start
        with open(self._path(seq), "rb") as fh:
            fh.seek(start)
            while True:
                header = fh.read(HEADER.size)
                if len(header) < HEADER.size:
                    break
                length, npoints, _, crc = HEADER.unpack(header)
                payload = fh.read(length)
                if len(payload) < length or zlib.crc32(payload) != crc:
                    break
                points += npoints
                pos += HEADER.size + length
        return points, pos

    def _open_head(self) -> None:
        head = self._segments[-1]
        self._head = open(self._path(head.seq), "ab")  # noqa: SIM115

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

    # -- writing --------------------------------------------------------------------------

    def append(self, payload: bytes, points: int) -> int:
        """Append one record; returns the points dropped to stay within the bound."""
        now = time.time()
        with self._lock:
            self._require_open()
            if HEADER.size + len(payload) > self.max_bytes - self.segment_bytes:
                self._dropped_total += points
                self._save_state()
                log.error("spool: a %d-byte batch exceeds the bound; dropped", len(payload))
                return points
            if self.write_behind_s > 0 and self._disk_points() == 0:
                stale = self._staged and now - self._staged[0].appended_at >= self.write_behind_s
                full = self._staged_bytes + len(payload) > self.write_behind_bytes
                if not stale and not full:
                    self._staged_seq += 1
                    seq = self._staged_seq
                    self._staged.append(Record(MEMORY, seq, seq, points, now, payload))
                    self._staged_bytes += len(payload)
                    self._staged_points += points
                    return 0
            dropped = self._spill()
            return dropped + self._write(payload, points, now)[1]

    def _write(self, payload: bytes, points: int, appended_at: float) -> tuple[Record, int]:
        """Append one record to the head segment (lock held): the record, and the points
        dropped from the oldest segments to make room for it."""
        record_size = HEADER.size + len(payload)
        header = HEADER.pack(len(payload), points, appended_at, zlib.crc32(payload))
        dropped = 0
        while self.size_bytes + record_size > self.max_bytes:
            dropped += self._drop_oldest()
        head = self._segments[-1]
        if head.size > 0 and head.size + record_size > self.segment_bytes:
            head = self._rotate()
        assert self._head is not None
        record = Record(head.seq, head.size, head.size + record_size, points, appended_at, payload)
        if self._recent_bytes + len(payload) <= self._recent_max_bytes:
            self._recent[(head.seq, head.size)] = record
            self._recent_bytes += len(payload)
        self._head.write(header)
        self._head.write(payload)
        self._head.flush()
        if self.fsync:
            os.fsync(self._head.fileno())
        head.size += record_size
        head.points += points
        if dropped:
            self._save_state()
        return record, dropped

    def _spill(self) -> int:
        """Write every batch held in memory to disk, in order (lock held). A batch whose send
        is in flight keeps its place: its commit or release is applied to its disk record."""
        dropped = 0
        while self._staged:
            staged = self._staged[0]  # leaves memory only once it is on disk (a write may fail)
            record, lost = self._write(staged.payload, staged.points, staged.appended_at)
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
        """Write what waits in memory to disk now; returns points dropped by the bound."""
        with self._lock:
            self._require_open()
            return self._spill()

    def _rotate(self) -> _Segment:
        assert self._head is not None
        self._head.close()
        seg = _Segment(self._segments[-1].seq + 1, 0, 0)
        self._segments.append(seg)
        self._open_head()
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
                while pos < seg.size:
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
        return Record(seq, offset, offset + HEADER.size + length, points, appended_at, payload)

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
            self._save_state()

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
                self._save_state()
            if self._opened:
                self._spill()  # its drops are counted where the bound drops them
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
        """When the oldest undelivered batch was appended (None if nothing is pending)."""
        with self._lock:
            if not self._opened or self.pending_points == 0:
                return None
            if self._disk_points() == 0:
                return self._staged[0].appended_at if self._staged else None
            seq, offset = self._cursor
            for seg in self._segments:
                if seg.seq >= seq and seg.points:
                    rec = self._read_record(seg.seq, offset if seg.seq == seq else 0)
                    return rec.appended_at if rec else None
            return None
