"""Helpers shared by the remediation tests and benchmark: findings and polling. The in-memory
scheduler they act on is :class:`testbed.scheduler.RecordingAdapter`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from gpuwarden.core.finding import Finding, Severity
from testbed.scheduler import RecordingAdapter

__all__ = ["RecordingAdapter", "passed_check", "poll", "risk"]

T = TypeVar("T")


def passed_check(node: str) -> Finding:
    """The node's agent says it is healthy, with a check that passed just now (CONSTRUCTED)."""
    now = time.time_ns()
    return Finding(kind="node_healthy", subject={"cluster": "test", "node": node},
                   severity=Severity.INFO, time_ns=now,
                   evidence={"check": "pass", "checked_ns": now}, source="agent")  # fmt: skip


def risk(node: str, probability: float = 0.93, t_ns: int | None = None, **subject: str) -> Finding:
    """A failure-risk finding as the predictor's scorer emits it (SIMULATED numbers)."""
    return Finding(
        kind="failure_risk",
        subject={"cluster": "test", "node": node, "gpu": "3", **subject},
        severity=Severity.WARNING,
        time_ns=time.time_ns() if t_ns is None else t_ns,
        evidence={"ecc_sbe_growth": 41.0},
        probability=probability,
        summary=f"{node} GPU 3: {probability:.0%} risk of a hardware failure within 120 min",
        source="analytics",
    )


def poll(check: Callable[[], T | None], timeout_s: float, what: str, every_s: float = 0.2) -> T:
    """Wait for ``check`` to return something truthy (a guard against hangs, not a speed limit)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class HandClock:
    """Wall and monotonic time, driven by hand: :meth:`advance` lets time pass (both move),
    :meth:`step` steps the wall clock only (an operator, or NTP without slewing)."""

    def __init__(self, wall: float = 1_800_000_000.0, mono: float = 1_000.0) -> None:
        self.wall_s, self.mono_s = wall, mono

    def wall(self) -> float:
        return self.wall_s

    def mono(self) -> float:
        return self.mono_s

    def advance(self, s: float) -> None:
        self.wall_s += s
        self.mono_s += s

    def step(self, s: float) -> None:
        self.wall_s += s

    def restart(self, down_s: float, step_s: float = 0.0) -> None:
        """The engine is down ``down_s`` (the wall clock stepped by ``step_s`` meanwhile) and a
        new process starts: its monotonic clock has another origin."""
        self.wall_s += down_s + step_s
        self.mono_s = 7.0
