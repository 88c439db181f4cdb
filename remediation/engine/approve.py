"""Plans that wait, and what operators do with them: approve a plan, undo a node, and the
engine's tick that releases plans the blast radius or the rate limit now allow.

A plan waits for one of three reasons: it needs ``approval`` (a person decides), or the
``blast_radius`` or ``rate_limited`` guard held it (it runs by itself, oldest first, once
there is room). The operator is told each time a plan starts waiting (the escalation
notification). Waiting plans are journalled (their decision record holds the plan) and restored
after a restart; one that waited longer than ``[engine] pending_expire_s`` is dropped with an
``expired`` record (a plan the blast radius held days ago must not run when room frees up).
How long a plan has waited is measured on the monotonic clock; a plan restored after a restart
has waited since its ``finding`` record's wall time, placed on this process's monotonic clock
(:meth:`remediation.clock.Clock.journal_frame`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwarden.core.finding import Finding
from gpuwarden.remediation.audit import WAITING_VERDICTS
from gpuwarden.remediation.clock import Instant
from gpuwarden.remediation.engine.decide import Decision


@dataclass
class Pending:
    finding: Finding
    decision: Decision
    received: Instant
    approved: bool = False
    """An operator approved it (then the blast radius or the rate limit held it): released,
    it skips the guards an approval skips. Any other plan is checked by every guard again
    when released (the node may have been taken out again, or acted on, meanwhile). Its
    ``approval`` record holds across a restart (:attr:`remediation.audit.Memory.approved_plans`)."""


SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
#: verdicts whose plans wait here, and those of them that free themselves (tick)
WAITING = WAITING_VERDICTS  # one list: what waits here is what the journal's replay restores
SELF_RELEASING = ("blast_radius", "rate_limited", "busy")
#: waiting verdicts nobody is paged about: ``busy`` ends by itself within a plan's run
QUIET = ("busy",)


class PendingPlans:
    """Waiting plans by plan id. Not thread-safe on its own: used under the engine's lock."""

    def __init__(self) -> None:
        self._plans: dict[str, Pending] = {}
        # per node, how many wait at each severity rank: `full` is asked for every finding
        # of a storm, and counting all waiting plans each time was quadratic
        self._by_node: dict[str, list[int]] = {}

    def add(self, finding: Finding, d: Decision, received: Instant, approved: bool = False) -> None:
        if d.plan_id in self._plans:
            self._count(self._plans[d.plan_id].finding, -1)
        self._plans[d.plan_id] = Pending(finding, d, received, approved)
        self._count(finding, +1)

    def _count(self, finding: Finding, by: int) -> None:
        node = finding.subject.get("node", "")
        counts = self._by_node.setdefault(node, [0] * len(SEVERITY_RANK))
        counts[SEVERITY_RANK[str(finding.severity)]] += by
        if not any(counts):
            del self._by_node[node]

    def full(self, finding: Finding, per_node: int, total: int) -> str:
        """Why one more plan for ``finding`` may not wait (``""`` when it may). Per node, only
        plans at least as severe count: warnings waiting for an operator never keep a
        critical drain from its place."""
        if total > 0 and len(self._plans) >= total:
            return f"{len(self._plans)} plans wait already (max_pending={total})"
        node, rank = finding.subject.get("node", ""), SEVERITY_RANK[str(finding.severity)]
        about = sum(self._by_node.get(node, ())[rank:])
        if node and per_node > 0 and about >= per_node:
            return (
                f"{about} plans about {node} at {finding.severity} or above wait already "
                f"(max_pending_per_node={per_node})"
            )
        return ""

    def plans(self) -> list[Pending]:
        """Every waiting plan, in the order they came."""
        return list(self._plans.values())

    def take(self, plan_id: str) -> Pending:
        """Remove and return a waiting plan; ``KeyError`` when there is none by that id."""
        pending = self._plans.pop(plan_id, None)
        if pending is None:
            raise KeyError(f"no pending plan {plan_id!r}")
        self._count(pending.finding, -1)
        return pending

    def releasable(self) -> list[tuple[str, Pending]]:
        """Plans the guards held (not those waiting for a person), oldest first."""
        return [
            (plan_id, p)
            for plan_id, p in sorted(self._plans.items(), key=lambda kv: kv[1].received.mono)
            if p.decision.verdict in SELF_RELEASING
        ]

    def drop(self, plan_id: str) -> None:
        self._count(self._plans.pop(plan_id).finding, -1)

    def older_than(self, mono: float) -> list[tuple[str, Pending]]:
        """Plans received before ``mono`` (monotonic time), oldest first."""
        return sorted(
            ((i, p) for i, p in self._plans.items() if p.received.mono < mono),
            key=lambda kv: kv[1].received.mono,
        )

    def listing(self) -> list[dict[str, Any]]:
        return [
            {
                "plan_id": p.decision.plan_id,
                "verdict": p.decision.verdict,
                "why": p.decision.why,
                "node": p.finding.subject.get("node", ""),
                "actions": [str(a.kind) for a in p.decision.actions],
                "since": p.received.wall,
            }
            for p in self._plans.values()
        ]
