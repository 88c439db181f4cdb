"""Executing: a plan's actions run in order on a small thread pool, each audited with its
outcome and timings, so a checkpoint that takes a minute on one node does not hold up a fatal
XID on another.

Every action is idempotent: its id (finding, step, adapter, node, job) is done at most once,
across restarts (the audit log remembers). A removing action (cordon, drain) that fails stops
the rest of its ladder; an adapter that raises anything is a failed action, never a dead engine.

Write ahead, then act: before an action changes anything its ``intent`` record is on disk
(with what a :class:`~remediation.model.Reconciling` adapter observed just before), and after
it its ``action`` record. A record the disk refuses is retried until it is written (the plan
waits: nothing acts on an intent that is not durable, and an action that was done is never
forgotten inside a worker thread). After a crash between the two, the restarted engine asks
the adapter whether the action took effect before doing it (:meth:`Executor.perform`).

Records carry wall time (``t``, ``started``); the durations in them (``duration_s``,
``since_finding_s``) are measured on the monotonic clock, so a clock step never makes them
negative or an hour long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.remediation.audit import AuditLog, JournalError, Memory
from gpuwarden.remediation.clock import Clock, Instant
from gpuwarden.remediation.engine.decide import Decision
from gpuwarden.remediation.model import (
    MUTATING,
    REMOVING,
    Action,
    ActionKind,
    Adapter,
    AdapterError,
    Outcome,
    Reconciling,
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
        clock: Clock,
        on_action: OnAction | None = None,
        before_requeue: Callable[[str], object] | None = None,
        before_uncordon: Callable[[Action], Outcome | None] | None = None,
        checked_return: Callable[[Action], bool] | None = None,
        return_workers: int = 1,
    ) -> None:
        """``checked_return``: whether ``before_uncordon`` runs a slow check for this action;
        a plan with one runs on a pool of ``return_workers`` threads of its own, so that
        returns waiting on their checks never hold the threads a fault's drain needs."""
        self.adapters = adapters
        self.checked_return = checked_return
        self.before_requeue = before_requeue
        self.before_uncordon = before_uncordon
        self.audit = audit
        self.memory = memory
        self.stats = stats
        self.clock = clock
        self.on_action = on_action
        self._lock = lock  # the engine's: memory and stats are shared with deciding
        # plans not finished: each removes itself when done (a storm's thousands of plans
        # were scanned on every start, under the engine's lock)
        self._futures: set[Future[None]] = set()
        self._futures_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="remediate")
        self._returns = ThreadPoolExecutor(return_workers, thread_name_prefix="remediate-return")
        self._stopping = threading.Event()

    def start(
        self,
        d: Decision,
        received: Instant,
        *,
        dry_run: bool,
        done: Callable[[], None] | None = None,
        resume: bool = False,
    ) -> None:
        """Run ``d``'s actions in the background; ``done`` is called when they have finished.
        ``resume``: a plan from the journal, whose actions already recorded are passed over."""
        # a return waiting on its check (and nothing that takes a node out: a policy's own
        # ladder may hold both, and a drain never waits behind checks)
        checked = self.checked_return
        returning = (
            checked is not None
            and not dry_run
            and any(map(checked, d.actions))
            and not any(a.kind in REMOVING for a in d.actions)
        )
        pool = self._returns if returning else self._pool
        future = pool.submit(self._run, d, received, dry_run, done, resume)
        with self._futures_lock:
            self._futures.add(future)
        future.add_done_callback(self._finished)  # at once if it is done already

    def _finished(self, future: Future[None]) -> None:
        with self._futures_lock:
            self._futures.discard(future)

    def _run(
        self,
        d: Decision,
        received: Instant,
        dry_run: bool,
        done: Callable[[], None] | None,
        resume: bool = False,
    ) -> None:
        try:
            for action in d.actions:
                if resume and action.id in self.memory.recorded:
                    continue  # its outcome was recorded before the stop
                outcome = self.perform(action, received, dry_run)
                if action.kind in REMOVING and not outcome.ok:
                    log.error(
                        "%s on %s failed; the rest of the ladder is skipped",
                        action.kind,
                        action.node,
                    )
                    break
        except JournalError as exc:  # the lease no longer confirmed, or shutting down
            log.error("plan for %s stopped: %s (its intents are reconciled on the next start, "
                      "by whichever engine then acts)", d.finding_id, exc)  # fmt: skip
        finally:
            if done is not None:
                done()

    def perform(self, action: Action, received: Instant, dry_run: bool) -> Outcome:
        started = self.clock.now()
        adapter = self.adapters.get(action.adapter)
        resumed = {}
        if action.id in self.memory.done_actions:
            outcome = Outcome(Status.SKIPPED, "already done (idempotent)")
        elif adapter is None:  # a notification with notify_adapter = "" (Engine.submit); or a
            # plan resumed after a restart whose configuration dropped an adapter it names
            outcome = (
                Outcome(Status.SKIPPED, "no notification adapter ([engine] notify_adapter)")
                if action.kind is ActionKind.NOTIFY
                else Outcome(Status.FAILED, f"no adapter {action.adapter!r} configured")
            )
        elif action.kind not in adapter.actions:
            outcome = Outcome(Status.SKIPPED, f"{adapter.name} cannot {action.kind}: skipped")
        elif dry_run and action.kind in MUTATING:
            outcome = Outcome(Status.DRY_RUN, "would " + adapter.describe(action))
        elif (done := self._reconciled(adapter, action)) is not None:
            outcome, resumed = done, {"resumed": "reconciled"}
        else:
            if action.kind in MUTATING:
                self._intent(adapter, action)
                resumed = {"resumed": "redone"} if action.id in self.memory.intents else {}
            if action.kind is ActionKind.REQUEUE and self.before_requeue is not None:
                self.before_requeue(action.node)  # a hot spare back in service first
            refused = None
            if action.kind is ActionKind.UNCORDON and self.before_uncordon is not None:
                refused = self.before_uncordon(action)  # the return check, where configured
            if refused is None and action.kind in MUTATING and self.audit.fence is not None:
                # the intent went to disk under a confirmed lease; confirm it again just before
                # acting (a pause since, and the standby may hold it now): if not, nothing is
                # done here and the intent is reconciled by whoever holds the lease
                self.audit.fence()
            try:
                outcome = refused or adapter.perform(action)
            except AdapterError as exc:
                outcome = Outcome(Status.FAILED, str(exc))
            except Exception as exc:  # an adapter bug must not take the engine down
                log.exception("adapter %s crashed on %s", adapter.name, action.kind)
                outcome = Outcome(Status.FAILED, f"adapter error: {exc!r}")
        ended = self.clock.now()
        record = self._durable(
            "action",
            ended.wall,
            **action.to_json(),
            dry_run=dry_run and action.kind in MUTATING,
            outcome=str(outcome.status),
            message=outcome.message,
            details=dict(outcome.details),
            started=round(started.wall, 6),
            duration_s=round(ended.mono - started.mono, 6),
            since_finding_s=round(ended.mono - received.mono, 6),
            # a prediction's removal: how long it holds the node (remediation.holds reads it)
            **({"hold_s": action.params["hold_s"]} if "hold_s" in action.params else {}),
            **resumed,
        )
        with self._lock:
            self.memory.note_action(record, ended.mono)
            key = f"{action.kind}:{outcome.status}"
            self.stats.actions[key] = self.stats.actions.get(key, 0) + 1
        if self.on_action is not None:
            self.on_action(action, outcome, record)
        return outcome

    def _reconciled(self, adapter: Adapter, action: Action) -> Outcome | None:
        """After a restart, an action whose intent is on disk but whose record is not: its
        outcome if the adapter shows it took effect (recorded now, not repeated), else None."""
        intent = self.memory.intents.get(action.id)
        if intent is None or not isinstance(adapter, Reconciling):
            return None
        try:
            outcome = adapter.reconcile(action, dict(intent.get("before") or {}))
        except AdapterError as exc:
            log.warning("cannot tell whether %s on %s took effect: %s", action.kind, action.node,
                        exc)  # fmt: skip
            return None
        if outcome is not None:
            log.warning("%s on %s was done before the restart; recorded now", action.kind,
                        action.node or action.job)  # fmt: skip
        return outcome

    def _intent(self, adapter: Adapter, action: Action) -> None:
        """The intent to do ``action``, durable before it is done."""
        before: dict[str, Any] = {}
        if isinstance(adapter, Reconciling):
            try:
                before = adapter.observe(action)
            except AdapterError as exc:  # perform will say what is wrong, if anything is
                log.warning("cannot observe %s before %s: %s", action.node, action.kind, exc)
        self._durable("intent", self.clock.wall(), action_id=action.id, action=str(action.kind),
                      node=action.node, job=action.job, finding_id=action.finding_id,
                      before=before)  # fmt: skip

    def _durable(self, event: str, t: float, **record: Any) -> dict[str, Any]:
        """Append a record, retrying while the disk refuses it (full, read-only): the plan
        waits rather than act without its intent or forget what it did. Raises
        :class:`JournalError` only once the engine is shutting down."""
        delay = 0.2
        while True:
            try:
                return self.audit.append(event, t, **record)
            except JournalError as exc:
                if self._stopping.is_set():
                    raise
                log.error("%s; retrying in %.1f s", exc, delay)
                if self._stopping.wait(delay):
                    raise
                delay = min(delay * 2, 5.0)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every started plan has finished; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._futures_lock:
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

    def shutdown(self, journal_grace_s: float = 10.0) -> None:
        """Let running plans finish; a plan that still cannot write its records after
        ``journal_grace_s`` gives up (its intent, if written, is reconciled on the next start)."""
        if not self.wait(journal_grace_s):
            self._stopping.set()
        self.wait()
        self._pool.shutdown(wait=True)
        self._returns.shutdown(wait=True)
