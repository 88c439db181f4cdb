"""The engine's two clocks: monotonic time for every timer, wall time only for timestamps.

Every timer of the engine (the per-node cooldown, the rate limit's minute, the lemon window,
how long a plan has waited, the endpoint's quotas, the caches' time to live) measures elapsed
time on :attr:`Clock.mono`, which no clock step moves. Wall time (:attr:`Clock.wall`) is
written into the records (``t`` and ``time`` in the audit log) and compared with other hosts'
clocks (a finding's ``time_ns``, a signature's timestamp, a node check's ``checked_ns``).

Across a restart only wall time exists: the journal's records carry ``t``. On start the engine
reads the clocks once (:meth:`Clock.journal_frame`) and places each record in this process's
monotonic frame: ``mono = mono_now - max(0, wall_now - t)``. From then on no wall-clock step
moves any timer. What remains is the time the engine was down: a step while it was down is
seen as elapsed time (a clock stepped forward an hour while it was stopped ends cooldowns an
hour early), and a record "from the future" (the clock stepped back since it was written) is
placed at the start, never later: its timers run from the restart, whole.

A test or a backtest injects its own clock: ``Clock(wall=..., mono=...)``, or
:meth:`Clock.simulated` where one simulated time serves as both (a backtest's time is both the
records' timestamps and what its timers measure).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Instant:
    """One moment as both clocks read it: ``wall`` (Unix seconds, for records and for
    comparison with other hosts) and ``mono`` (seconds in this process's monotonic frame, for
    elapsed time)."""

    wall: float
    mono: float


@dataclass(frozen=True)
class Clock:
    wall: Callable[[], float] = time.time
    mono: Callable[[], float] = time.monotonic

    @classmethod
    def simulated(cls, now: Callable[[], float]) -> Clock:
        """One simulated time for both clocks (a backtest, a test that drives time by hand)."""
        return cls(now, now)

    @classmethod
    def of(cls, clock: Clock | Callable[[], float]) -> Clock:
        """``clock`` itself, or a bare callable as :meth:`simulated` (how the engine took a
        clock before it had two)."""
        return clock if isinstance(clock, Clock) else cls.simulated(clock)

    def now(self) -> Instant:
        return Instant(self.wall(), self.mono())

    def journal_frame(self) -> Callable[[float], float]:
        """Places a journal record's wall time ``t`` in this process's monotonic frame, the
        clocks read once, now: ``mono_now - max(0, wall_now - t)``. A record from the future
        (the wall clock stepped back since it was written) is placed at now."""
        wall_now, mono_now = self.wall(), self.mono()

        def to_mono(t: float) -> float:
            return mono_now - max(0.0, wall_now - t)

        return to_mono


SYSTEM = Clock()
"""The host's clocks: :func:`time.time` and :func:`time.monotonic`."""
