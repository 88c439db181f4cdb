"""Compacting the journal: the audit log archived whole, and a live log that keeps only what
the engine must still remember.

The audit log is the engine's memory (:func:`remediation.audit.replay`) and the operators'
record, so it is never cut: compaction hard-links the whole log to an archive
(``<log>.<UTC time>Z``, complete and never written again, for logrotate or an archive job to
take), then atomically replaces the live log with a copy holding

* a ``compacted`` record first (the archive's name, how many records were kept and dropped);
* every record newer than the retention (the longest window anything reads,
  :attr:`EngineSettings.journal_retain_s`), verbatim;
* from older records, only those the engine still needs: every record of a plan not finished,
  still waiting or still without its outcome, intents without their action, the action that
  last changed each node (cooldown) and the one that took out each node still out, the
  findings about those nodes, and each policy's last ``demoted``/``promoted`` record;
* every record from ``keep_from`` on (those the outcome reader has not read yet), verbatim.

What matters is tested, not argued: :func:`replay` of the compacted log gives the memory the
whole log gives once ids past ``seen_retention_s`` are forgotten (which the engine does at
start), and the outcome reader restarted on it reaches the same open plans, verdicts and
precision (tests/test_journal_compaction.py, on a SIMULATED 90-day journal of a real engine).

Crash at any instant: until the replace the live log is the whole log (an archive link made
before a crash is the same file: the next compaction removes a link that shares the live log's
inode before it makes its own); after it, the compacted log, whose copy was fsynced before. The
folder is fsynced after the replace.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuwarden.remediation.audit import (
    REMOVING_KINDS,
    RUNNING_VERDICTS,
    WAITING_VERDICTS,
    read_records,
)


@dataclass(frozen=True)
class Compacted:
    archive: Path
    kept: int
    dropped: int
    offset: int
    """Where the reader that had read up to ``keep_from`` in the old log now stands."""
    size: int


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # a torn line: replay skips it, so does the copy
    return record if isinstance(record, dict) else None


def _fid(r: Mapping[str, Any]) -> str:
    return str(r.get("finding_id", "") or r.get("plan_id", ""))


def select(records: list[dict[str, Any] | None], horizon: float) -> list[bool]:
    """Which of ``records`` (the log before the reader's offset, oldest first; None for a torn
    line) the compacted log keeps: those at ``horizon`` or later, and the older ones still
    needed (see the module)."""
    latest: dict[str, dict[str, Any]] = {}
    acted: dict[str, bool] = {}  # action id -> recorded
    outcome: set[str] = set()
    removed: set[str] = set()  # plans with a removing action done
    last_change: dict[str, int] = {}  # node -> index of the action that set the cooldown
    out_since: dict[str, int] = {}  # node -> index of the take-out since its last return
    marks: dict[str, int] = {}  # policy -> its last demoted/promoted
    for i, r in enumerate(records):
        if r is None:
            continue
        event, fid, node = r.get("event"), _fid(r), str(r.get("node", ""))
        if event == "decision" and fid and r.get("verdict") != "duplicate":
            latest[fid] = r
        elif event == "expired":
            latest.pop(fid, None)
        elif event == "outcome":
            outcome.add(fid)
        elif event in ("demoted", "promoted"):
            marks[str(r.get("policy", ""))] = i
        elif event == "intent":
            acted.setdefault(str(r.get("action_id", "")), False)
        elif event == "action":
            acted[str(r.get("action_id", ""))] = True
            if r.get("dry_run") or r.get("outcome") != "ok" or not node:
                continue
            kind = r.get("action")
            if kind not in ("notify", "uncordon"):
                last_change[node] = i
            if kind in REMOVING_KINDS:
                removed.add(fid)
                out_since.setdefault(node, i)
            elif kind == "uncordon":
                out_since.pop(node, None)
    live = {
        fid
        for fid, d in latest.items()
        if d.get("verdict") in WAITING_VERDICTS
        or (d.get("verdict") in RUNNING_VERDICTS and not _all_recorded(d, acted))
    }
    live |= removed - outcome  # its outcome not yet decided: the reader still follows it
    # a node a live plan is about, or that is still out: its whole story is kept (what took it
    # out and returned it, the findings and decisions about it, its undos: replay's taken-out
    # set and the outcome reader's evidence both read them)
    live_nodes = {str(d.get("node", "")) for f, d in latest.items() if f in live}
    live_nodes = (live_nodes | set(out_since)) - {""}
    needed = set(last_change.values()) | set(out_since.values()) | set(marks.values())
    keep = [
        r is not None
        and (
            float(r.get("t", 0.0)) >= horizon
            or i in needed
            or _fid(r) in live
            or (r.get("event") == "intent" and not acted.get(str(r.get("action_id", "")), False))
            or _node_of(r) in live_nodes
        )
        for i, r in enumerate(records)
    ]
    # to a fixed point: a plan is kept whole or not at all (a decision kept without its
    # actions' records would read as unfinished, and be resumed), and a node with one kept
    # removal or return keeps them all (a drain kept without the return after it would read
    # as a node still out)
    while True:
        whole = {_fid(r) for r, k in zip(records, keep, strict=True) if k and r is not None}
        whole.discard("")
        moved = {
            str(r.get("node", ""))
            for r, k in zip(records, keep, strict=True)
            if k and r is not None and _moves(r)
        }
        grown = [
            k or (r is not None and (_fid(r) in whole or (_moves(r) and r.get("node") in moved)))
            for r, k in zip(records, keep, strict=True)
        ]
        if grown == keep:
            return keep
        keep = grown


def _moves(r: Mapping[str, Any] | None) -> bool:
    """An action record that took a node out or returned it (what replay's taken-out set and
    the lemon history are made of)."""
    return (
        r is not None
        and r.get("event") == "action"
        and r.get("action") in (*REMOVING_KINDS, "uncordon")
        and r.get("outcome") == "ok"
        and not r.get("dry_run")
        and bool(r.get("node"))
    )


def _node_of(r: Mapping[str, Any]) -> str:
    subject = r.get("subject")
    if isinstance(subject, dict) and subject.get("node"):
        return str(subject["node"])
    return str(r.get("node", ""))


def _all_recorded(decision: Mapping[str, Any], acted: Mapping[str, bool]) -> bool:
    return all(acted.get(str(a.get("action_id")), False) for a in decision.get("plan") or [])


def _archive_name(path: Path, now: float) -> Path:
    """``<name>.<UTC time to the millisecond>Z``, after every archive there is (a clock
    stepped back moves the name on past the last one): names sort in the order made."""
    ms = int(now * 1000)
    before = archives(path)
    if before:
        stamp = before[-1].name[len(path.name) + 1 :].removesuffix(".gz").removesuffix("Z")
        with contextlib.suppress(ValueError):
            last = datetime.strptime(stamp, "%Y%m%dT%H%M%S.%f").replace(tzinfo=UTC)
            ms = max(ms, round(last.timestamp() * 1000) + 1)
    while True:
        at = datetime.fromtimestamp(ms / 1000, UTC)
        candidate = path.with_name(f"{path.name}.{at:%Y%m%dT%H%M%S}.{ms % 1000:03d}Z")
        if not candidate.exists() and not candidate.with_name(candidate.name + ".gz").exists():
            return candidate
        ms += 1


def archives(path: Path) -> list[Path]:
    """The archives of the log at ``path``, oldest first (``<name>.<UTC time>Z``, or
    ``...Z.gz`` once compressed; a compressed one hides an uncompressed one of its name that
    a crash left behind)."""
    prefix = path.name + "."
    found = {
        p.name: p
        for p in path.parent.iterdir()
        if p.name.startswith(prefix) and p.name[len(prefix) : len(prefix) + 1].isdigit()
    }
    return sorted(
        (p for name, p in found.items() if f"{name}.gz" not in found), key=lambda p: p.name
    )


def _same_file(path: Path, other: os.stat_result) -> bool:
    try:
        mine = os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_ino, mine.st_dev) == (other.st_ino, other.st_dev)


def tidy(path: Path, keep: int) -> list[Path]:
    """Compress every archive not compressed yet, then remove the oldest beyond ``keep`` (0:
    keep all); returns the archives removed. Runs without a lock: archives are never written
    again. A crash leaves at worst an archive and its compressed copy (the copy is complete:
    written, fsynced and renamed before the original goes), and the next call removes the
    original."""
    live = os.stat(path)
    for archive in list(path.parent.glob(f"{glob.escape(path.name)}.[0-9]*Z")):
        gz = archive.with_name(archive.name + ".gz")
        if _same_file(archive, live):
            continue  # the live log itself, linked by a compaction a crash cut short
        if not gz.exists():
            tmp = archive.with_name(f".{gz.name}.tmp")
            with archive.open("rb") as src, open(tmp, "wb") as raw:
                with gzip.GzipFile(filename=archive.name, mode="wb", fileobj=raw, mtime=0) as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(tmp, gz)
            _fsync_dir(path.parent)
        os.unlink(archive)
    removed = []
    if keep > 0:
        done = [a for a in archives(path) if not _same_file(a, live)]
        for old in done[:-keep]:
            old.unlink()
            removed.append(old)
    return removed


def history(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of the log at ``path`` once, oldest first: its archives that are left,
    then the live log, each file's copies (the ``kept`` records after its ``compacted``
    record, which is shown) skipped when the file before it was read (they are that file's
    records)."""
    read_one = False
    for file in [*archives(path), path]:
        skip = 0
        for number, record in enumerate(_records(file)):
            if number == 0 and record.get("event") == "compacted" and read_one:
                skip = int(record.get("kept", 0))
                yield record  # where each compaction happened
                continue
            if skip:
                skip -= 1
                continue
            yield record
        read_one = True


