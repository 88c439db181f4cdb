"""The signatures the engine has accepted, remembered before anything is acted on, for their
whole validity window, across restarts (issue 38).

A signature is good while its timestamp is within ``window_s`` of the engine's clock (the
endpoint's ``max_clock_skew_s``), so it must be remembered until then: one JSON line per
accepted signature (``{"t": <signed seconds>, "mac": <hex>}``), appended and fsynced before
the request is acted on, in a file beside the audit log. On start the file is read back
(entries whose window is over are dropped, and the file is rewritten without them); while it
runs, it is rewritten the same way whenever it holds more than twice the live entries, so it
stays bounded by what a window can hold. A request whose signature cannot be written gets 503
and is not acted on (its sender signs its retry afresh).

The window is wall time on purpose: a signature is accepted by comparing its timestamp with the
engine's wall clock, and it is forgotten by the same comparison, so one is forgotten only once
it would be refused as stale, whatever steps that clock took in between. And once one is
forgotten, every signature signed at or before it is a replay (the file keeps that time,
``{"floor": ...}``): a clock stepped back after forgetting cannot make a captured request new.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuwarden.core.files import fsync_dir, write_all

log = logging.getLogger(__name__)


class ReplayError(Exception):
    """A signature could not be remembered durably (the request must not be acted on)."""


class SignatureMemory:
    """Signatures seen, keyed by their MAC; ``path`` "" keeps them in memory only."""

    def __init__(
        self,
        path: str | Path = "",
        window_s: float = 300.0,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path) if path else None
        self.window_s = window_s
        self._wall = wall
        self._seen: dict[str, int] = {}
        # the newest signed time of a signature forgotten: one signed at or before it may have
        # been seen, so it is a replay whatever the clock says now (a captured request was
        # accepted again once the engine's clock stepped back past its window; found in
        # review). Kept in the file across a rewrite, so across a restart too.
        self._floor: int | None = None
        self._lines = 0
        self._next_expiry = 0.0
        self._lock = threading.Lock()  # what is seen, the file's descriptor, what is written
        self._sync_lock = threading.Lock()  # one fsync at a time: see remember
        self._fd = -1
        self._written = self._synced = 0  # lines appended through _fd; of them, durable
        # lines an fsync that failed covered: never answered as durable, even when a later
        # fsync of the descriptor returns 0 (Linux reports a writeback error once, and the
        # pages it failed to write are then clean, their data possibly gone)
        self._failed_upto = 0
        self._dir_pending = False  # the folder's fsync after a rewrite's rename failed
        self._closed = False
        if self.path is not None:
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        now = self._wall()
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            text = ""
        for raw in text.splitlines():
            if raw.startswith('{"floor": '):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self._forgot(int(json.loads(raw)["floor"]))
                continue
            # a line may follow bytes a failed writeback left (NULs, no newline): each entry
            # is read from its own start
            try:
                entry = json.loads(raw[max(0, raw.rfind('{"t": ')) :])
                t, mac = int(entry["t"]), str(entry["mac"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: it was never acted on (written before acting)
            if t >= now - self.window_s:
                self._seen[mac] = t
            else:
                self._forgot(t)
        self._rewrite()
        if self._seen:
            log.info("remembering %d signatures from before the restart", len(self._seen))

    def _rewrite(self) -> None:
        """The file again with only what is remembered, fsynced, then appended to (both locks
        held, or none yet: every line written so far is in it, so all of them are durable)."""
        assert self.path is not None
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        # the descriptor that writes the copy appends after it: once renamed it is the file's
        # (a reopen that failed would leave later lines in the file replaced)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            floor = "" if self._floor is None else json.dumps({"floor": self._floor}) + "\n"
            text = floor + "".join(
                json.dumps({"t": t, "mac": mac}) + "\n" for mac, t in self._seen.items()
            )
            write_all(fd, text.encode())
            os.fsync(fd)
            os.replace(tmp, self.path)
        except OSError:
            os.close(fd)
            raise
        old, self._fd = self._fd, fd  # swapped first: a close that fails leaves no stale fd
        if old >= 0:
            with contextlib.suppress(OSError):
                os.close(old)
        try:
            fsync_dir(self.path.parent)  # the new name, before anything counts on it
        except OSError:
            # what waits was only in the renamed copy; and every later line is in the new
            # file only: none is durable until the folder's fsync is done (see _sync)
            self._failed_upto = self._written
            self._dir_pending = True
            raise
        self._synced = self._written
        self._lines = len(self._seen)

    def _forgot(self, t: int) -> None:
        if self._floor is None or t > self._floor:
            self._floor = t

    def seen(self, mac: str) -> bool:
        with self._lock:
            return mac in self._seen

    def remember(self, mac: str, t: int) -> bool:
        """Remember ``mac`` (signed at ``t``): False if it was seen before (a replay); True
        once it is durable. :class:`ReplayError` if it cannot be written.

        Group commit: the line is appended under the lock, the fsync made outside it, and one
        fsync makes every line appended before it durable, so requests that arrive together
        share one (an XID storm's 3,000 signed findings in 10 s did one each, in turn, each
        under the lock). A second request with the same MAC is a replay from the moment the
        first one's line is written; the first is answered only once it is durable."""
        with self._lock:
            if mac in self._seen or (self._floor is not None and t <= self._floor):
                return False
            if self.path is None:
                self._seen[mac] = t
                written = 0
            else:
                line = (json.dumps({"t": t, "mac": mac}) + "\n").encode()
                try:
                    start = os.fstat(self._fd).st_size
                    try:
                        write_all(self._fd, line)
                    except OSError:
                        os.ftruncate(self._fd, start)  # the next line starts clean
                        raise
                except OSError as exc:
                    # kept as seen: a request that got 503 must not be replayable (its sender
                    # signs its retry afresh, a new MAC; only a captured copy comes back)
                    self._seen[mac] = t
                    raise ReplayError(f"cannot remember the signature: {exc}") from None
                self._seen[mac] = t
                self._lines += 1
                self._written += 1
                written = self._written
        if written:
            try:
                self._sync(written)
            except OSError as exc:  # its MAC stays seen (see the write's failure above)
                raise ReplayError(f"cannot remember the signature: {exc}") from None
        self._expire()
        return True

    def _sync(self, upto: int) -> None:
        """Make the first ``upto`` lines durable: one fsync covers every line written before
        it started, so a caller whose line an earlier fsync covered returns at once."""
        with self._sync_lock:
            if upto <= self._failed_upto:
                raise OSError("an fsync that covered this signature failed")
            if self._dir_pending:  # the file's name is not durable yet: nothing in it is
                assert self.path is not None
                try:
                    fsync_dir(self.path.parent)
                except OSError:
                    with self._lock:
                        self._failed_upto = max(self._failed_upto, self._written)
                    raise
                self._dir_pending = False
            if self._synced >= upto:
                return
            with self._lock:
                fd, target = self._fd, self._written
            try:
                os.fsync(fd)
            except OSError:
                with self._lock:  # lines written while it ran too: their pages may have
                    # been in the writeback that failed
                    self._failed_upto = max(self._failed_upto, self._written)
                raise
            self._synced = max(self._synced, target)

    def _expire(self) -> None:
        # at most once a second (monotonic: a clock stepped back must not stop the expiry for
        # as long), so a storm stays O(1) per request
        if time.monotonic() < self._next_expiry:
            return
        with self._sync_lock, self._lock:  # the rewrite swaps the descriptor _sync uses
            if self._closed or time.monotonic() < self._next_expiry:
                return
            self._next_expiry = time.monotonic() + 1.0
            horizon = self._wall() - self.window_s
            for mac in [m for m, t in self._seen.items() if t < horizon]:
                self._forgot(self._seen.pop(mac))
            if self.path is not None and self._lines > 2 * len(self._seen) + 64:
                try:
                    self._rewrite()
                except OSError as exc:  # the append-only file stays valid; compacted next time
                    log.warning("cannot compact %s: %s", self.path, exc)

    def close(self) -> None:
        with self._sync_lock, self._lock:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __len__(self) -> int:
        return len(self._seen)
