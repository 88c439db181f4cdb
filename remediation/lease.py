"""Which engine acts: a lease held as a PostgreSQL session advisory lock.

Two or more ``gpuwarden remediate serve`` processes, on different hosts, share one audit log
(on storage each can reach) and one ``[lease]``. Each starts as a *standby*: it does not
listen, and tries ``pg_try_advisory_lock(key)`` every ``retry_s``. The one that gets the lock
is the *acting* engine: it opens the audit log, replays it, resumes every unfinished plan
(docs/DURABILITY.md: nothing lost, nothing done twice) and serves. Senders list every engine's
URL and post to the first that answers (:class:`core.poster.FindingPoster`), so they find the
acting one by themselves.

PostgreSQL holds a session-level advisory lock for as long as the session lives, and ends the
session when the engine's connection closes: a crash, a SIGKILL or a stop hands the lease on
at once. A host that vanishes (power, network) is noticed by the server's TCP keepalives,
which this session sets short (``tcp_keepalives_*``, ``tcp_user_timeout``: ``lost_after_s``).

The acting engine must stop acting *before* the server could give the lock to another one.
It confirms its hold every ``check_s`` (its session still holds an advisory lock in
``pg_locks``, with a statement timeout); if a check
fails, or gets no answer within ``lost_after_s / 2``, it exits at once (exit status 75: its
journal is written for a SIGKILL at any instant, and systemd restarts it as a standby). Every
audit record is fenced too (:meth:`PostgresLease.fence`): an engine whose last confirmation is
older than ``lost_after_s / 2`` writes nothing, so it cannot journal, and therefore cannot
do, an action while the server may already have given the lease away. The server drops a
silent session only after ``lost_after_s`` without an answer, twice that margin. The fence
reads ``CLOCK_BOOTTIME``, which also counts time the machine was suspended: a host that
wakes after the server freed its lease refuses its next record.

A new holder waits ``lost_after_s / 2 + check_s`` after taking the lease before it writes
anything: the engine before it may have confirmed its hold just before its session was ended
on the server's side (an operator's ``pg_terminate_backend``, a PostgreSQL restart), and its
fence lets it write until then. Each action is fenced again just before it is done. A server
in recovery (a replica) is refused: it would grant a lock of its own. Do not put a pooler in
transaction mode between the engines and PostgreSQL (the lock lives in one session), and use
``sslmode=verify-full`` for a server across a network (else whoever answers in its place
grants every engine the lease).

What the lease does not cover: the audit log must be one file both hosts reach (NFS, a shared
block device), and the local ``flock`` (:class:`remediation.audit.AuditLog`) keeps two
engines on one host off it; PostgreSQL itself is a single point (run it with the site's own
replication: a promoted replica has no session and so no lock, and the engines contend again).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuwarden.remediation.audit import JournalError
from gpuwarden.remediation.errors import RemediationError

log = logging.getLogger(__name__)

#: does this session hold an advisory lock? (the lease is the only one an engine takes)
HELD = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
    "AND pid = pg_backend_pid() AND granted)"
)

#: the exit status of an engine that lost its lease (EX_TEMPFAIL: restart me, I will wait)
LEASE_LOST_EXIT = 75


class LeaseError(RemediationError):
    pass


class NotPrimaryError(Exception):
    """The connection reached a server in recovery (a replica): tried again, not held."""


class LeaseLostError(JournalError):
    """This engine can no longer show that it holds the lease: nothing may be written, so
    nothing is acted on (the engine answers 503, and exits)."""


def lease_key(name: str) -> int:
    """The advisory lock's 64-bit key for a lease name (the same on every host)."""
    return int.from_bytes(hashlib.sha256(f"gpuwarden-lease:{name}".encode()).digest()[:8],
                          "big", signed=True)  # fmt: skip


