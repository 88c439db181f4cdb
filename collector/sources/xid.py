"""XIDs, NVSwitch SXids and OS faults from the kernel log: ``/dev/kmsg``, a file, or the
host's systemd journal (``[agent] kernel_journal``: :mod:`collector.sources.journal`, where
``/dev/kmsg`` cannot be read, as in an unprivileged container).

``NVRM: Xid`` lines are the GPUs' errors; ``nvidia-nvswitchN: SXid`` lines are the NVSwitches'
(HGX and DGX baseboards): the driver says itself whether each is ``Fatal`` (NVLink traffic
through that switch stops; every GPU of the node needs a reset) or ``Non-fatal``, and names
the switch port (``Link N``) where there is one. They become ``nvswitch_event`` points and, when
fatal, an ``nvswitch_sxid`` finding on the fast path. The same lines in a Fabric Manager log
file are read the same way.

``/dev/kmsg`` yields one record per read (``prio,seq,usec,flags;text``) and is read without
blocking; a plain file (a saved ``dmesg -T``, a journal export) is followed like ``tail -f``.
Only the kernel's own lines count (:mod:`collector.sources.kmsg`): every rule is anchored at the
message's start, and a record whose facility is not the kernel's (what user space writes to
``/dev/kmsg``) is skipped; from the ``/dev/kmsg`` device, so is a record without a priority.
The PCI address in the XID line is mapped to the GPU index and UUID through the NVML source's
inventory, or through the driver's own ``NVRM: GPU at PCI:... GPU-...`` lines when NVML is
not running. The job tagged is the one the NVML source saw on that process or GPU when the
record was written (:class:`~collector.attribution.JobHistory`), else that of the process
named, if it still runs under the same name. Records older than ``lookback_s`` are skipped
(0: keep all), so an agent restart does not re-report what the kernel ring still holds from
long ago.

With ``os_rules`` (the default) the same reader applies the OS rules of
:data:`~collector.sources.kmsg.OS_RULES`: an NFS server not responding, Lustre errors, hung
tasks, soft lockups, NVMe errors and OOM kills. Each matching line is an ``os_event`` point;
repeated lines about one thing (a server, a device, a process name) are one episode
(:mod:`collector.episodes`), which raises one finding of the rule's kind and severity on the
fast path, with the job the process ran for when the line names one. An episode ends after
``os_recovery_s`` without such a line, or at once when the kernel says the thing recovered
("nfs: server X OK", "Lustre: ... Connection restored to ...").

Between cycles a follower thread reads new records as the kernel logs them: it sleeps in
``poll()`` on ``/dev/kmsg`` (or until journalctl hands on a record) and costs nothing while
the kernel is quiet (issue 37: the agent's fixed cost). A plain file cannot be polled and is
looked at every ``follow_s`` (0.1 s). Either way a fatal XID's fast-path finding leaves at
once, whatever the collection interval; its point goes out with the next cycle, as every point
does. ``follow_s = 0`` reads only at each cycle (deterministic: the golden cases use it).

From the journal, the records come from a supervised ``journalctl --follow`` (the follower
thread hands them on as it does ``/dev/kmsg``'s); each point's ``source`` tag is ``journal``,
and the cursor of the last record handled is saved so that a restart does not raise old
records again. The source fails (with journalctl's reason) while journalctl is not running.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import stat
import threading
import time
from typing import Any

from gpuwarden.collector.attribution import job_of_pid
from gpuwarden.collector.episodes import Episodes
from gpuwarden.collector.sources.base import SourceContext, SourceError
from gpuwarden.collector.sources.events import emit, job_words, sxid_point, xid_point
from gpuwarden.collector.sources.journal import JournalFollower
from gpuwarden.collector.sources.kmsg import (
    RECOVERS,
    SUMMARIES,
    OsLine,
    Parsed,
    SxidLine,
    parse_line,
    parse_message,
)
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.xidcat import DEFAULT_FATAL_XIDS, XidPolicy

log = logging.getLogger(__name__)

#: the follower's longest sleep when nothing is logged (a safety net: close() wakes it)
IDLE_WAKE_S = 60.0
#: points kept to be sent again until the agent's sink has them (the newest)
MAX_UNACKED = 10_000


class KmsgXidSource:
    name = "xid"

    def __init__(self, context: SourceContext, settings: dict[str, Any]) -> None:
        self.context = context
        self.path = str(settings.get("path") or context.kmsg)
        self.lookback_s = float(settings.get("lookback_s", 300.0))
        # the host's journal replaces /dev/kmsg when it is set (and no file is named)
        self.journal: JournalFollower | None = None
        self.tag = "kmsg"
        if context.kernel_journal and not settings.get("path"):
            self.journal = JournalFollower(
                context.kernel_journal,
                cursor_file=str(settings.get("journal_cursor_file", "")),
                lookback_s=self.lookback_s,
            )
            self.tag = "journal"
        self.policy = XidPolicy(
            settings.get("fatal_xids", DEFAULT_FATAL_XIDS),
            settings.get("extra_fatal_xids", ()),
            settings.get("not_fatal_xids", ()),
        )
        self.os_rules = bool(settings.get("os_rules", True))
        self.episodes = Episodes(recovery_s=float(settings.get("os_recovery_s", 300.0)))
        # one XID code repeating on one GPU: one fast-path finding per episode
        self.xid_episodes = Episodes(
            recovery_s=float(settings.get("xid_recovery_s", 300.0)),
            resend_s=float(settings.get("xid_resend_s", 600.0)),
        )
        self.follow_s = float(settings.get("follow_s", 0.1))
        if self.follow_s < 0:
            raise SourceError(f"xid.follow_s must be 0 or more, got {self.follow_s}")
        self._fd: int | None = None
        self._is_kmsg = False
        self._buffer = b""
        self._uuids: dict[str, str] = {}
        self._boot_ns: int | None = None
        # records are read and turned into points (and fast-path findings) under one lock, by
        # the follower between cycles and by collect() at each; points wait here for the cycle
        self._lock = threading.Lock()
        self._pending: list[Point] = []
        # journal cursors: of the last collect's records, and of those the sink has ("": none)
        self._staged = self._committed = ""
        self._unacked: list[Point] = []  # points collected, not yet on the sink's disk
        #: set by :meth:`Agent.run`, which tells the source when its sink has the points
        #: (:meth:`committed`); a caller of collect() alone (a test, a benchmark) is never told
        self.retain_until_committed = False
        self.resent = 0  # of the last collect's points, how many were sent before
        # the backlog was cut (past MAX_UNACKED) in a collect not yet committed; once that
        # collect's points are lost, the cursor is saved no more until a restart
        self._cut = self._lost = False
        self._reopen_failed = ""  # the last reason a rotated file could not be opened
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # close() wakes it

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._is_kmsg = stat.S_ISCHR(os.fstat(fd).st_mode)
        if self._is_kmsg:
            self._boot_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        return fd

    def _parsed(self) -> list[Parsed]:
        """Every record logged since the last read, parsed (the journal's, or the log's)."""
        if self.journal is not None:
            self.journal.start()
            records = self.journal.read()
            return [parse_message(text, when, os_rules=self.os_rules) for text, when in records]
        strict = self._is_kmsg  # the device always gives a priority: a record without is refused
        return [
            parse_line(record, self._boot_ns, os_rules=self.os_rules, priority_required=strict)
            for record in self._records()
        ]

    def _records(self) -> list[str]:
        if self._fd is None:
            self._fd = self._open()
            self._reopen_failed = ""
        out = self._read_fd()
        try:
            if not self._is_kmsg and self._rotated():
                # logrotate moved the file away (a new one at the path) or cut it
                # (copytruncate): what the old one still held is read above; the new one from
                # its start. Before, the source read the old file for ever and every later
                # XID was lost, silently (found by a review against real operations)
                os.close(self._fd)
                self._fd, self._buffer = None, b""
                self._fd = self._open()
                out += self._read_fd()
        except FileNotFoundError:  # between logrotate's rename and the new file: not yet
            pass
        except OSError as exc:  # the new file not readable: the next look tries again
            if str(exc) != self._reopen_failed:
                self._reopen_failed = str(exc)
                log.warning("kernel log %s rotated, and the new file cannot be read: %s",
                            self.path, exc.strerror or exc)  # fmt: skip
        return out

    def _rotated(self) -> bool:
        """Whether the file at :attr:`path` is no longer the one read (another file there now,
        or this one shorter than what was read of it)."""
        assert self._fd is not None
        now = os.stat(self.path)  # (missing between logrotate's rename and the new file)
        held = os.fstat(self._fd)
        if not stat.S_ISREG(held.st_mode):  # a pipe, a device: nothing rotates it
            return False
        if (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev):
            return True
        return now.st_size < os.lseek(self._fd, 0, os.SEEK_CUR)

    def _read_fd(self) -> list[str]:
        assert self._fd is not None
        out: list[str] = []
        while True:
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # kmsg: records overwritten before we read them
                    continue
                raise
            if not chunk:
                break
            if self._is_kmsg:
                out.append(chunk.decode("utf-8", "replace").rstrip("\n"))
            else:
                self._buffer += chunk
        if not self._is_kmsg and b"\n" in self._buffer:
            complete, _, self._buffer = self._buffer.rpartition(b"\n")
            out.extend(complete.decode("utf-8", "replace").split("\n"))
        return out

    def _follow(self) -> None:
        """Between cycles: read what the kernel logged as it is logged, so a fatal XID's
        finding is posted at once, not at the next cycle (``interval_s`` later). The thread
        sleeps until there is something to read (``/dev/kmsg`` and the journal say so); a
        plain file, which cannot, is looked at every ``follow_s``. A read that fails is
        retried at the next look; collect() reports it."""
        while not self._stop.is_set():
            self._wait_for_records()
            if self._stop.is_set():
                return
            try:
                with self._lock:
                    self._pending += self._read(time.time_ns())
            except OSError:
                self._stop.wait(self.follow_s)  # (a device that keeps failing: not a spin)
                continue

    def _wait_for_records(self) -> None:
        if self.journal is not None:
            self.journal.wait_for_records(IDLE_WAKE_S)
        elif self._is_kmsg and self._fd is not None:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            poller.poll(IDLE_WAKE_S * 1000)
        else:
            self._stop.wait(self.follow_s)

    def collect(self, now_ns: int) -> list[Point]:
        if self._follower is None and self.follow_s > 0:
            with self._lock:  # the first cycle opens the log (and reports if it cannot)
                points = self._read(now_ns)
            self._follower = threading.Thread(target=self._follow, daemon=True, name="kmsg")
            self._follower.start()
        else:
            with self._lock:
                points = self._read(now_ns)
        with self._lock:
            points, self._pending = self._pending + points, []
            if self.journal is not None:
                try:  # journalctl is not running: the cycle fails, with its reason, and the
                    self.journal.check()  # points read so far go out with the next cycle
                except SourceError:
                    self._pending = points + self._pending
                    raise
                self._staged = self.journal.handled  # saved once the sink has the points
            self.resent = 0
            if self.retain_until_committed:
                # until the agent says its sink has them, the points go out again with each
                # collect (a cycle the agent abandoned in a later, hung source lost them; a
                # point sent twice overwrites itself)
                if self._cut and not self._lost:  # the cycle that carried the cut ones failed
                    self._lost = True
                    log.warning("kernel-log points were lost before they reached the sink's "
                                "disk: the journal's cursor stays where it is until a restart "
                                "reads their records again")  # fmt: skip
                self.resent = len(self._unacked)
                points = self._unacked + points
                self._cut = len(points) > MAX_UNACKED
                self._unacked = points[-MAX_UNACKED:]  # (a storm's all go now)
            return points

    def commit_due(self) -> bool:
        """Whether :meth:`committed` has anything to do."""
        return bool(self._unacked) or self._staged != self._committed

    def holds_points(self) -> bool:
        """Whether points of this source wait to be on the sink's disk (the agent then puts
        them there before :meth:`committed`; a cursor moved by records that made no point
        needs no disk write)."""
        return bool(self._unacked)

    def committed(self, save: bool = True) -> None:
        """The agent's sink has the points of the last collect(), on disk: they are not sent
        again, and (``save``: the agent that writes to InfluxDB, not ``--once`` or
        ``--print``) a restart of the journal goes on after their records. Before, the cursor
        was saved as a record was read, and an agent killed before its point reached the sink
        lost a fatal XID for good; a record read again is harmless: its point overwrites
        itself and its finding has the same id."""
        with self._lock:
            self._unacked, self._cut = [], False
            if save and not self._lost and self.journal is not None and self._staged:
                self._committed = self._staged
                self.journal.save(self._committed)

    def _read(self, now_ns: int) -> list[Point]:
        """Every record logged since the last read, as points (a fatal one also emits its
        fast-path finding, now). Called with the lock held."""
        points = []
        oldest = now_ns - int(self.lookback_s * 1e9) if self.lookback_s > 0 else None
        for parsed in self._parsed():
            if parsed is None:
                continue
            if isinstance(parsed, tuple):
                self._uuids[parsed[0]] = parsed[1]
                continue
            when = parsed.time_ns if parsed.time_ns is not None else now_ns
            if oldest is not None and when < oldest:
                continue
            if isinstance(parsed, OsLine):
                points.append(self._os_event(parsed, when))
                continue
            if isinstance(parsed, SxidLine):
                points.append(sxid_point(self.context, parsed, source=self.tag, now_ns=when))
                continue
            known = self.context.inventory.gpu_for_pci(parsed.pci)
            gpu, uuid = known if known else (None, self._uuids.get(parsed.pci, ""))
            job = self.context.inventory.jobs.job_at(when, gpu, parsed.pid)
            if not job.job and parsed.pid is not None and parsed.process:
                # a process no look saw (it started since, or NVML is not running here)
                job = job_of_pid(str(self.context.procfs), parsed.pid, parsed.process)
            points.append(
                xid_point(
                    self.context,
                    self.policy,
                    xid=parsed.xid,
                    message=parsed.message,
                    source=self.tag,
                    now_ns=when,
                    gpu=gpu,
                    uuid=uuid,
                    pid=parsed.pid,
                    job=job,
                    episodes=self.xid_episodes,
                    device=parsed.pci,
                )
            )
        return points

    def _os_event(self, line: OsLine, when: int) -> Point:
        """The ``os_event`` point of an OS rule's line; the episode's finding when it opens."""
        job = self.context.inventory.jobs.job_at(when, None, line.pid)
        if not job.job and line.pid is not None and line.process:
            job = job_of_pid(str(self.context.procfs), line.pid, line.process)
        tags = self.context.base_tags() | {
            "event": line.rule, "severity": line.severity, "source": self.tag}  # fmt: skip
        fields: dict[str, Any] = {"key": line.key, "message": line.message[:500]}
        if line.pid is not None:
            fields["pid"] = line.pid
        if line.rule in RECOVERS:  # the thing is well again: its episode ends here
            for severity in ("warning", "critical"):
                self.episodes.recovered((RECOVERS[line.rule], line.key, severity))
            return Point("os_event", tags | job.tags(), fields, when)
        # severity is part of the key: an NVMe device's timeouts (a warning) do not hide its
        # removal (critical) that follows
        episode = self.episodes.event((line.rule, line.episode or line.key, line.severity), when)
        if episode is not None:
            what = SUMMARIES[line.rule].format(key=line.key, pid=line.pid, process=line.process)
            emit(self.context, line.rule, None, when, what + job_words(job),
                 {"key": line.key, "message": line.message[:500], "source": self.tag,
                  "severity": line.severity} | job.tags(),
                 severity=line.severity)  # fmt: skip
        return Point("os_event", tags | job.tags(), fields, when)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self.journal is not None:
            self.journal.wake()
        if self._follower is not None:
            self._follower.join(timeout=2)
        with self._lock:
            if self.journal is not None:
                self.journal.close(self._committed)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._follower is None or not self._follower.is_alive():
                for fd in (self._wake_r, self._wake_w):
                    os.close(fd)
                self._wake_r = self._wake_w = -1
