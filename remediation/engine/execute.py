"""Executing: a plan's actions run in order on a small thread pool, each audited with its
outcome and timings, so a checkpoint that takes a minute on one node does not hold up a fatal
XID on another.

Every action is idempotent: its id (finding, step, adapter, node, job) is done at most once,
across restarts (the audit log remembers). A removing action (cordon, drain) that fails stops
the rest of its ladder; an adapter that raises anything is a failed action, never a dead engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.remediation.audit import AuditLog, Memory
from gpuwarden.remediation.engine.decide import Decision
from gpuwarden.remediation.model import (
    MUTATING,
    REMOVING,
    Action,
    ActionKind,
    Adapter,
    AdapterError,
    Outcome,
    Status,
)

log = logging.getLogger("gpuwarden.remediation.engine")

OnAction = Callable[[Action, Outcome, dict[str, Any]], None]


@dataclass
class Stats:
    findings: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)


class Executor:
    def __init__(
        self,
        adapters: Mapping[str, Adapter],
        audit: AuditLog,
        memory: Memory,
        stats: Stats,
        lock: threading.RLock,
        *,
        workers: int,
        clock: Callable[[], float],
        on_action: OnAction | None = None,
        before_requeue: Callable[[str], object] | None = None,
        before_uncordon: Callable[[Action], Outcome | None] | None = None,
    ) -> None:
        self.adapters = adapters
        self.before_requeue = before_requeue
        self.before_uncordon = before_uncordon
        self.audit = audit
        self.memory = memory
        self.stats = stats
        self.clock = clock
        self.on_action = on_action
        self._lock = lock  # the engine's: memory and stats are shared with deciding
        self._futures: list[Future[None]] = []
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="remediate")

    def start(
        self,
        d: Decision,
        received: float,
        *,
        dry_run: bool,
        done: Callable[[], None] | None = None,
    ) -> None:
        """Run ``d``'s actions in the background; ``done`` is called when they have finished."""
        future = self._pool.submit(self._run, d, received, dry_run, done)
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()] + [future]

    def _run(
        self, d: Decision, received: float, dry_run: bool, done: Callable[[], None] | None
    ) -> None:
        try:
            for action in d.actions:
                outcome = self.perform(action, received, dry_run)
                if action.kind in REMOVING and not outcome.ok:
                    log.error(
                        "%s on %s failed; the rest of the ladder is skipped",
                        action.kind,
                        action.node,
                    )
                    break
        finally:
            if done is not None:
                done()

    def perform(self, action: Action, received: float, dry_run: bool) -> Outcome:
        started = self.clock()
        adapter = self.adapters[action.adapter]
        if action.id in self.memory.done_actions:
            outcome = Outcome(Status.SKIPPED, "already done (idempotent)")
        elif action.kind not in adapter.actions:
            outcome = Outcome(Status.SKIPPED, f"{adapter.name} has no {action.kind} (not needed)")
        elif dry_run and action.kind in MUTATING:
            outcome = Outcome(Status.DRY_RUN, "would " + adapter.describe(action))
        else:
            if action.kind is ActionKind.REQUEUE and self.before_requeue is not None:
                self.before_requeue(action.node)  # a hot spare back in service first
            refused = None
            if action.kind is ActionKind.UNCORDON and self.before_uncordon is not None:
                refused = self.before_uncordon(action)  # the return check, where configured
            try:
                outcome = refused or adapter.perform(action)
            except AdapterError as exc:
                outcome = Outcome(Status.FAILED, str(exc))
            except Exception as exc:  # an adapter bug must not take the engine down
                log.exception("adapter %s crashed on %s", adapter.name, action.kind)
                outcome = Outcome(Status.FAILED, f"adapter error: {exc!r}")
        ended = self.clock()
        record = self.audit.append(
            "action",
            ended,
            **action.to_json(),
            dry_run=dry_run and action.kind in MUTATING,
            outcome=str(outcome.status),
            message=outcome.message,
            details=dict(outcome.details),
            started=round(started, 6),
            duration_s=round(ended - started, 6),
            since_finding_s=round(ended - received, 6),
        )
        with self._lock:
            self.memory.note_action(record)
            key = f"{action.kind}:{outcome.status}"
            self.stats.actions[key] = self.stats.actions.get(key, 0) + 1
        if self.on_action is not None:
            self.on_action(action, outcome, record)
        return outcome

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every started plan has finished; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                futures = [f for f in self._futures if not f.done()]
            if not futures:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            try:
                futures[0].exception(timeout=remaining)
            except TimeoutError:
                return False

    def shutdown(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)