def _records(file: Path) -> Iterator[dict[str, Any]]:
    if file.name.endswith(".gz"):
        with gzip.open(file, "rb") as fh:
            for line in fh:
                record = _parse(line)
                if record is not None:
                    yield record
    else:
        yield from read_records(file)


@dataclass(frozen=True)
class Selection:
    """What a compaction keeps of the log before ``keep_from``: chosen without any lock (that
    part of the file no longer changes: the log is only appended to, and only this engine
    compacts it), then written by :func:`swap` under the writer's lock."""

    keep_from: int
    kept_lines: list[bytes]
    dropped: int
    horizon: float


def choose(path: Path, keep_from: int, horizon: float) -> Selection:
    """The slow part (every record before ``keep_from`` parsed): no lock needed."""
    with path.open("rb") as fh:
        head = fh.read(keep_from)
    if len(head) != keep_from:
        raise OSError(f"{path} is shorter than the {keep_from} bytes already read")
    lines = head.splitlines(keepends=True)
    keep = select([_parse(line) for line in lines], horizon)
    kept = [
        line if line.endswith(b"\n") else line + b"\n"
        for line, k in zip(lines, keep, strict=True)
        if k
    ]
    return Selection(keep_from, kept, len(lines) - len(kept), horizon)


def swap(path: Path, chosen: Selection, now: float) -> Compacted:
    """Archive the whole log and put the compacted one in its place: the ``compacted`` record,
    the kept records, then every byte from ``keep_from`` on as it is now (what was appended
    since :func:`choose` included). The caller holds the writer's lock. Raises OSError with
    the live log as it was."""
    live = os.stat(path)
    for stale in archives(path):  # a link a crash left: the live log itself, not an archive
        if _same_file(stale, live):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
    with path.open("rb") as fh:
        fh.seek(chosen.keep_from)
        tail = fh.read()
    archive = _archive_name(path, now)
    mark = {
        "event": "compacted",
        "time": datetime.fromtimestamp(now, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "t": round(now, 6),
        "archive": archive.name,
        "kept": len(chosen.kept_lines),
        "dropped": chosen.dropped,
        "horizon_t": round(chosen.horizon, 6),
        "why": "the whole log is in the archive; the records after this one are copies of "
        "those the engine still needs, then what came after",
    }
    body = (json.dumps(mark) + "\n").encode() + b"".join(chosen.kept_lines)
    tmp = path.with_name(f".{path.name}.compact.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
    try:
        _write_all(fd, [body, tail])
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(path, archive)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return Compacted(
        archive, len(chosen.kept_lines), chosen.dropped, len(body), len(body) + len(tail)
    )


def compact_file(path: Path, keep_from: int, horizon: float, now: float) -> Compacted:
    """:func:`choose` and :func:`swap` at once (the caller holds the writer's lock)."""
    return swap(path, choose(path, keep_from, horizon), now)


def _write_all(fd: int, parts: Iterable[bytes]) -> None:
    for part in parts:
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view) :]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
