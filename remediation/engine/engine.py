"""The engine: decides on each finding under one lock, so two findings never both take the
last node the blast-radius limit allows, and hands the plan to the executor. See the package
docstring for the whole path; each step is its own module.

Its clock (:class:`remediation.clock.Clock`) has two faces: every timer reads the monotonic
one, every record the wall one; the journal's wall times are placed on the monotonic clock
once, at start. A bare callable (a backtest's simulated time) serves as both."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.names import BadNameError, NodeName, fill_argv
from gpuwarden.remediation.audit import (
    RUNNING_VERDICTS,
    AuditLog,
    JournalError,
    Memory,
    PlanRecord,
    replay,
)
from gpuwarden.remediation.clock import SYSTEM, Clock, Instant
from gpuwarden.remediation.compact import choose, compacted_size, swap, tidy
from gpuwarden.remediation.engine.approve import (
    QUIET,
    SELF_RELEASING,
    WAITING,
    Pending,
    PendingPlans,
)
from gpuwarden.remediation.engine.decide import (
    Decision,
    EngineSettings,
    action_for,
    escalation,
    plan,
)
from gpuwarden.remediation.engine.execute import Executor, OnAction, Stats
from gpuwarden.remediation.engine.guard import Guards
from gpuwarden.remediation.engine.spares import Spares
from gpuwarden.remediation.errors import RemediationError
from gpuwarden.remediation.holds import EXPIRED_KIND, Hold, Holds
from gpuwarden.remediation.model import (
    MUTATING,
    REMOVING,
    Action,
    ActionKind,
    Adapter,
    AdapterError,
    NodeFacts,
    NodeGroups,
    Outcome,
    Status,
)
from gpuwarden.remediation.outcomes import UNDO_REASONS, Outcomes
from gpuwarden.remediation.policy import Policy

log = logging.getLogger("gpuwarden.remediation.engine")
FACTS_TTL_S = 60.0
COMPACT_RETRY_S = 300.0
"""After a compaction failed (a full disk, a lost lease), the next try waits this long."""
OFFER_RETRY_S = 300.0
"""An offer back of a held node that found the queue full is tried again this much later."""
COMPACT_MARGIN_S = 86400.0
"""A finding this much newer than the compacted journal's horizon is still refused: its sender's
clock may run ahead of the engine's."""


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
        clock: Clock | Callable[[], float] = SYSTEM,
        on_action: OnAction | None = None,
        on_outcome: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.policies = list(policies)
        self.adapters = dict(adapters)
        self.audit = audit
        self.settings = settings or EngineSettings()
        self.clock = clock = Clock.of(clock)
        # the journal's wall times on this process's monotonic clock, the clocks read once now
        self._to_mono = clock.journal_frame()
        self.memory: Memory = replay(audit.path, self._to_mono)
        if self.memory.torn_lines:
            log.warning("audit log %s: skipped torn lines %s", audit.path, self.memory.torn_lines)
        if self.settings.seen_retention_s > 0:
            self.memory.forget_seen_before(clock.wall() - self.settings.seen_retention_s)
        latest = clock.wall() - self.settings.journal_retain_s + COMPACT_MARGIN_S
        if self.memory.compacted_horizon > latest:  # compacted while the clock ran ahead
            log.warning(
                "the audit log was compacted up to %.0f, later than this clock allows (%.0f): "
                "the clock ran ahead then; only findings before %.0f count as maybe decided",
                self.memory.compacted_horizon, latest, latest,
            )  # fmt: skip
            self.memory.compacted_horizon = latest
        self.stats = Stats()
        self._lock = threading.RLock()
        self._closed = False
        removing = {p.name for p in self.policies if set(p.actions) & REMOVING}
        self.holds = Holds(removing.__contains__, self.settings.max_prediction_hold_s)
        self.guards = Guards(self.settings, self.adapters, self.memory, clock, self.holds)
        self.waiting = PendingPlans()
        self.executor = Executor(
            self.adapters,
            audit,
            self.memory,
            self.stats,
            self._lock,
            workers=self.settings.workers,
            clock=clock,
            on_action=on_action,
            before_requeue=self._release_spare,
            before_uncordon=self._return_check
            if self.settings.return_requires == "command"
            else None,
            checked_return=self._checks_return
            if self.settings.return_requires == "command"
            else None,
            return_workers=self.settings.return_workers,
        )
        self.spares = Spares(self.settings, self.adapters, self.memory, audit, clock)
        self._facts: dict[str, tuple[float, NodeFacts | None]] = {}
        for p in self.memory.waiting:
            self._restore_waiting(p)
        self.outcomes = Outcomes(
            audit, self.policies, clock, self.settings.outcomes, on_outcome=on_outcome,
            holds=self.holds,
        )  # fmt: skip
        self._compacted_size = compacted_size(Path(audit.path))
        self._compact_retry_at = 0.0
        self._compactor: threading.Thread | None = None
        self._absorb()

    def _node_facts(self, node: str) -> NodeFacts | None:
        """A node's partitions, features and labels from the node adapter, kept for
        ``FACTS_TTL_S`` (a node's groups change rarely); None when they cannot be read."""
        kept = self._facts.get(node)
        now = self.clock.mono()
        if kept is not None and now - kept[0] < FACTS_TTL_S:
            return kept[1]
        adapter = self.adapters.get(self.settings.node_adapter)
        facts = None
        if isinstance(adapter, NodeGroups):
            try:
                facts = adapter.node_facts(node)
            except AdapterError as exc:
                log.warning("cannot tell %s's partitions, features and labels: %s", node, exc)
        self._facts[node] = (now, facts)
        return facts

    # -- deciding -----------------------------------------------------------------------------

    def submit(self, finding: Finding, via: str = "api") -> Decision:
        """Decide on a finding now; its actions run in the background (see :meth:`wait`).
        ``via`` says how it arrived, for the audit (``http, signed`` from the endpoint)."""
        received = self.clock.now()
        with self._lock:
            self._require_open()
            self._absorb()
            self.stats.findings += 1
            if finding.id in self.memory.seen_findings:
                same = self.memory.finding_digests.get(finding.id) == finding.digest
                why = (
                    "received before, same content"
                    if same
                    else "another finding with this id (different content) was received first; "
                    "this one was not acted on"
                )
                d = Decision(finding.id, "duplicate", why=why, same_content=same)
                return self._decide(finding, d, received)
            if (
                self.settings.seen_retention_s <= 0  # `serve` refuses stale findings first
                and self.memory.compacted_horizon > 0  # compacted at all
                and finding.time_ns / 1e9 < self.memory.compacted_horizon + COMPACT_MARGIN_S
            ):
                # the journal was compacted: a finding this old may have been decided, and
                # its id is no longer in it (`remediate apply` keeps every id; the endpoint
                # refuses such a finding as stale before the engine sees it)
                why = (
                    "older than the compacted journal remembers (compacted up to "
                    f"{self.memory.compacted_horizon:.0f}): it may have been decided"
                )
                d = Decision(finding.id, "duplicate", why=why, same_content=False)
                return self._decide(finding, d, received)
            # seen only once its decision is durable (in _decide): a finding whose records a
            # full disk refused (JournalError, 503 at the endpoint) is decided again on re-send
            self.memory.finding_digests[finding.id] = finding.digest
            self.audit.append_unsynced(  # durable with the decision that always follows
                "finding",
                received.wall,
                finding_id=finding.id,
                digest=finding.digest,
                kind=finding.kind,
                severity=str(finding.severity),
                subject=dict(finding.subject),
                probability=finding.probability,
                confidence=finding.confidence,
                summary=finding.summary,
                source=finding.source,
                finding_time_ns=finding.time_ns,
                evidence=dict(finding.evidence),
                bucket_s=finding.bucket_s,
                via=via,
            )
            planned = plan(self.policies, finding, self.settings, self._node_facts)
            if planned is None:
                return self._decide(finding, Decision(finding.id, "no_policy"), received)
            policy, actions = planned
            if (demoted := self.outcomes.demoted.get(policy.name)) is not None and any(
                a.kind in REMOVING for a in actions
            ):
                notify = tuple(a for a in actions if a.kind is ActionKind.NOTIFY) or (
                    action_for(ActionKind.NOTIFY, finding, self.settings),
                )
                why = f"policy {policy.name} is demoted to notify: {demoted}"
                d = Decision(finding.id, "demoted", policy.name, notify, why)
                return self._decide(finding, d, received)
            missing = sorted(
                {a.adapter for a in actions if a.adapter or a.kind is not ActionKind.NOTIFY}
                - set(self.adapters)
            )  # (notify_adapter = "": notifications are skipped, the plan runs)
            if missing:
                why = f"no adapter configured for {missing}"
                return self._decide(
                    finding, Decision(finding.id, "failed", policy.name, actions, why), received
                )
            decision = self.guards.check(finding, Decision(finding.id, "act", policy.name, actions))
            return self._decide(finding, decision, received)

    def _decide(
        self, finding: Finding, d: Decision, received: Instant, *, approved: bool = False
    ) -> Decision:
        """Record the decision (with its whole plan: the journal), then start the plan, or
        keep it waiting and tell a person. Nothing is started unless the record is durable.
        A plan that would wait where too many wait already is not queued (``queue_full``): the
        endpoint answers 503 and the sender tries again later; it is not remembered as seen."""
        node = finding.subject.get("node", "")
        if d.verdict in WAITING:
            s = self.settings
            full = self.waiting.full(finding, s.max_pending_per_node, s.max_pending)
            if full:
                why = f"not queued: {full}; it would have waited for: {d.why}"
                d = Decision(d.finding_id, "queue_full", d.policy, (), why)
                log.warning("plan %s about %s not queued: %s", d.plan_id, node or "-", full)
        self.audit.append(
            "decision",
            self.clock.wall(),
            finding_id=d.finding_id,
            verdict=d.verdict,
            policy=d.policy,
            actions=[str(a.kind) for a in d.actions],
            node=node,
            why=d.why,
            **({"plan": [a.journal() for a in d.actions]} if d.verdict != "duplicate" else {}),
            # a prediction, whatever its plan was cut to (remediation.holds.is_prediction)
            **({"predicted": True} if finding.kind in self.settings.predicted_kinds else {}),
        )
        if d.verdict != "queue_full":  # not queued: the same finding sent again is decided again
            self.memory.saw(finding.id, self.clock.wall())
        self.stats.decisions[d.verdict] = self.stats.decisions.get(d.verdict, 0) + 1
        if d.verdict in RUNNING_VERDICTS:
            reserved, busy = self.guards.started(d, node)
            dry_run = d.verdict == "dry_run"
            # after a real drain the scheduler's own view shows the node out; a dry run keeps
            # its reservation so that later decisions see what would have been out
            done = self._releaser("" if dry_run else reserved, busy)
            self.executor.start(d, received, dry_run=dry_run, done=done)
        elif d.verdict in WAITING:
            self.waiting.add(finding, d, received, approved)
            if d.verdict not in QUIET:
                self._escalate(finding, d)
        return d

    def _releaser(self, reserved: str, busy: str) -> Callable[[], None] | None:
        """What frees a finished plan's reserved node and busy node (None: neither)."""
        if not reserved and not busy:
            return None

        def release() -> None:
            with self._lock:
                if reserved:
                    self.guards.release(reserved)
                if busy:
                    self.guards.finished(busy)

        return release

    def _escalate(self, finding: Finding, d: Decision) -> None:
        """Tell a person why a plan waits (a notification outside the plan's own ladder)."""
        if self.settings.notify_adapter not in self.adapters:
            log.warning("plan %s waits (%s): %s", d.plan_id, d.verdict, d.why)
            return
        action = escalation(finding, d, self.settings)
        self.executor.start(
            Decision(finding.id, "escalate", d.policy, (action,)), self.clock.now(), dry_run=False
        )

    # -- operators ----------------------------------------------------------------------------

    def precision(self) -> list[dict[str, Any]]:
        """Each policy's outcomes and precision now (:meth:`.outcomes.Outcomes.table`)."""
        with self._lock:
            return self.outcomes.table()

    def pending(self) -> list[dict[str, Any]]:
        with self._lock:
            return self.waiting.listing()

    def held(self) -> list[dict[str, Any]]:
        """Nodes a prediction holds out (:mod:`remediation.holds`), oldest hold first: until
        when, whether the hold has ended, and whether the node has been offered back."""
        with self._lock:
            self.outcomes.update(write=False)  # the journal's records since (holds follow it)
            now = self.clock.mono()
            return [
                {"node": h.node, "plan_id": h.plan_id, "until": round(h.until_wall, 3),
                 "ended": now >= h.until_mono, "offered": h.asked}
                for h in sorted(self.holds.held.values(), key=lambda h: h.until_wall)
            ]  # fmt: skip

    def approve(self, plan_id: str, by: str = "operator") -> Decision:
        """Run a plan that waits for approval (the other guards still apply, except cooldown)."""
        with self._lock:
            self._require_open()
            pending = self.waiting.take(plan_id)
            approved = False
            try:
                self.audit.append("approval", self.clock.wall(), finding_id=plan_id, by=by)
                approved = True
                return self._approved(pending)
            except JournalError:
                # nothing was acted on: the plan waits again (approved, if that record is on
                # disk, so that a restart and the retry agree), and the caller may retry
                self.waiting.add(pending.finding, pending.decision, pending.received,
                                 pending.approved or approved)  # fmt: skip
                raise

    def _approved(self, pending: Pending) -> Decision:
        d = self.guards.check(pending.finding, pending.decision, approved=True)
        return self._decide(pending.finding, d, pending.received, approved=True)

    def undo(
        self, node: str, by: str = "operator", *, force: bool = False, reason: str = ""
    ) -> Decision:
        """Put a node gpuwarden took out back in service (``force``: one it did not take out).
        A ``node`` that is not a node name is a :class:`core.names.BadNameError`. ``reason``:
        ``false_alarm`` (its removal was not needed: refuted), ``repaired`` or ``rma`` (it
        was: confirmed), or ``""`` (says nothing; :mod:`remediation.outcomes`)."""
        node = NodeName(node)
        if reason and reason not in UNDO_REASONS:
            raise ValueError(f"undo reason must be one of {sorted(UNDO_REASONS)}, not {reason!r}")
        with self._lock:
            self._require_open()
            if node not in self.memory.taken_out and not self.guards.reserved[node] and not force:
                raise KeyError(f"{node} was not taken out by gpuwarden; use force to resume it")
            finding = Finding(
                kind="operator_undo",
                subject={"node": node},
                severity=Severity.INFO,
                time_ns=int(self.clock.wall() * 1e9),  # the engine's clock, as every record
                summary=f"{by} puts {node} back in service",
                source=by,
                bucket_s=1,
            )
            action = action_for(ActionKind.UNCORDON, finding, self.settings)
            said = {"reason": reason} if reason else {}
            self.audit.append("undo", self.clock.wall(), finding_id=finding.id, node=node, by=by,
                              **said)  # fmt: skip
            self._absorb()
            d = Decision(
                finding.id, "dry_run" if self.settings.dry_run else "act", "undo", (action,)
            )
            return self._decide(finding, d, self.clock.now())

    @staticmethod
    def _checks_return(action: Action) -> bool:
        """Whether :meth:`_return_check` runs its command for ``action`` (an operator's undo
        is exempt)."""
        return action.kind is ActionKind.UNCORDON and action.params.get("kind") != "operator_undo"

    def _return_check(self, action: Action) -> Outcome | None:
        """``return_requires = "command"``: run the check command for the node; a failed
        outcome (the uncordon is not done) or None to go on. An operator's undo is exempt."""
        if not self._checks_return(action):
            return None
        try:
            argv = fill_argv(self.settings.return_check_command, NodeName(action.node))
        except BadNameError as exc:
            return Outcome(Status.FAILED, f"return check not run: {exc}")
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=self.settings.return_check_timeout_s)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Outcome(Status.FAILED, f"return check {argv} could not run: {exc}")
        if done.returncode == 0:
            return None
        said = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return Outcome(Status.FAILED, f"return check failed (exit {done.returncode}): "
                       + " | ".join(said)[:400])  # fmt: skip

    def _absorb(self) -> None:
        """Decide the outcomes the journal now shows (:mod:`remediation.outcomes`); a policy
        demoted or promoted is recorded as a finding and a person is told."""
        for finding in self.outcomes.update():
            log.warning("%s", finding.summary)
            self.submit(finding, via="engine")
            if self.settings.notify_adapter in self.adapters:
                action = action_for(ActionKind.NOTIFY, finding, self.settings)
                d = Decision(finding.id, "escalate", "", (action,))
                self.executor.start(d, self.clock.now(), dry_run=False)

    def _release_spare(self, node: str) -> object:
        return self.spares.release_for(node)

    def tick(self) -> list[Decision]:
        """Release queued plans the blast radius or the rate limit now allows (oldest first);
        top up the hot-spare pool; offer back each node whose prediction hold has ended
        (:mod:`remediation.holds`). A released plan meets every guard again, as when it came
        (unless an operator approved it): the node may have been taken out again, or acted on,
        while it waited, and what the guards say now is what happens (a notification, a wait
        for an operator). It stays queued only while the blast radius or rate limit holds it."""
        self.spares.refill()
        released = []
        with self._lock:
            self._require_open()
            self._absorb()
            now = self.clock.mono()
            for hold in self.holds.due(now, self.memory.compacted_horizon):
                d = self.submit(_expired(hold, self.settings.return_requires), via="engine")
                log.warning("%s's prediction hold ended: %s (%s)", hold.node, d.verdict,
                            d.why or "returned")  # fmt: skip
                if d.verdict == "queue_full":  # not queued, not remembered: tried again later
                    hold.retry_mono = now + OFFER_RETRY_S
                else:
                    hold.asked = True  # its decision is on disk: a restart reads it so too
            self._expire_waiting()
            self._forget_old()
            self._maybe_compact()
            self.guards.forget_inventory()  # each tick looks afresh: room may have freed
            for plan_id, p in self.waiting.releasable():
                d = self.guards.check(p.finding, p.decision, approved=p.approved)
                if d.verdict not in SELF_RELEASING:
                    self.waiting.drop(plan_id)
                    released.append(self._decide(p.finding, d, p.received, approved=p.approved))
                elif p.decision.verdict in QUIET and d.verdict not in QUIET:
                    # it waited for a plan on its node, and now for room or the rate limit:
                    # journaled and told as any plan that waits so
                    self.waiting.drop(plan_id)
                    self._decide(p.finding, d, p.received, approved=p.approved)
        return released

    def _forget_old(self) -> None:
        """Bounded memory: seen finding ids past ``seen_retention_s``, node facts past their
        time to live (a sender can name many nodes; the scheduler's facts are re-read)."""
        keep = self.settings.seen_retention_s
        if keep > 0:
            self.memory.forget_seen_before(self.clock.wall() - keep)  # wall: see Memory.seen_at
        now = self.clock.mono()
        for node in [n for n, (t, _) in self._facts.items() if now - t >= FACTS_TTL_S]:
            del self._facts[node]

    def _maybe_compact(self) -> None:
        """Start compacting the audit log past ``journal_compact_bytes``
        (:mod:`remediation.compact`) in a thread of its own: the records are chosen without a
        lock, up to where the outcome reader has read (it just read to the end, under the
        engine's lock); only the swap holds the locks."""
        limit = self.settings.journal_compact_bytes
        if limit <= 0 or self.settings.seen_retention_s <= 0:
            return
        if self._compactor is not None and self._compactor.is_alive():
            return
        if self.clock.mono() < self._compact_retry_at:
            return
        try:
            size = os.stat(self.audit.path).st_size
        except OSError:
            return
        if size < max(limit, 2 * self._compacted_size):
            return
        self._compactor = threading.Thread(
            target=self._compact, args=(self.outcomes.offset,), name="compact", daemon=True
        )
        self._compactor.start()

    def _compact(self, keep_from: int) -> None:
        path = Path(os.path.realpath(self.audit.path))  # a symlinked log: beside the file
        try:
            horizon = self.clock.wall() - self.settings.journal_retain_s
            chosen = choose(path, keep_from, horizon)
            with self._lock, self.audit.rewriting():  # the reader's offset holds still too
                done = swap(path, chosen, self.clock.wall(), check=self.audit.fence)
                self.outcomes.moved(done.offset + self.outcomes.offset - keep_from)
                self._compacted_size = done.size
                self.memory.compacted_horizon = max(self.memory.compacted_horizon, horizon)
        except Exception as exc:  # the live log is as it was (swap says so); later again
            log.warning("cannot compact the audit log %s: %s", path, exc)
            self._compact_retry_at = self.clock.mono() + COMPACT_RETRY_S
            return
        log.info("audit log compacted: %d records kept, %d dropped, the whole log archived "
                 "as %s", done.kept, done.dropped, done.archive)  # fmt: skip
        try:  # archives are never written again: no lock
            for gone in tidy(path, self.settings.journal_archives_keep):
                log.info("removed the audit log archive %s (journal_archives_keep)", gone)
        except OSError as exc:
            log.warning("cannot compress or prune the audit log's archives: %s", exc)

    def wait_compaction(self, timeout_s: float | None = None) -> bool:
        """Wait for a compaction under way to finish; False on timeout."""
        compactor = self._compactor
        if compactor is not None:
            compactor.join(timeout_s)
            return not compactor.is_alive()
        return True

    def _expire_waiting(self) -> None:
        """Plans that waited longer than ``pending_expire_s`` are dropped, with an ``expired``
        record: a plan the blast radius held days ago must not run when room frees up; its
        finding, if still true, comes again. Waiting is measured on the monotonic clock; a plan
        that waited through a restart has waited since its record's wall time (placed on the
        monotonic clock at start: :meth:`remediation.clock.Clock.journal_frame`)."""
        limit = self.settings.pending_expire_s
        if limit <= 0:
            return
        now = self.clock.now()
        for plan_id, p in self.waiting.older_than(now.mono - limit):
            waited = now.mono - p.received.mono
            self.audit.append(
                "expired",
                now.wall,
                finding_id=plan_id,
                verdict=p.decision.verdict,
                node=p.finding.subject.get("node", ""),
                waited_s=round(waited, 3),
                why=f"waited more than pending_expire_s={limit:g} s ({p.decision.verdict})",
            )
            self.waiting.drop(plan_id)
            log.warning("plan %s expired after %.0f s waiting", plan_id, waited)

    # -- after a restart ----------------------------------------------------------------------

    def _restore_waiting(self, p: PlanRecord) -> None:
        try:
            finding = _finding_from_record(p)
            d = _decision_from_record(p.decision)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("cannot restore waiting plan %s: %s", p.decision.get("finding_id"), exc)
            return
        approved = d.plan_id in self.memory.approved_plans
        self.waiting.add(finding, d, self._restored(p.received), approved)

    def _escalate_unrecorded(self) -> None:
        """Tell a person about each restored waiting plan whose notification has no record:
        the engine stopped between the plan's ``decision`` record and its escalation's
        outcome. Found by a review of what a crash loses (2026-11-28): such a plan (a fatal
        XID held by the blast radius, one waiting for approval) waited silently until
        ``pending_expire_s``, nobody told. A notification whose record is on disk is not sent
        again; one sent just before the stop, and not yet recorded, is sent twice (at least
        once, as every notification: docs/DURABILITY.md)."""
        if self.settings.notify_adapter not in self.adapters:
            return
        for p in self.waiting.plans():
            d = p.decision
            if d.verdict in QUIET or p.approved:
                continue
            if escalation(p.finding, d, self.settings).id in self.memory.recorded:
                continue
            log.warning("plan %s waits (%s) and nobody was told before the restart: telling "
                        "them now", d.plan_id, d.verdict)  # fmt: skip
            self._escalate(p.finding, d)

    def _restored(self, t: float) -> Instant:
        """A journal record's wall time ``t`` as a moment of this process (its monotonic
        time placed once, at start; never later than the start)."""
        return Instant(t, self._to_mono(t))

    def resume(self) -> list[Decision]:
        """Start every plan the journal shows unfinished at the last stop, from its first
        unrecorded action (an action whose intent is on disk is reconciled against the
        scheduler first: :class:`remediation.model.Reconciling`). Call once, after start."""
        resumed = []
        with self._lock:
            self._require_open()
            pending, self.memory.unfinished = self.memory.unfinished, []
            for p in pending:
                try:
                    d = _decision_from_record(p.decision)
                except (KeyError, TypeError, ValueError) as exc:
                    log.error("cannot resume plan %s: %s", p.decision.get("finding_id"), exc)
                    continue
                node = str(p.decision.get("node", ""))
                log.warning("resuming plan %s (%s) on %s after a restart", d.plan_id,
                            [str(a.kind) for a in d.actions], node or "-")  # fmt: skip
                dry_run = d.verdict == "dry_run"
                # busy while any change is still to be done (a return, a requeue after its
                # drain): a fault that arrives meanwhile waits for it, as before the restart
                changing = any(
                    a.kind in MUTATING and a.id not in self.memory.recorded for a in d.actions
                )
                reserved, busy = self.guards.started(d, node) if changing else ("", "")
                done = self._releaser("" if dry_run else reserved, busy)
                self.executor.start(
                    d, self._restored(p.received), dry_run=dry_run, done=done, resume=True
                )
                resumed.append(d)
            # approvals on disk whose plan was not decided again before the stop: they hold,
            # unless the plan has waited past pending_expire_s meanwhile (as any waiting plan)
            self._expire_waiting()
            self._escalate_unrecorded()
            for plan_id, by in self.memory.approved.items():
                try:
                    approved = self.waiting.take(plan_id)
                except KeyError:
                    continue  # not restored (its record could not be read)
                log.warning("plan %s was approved by %s before a restart; running it", plan_id,
                            by or "-")  # fmt: skip
                resumed.append(self._approved(approved))
            self.memory.approved = {}
        return resumed

    # -- lifetime -----------------------------------------------------------------------------

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every started plan has finished; False on timeout."""
        return self.executor.wait(timeout_s)

    def _require_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the remediation engine is closed: nothing was recorded; retry")

    def close(self) -> None:
        """Refuse new work (:class:`EngineClosedError`), let the plans running finish, stop."""
        with self._lock:
            self._closed = True
        self.executor.shutdown()
        self.wait_compaction()
        self.audit.close()


#: what happens after an offer, by ``return_requires``; a person is needed (a warning) unless
#: the engine returns the node by itself
_OFFER_NEXT = {
    "command": "the engine runs its return check and returns it if the check passes",
    "none": "the engine returns it now",
    "check": "it returns at the first passing node check newer than that: run "
    "'gpuwarden check --report' on {node} (or let Slurm's health check report it)",
    "approval": "it returns when an operator approves the plan (gpuwarden remediate pending, "
    "approve) within pending_expire_s",
}


def _expired(hold: Hold, return_requires: str) -> Finding:
    """The engine's finding that ``hold`` has ended with no fault: the node may go back. Its
    time is the hold's end, so the same hold gives the same finding id after a restart. A
    warning where a person must act (``check``, ``approval``): it reaches the routes an info
    does not."""
    ended = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(hold.until_wall))
    node = hold.node
    automatic = return_requires in ("command", "none")
    after = _OFFER_NEXT.get(return_requires, _OFFER_NEXT["check"]).format(node=node)
    return Finding(
        kind=EXPIRED_KIND,
        subject={"cluster": hold.cluster, "node": node} if hold.cluster else {"node": node},
        severity=Severity.INFO if automatic else Severity.WARNING,
        time_ns=int(hold.until_wall * 1e9),
        evidence={"plan": hold.plan_id, "held_s": round(hold.until_wall - hold.removed_wall, 3)},
        summary=(
            f"{node}: the prediction that took it out (plan {hold.plan_id[:12]}) ran to "
            f"{ended}Z with no fault; {after}; or by hand: gpuwarden remediate undo {node}"
        ),
        source="gpuwarden-remediation",
        bucket_s=1,
    )


def _decision_from_record(record: Mapping[str, Any]) -> Decision:
    """A plan's decision as its journal record holds it (``plan``: every action)."""
    if "plan" not in record:
        raise KeyError("the record has no plan (written before the journal kept plans)")
    actions = tuple(Action.from_journal(a) for a in record["plan"])
    return Decision(
        str(record["finding_id"]), str(record["verdict"]), str(record.get("policy", "")),
        actions, str(record.get("why", "")),
    )  # fmt: skip


def _finding_from_record(p: PlanRecord) -> Finding:
    """The finding behind a waiting plan, from its ``finding`` record; its id must match."""
    r = p.finding
    if r is None:
        raise KeyError("no finding record")
    finding = Finding(
        kind=str(r["kind"]),
        subject={str(k): str(v) for k, v in dict(r["subject"]).items()},
        severity=Severity(r["severity"]),
        time_ns=int(r["finding_time_ns"]),
        evidence=dict(r.get("evidence") or {}),
        confidence=r.get("confidence"),
        probability=r.get("probability"),
        summary=str(r.get("summary", "")),
        source=str(r.get("source", "")),
        bucket_s=int(r.get("bucket_s", 300)),
    )
    if finding.id != r.get("finding_id"):
        raise ValueError(f"finding record {r.get('finding_id')} does not rebuild to its id")
    return finding
