"""Guarding: whether a plan runs now, waits, or is cut down to a notification.

The checks, in order (de-duplication by finding id happens before, in the engine):

0. **unknown node**: a plan that would take out (or act on) a node the scheduler does not
   list is not made at all (``unknown_node``: journaled, counted, no notification);
1. **not ours**: a plan whose only change is ``uncordon`` touches only nodes gpuwarden took
   out itself; an admin's maintenance drain is the admin's to end;
2. **held**: a node taken out on a prediction does not return before the prediction's hold
   ends (:mod:`remediation.holds`); the plan is cut down to a notification;
   **lemon**: a node gpuwarden took out ``lemon_count`` times within ``lemon_window_s`` does
   not come back by itself: its ``uncordon`` waits for an operator, who is told the node's
   history (when and why each time);
3. **return check**: with ``return_requires = "check"`` (the default), a return to service needs
   a ``node_healthy`` finding carrying a passing ``gpuwarden check`` newer than the node's
   removal (and than its hold's end, and than a fault that ended its hold); without one the
   plan is cut down to a notification (``unchecked``). With ``"approval"`` it waits for an operator;
   **approval**: a plan with an action kind listed in ``approval`` waits for an operator;
4. **busy**: a plan for a node another plan is acting on now waits, and is decided again when
   that one has finished (nobody is paged for it);
   **cooldown** per node: a node acted on in the last ``cooldown_s`` gets only a notification
   (putting a repaired node back is exempt: it disrupts nothing; nor does it start the
   cooldown: a node that breaks again right after it returns comes out again at once; but a
   return that failed is not tried again within ``cooldown_s``);
5. **blast radius**: taking a node out when ``max_nodes_out`` nodes (or ``max_fraction_out``
   of its partition) are already out (by anyone: the scheduler's own view, plus the nodes
   plans in flight are taking out) waits;
6. **rate limit**: at most ``actions_per_minute`` target-changing actions a minute;
7. **dry run** (the default): the plan runs, but no adapter is asked to change anything.

A plan cut down to a notification (cooldown, not ours, held, unchecked) tells people once
per node, policy and verdict within ``cooldown_s``; the others are journaled, with no action.

An approved plan skips 1-4 but busy: the operator has decided, but not to run two plans on one
node at once.

Every window here (cooldown, lemon, the rate limit's minute, the inventory's time to live) is
measured on the monotonic clock (:mod:`remediation.clock`): a wall clock stepped back does not
prolong them, one stepped forward does not end them early. The return check compares the
node's own check time with the removal's wall time: two hosts' clocks, compared as timestamps.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from collections.abc import Mapping

from gpuwarden.core.finding import Finding
from gpuwarden.remediation.audit import NOTIFY_ONCE_VERDICTS, Memory
from gpuwarden.remediation.clock import Clock
from gpuwarden.remediation.engine.decide import Decision, EngineSettings
from gpuwarden.remediation.holds import EXPIRED_KIND, Holds
from gpuwarden.remediation.model import (
    MUTATING,
    REMOVING,
    ActionKind,
    Adapter,
    AdapterError,
    Inventory,
    Scheduler,
)

log = logging.getLogger("gpuwarden.remediation.engine")

#: verdicts that cut a plan down to its notification (:meth:`Guards._told_once`)
CUT_TO_NOTIFY = NOTIFY_ONCE_VERDICTS
TOLD_MAX = 10_000


class Guards:
    """The guards' state: nodes plans in flight are taking out, and the last minute's actions.
    Not thread-safe on its own: the engine calls it under its lock."""

    def __init__(
        self,
        settings: EngineSettings,
        adapters: Mapping[str, Adapter],
        memory: Memory,
        clock: Clock,
        holds: Holds | None = None,
    ) -> None:
        self.settings = settings
        self.holds = holds or Holds(lambda _: False)
        self.adapters = adapters
        self.memory = memory
        self.clock = clock
        # nodes that plans in flight are taking out, counted per plan: one plan finishing must
        # not free a node another plan is still about to drain
        self.reserved: Counter[str] = Counter()
        self.busy: Counter[str] = Counter()  # nodes a plan in flight changes, per plan
        # (node, policy, verdict): when; from the journal at start (a restart pages no more)
        self._told: dict[tuple[str, str, str], float] = dict(memory.told)
        self._inventory: tuple[float, Inventory] | None = None  # (when, view) for inventory_ttl_s
        self.recent: deque[float] = deque()  # when (monotonic) each of the last minute's actions
        # the scheduler that lists nodes out, told once: a runtime Protocol check costs ~0.1 ms,
        # and the inventory is asked for every plan a tick looks at again
        scheduler = adapters.get(settings.node_adapter)
        self._scheduler = scheduler if isinstance(scheduler, Scheduler) else None

    def check(self, finding: Finding, d: Decision, *, approved: bool = False) -> Decision:
        d = self._check(finding, d, approved=approved)
        node = finding.subject.get("node", "")
        if d.verdict in CUT_TO_NOTIFY and d.actions and node:
            return self._told_once(d, node)
        return d

    def _told_once(self, d: Decision, node: str) -> Decision:
        """A plan cut down to a notification tells people once per node, policy and verdict
        within ``cooldown_s``; the others are journaled with no action. (A node's own key sent
        60 critical findings a minute about its node, each a different GPU: after the first
        drain each was ``cooldown``, and each paged, 86,000 a day.)"""
        now, window = self.clock.mono(), self.settings.cooldown_s
        key = (node, d.policy, d.verdict)
        told = self._told.get(key)
        if told is not None and now - told < window:
            why = f"{d.why}; told at most once in {window:.0f} s ({now - told:.0f} s ago)"
            return Decision(d.finding_id, d.verdict, d.policy, (), why)
        if len(self._told) >= TOLD_MAX:  # bounded: forget what no longer silences anything
            self._told = {k: t for k, t in self._told.items() if now - t < window}
        self._told[key] = now
        return d

    def cooling(self, finding: Finding, undo_only: bool) -> str:
        """Why a plan that changes the finding's node is cut down to a notification now, or
        ``""``: it was acted on within ``cooldown_s``, or (for a return to service) returning
        it failed within ``cooldown_s`` (the engine's own offer when a hold ends excepted: it
        comes once). Putting a repaired node back otherwise disrupts nothing and is exempt,
        nor does it start the cooldown."""
        s, now = self.settings, self.clock.mono()
        node = finding.subject.get("node", "")
        if undo_only and finding.kind == EXPIRED_KIND:
            return ""
        if undo_only:
            failed = self.memory.return_failed_at.get(node)
            if failed is not None and now - failed < s.cooldown_s:
                return (
                    f"returning {node} to service failed {now - failed:.0f} s ago; it is tried "
                    f"again {s.cooldown_s:.0f} s after (cooldown)"
                )
            return ""
        last = self.memory.last_action_at.get(node)
        if last is not None and now - last < s.cooldown_s:
            return f"{node} was acted on {now - last:.0f} s ago (cooldown {s.cooldown_s:.0f} s)"
        return ""

    def _check(self, finding: Finding, d: Decision, *, approved: bool = False) -> Decision:
        s = self.settings
        node = finding.subject.get("node", "")
        mutating = [a for a in d.actions if a.kind in MUTATING]
        notify_only = tuple(a for a in d.actions if a.kind is ActionKind.NOTIFY)
        undo_only = bool(mutating) and all(a.kind is ActionKind.UNCORDON for a in mutating)
        # (a return needs no look: a node gpuwarden took out is the scheduler's, and any other
        # is not_ours; every node_healthy asked the scheduler for its whole inventory)
        if node and mutating and not undo_only and (unknown := self.unknown(node)):
            return Decision(d.finding_id, "unknown_node", d.policy, (), unknown)
        if undo_only and not approved and node not in self.memory.taken_out:
            why = f"gpuwarden did not take {node} out; whoever did decides when it returns"
            return Decision(d.finding_id, "not_ours", d.policy, notify_only, why)
        if undo_only and not approved and (held := self.held(node)):
            # before the lemon rule: a return during the hold is not considered at all (as a
            # lemon it would wait, and fill the node's queue before the hold ends)
            return Decision(d.finding_id, "held", d.policy, notify_only, held)
        if undo_only and not approved and (history := self.lemon(node)):
            why = (
                f"{node} is a lemon: taken out {len(history)} times in "
                f"{s.lemon_window_s / 86400:g} days ({'; '.join(history)}); it returns when an "
                f"operator approves: gpuwarden remediate approve {d.plan_id}"
            )
            return Decision(d.finding_id, "lemon", d.policy, d.actions, why)
        if undo_only and not approved and s.return_requires == "check":
            unchecked = self.unchecked(finding, node)
            if unchecked:
                return Decision(d.finding_id, "unchecked", d.policy, notify_only, unchecked)
        needs = set(s.approval) | ({"uncordon"} if s.return_requires == "approval" else set())
        if not approved and any(str(a.kind) in needs for a in mutating):
            kinds = [str(a.kind) for a in mutating]
            why = (
                f"{kinds} on {node or 'subject'} wait for approval: "
                f"gpuwarden remediate approve {d.plan_id}"
            )
            return Decision(d.finding_id, "approval", d.policy, d.actions, why)
        if node and mutating and self.busy[node] > 0:
            # decided again once that plan has finished (a tick): a fault that came while a
            # prediction's plan ran then finds its hold and ends it, as it should. An approved
            # plan waits too (approving a busy plan drained and requeued the node twice)
            why = f"a plan acting on {node} is under way; this one is decided when it is done"
            return Decision(d.finding_id, "busy", d.policy, d.actions, why)
        if node and mutating and not approved and (cooling := self.cooling(finding, undo_only)):
            return Decision(d.finding_id, "cooldown", d.policy, notify_only, cooling)
        if any(a.kind in REMOVING for a in mutating):
            blocked = self.blast_radius(node)
            if blocked:
                return Decision(d.finding_id, "blast_radius", d.policy, d.actions, blocked)
        now = self.clock.mono()
        while self.recent and now - self.recent[0] > 60.0:
            self.recent.popleft()
        if mutating and len(self.recent) + len(mutating) > s.actions_per_minute:
            why = f"more than {s.actions_per_minute} actions a minute"
            return Decision(d.finding_id, "rate_limited", d.policy, d.actions, why)
        return Decision(d.finding_id, "dry_run" if s.dry_run else "act", d.policy, d.actions)

    def unchecked(self, finding: Finding, node: str) -> str:
        """Why ``finding`` does not show ``node`` fit to return, or ``""`` when it does: a
        ``node_healthy`` whose evidence says a check passed (``check = "pass"``) at
        ``checked_ns``, after gpuwarden last took the node out."""
        ev = finding.evidence
        taken = [at.wall for at, _ in self.memory.taken_out_at.get(node, [])]
        fix = (
            f"run 'gpuwarden check --report' on {node}, or put it back by hand: "
            f"gpuwarden remediate undo {node}"
        )
        if finding.kind != "node_healthy" or ev.get("check") != "pass":
            return f"{node} returns to service only after a passing node check; {fix}"
        checked = ev.get("checked_ns")
        if not isinstance(checked, int) or (taken and checked / 1e9 < max(taken)):
            return f"the passing check on {node} is older than its removal; {fix}"
        hold = self.holds.until(node)
        if hold is not None and checked / 1e9 < hold.until_wall:
            return f"the passing check on {node} is older than the end of its hold; {fix}"
        fault = self.holds.fault_at.get(node)
        if fault is not None and checked / 1e9 < fault:
            return f"the passing check on {node} is older than the fault it had since; {fix}"
        return ""

    def held(self, node: str) -> str:
        """Why ``node`` may not return yet because a prediction holds it out, or ``""``."""
        hold = self.holds.until(node)
        if hold is None or self.clock.mono() >= hold.until_mono:
            return ""
        ends = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(hold.until_wall))
        return (
            f"{node} was taken out on a prediction (plan {hold.plan_id[:12]}) that holds it "
            f"out until {ends}Z: a passing check now does not say the predicted fault will not "
            f"come; it is offered back then, or by hand: gpuwarden remediate undo {node}"
        )

    def lemon(self, node: str) -> list[str]:
        """When and why ``node`` was taken out within the lemon window, if that is
        ``lemon_count`` times or more (else empty)."""
        s = self.settings
        if s.lemon_count < 1 or s.lemon_window_s <= 0:
            return []
        now = self.clock.mono()
        recent = [
            (at.wall, why)
            for at, why in self.memory.taken_out_at.get(node, [])
            if now - at.mono <= s.lemon_window_s
        ]
        if len(recent) < s.lemon_count:
            return []
        return [
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t))}Z {why[:80]}" for t, why in recent
        ]

    def inventory(self) -> Inventory:
        adapter = self._scheduler
        if adapter is not None:
            ttl, now = self.settings.inventory_ttl_s, self.clock.mono()
            kept = self._inventory
            if ttl > 0 and kept is not None and now - kept[0] < ttl:
                return kept[1]
            try:
                inv = adapter.inventory()
                self._inventory = (now, inv)
                return inv
            except AdapterError as exc:
                log.error("inventory from %s failed: %s", adapter.name, exc)
                raise
        return Inventory({}, frozenset(self.memory.taken_out), lists_all=False)

    def unknown(self, node: str) -> str:
        """Why ``node`` is none of the scheduler's, or ``""`` (it is, or that cannot be told:
        no scheduler, or its inventory failed, which the blast radius answers for a removal).

        A sender that may name any node (an ``alerts`` identity, the shared credential) could
        otherwise queue a plan per invented name while the blast radius is full (each with a
        page), or fail one per name against the scheduler. Nothing is done and nobody is paged:
        the decision is journaled and counted (``gpuwarden_engine_decisions_total
        {verdict="unknown_node"}``, the ``GpuwardenUnknownNodes`` alert), which is also how a
        name that differs between the agents and the scheduler shows (``gpu01`` against
        ``gpu01.cluster``)."""
        if self._scheduler is None:
            return ""
        try:
            inv = self.inventory()
        except AdapterError:
            return ""
        if not inv.lists_all or node in inv.partitions:
            return ""
        return (
            f"{self._scheduler.name} has no node named {node!r}; nothing done (a name the "
            f"agents and the scheduler spell differently, or a sender naming nodes at random)"
        )

    def forget_inventory(self) -> None:
        """The next check asks the scheduler again (a new tick, a plan that finished)."""
        self._inventory = None

    def blast_radius(self, node: str) -> str:
        """Why taking ``node`` out would break the limit, or ``""``."""
        try:
            inv = self.inventory()
        except AdapterError as exc:
            return f"cannot tell how many nodes are out ({exc}); not taking {node} out blind"
        # hot spares are held, not broken: they do not count against the limit
        out = (set(inv.out) - set(inv.spares)) | {n for n, c in self.reserved.items() if c > 0}
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
            # a share of a small partition rounds up to one node (0.1 of 8 nodes allowed none:
            # a node with a fatal XID stayed in service, jobs landing on it); 0 allows none
            allowed = math.floor(s.max_fraction_out * size + 1e-9)
            if s.max_fraction_out > 0:
                allowed = max(1, allowed)
            if in_part + 1 > allowed:
                return (
                    f"{in_part} of {size} nodes of partition {partition} already out; one more "
                    f"exceeds max_fraction_out={s.max_fraction_out} ({allowed} of {size})"
                )
        return ""

    def started(self, d: Decision, node: str) -> tuple[str, str]:
        """A plan starts: count its target-changing actions against the rate limit, reserve
        the node it takes out, and mark the node it changes busy. Returns the reserved node
        and the busy one (``""`` for none): :meth:`release` and :meth:`finished` free them."""
        reserved = busy = ""
        if d.verdict in ("act", "dry_run") and any(a.kind in REMOVING for a in d.actions):
            reserved = node
            self.reserved[reserved] += 1
        changes = sum(a.kind in MUTATING for a in d.actions)
        if node and changes:
            busy = node
            self.busy[busy] += 1
        self.recent.extend([self.clock.mono()] * changes)
        return reserved, busy

    def release(self, node: str) -> None:
        """A plan that took ``node`` out has finished (the scheduler's view now shows it)."""
        self.reserved[node] -= 1
        self.forget_inventory()  # a view from before the drain would miss this node

    def finished(self, node: str) -> None:
        """A plan that changed ``node`` has finished (its action records are written)."""
        self.busy[node] -= 1
        if self.busy[node] <= 0:
            del self.busy[node]
