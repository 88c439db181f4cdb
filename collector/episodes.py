"""Hysteresis for repeated events: one finding per episode, with a count, not one per line.

A flapping InfiniBand port goes down and up every few seconds; an NFS server that stops
answering logs "not responding, still trying" dozens of times a minute. A finding for each
would flood the engine and the pager with the same news. So each kind of event on each thing
(a port, a server, a device) is an **episode**:

* it opens at the first event; its finding is due once ``threshold`` events have fallen within
  ``window_s`` of each other (``threshold = 1``: at the first event);
* every later event in the episode is only counted (its point is still written: nothing is
  lost, only the finding is not repeated);
* it closes after ``recovery_s`` with no event (or when the source sees the thing recover, e.g.
  "nfs: server X OK"); the next event opens a new episode, which may warn again.

A storm is one episode however long it lasts: once its finding is out, its memory is a count,
not a time per event (a GPU can log XID 95 hundreds of thousands of times).

This is the shape gpud gives InfiniBand flaps (a count of flaps within a window, then quiet for
a while before it says so again). Not thread-safe: each source owns its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

NS = 1_000_000_000


@dataclass
class Episode:
    first_ns: int
    last_ns: int
    count: int = 0
    said: bool = False
    said_ns: int = 0
    recent: deque[int] = field(default_factory=deque)


class Episodes:
    def __init__(
        self,
        *,
        threshold: int = 1,
        window_s: float = 600.0,
        recovery_s: float = 600.0,
        resend_s: float = 0.0,
    ):
        """``resend_s`` > 0: an episode still going on is due again every ``resend_s`` (a
        finding lost on its way, or a plan that expired, is not the last word on a storm)."""
        if threshold < 1 or window_s <= 0 or recovery_s <= 0 or resend_s < 0:
            raise ValueError("threshold must be at least 1, window_s and recovery_s positive")
        self.resend_ns = int(resend_s * NS)
        self.threshold = threshold
        self.window_ns = int(window_s * NS)
        self.recovery_ns = int(recovery_s * NS)
        self.open: dict[Hashable, Episode] = {}

    def event(self, key: Hashable, now_ns: int, n: int = 1) -> Episode | None:
        """``n`` events of ``key`` at ``now_ns``; the episode when its finding is due now (the
        first time it reaches the threshold), else None."""
        self.expire(now_ns)
        ep = self.open.get(key)
        if ep is None:
            ep = self.open[key] = Episode(now_ns, now_ns)
        ep.last_ns = now_ns
        ep.count += n
        if ep.said:  # told already: a storm (an XID 100,000 times) keeps a count, no times
            if self.resend_ns and now_ns - ep.said_ns >= self.resend_ns:
                ep.said_ns = now_ns
                return ep
            return None
        ep.recent.extend([now_ns] * n)
        while ep.recent and now_ns - ep.recent[0] > self.window_ns:
            ep.recent.popleft()
        if not ep.said and len(ep.recent) >= self.threshold:
            ep.said, ep.said_ns = True, now_ns
            return ep
        return None

    def recovered(self, key: Hashable) -> Episode | None:
        """``key`` says it is well again: its episode closes (returned, if there was one)."""
        return self.open.pop(key, None)

    def expire(self, now_ns: int) -> list[tuple[Hashable, Episode]]:
        """Close the episodes quiet for longer than ``recovery_s``; they are returned."""
        done = [(k, e) for k, e in self.open.items() if now_ns - e.last_ns > self.recovery_ns]
        for k, _ in done:
            del self.open[k]
        return done
