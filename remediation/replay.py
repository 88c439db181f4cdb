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
it would be refused as stale, whatever steps that clock took in between.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

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
        self._lines = 0
        self._next_expiry = 0.0
        self._lock = threading.Lock()
        if self.path is not None:
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        now = self._wall()
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            text = ""
        for line in text.splitlines():
            try:
                entry = json.loads(line)
                t, mac = int(entry["t"]), str(entry["mac"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: it was never acted on (written before acting)
            if t >= now - self.window_s:
                self._seen[mac] = t
        self._rewrite()
        if self._seen:
            log.info("remembering %d signatures from before the restart", len(self._seen))

    def _rewrite(self) -> None:
        assert self.path is not None
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for mac, t in self._seen.items():
                f.write(json.dumps({"t": t, "mac": mac}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._lines = len(self._seen)

    def seen(self, mac: str) -> bool:
        with self._lock:
            return mac in self._seen

    def remember(self, mac: str, t: int) -> bool:
        """Remember ``mac`` (signed at ``t``): False if it was seen before (a replay); True
        once it is durable. :class:`ReplayError` if it cannot be written."""
        with self._lock:
            if mac in self._seen:
                return False
            if self.path is not None:
                try:
                    with open(self.path, "a", encoding="utf-8") as f:
                        f.write(json.dumps({"t": t, "mac": mac}) + "\n")
                        f.flush()
                        os.fsync(f.fileno())
                except OSError as exc:
                    raise ReplayError(f"cannot remember the signature: {exc}") from None
                self._lines += 1
            self._seen[mac] = t
            self._expire()
            return True

    def _expire(self) -> None:
        # at most once a second (monotonic: a clock stepped back must not stop the expiry for
        # as long), so a storm stays O(1) per request
        if time.monotonic() < self._next_expiry:
            return
        self._next_expiry = time.monotonic() + 1.0
        horizon = self._wall() - self.window_s
        for mac in [m for m, t in self._seen.items() if t < horizon]:
            del self._seen[mac]
        if self.path is not None and self._lines > 2 * len(self._seen) + 64:
            try:
                self._rewrite()
            except OSError as exc:  # the append-only file stays valid; compacted next time
                log.warning("cannot compact %s: %s", self.path, exc)

    def __len__(self) -> int:
        return len(self._seen)