class PostgresLease:
    """One engine's hold on the lease ``name`` in the PostgreSQL at ``dsn``."""

    def __init__(
        self,
        dsn: str,
        name: str = "gpuwarden-engine",
        *,
        retry_s: float = 0.5,
        check_s: float = 1.0,
        lost_after_s: float = 10.0,
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = lambda: time.clock_gettime(time.CLOCK_BOOTTIME),
    ) -> None:
        if not 0 < check_s < lost_after_s / 4:
            raise LeaseError("lease.check_s must be more than 0 and under lost_after_s / 4")
        self.dsn = dsn
        self.name = name
        self.key = lease_key(name)
        self.retry_s = retry_s
        self.check_s = check_s
        self.lost_after_s = lost_after_s
        self.on_lost = on_lost or _exit_lost
        self.clock = clock
        self.confirmed_at: float | None = None
        self.tries = 0
        self._conn: Any = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def _connect(self) -> Any:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - the extra is in `all`
            raise LeaseError("a lease needs psycopg: pip install 'gpuwarden[standby]'") from exc
        lost_ms = int(self.lost_after_s * 1000)
        conn = psycopg.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=max(2, int(self.lost_after_s / 2)),
            application_name="gpuwarden-engine",
            # the client notices a dead server within about lost_after_s / 2 ...
            keepalives=1,
            keepalives_idle=1,
            keepalives_interval=1,
            keepalives_count=max(1, int(self.lost_after_s / 4)),
            tcp_user_timeout=lost_ms // 2,
        )
        # ... and the server ends this session (and frees the lock) after lost_after_s of silence
        conn.execute(f"SET tcp_keepalives_idle = {max(1, int(self.lost_after_s / 4))}")
        conn.execute("SET tcp_keepalives_interval = 1")
        conn.execute(f"SET tcp_keepalives_count = {max(1, int(self.lost_after_s / 2))}")
        conn.execute(f"SET tcp_user_timeout = {lost_ms}")
        conn.execute(f"SET statement_timeout = {int(self.check_s * 1000)}")
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        if row and row[0]:  # a replica grants advisory locks of its own: two holders
            conn.close()
            raise NotPrimaryError("the DSN reached a replica (pg_is_in_recovery); the lease is "
                                  "taken on the primary only")  # fmt: skip
        return conn

    def acquire(self, stop: threading.Event) -> bool:
        """Wait, as a standby, until this engine holds the lease (True) or ``stop`` is set."""
        waiting_logged = False
        while not stop.is_set():
            self.tries += 1
            try:
                if self._conn is None:
                    self._conn = self._connect()
                row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
                if row and row[0]:
                    self.confirmed_at = self.clock()
                    return True
                if not waiting_logged:
                    log.info("standby: another engine holds the lease %r; trying every %.1f s",
                             self.name, self.retry_s)  # fmt: skip
                    waiting_logged = True
            except LeaseError:
                raise
            except Exception as exc:  # psycopg's errors, OSError: try again
                log.warning("lease %r: cannot reach PostgreSQL (%s: %s); trying again",
                            self.name, type(exc).__name__, exc)  # fmt: skip
                self._drop()
            stop.wait(self.retry_s)
        return False

    def watch(self) -> None:
        """Confirm the session every ``check_s`` on a thread; on failure, :attr:`on_lost`."""
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="lease")
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.check_s):
            why = self._check()
            if self._stop.is_set():
                return
            if why:
                self.confirmed_at = None
                self.on_lost(why)
                return
            self.confirmed_at = self.clock()

    def _check(self) -> str:
        """One confirmation: "" when the session answered, else why not. A check that gets no
        answer within ``lost_after_s / 2`` (a network that drops everything silently: no
        error ever comes) fails too; it runs on a thread of its own so as to be timed."""
        done = threading.Event()
        failed: list[str] = []

        def check() -> None:
            try:
                # this very session still holds an advisory lock (not merely "a server
                # answers": through a pooler the answer may come from another session)
                row = self._conn.execute(HELD).fetchone()
                if not (row and row[0]):
                    failed.append("this session no longer holds the lease")
            except Exception as exc:  # any failure: the hold is unproven
                failed.append(f"{type(exc).__name__}: {exc}")
            done.set()

        threading.Thread(target=check, daemon=True, name="lease-check").start()
        if not done.wait(self.lost_after_s / 2):
            return f"no answer from PostgreSQL within {self.lost_after_s / 2:.1f} s"
        return failed[0] if failed else ""

    def fence(self) -> None:
        """Raise :class:`LeaseLostError` unless the hold was confirmed within
        ``lost_after_s / 2`` (the audit log calls this before every record)."""
        at = self.confirmed_at
        if at is None or self.clock() - at > self.lost_after_s / 2:
            raise LeaseLostError(f"the lease {self.name!r} is not confirmed: writing nothing")

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                conn.close()

    def release(self) -> None:
        """Give the lease up (a clean stop): the session ends, a standby takes it."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(self.check_s * 2 + 1)
        self.confirmed_at = None
        self._drop()


def _exit_lost(why: str) -> None:
    log.critical("lost the lease (%s): exiting now so that the standby acts alone", why)
    logging.shutdown()
    os._exit(LEASE_LOST_EXIT)
