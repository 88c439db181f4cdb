"""The remediation engine: findings in, guarded actions out, every step in the audit log.

``submit(finding)`` decides at once (under one lock, so two findings never both take the last
node the blast-radius limit allows) and runs the chosen ladder on a small thread pool, so a
checkpoint that takes a minute on one node does not hold up a fatal XID on another.

Guards, in the order they are checked:

1. **de-duplication** by finding id (ids are stable per kind, subject and time bucket; the
   audit log remembers them across restarts): a repeat is answered ``duplicate``, nothing runs;
2. **approval**: a plan with an action kind listed in ``approval`` waits for an operator
   (``approve``), who is notified (and who may overrule the cooldown);
3. **cooldown** per node: a node acted on (by another finding) in the last ``cooldown_s`` gets
   only a notification (putting a repaired node back is exempt: it disrupts nothing);
   and a policy's ``uncordon`` only touches nodes gpuwarden itself took out (``not_ours``
   otherwise: an admin's maintenance drain is the admin's to end);
4. **blast radius**: a plan that would take a node out when ``max_nodes_out`` nodes (or
   ``max_fraction_out`` of the node's partition) are already out (by anyone: the scheduler's
   own view, plus plans in flight) is queued, and a person is told; it runs by itself when
   room frees (``tick``);
5. **rate limit**: at most ``actions_per_minute`` target-changing actions; beyond, queued;
6. **dry-run** (the default): the decision and each action are audited with what would have
   been done; no adapter is asked to change anything.

Every action is idempotent: its id (finding, step, adapter, node, job) is done at most once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from core.finding import Finding, Severity
from remediation.audit import AuditLog, Memory, replay
from remediation.errors import RemediationError
from remediation.model import (
    MUTATING,
    REMOVING,
    Action,
    ActionKind,
    Adapter,
    AdapterError,
    Inventory,
    Outcome,
    Scheduler,
    Status,
)
from remediation.policy import Policy, first_match

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSettings:
    dry_run: bool = True
    max_nodes_out: int = 2
    max_fraction_out: float = 0.1
    cooldown_s: float = 1800.0
    actions_per_minute: int = 20
    approval: tuple[str, ...] = ("uncordon",)
    notify_adapter: str = "webhook"
    checkpoint_adapter: str = "slurm"
    node_adapter: str = "slurm"
    workers: int = 4


@dataclass(frozen=True)
class Decision:
    finding_id: str
    verdict: str
    """``act``, ``dry_run``, ``duplicate``, ``no_policy``, ``cooldown``, ``not_ours``,
    ``approval``, ``blast_radius``, ``rate_limited`` or ``failed`` (no such adapter)."""
    policy: str = ""
    actions: tuple[Action, ...] = ()
    why: str = ""

    @property
    def plan_id(self) -> str:
        return self.finding_id


@dataclass
class _Pending:
    finding: Finding
    decision: Decision
    received: float


@dataclass
class _Stats:
    findings: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)


class EngineClosedError(RemediationError, RuntimeError):
    """The engine was closed before this call: nothing was recorded or done, so the same
    finding (or approval, or undo) can be sent again to a running engine."""


class Engine:
    def __init__(
        self,
        policies: Sequence[Policy],
        adapters: Mapping[str, Adapter],
        audit: AuditLog,
        settings: EngineSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        on_action: Callable[[Action, Outcome, dict[str, Any]], None] | None = None,
    ) -> None:
        self.policies = list(policies)
        self.adapters = dict(adapters)
        self.audit = audit
        self.settings = settings or EngineSettings()
        self.clock = clock
        self.on_action = on_action
        self.memory: Memory = replay(audit.path)
        if self.memory.torn_lines:
            log.warning("audit log %s: skipped torn lines %s", audit.path, self.memory.torn_lines)
        self.stats = _Stats()
        self._lock = threading.RLock()
        self._closed = False
        # nodes that plans in flight are taking out, counted per plan: one plan finishing must
        # not free a node another plan is still about to drain
        self._reserved: Counter[str] = Counter()
        self._recent: deque[float] = deque()
        self._pending: dict[str, _Pending] = {}
        self._futures: list[Future[None]] = []
        self._pool = ThreadPoolExecutor(self.settings.workers, thread_name_prefix="remediate")

    # -- deciding -----------------------------------------------------------------------------

    def submit(self, finding: Finding) -> Decision:
        """Decide on a finding now; its actions run in the background (see :meth:`wait`)."""
        received = self.clock()
        with self._lock:
            self._require_open()
            self.stats.findings += 1
            if finding.id in self.memory.seen_findings:
                return self._decide(finding, Decision(finding.id, "duplicate"), received)
            self.memory.seen_findings.add(finding.id)
            self.audit.append(
                "finding",
                received,
                finding_id=finding.id,
                kind=finding.kind,
                severity=str(finding.severity),
                subject=dict(finding.subject),
                probability=finding.probability,
                confidence=finding.confidence,
                summary=finding.summary,
                source=finding.source,
                finding_time_ns=finding.time_ns,
            )
            policy = first_match(self.policies, finding)
            if policy is None:
                return self._decide(finding, Decision(finding.id, "no_policy"), received)
            plan = tuple(self._action(kind, finding) for kind in policy.actions)
            missing = sorted({a.adapter for a in plan} - set(self.adapters))
            if missing:
                why = f"no adapter configured for {missing}"
                return self._decide(
                    finding, Decision(finding.id, "failed", policy.name, plan, why), received
                )
            decision = self._guard(finding, Decision(finding.id, "act", policy.name, plan))
            return self._decide(finding, decision, received)

    def _action(self, kind: ActionKind, finding: Finding) -> Action:
        s = self.settings
        adapter = {ActionKind.NOTIFY: s.notify_adapter, ActionKind.CHECKPOINT: s.checkpoint_adapter}
        return Action(
            kind=kind,
            adapter=adapter.get(kind, s.node_adapter),
            node=finding.subject.get("node", ""),
            cluster=finding.subject.get("cluster", ""),
            job=finding.subject.get("job", ""),
            finding_id=finding.id,
            reason=f"gpuwarden: {finding.summary or finding.kind} [{finding.id[:12]}]",
            severity=str(finding.severity),
            params={"kind": finding.kind, "subject": dict(finding.subject)},
        )

    def _guard(self, finding: Finding, d: Decision, *, approved: bool = False) -> Decision:
        s = self.settings
        node = finding.subject.get("node", "")
        mutating = [a for a in d.actions if a.kind in MUTATING]
        notify_only = tuple(a for a in d.actions if a.kind is ActionKind.NOTIFY)
        undo_only = bool(mutating) and all(a.kind is ActionKind.UNCORDON for a in mutating)
        if undo_only and not approved and node not in self.memory.taken_out:
            why = f"gpuwarden did not take {node} out; whoever did decides when it returns"
            return Decision(d.finding_id, "not_ours", d.policy, notify_only, why)
        if not approved and any(str(a.kind) in s.approval for a in mutating):
            kinds = [str(a.kind) for a in mutating]
            why = (
                f"{kinds} on {node or 'subject'} wait for approval: "
                f"gpuwarden-remediate approve {d.plan_id}"
            )
            return Decision(d.finding_id, "approval", d.policy, d.actions, why)
        if node and mutating and not undo_only:  # putting a repaired node back disrupts nothing
            last = self.memory.last_action_at.get(node)
            if last is not None and self.clock() - last < s.cooldown_s and not approved:
                ago = self.clock() - last
                why = f"{node} was acted on {ago:.0f} s ago (cooldown {s.cooldown_s:.0f} s)"
                return Decision(d.finding_id, "cooldown", d.policy, notify_only, why)
        if any(a.kind in REMOVING for a in mutating):
            blocked = self._blast_radius(node)
            if blocked:
                return Decision(d.finding_id, "blast_radius", d.policy, d.actions, blocked)
        now = self.clock()
        while self._recent and now - self._recent[0] > 60.0:
            self._recent.popleft()
        if mutating and len(self._recent) + len(mutating) > s.actions_per_minute:
            why = f"more than {s.actions_per_minute} actions a minute"
            return Decision(d.finding_id, "rate_limited", d.policy, d.actions, why)
        return Decision(d.finding_id, "dry_run" if s.dry_run else "act", d.policy, d.actions)

    def _inventory(self) -> Inventory:
        adapter = self.adapters.get(self.settings.node_adapter)
        if isinstance(adapter, Scheduler):
            try:
                return adapter.inventory()
            except AdapterError as exc:
                log.error("inventory from %s failed: %s", adapter.name, exc)
                raise
        return Inventory({}, frozenset(self.memory.taken_out))

    def _blast_radius(self, node: str) -> str:
        """Why taking ``node`` out would break the limit, or ``""``."""
        try:
            inv = self._inventory()
        except AdapterError as exc:
            return f"cannot tell how many nodes are out ({exc}); not taking {node} out blind"
        out = set(inv.out) | {n for n, c in self._reserved.items() if c > 0}
        if node in out:
            return ""
        s = self.settings
        if len(out) + 1 > s.max_nodes_out:
            return (
                f"{len(out)} nodes already out {sorted(out)}; limit max_nodes_out={s.max_nodes_out}"
            )
        partition = inv.partitions.get(node)
        if partition:
            size = inv.partition_size(partition)
            in_part = sum(1 for n in out if inv.partitions.get(n) == partition)
            if (in_part + 1) / size > s.max_fraction_out + 1e-9:
                return (
                    f"{in_part} of {size} nodes of partition {partition} already out; one more "
                    f"exceeds max_fraction_out={s.max_fraction_out}"
                )
        return ""

    def _decide(self, finding: Finding, d: Decision, received: float) -> Decision:
        self.stats.decisions[d.verdict] = self.stats.decisions.get(d.verdict, 0) + 1
        self.audit.append(
            "decision",
            self.clock(),
            finding_id=d.finding_id,
            verdict=d.verdict,
            policy=d.policy,
            actions=[str(a.kind) for a in d.actions],
            node=finding.subject.get("node", ""),
            why=d.why,
        )
        if d.verdict in ("act", "dry_run", "cooldown", "not_ours"):
            reserved = ""
            if d.verdict in ("act", "dry_run") and any(a.kind in REMOVING for a in d.actions):
                reserved = finding.subject.get("node", "")
                self._reserved[reserved] += 1
            self._recent.extend([self.clock()] * sum(a.kind in MUTATING for a in d.actions))
            self._start(d, received, dry_run=d.verdict == "dry_run", reserved=reserved)
        elif d.verdict in ("approval", "blast_radius", "rate_limited"):
            self._pending[d.plan_id] = _Pending(finding, d, received)
            self._escalate(finding, d)
        return d

    def _escalate(self, finding: Finding, d: Decision) -> None:
        """Tell a person why a plan waits (a notification outside the plan's own ladder)."""
        if self.settings.notify_adapter not in self.adapters:
            log.warning("plan %s waits (%s): %s", d.plan_id, d.verdict, d.why)
            return
        action = Action(
            kind=ActionKind.NOTIFY,
            adapter=self.settings.notify_adapter,
            node=finding.subject.get("node", ""),
            cluster=finding.subject.get("cluster", ""),
            finding_id=f"{finding.id}:{d.verdict}",
            reason=f"gpuwarden needs a human ({d.verdict}): {d.why}",
            severity="critical",
            params={"kind": finding.kind, "subject": dict(finding.subject), "plan": d.plan_id},
        )
        self._start(
            Decision(finding.id, "escalate", d.policy, (action,)), self.clock(), dry_run=False
        )

    # -- operators ----------------------------------------------------------------------------

    def pending(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "plan_id": p.decision.plan_id,
                    "verdict": p.decision.verdict,
                    "why": p.decision.why,
                    "node": p.finding.subject.get("node", ""),
                    "actions": [str(a.kind) for a in p.decision.actions],
                    "since": p.received,
                }
                for p in self._pending.values()
            ]

    def approve(self, plan_id: str, by: str = "operator") -> Decision:
        """Run a plan that waits for approval (the other guards still apply, except cooldown)."""
        with self._lock:
            self._require_open()
            pending = self._pending.pop(plan_id, None)
            if pending is None:
                raise KeyError(f"no pending plan {plan_id!r}")
            self.audit.append("approval", self.clock(), finding_id=plan_id, by=by)
            d = self._guard(pending.finding, pending.decision, approved=True)
            return self._decide(pending.finding, d, pending.received)

    def undo(self, node: str, by: str = "operator", *, force: bool = False) -> Decision:
        """Put a node gpuwarden took out back in service (``force``: one it did not take out)."""
        with self._lock:
            self._require_open()
            if node not in self.memory.taken_out and not self._reserved[node] and not force:
                raise KeyError(f"{node} was not taken out by gpuwarden; use force to resume it")
            finding = Finding(
                kind="operator_undo",
                subject={"node": node},
                severity=Severity.INFO,
                time_ns=time.time_ns(),
                summary=f"{by} puts {node} back in service",
                source=by,
                bucket_s=1,
            )
            action = self._action(ActionKind.UNCORDON, finding)
            self.audit.append("undo", self.clock(), finding_id=finding.id, node=node, by=by)
            d = Decision(
                finding.id, "dry_run" if self.settings.dry_run else "act", "undo", (action,)
            )
            return self._decide(finding, d, self.clock())

    def tick(self) -> list[Decision]:
        """Release queued plans the blast radius or the rate limit now allows (oldest first)."""
        released = []
        with self._lock:
            self._require_open()
            for plan_id, p in sorted(self._pending.items(), key=lambda kv: kv[1].received):
                if p.decision.verdict not in ("blast_radius", "rate_limited"):
                    continue
                d = self._guard(p.finding, p.decision, approved=True)
                if d.verdict in ("act", "dry_run"):
                    del self._pending[plan_id]
                    released.append(self._decide(p.finding, d, p.received))
        return released

    # -- acting -------------------------------------------------------------------------------

    def _start(self, d: Decision, received: float, *, dry_run: bool, reserved: str = "") -> None:
        future = self._pool.submit(self._run, d, received, dry_run, reserved)
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()] + [future]

    def _run(self, d: Decision, received: float, dry_run: bool, reserved: str) -> None:
        try:
            for action in d.actions:
                outcome = self._perform(action, received, dry_run)
                if action.kind in REMOVING and not outcome.ok:
                    log.error(
                        "%s on %s failed; the rest of the ladder is skipped",
                        action.kind,
                        action.node,
                    )
                    break
        finally:
            # after a real drain the scheduler's own view shows the node out; a dry run keeps
            # its reservation so that later decisions see what would have been out
            if reserved and not dry_run:
                with self._lock:
                    self._reserved[reserved] -= 1

    def _perform(self, action: Action, received: float, dry_run: bool) -> Outcome:
        started = self.clock()
        adapter = self.adapters[action.adapter]
        if action.id in self.memory.done_actions:
            outcome = Outcome(Status.SKIPPED, "already done (idempotent)")
        elif action.kind not in adapter.actions:
            outcome = Outcome(Status.SKIPPED, f"{adapter.name} has no {action.kind} (not needed)")
        elif dry_run and action.kind in MUTATING:
            outcome = Outcome(Status.DRY_RUN, "would " + adapter.describe(action))
        else:
            try:
                outcome = adapter.perform(action)
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

    def _require_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the remediation engine is closed: nothing was recorded; retry")

    def close(self) -> None:
        """Refuse new work (:class:`EngineClosedError`), let the plans running finish, stop."""
        with self._lock:
            self._closed = True
        self.wait()
        self._pool.shutdown(wait=True)
