"""The kernel's records from the host's systemd journal, read with ``journalctl``.

In an unprivileged container the host's ``/dev/kmsg`` cannot be read (the device cgroup
refuses a host character device: EPERM), but journald has stored every kernel record in the
host's journal files, which a read-only mount shows. ``[agent] kernel_journal`` names the
folder below which the host's journal lies as the host's own ``journalctl`` finds it:
``var/log/journal`` (a persistent journal) and ``run/log/journal`` (a volatile one, and every
journal before journald flushes it at boot), e.g. ``/host`` where the DaemonSet mounts both.
It is read by the real tool, supervised::

    journalctl --root=ROOT --merge --follow --no-tail --all --output=json
               --output-fields=MESSAGE,_TRANSPORT,SYSLOG_FACILITY
               (--after-cursor=C | --since=@T) _TRANSPORT=kernel SYSLOG_FACILITY=0

The first run has no ``--follow``: it reads what the journal holds and exits, and the first
cycle waits for it (up to 2 s), so that cycle (and ``gpuwarden agent --once``) sees those
records; the follower then goes on after the last one. ``--merge`` because ``--follow`` alone
implies ``--boot``, which against a folder means the
newest boot in it and fails while there is none. A record counts only if the journal says the
kernel wrote it: ``_TRANSPORT=kernel`` (a field journald sets itself; no client can) *and*
``SYSLOG_FACILITY=0``, since journald also stores what user space writes to ``/dev/kmsg``
with ``_TRANSPORT=kernel``, under the facility the writer chose, never 0 (the same rule as for
a ``/dev/kmsg`` record: :mod:`collector.sources.kmsg`). journalctl's own match says so, and
:func:`kernel_record` checks it again. journald unescapes the kernel's ``\\xNN`` escapes, so
a message is escaped again as the kernel does for ``/dev/kmsg`` (:func:`kernel_escape`) and
goes to the same parser (:func:`~collector.sources.kmsg.parse_message`); its time is the
record's ``__REALTIME_TIMESTAMP``.

Where it resumes: the cursor of the last record whose point the agent's sink has on disk is
saved in ``[xid] journal_cursor_file`` (at most once a second, and when the agent stops), and a
restart reads from after it, so an old XID is not raised again, and a record whose point had not
reached the sink is read again (before, the cursor was saved as a record was read: an agent
killed before the cycle that wrote its point lost a fatal XID for good; reading one again is
harmless: its point overwrites itself and its finding has the same id; until the agent says the
sink has them on disk, the source sends its points again with each collect); without a cursor
(the first start, or one journalctl refuses) it reads from ``[xid] lookback_s`` ago (0: the
whole journal). If journalctl exits it is started again after a back-off (1 s, doubling to 60 s,
back to 1 s once it ran a minute) from the last record read; while it is not running the source
fails each cycle with the reason (the agent goes on; ``/readyz`` says so after
``health_fail_cycles``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from gpuwarden.collector.sources.base import SourceError
from gpuwarden.core.checkpoint import read_json, write_json_atomic

log = logging.getLogger(__name__)

FIELDS = "MESSAGE,_TRANSPORT,SYSLOG_FACILITY,_MACHINE_ID"
MACHINE_ID_RE = re.compile(r"[0-9a-f]{32}")
MATCHES = ("_TRANSPORT=kernel", "SYSLOG_FACILITY=0")
# a journal cursor: ``s=<hex>;i=<hex>;b=<hex>;m=<hex>;t=<hex>;x=<hex>``
CURSOR_RE = re.compile(r"[a-z]=[0-9a-f]{1,64}(?:;[a-z]=[0-9a-f]{1,64}){0,15}")
MAX_LINE = 1 << 20  # a JSON record longer than this is skipped (a kernel record is ~1 KiB)
MAX_PENDING = 10_000  # records read and not yet handled; the reader waits when it is full
BACKOFF_S = (1.0, 60.0)
STABLE_S = 60.0  # a journalctl that ran this long starts the back-off again from its first step
SAVE_EVERY_S = 1.0


def kernel_escape(raw: bytes) -> str:
    """``raw`` as the kernel writes a message to ``/dev/kmsg``: a control byte, a byte past
    ASCII and the backslash become ``\\xNN`` (kernel/printk/printk.c), so a journal record's
    message is the text the ``/dev/kmsg`` path would parse."""
    return "".join(chr(c) if 32 <= c < 127 and c != 92 else f"\\x{c:02x}" for c in raw)


def _bytes(value: Any) -> bytes | None:
    """A field's value from ``journalctl -o json``: a string, or (not printable UTF-8) an array
    of byte values; None for anything else (an array of several values: a field repeated,
    which the kernel's records never have)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, list) and all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in value
    ):
        return bytes(value)
    return None


