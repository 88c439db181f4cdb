"""Helpers shared by the remediation tests and benchmark: findings, a recording adapter, polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from collector.finding import Finding, Severity
from remediation.model import Action, ActionKind, Inventory, Outcome, Status

T = TypeVar("T")


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


class RecordingAdapter:
    """A scheduler that keeps its state in memory and records every call that changes it."""

    def __init__(self, name: str, nodes: dict[str, str] | None = None) -> None:
        self.name = name
        self.actions = frozenset(ActionKind)
        self.partitions = dict(nodes or {})
        self.out: set[str] = set()
        self.calls: list[Action] = []
        self.max_out_seen = 0
        self._lock = threading.Lock()

    def inventory(self) -> Inventory:
        with self._lock:
            return Inventory(dict(self.partitions), frozenset(self.out))

    def describe(self, action: Action) -> str:
        return f"{action.kind} {action.node}"

    def perform(self, action: Action) -> Outcome:
        with self._lock:
            self.calls.append(action)
            if action.kind in (ActionKind.CORDON, ActionKind.DRAIN):
                self.out.add(action.node)
            elif action.kind is ActionKind.UNCORDON:
                self.out.discard(action.node)
            self.max_out_seen = max(self.max_out_seen, len(self.out))
        return Outcome(Status.OK, self.describe(action))
