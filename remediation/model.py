"""What the engine decides and what adapters do: actions, their outcomes, and the adapter interface.

An :class:`Action` is one step of a policy's ladder applied to one subject (usually a node).
Its ``id`` is stable (finding, step, adapter, node, job), which is what makes actions
idempotent: an action whose id the audit log already shows as done is never done again, and
adapters themselves treat "already drained" or "already cordoned" as success.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from gpuwarden.remediation.errors import RemediationError


class ActionKind(StrEnum):
    NOTIFY = "notify"
    """Tell people (webhooks): Slack, Alertmanager, a generic JSON receiver."""
    CHECKPOINT = "checkpoint"
    """Ask the jobs on the node to checkpoint now, and wait for their acknowledgement."""
    CORDON = "cordon"
    """No new work on the node; running work continues (Slurm: drain; Kubernetes: cordon)."""
    DRAIN = "drain"
    """No new work, and move the running work off (Kubernetes: cordon + evict; torch elastic:
    stop the node's agent so the others re-form without it; Slurm: drain, then ``requeue``)."""
    REQUEUE = "requeue"
    """Put the node's jobs back in the queue, so they run elsewhere (Slurm)."""
    UNCORDON = "uncordon"
    """Undo: the node takes work again (Slurm: resume; Kubernetes: uncordon, untaint)."""
    CHECKPOINT_INTERVAL = "checkpoint_interval"
    """Ask a job to checkpoint at a new interval (analytics' ``checkpoint_advice``), and wait for
    it to say it does; a job whose hook does not take such requests never answers."""


# actions that take a node out of service: the blast-radius limit applies to these
REMOVING = frozenset({ActionKind.CORDON, ActionKind.DRAIN})
# actions that change something on a target (everything but telling people)
MUTATING = frozenset(ActionKind) - {ActionKind.NOTIFY}


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    DRY_RUN = "dry_run"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    adapter: str
    node: str = ""
    cluster: str = ""
    job: str = ""
    finding_id: str = ""
    reason: str = ""
    severity: str = "warning"
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        key = [self.finding_id, str(self.kind), self.adapter, self.node, self.job]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]

    def to_json(self) -> dict[str, Any]:
        return {
            "action_id": self.id,
            "action": str(self.kind),
            "adapter": self.adapter,
            "node": self.node,
            "cluster": self.cluster,
            "job": self.job,
            "finding_id": self.finding_id,
            "reason": self.reason,
            "severity": self.severity,
        }

    def journal(self) -> dict[str, Any]:
        """Everything :meth:`from_journal` needs to rebuild the action after a restart."""
        return self.to_json() | {"params": dict(self.params)}

    @classmethod
    def from_journal(cls, data: Mapping[str, Any]) -> Action:
        """The action a decision record planned; its id must match the one recorded."""
        action = cls(
            kind=ActionKind(data["action"]),
            adapter=str(data["adapter"]),
            node=str(data.get("node", "")),
            cluster=str(data.get("cluster", "")),
            job=str(data.get("job", "")),
            finding_id=str(data.get("finding_id", "")),
            reason=str(data.get("reason", "")),
            severity=str(data.get("severity", "warning")),
            params=dict(data.get("params") or {}),
        )
        if data.get("action_id") not in (None, action.id):
            raise ValueError(f"journal action {data.get('action_id')!r} does not match its content")
        return action


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in (Status.OK, Status.DRY_RUN)


ALREADY_OUT = "already_out"
"""An ``Outcome.details`` key: a ``cordon``/``drain`` found the node out already, taken out by
someone else (an administrator's maintenance drain, with its reason as the value). gpuwarden
did not take it out and does not count it as its own: it never puts such a node back (the
``not_ours`` guard) and holds no prediction on it. (Before, the removal answered "already
draining", OK, and the node became gpuwarden's: its agent's next passing check resumed a node
an administrator had drained "DO NOT RESUME".)"""


def foreign_removal(record: Mapping[str, Any]) -> bool:
    """Whether an ``action`` record found the node out by someone else: a removal (the node
    is theirs, not gpuwarden's), or a return (someone took gpuwarden's node over since:
    gpuwarden lets go of it, and the node stays out)."""
    details = record.get("details")
    return isinstance(details, Mapping) and bool(details.get(ALREADY_OUT))


class AdapterError(RemediationError, RuntimeError):
    """An adapter could not do what it was asked; the message says what and why."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """What a scheduler knows about nodes, for the blast-radius limit.

    ``partitions`` maps node → partition (node pool); ``out`` holds the nodes that take no new
    work now, for whatever reason (drained, down, cordoned), ours or not.
    """

    partitions: Mapping[str, str]
    out: frozenset[str]
    spares: frozenset[str] = frozenset()
    """Nodes held out as hot spares by gpuwarden (within ``out``, not broken)."""
    idle: frozenset[str] = frozenset()
    """Nodes in service with no work on them (candidates for the spare pool)."""
    lists_all: bool = True
    """``partitions`` names every node the scheduler has (a real scheduler's view): a node it
    does not name is not one of the scheduler's, and gpuwarden does not act on it. False for a
    view that knows only some nodes (no scheduler configured: the nodes gpuwarden took out)."""

    def partition_size(self, partition: str) -> int:
        return sum(1 for p in self.partitions.values() if p == partition)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a scheduler says a node is, for policies limited to a group of nodes."""

    partitions: frozenset[str] = frozenset()
    """Slurm partitions; a Kubernetes node's pool (its ``pool_label`` value)."""
    features: frozenset[str] = frozenset()
    """Slurm features (active and available)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Kubernetes node labels."""


@runtime_checkable
class Adapter(Protocol):
    """One target the engine acts on. Adapters are registered by name (``adapters.ADAPTERS``)."""

    name: str
    actions: frozenset[ActionKind]

    def perform(self, action: Action) -> Outcome:
        """Do it (idempotently). Raise :class:`AdapterError` or return a FAILED outcome."""
        ...

    def describe(self, action: Action) -> str:
        """What :meth:`perform` would do, in words (dry-run and approval messages)."""
        ...


@runtime_checkable
class Scheduler(Adapter, Protocol):
    """An adapter that owns nodes (Slurm, Kubernetes): it can say which are out of service."""

    def inventory(self) -> Inventory: ...


@runtime_checkable
class NodeGroups(Adapter, Protocol):
    """An adapter that can say which partitions, features and labels a node has."""

    def node_facts(self, node: str) -> NodeFacts: ...


@runtime_checkable
class SparePool(Scheduler, Protocol):
    """A scheduler that can hold idle nodes as hot spares (:mod:`remediation.engine.spares`)."""

    def hold_spare(self, node: str) -> None: ...
    def release_spare(self, node: str) -> None: ...


@runtime_checkable
class Reconciling(Adapter, Protocol):
    """An adapter that can tell, after a crash, whether an action it was asked to do took
    effect. The engine records :meth:`observe`'s answer in the action's intent, before it calls
    :meth:`perform`; after a restart it asks :meth:`reconcile` with that record instead of
    acting again blindly (SQLite's rollback journal, a controller's reconcile loop)."""

    def observe(self, action: Action) -> dict[str, Any]:
        """What the world looks like before ``action`` (small, JSON-serialisable)."""
        ...

    def reconcile(self, action: Action, before: Mapping[str, Any]) -> Outcome | None:
        """The outcome if ``action`` already took effect since ``before`` was observed (it is
        recorded, not repeated), or None when it did not (the engine performs it)."""
        ...
