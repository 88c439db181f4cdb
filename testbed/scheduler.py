"""An in-memory scheduler behind the remediation adapter interface, for tests and benchmarks.

It keeps which nodes are out and records every call that changes them, so a test can assert
exactly what the engine asked for (and that the blast radius was never exceeded:
:attr:`RecordingAdapter.max_out_seen`). The real schedulers are :mod:`testbed.slurm` (a real
Slurm) and :mod:`testbed.k8s` (a Kubernetes API fake).
"""

from __future__ import annotations

import threading

from gpuwarden.remediation.model import Action, ActionKind, Inventory, Outcome, Status


class RecordingAdapter:
    """A scheduler that keeps its state in memory and records every call that changes it."""

    def __init__(self, name: str, nodes: dict[str, str] | None = None) -> None:
        """``nodes`` maps each node the scheduler has to its partition; without it the
        scheduler takes any node name (its inventory does not list them all)."""
        self.name = name
        self.lists_all = nodes is not None
        self.actions = frozenset(ActionKind)
        self.partitions = dict(nodes or {})
        self.out: set[str] = set()
        self.calls: list[Action] = []
        self.max_out_seen = 0
        self._lock = threading.Lock()

    def inventory(self) -> Inventory:
        with self._lock:
            return Inventory(dict(self.partitions), frozenset(self.out), lists_all=self.lists_all)

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
