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
import logging
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuwarden.core.files import fsync_dir, write_all
from gpuwarden.remediation.audit import (
    REMOVING_KINDS,
    RUNNING_VERDICTS,
    WAITING_VERDICTS,
    finished,
    read_records,
)
from gpuwarden.remediation.model import foreign_removal

log = logging.getLogger(__name__)


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


def _moves(r: Mapping[str, Any]) -> bool:
    """An action record that took a node out or returned it: a node's last one says whether
    it is out (replay's taken-out set: each sets the state, whatever came before)."""
    return (
        r.get("event") == "action"
        and r.get("action") in (*REMOVING_KINDS, "uncordon")
        and r.get("outcome") == "ok"
        and not r.get("dry_run")
        and bool(r.get("node"))
        # a removal that found the node out by someone else moved nothing of gpuwarden's:
        # kept as a node's last move, it hid gpuwarden's own earlier removal
        and not (r.get("action") in REMOVING_KINDS and foreign_removal(r))
    )


Records = Callable[[], Iterable[dict[str, Any] | None]]


def select(records: Records, horizon: float) -> list[bool]:
    """Which of the records ``records()`` yields (the log before the reader's offset, oldest
    first; None for a torn line) the compacted log keeps. Three passes over the records, each
    holding no more than a few fields per plan:

    1. what replay would make of the whole log: each plan's latest decision (its verdict and
       its actions), every action's outcome, intents without their action, each policy's last
       demotion or promotion, each node's last removal or return;
    2. which records are kept on their own: those at ``horizon`` or later; every record of a
       plan still waiting or unfinished (by replay's own rule, :func:`finished`); intents
       without their action; the demotions and the nodes' last moves of step 1;
    3. a plan is kept whole or not at all: a decision kept without its actions' records would
       read as unfinished, and be resumed.

    Everything else the engine or the outcome reader reads lies within ``horizon``
    (:attr:`EngineSettings.journal_retain_s`: cooldowns, the lemon window, the seen ids,
    waiting plans, outcome windows and precision), so it is kept by the first rule."""
    latest: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    outcomes: dict[str, str] = {}
    open_intents: set[str] = set()
    marks: dict[str, int] = {}
    last_move: dict[str, int] = {}
    for i, r in enumerate(records()):
        if r is None:
            continue
        event, fid = r.get("event"), _fid(r)
        if event == "decision" and fid and r.get("verdict") != "duplicate":
            plan = [
                {"action_id": a.get("action_id"), "action": a.get("action")}
                for a in r.get("plan") or []
                if isinstance(a, dict)
            ]
            latest[fid] = (str(r.get("verdict", "")), plan)
        elif event == "expired":
            latest.pop(fid, None)
        elif event in ("demoted", "promoted"):
            marks[str(r.get("policy", ""))] = i
        elif event == "intent":
            open_intents.add(str(r.get("action_id", "")))
        elif event == "action":
            action_id = str(r.get("action_id", ""))
            open_intents.discard(action_id)
            outcomes[action_id] = str(r.get("outcome", ""))
            if _moves(r):
                last_move[str(r["node"])] = i
    live = {
        fid
        for fid, (verdict, plan) in latest.items()
        if verdict in WAITING_VERDICTS
        or (verdict in RUNNING_VERDICTS and not finished({"plan": plan}, outcomes))
    }
    needed = set(marks.values()) | set(last_move.values())
    del latest, outcomes
    keep: list[bool] = []
    whole: set[str] = set()
    for i, r in enumerate(records()):
        kept = r is not None and (
            float(r.get("t", 0.0)) >= horizon
            or i in needed
            # (a waiting plan's notification is an action of "<finding id>:<verdict>": kept
            # with its plan, or a restart after the compaction told people again; found by a
            # review, 2026-11-28)
            or _fid(r).split(":", 1)[0] in live
            or (r.get("event") == "intent" and str(r.get("action_id", "")) in open_intents)
        )
        keep.append(kept)
        if kept and r is not None and _fid(r):
            whole.add(_fid(r))
    return [k or (r is not None and _fid(r) in whole) for k, r in zip(keep, records(), strict=True)]


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


_ARCHIVE = re.compile(r"\d{8}T\d{6}(\.\d{3})?Z(\.gz)?")