def kernel_record(record: dict[str, Any], machine_id: str = "") -> tuple[str, int | None] | None:
    """``(message, time_ns)`` of a journal record this host's kernel wrote, else None (pure):
    its ``_TRANSPORT`` is ``kernel``, its ``SYSLOG_FACILITY`` the kernel's, 0 (what user space
    writes to ``/dev/kmsg`` has another), and, with ``machine_id``, its ``_MACHINE_ID`` this
    host's (the same folders hold other machines' journals: ``remote/``, containers').
    The message is escaped as ``/dev/kmsg`` gives it."""
    if machine_id and _bytes(record.get("_MACHINE_ID")) != machine_id.encode():
        return None
    if _bytes(record.get("_TRANSPORT")) != b"kernel":
        return None
    if _bytes(record.get("SYSLOG_FACILITY")) != b"0":
        return None
    message = _bytes(record.get("MESSAGE"))
    if message is None:
        return None
    stamp = record.get("__REALTIME_TIMESTAMP")
    time_ns = int(stamp) * 1000 if isinstance(stamp, str) and stamp.isdigit() else None
    return kernel_escape(message), time_ns


class JournalFollower:
    """Runs and supervises ``journalctl`` over the journal below ``root`` (see the module's
    docstring); :meth:`read` hands out the kernel's records read since the last call.
    Constructing it starts nothing; :meth:`start` does."""

    def __init__(
        self,
        root: str,
        *,
        cursor_file: str = "",
        lookback_s: float = 300.0,
        journalctl: str = "journalctl",
    ) -> None:
        self.root = root
        self.machine_id = _machine_id(root)
        self.cursor_file = cursor_file
        self.lookback_s = lookback_s
        self.journalctl = journalctl
        self._lock = threading.Condition()
        self._pending: deque[tuple[str, int | None, str]] = deque()
        self._cursor = ""  # the last record read (a restart of journalctl goes on after it)
        self._handled = ""  # the last record handed out by read() (saved to cursor_file)
        self._saved = ""
        self._saved_at = 0.0
        self._cursor_from_file = False
        self._running = False
        self._down = "journalctl has not started yet"
        self._stop = threading.Event()
        # the first journalctl (no --follow) read the journal to its end, or failed
        self._caught_up = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self.restarts = 0
        self.skipped = 0  # records that were not JSON, too long, or not the kernel's

    # -- the caller's side --------------------------------------------------------------------

    def start(self, wait_s: float = 2.0) -> None:
        """Starts the supervisor (once), and waits up to ``wait_s`` for its first journalctl,
        which reads what the journal holds and exits, to have done so or failed: the first
        cycle (and ``gpuwarden agent --once``) sees the journal's records and says what is
        true."""
        if self._thread is not None:
            return
        self._cursor = self._load_cursor()
        self._cursor_from_file = bool(self._cursor)
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="journal")
        self._thread.start()
        self._caught_up.wait(wait_s)

    def read(self) -> list[tuple[str, int | None]]:
        """The kernel's records read since the last call: ``(message, time_ns)``. Their cursor
        counts as handled (saved by :meth:`save`)."""
        with self._lock:
            records = list(self._pending)
            self._pending.clear()
            self._lock.notify_all()
        if records:
            self._handled = records[-1][2]
        return [(text, when) for text, when, _ in records]

    def wait_for_records(self, timeout_s: float) -> None:
        """Sleep until a record is pending, :meth:`wake` or ``timeout_s``."""
        with self._lock:
            if not self._pending and not self._stop.is_set():
                self._lock.wait(timeout_s)

    def wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def check(self) -> None:
        """Raises :class:`SourceError` with the reason while journalctl is not running."""
        with self._lock:
            if not self._running:
                raise SourceError(f"xid: kernel journal {self.root}: {self._down}")

    def running_pid(self) -> int | None:
        """The running journalctl's process id, or None."""
        with self._lock:
            return self._proc.pid if self._running and self._proc is not None else None

    @property
    def handled(self) -> str:
        """The cursor of the last record :meth:`read` handed out."""
        return self._handled

    def save(self, cursor: str | None = None, *, force: bool = False) -> None:
        """Saves ``cursor`` (default: the last handled record's; at most once a second unless
        ``force``); a file that cannot be written is logged, and the agent goes on."""
        cursor = self._handled if cursor is None else cursor
        if not self.cursor_file or not cursor or cursor == self._saved:
            return
        now = time.monotonic()
        if not force and now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at = now
        try:
            write_json_atomic(Path(self.cursor_file), {"cursor": cursor})
        except OSError as exc:
            log.warning("cannot save the kernel journal's cursor in %s: %s (a restart reads "
                        "from lookback_s ago)", self.cursor_file, exc.strerror or exc)  # fmt: skip
            return
        self._saved = cursor

    def close(self, cursor: str | None = None) -> None:
        """Stops journalctl and saves ``cursor`` (default: the last handled record's)."""
        self._stop.set()
        with self._lock:
            proc = self._proc
            self._lock.notify_all()
        if proc is not None and proc.poll() is None:
            proc.terminate()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.save(cursor, force=True)

    # -- the supervisor -----------------------------------------------------------------------

    def _load_cursor(self) -> str:
        if not self.cursor_file:
            return ""
        saved = read_json(Path(self.cursor_file))
        cursor = saved.get("cursor") if saved else None
        if isinstance(cursor, str) and CURSOR_RE.fullmatch(cursor):
            self._saved = self._handled = cursor
            return cursor
        if saved is not None:
            log.warning("%s holds no journal cursor: reading from lookback_s ago",
                        self.cursor_file)  # fmt: skip
        return ""

    def argv(self, *, follow: bool = True) -> list[str]:
        """journalctl's command line, from the last record read or ``lookback_s`` ago."""
        argv = [self.journalctl, f"--root={self.root}", "--merge"]
        argv += ["--follow", "--no-tail"] if follow else []
        argv += ["--all", "--quiet", "--no-pager", "--output=json", f"--output-fields={FIELDS}"]
        if self._cursor:
            argv.append(f"--after-cursor={self._cursor}")
        elif self.lookback_s > 0:
            argv.append(f"--since=@{time.time() - self.lookback_s:.6f}")
        return argv + list(MATCHES) + [f"_MACHINE_ID={self.machine_id}"]

    def _missing(self) -> str:
        if not self.machine_id:
            return ("no etc/machine-id below it: without the host's machine id its kernel's "
                    "records cannot be told from other machines' in the same folders (remote/, "
                    "containers'); mount the host's /etc/machine-id there")  # fmt: skip
        here = [d for d in ("var/log/journal", "run/log/journal")
                if os.path.isdir(os.path.join(self.root, d))]  # fmt: skip
        if here:
            return ""
        return (
            "neither var/log/journal nor run/log/journal is below it ([agent] kernel_journal "
            "names the host's root as mounted here, e.g. /host)"
        )

    def _supervise(self) -> None:
        delay = BACKOFF_S[0]
        catch_up = True  # first to the journal's end without --follow, then follow from there
        while not self._stop.is_set():
            started = time.monotonic()
            why = self._missing() or self._run_once(follow=not catch_up)
            if catch_up:
                self._caught_up.set()
                if not why:
                    catch_up = False
                    continue
            with self._lock:
                self._running = False
                self._proc = None
                self._down = why
            if self._stop.is_set():
                return
            if time.monotonic() - started >= STABLE_S:
                delay = BACKOFF_S[0]
            log.warning("kernel journal %s: %s; starting journalctl again in %.0f s",
                        self.root, why, delay)  # fmt: skip
            self.restarts += 1
            self._stop.wait(delay)
            delay = min(delay * 2, BACKOFF_S[1])

    def _run_once(self, *, follow: bool) -> str:
        """Runs journalctl until it exits; the reason it is not running any more ("" when,
        without ``follow``, it read to the journal's end)."""
        argv = self.argv(follow=follow)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, close_fds=True)  # fmt: skip
        except OSError as exc:
            return f"cannot run {self.journalctl}: {exc.strerror or exc}"
        errors: deque[str] = deque(maxlen=4)
        drain = threading.Thread(target=_drain, args=(proc.stderr, errors), daemon=True)
        drain.start()
        with self._lock:
            if self._stop.is_set():
                proc.terminate()
            self._proc = proc
            self._running = True
        delivered = False
        assert proc.stdout is not None
        try:
            while True:
                line = proc.stdout.readline(MAX_LINE)
                if not line:
                    break
                if not line.endswith(b"\n"):  # too long: skip to its end
                    while line and not line.endswith(b"\n"):
                        line = proc.stdout.readline(MAX_LINE)
                    self.skipped += 1
                    continue
                delivered = self._take(line) or delivered
        finally:
            proc.stdout.close()
            if proc.poll() is None and self._stop.is_set():
                proc.terminate()
            code = proc.wait()
            drain.join(timeout=1)
            with self._lock:
                self._proc = None
        said = errors[-1] if errors else "no message"
        if code == 0 and not follow and not self._stop.is_set():
            return ""
        if (code != 0 and not delivered and self._cursor_from_file
                and "cursor" in " ".join(errors).lower()):  # fmt: skip
            log.warning("journalctl refused the saved cursor (%s): reading from lookback_s "
                        "ago", said)  # fmt: skip
            self._cursor = ""
            self._cursor_from_file = False
        return f"journalctl exited with status {code} ({said})"

    def _take(self, line: bytes) -> bool:
        """One line of journalctl's output into the pending records; whether it was one."""
        try:
            record = json.loads(line)
        except ValueError:
            self.skipped += 1
            return False
        if not isinstance(record, dict) or not isinstance(record.get("__CURSOR"), str):
            self.skipped += 1
            return False
        cursor = record["__CURSOR"]
        kernel = kernel_record(record, self.machine_id)
        with self._lock:
            while len(self._pending) >= MAX_PENDING and not self._stop.is_set():
                self._lock.wait(0.5)  # the reader waits (journalctl with it), nothing is lost
            self._cursor = cursor
            self._cursor_from_file = False
            if kernel is None:
                self.skipped += 1
                return True
            self._pending.append((kernel[0], kernel[1], cursor))
            self._lock.notify_all()  # the follower sleeps until a record is here
        return True


def _drain(stream: IO[bytes] | None, into: deque[str]) -> None:
    """Keeps journalctl's last lines on stderr (its reason, when it exits)."""
    if stream is None:
        return
    with stream:
        for raw in stream:
            text = raw.decode("utf-8", "replace").strip()
            if text:
                into.append(text[:300])


def _machine_id(root: str) -> str:
    """The host's machine id (``<root>/etc/machine-id``), or "" when it cannot be read."""
    try:
        with open(os.path.join(root, "etc/machine-id"), encoding="ascii") as fh:
            text = fh.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if MACHINE_ID_RE.fullmatch(text) else ""