def archives(path: Path) -> list[Path]:
    """The archives of the log at ``path``, oldest first: ``<name>.<UTC time>Z``, or
    ``...Z.gz`` once compressed (a compressed one hides an uncompressed one of its name that
    a crash left behind). Other names beside it (``.lock``, ``.signatures``, a logrotate
    ``.1.gz``) are not archives."""
    prefix = path.name + "."
    found = {
        p.name: p
        for p in path.parent.iterdir()
        if p.name.startswith(prefix) and _ARCHIVE.fullmatch(p.name[len(prefix) :])
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
            fsync_dir(path.parent)
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
    then the live log. Each file after the first read starts with a ``compacted`` record
    (shown: where each compaction happened) followed by copies of the file before it (the
    ``kept`` records and the ``tail`` ones), which are skipped. A link a cut-short compaction
    left (the live log itself) is not read twice."""
    live = os.stat(path)
    files = [a for a in archives(path) if not _same_file(a, live)]
    read_one = False
    for file in [*files, path]:
        skip = 0
        for number, record in enumerate(_records(file)):
            if number == 0 and record.get("event") == "compacted" and read_one:
                skip = int(record.get("kept", 0)) + int(record.get("tail", 0))
                yield record
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
    """What a compaction keeps of the log before ``keep_from``, chosen without any lock (that
    part of the file no longer changes: the log is only appended to, and only this engine
    compacts it) and written to ``copy``, a file beside the log; :func:`swap` puts it in
    place under the writer's lock."""

    keep_from: int
    copy: Path
    kept: int
    dropped: int
    horizon: float


def _head(path: Path, keep_from: int) -> Iterator[tuple[bytes, dict[str, Any] | None]]:
    """The log's lines before ``keep_from`` (a line boundary), each with its record."""
    left = keep_from
    with path.open("rb") as fh:
        for whole in fh:
            if left <= 0:
                return
            line = whole[:left]
            left -= len(line)
            yield line, _parse(line)
    if left > 0:
        raise OSError(f"{path} is shorter than the {keep_from} bytes already read")


def choose(path: Path, keep_from: int, horizon: float) -> Selection:
    """The slow part (every record before ``keep_from`` parsed three times, one at a time: the
    memory it takes is a few fields per plan, not the log): no lock needed."""
    keep = select(lambda: (r for _, r in _head(path, keep_from)), horizon)
    copy = path.with_name(f".{path.name}.kept.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(copy)
    kept = 0
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            for (line, _), k in zip(_head(path, keep_from), keep, strict=True):
                if k:
                    out.write(line if line.endswith(b"\n") else line + b"\n")
                    kept += 1
    finally:
        os.close(fd)
    return Selection(keep_from, copy, kept, len(keep) - kept, horizon)


def swap(
    path: Path, chosen: Selection, now: float, check: Callable[[], None] | None = None
) -> Compacted:
    """Archive the whole log and put the compacted one in its place: the ``compacted`` record,
    the kept records, then every byte from ``keep_from`` on as it is now (what was appended
    since :func:`choose` included). The caller holds the writer's lock; ``check`` (the lease's
    fence) is asked again just before the swap, and the swap is refused if the log changed
    meanwhile (another writer: the standby holds the lease). Raises OSError with the live log
    as it was; once the new log is in place it no longer raises."""
    live = os.stat(path)
    for stale in archives(path):  # a link a crash left: the live log itself, not an archive
        if _same_file(stale, live):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
    with path.open("rb") as fh:
        fh.seek(chosen.keep_from)
        tail = fh.read()
    copied = chosen.copy.stat().st_size
    archive = _archive_name(path, now)
    mark = {
        "event": "compacted",
        "time": datetime.fromtimestamp(now, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "t": round(now, 6),
        "archive": archive.name,
        "kept": chosen.kept,
        "tail": sum(1 for line in tail.splitlines() if _parse(line) is not None),
        "dropped": chosen.dropped,
        "horizon_t": round(chosen.horizon, 6),
        "copied_bytes": copied + len(tail),
        "why": "the whole log is in the archive; the records after this one are copies of "
        "those the engine still needs, then of those written after the compaction began",
    }
    head = (json.dumps(mark) + "\n").encode()
    tmp = path.with_name(f".{path.name}.compact.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with contextlib.suppress(PermissionError):  # the engine's user owns it anyway
            os.fchown(fd, live.st_uid, live.st_gid)
        os.fchmod(fd, stat.S_IMODE(live.st_mode))  # a log shipper keeps its access
        _write_all(fd, [head])
        with chosen.copy.open("rb") as src:
            while block := src.read(1 << 20):
                _write_all(fd, [block])
        _write_all(fd, [tail])
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if check is not None:
            check()
        now_is = os.stat(path)
        if not _same_file(path, live) or now_is.st_size != chosen.keep_from + len(tail):
            raise OSError(f"{path} changed during the compaction (another writer?)")
        os.link(path, archive)
        os.replace(tmp, path)
    except OSError:
        for leftover in (tmp, chosen.copy):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        raise
    with contextlib.suppress(OSError):
        os.unlink(chosen.copy)
    try:
        fsync_dir(path.parent)
    except OSError as exc:  # the swap happened: say so, do not undo it
        log.warning("the audit log's folder could not be fsynced after its compaction: %s", exc)
    return Compacted(
        archive, chosen.kept, chosen.dropped, len(head) + copied, len(head) + copied + len(tail)
    )


def compacted_size(path: Path) -> int:
    """The size of the log at ``path`` just after its last compaction (from its ``compacted``
    record; 0 if it was never compacted): the engine compacts again at twice that."""
    try:
        with path.open("rb") as fh:
            first = _parse(fh.readline())
    except OSError:
        return 0
    if first is None or first.get("event") != "compacted":
        return 0
    return int(first.get("copied_bytes", 0) or 0)


def compact_file(path: Path, keep_from: int, horizon: float, now: float) -> Compacted:
    """:func:`choose` and :func:`swap` at once (the caller holds the writer's lock)."""
    return swap(path, choose(path, keep_from, horizon), now)


def _write_all(fd: int, parts: Iterable[bytes]) -> None:
    for part in parts:
        write_all(fd, part)
