"""Deciding: which policy a finding meets, and the plan (the ladder of actions) it leads to.

A plan's actions each name the adapter that performs them: notifications go to
``notify_adapter``, checkpoint requests to ``checkpoint_adapter``, everything that changes a
node (cordon, drain, requeue, uncordon) to ``node_adapter``. Whether the plan runs, waits or is
cut down to a notification is the guards' call (:mod:`.guard`), not this module's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuwarden.core.finding import Finding
from gpuwarden.remediation.model import Action, ActionKind, NodeFacts
from gpuwarden.remediation.outcomes import OutcomeSettings
from gpuwarden.remediation.policy import Policy, first_match

JOURNAL_MARGIN_S = 86400.0
"""Kept beyond the longest window: a compaction run while the wall clock was a day ahead, or a
window made longer since, still finds what it reads."""


@dataclass(frozen=True)
class EngineSettings:
    dry_run: bool = True
    max_nodes_out: int = 2
    max_fraction_out: float = 0.1
    cooldown_s: float = 1800.0
    actions_per_minute: int = 20
    spares: int = 0
    """Hot spares to hold (:mod:`.spares`); 0: none."""
    lemon_count: int = 3
    lemon_window_s: float = 7 * 86400.0
    inventory_ttl_s: float = 2.0
    """How long the scheduler's view of which nodes are out is reused by the blast-radius
    guard (0: asked for every plan). gpuwarden's own plans in flight are always counted, and a
    plan that finishes forgets the view; only other people's drains can be this late."""
    pending_expire_s: float = 3600.0
    """A plan that waits (approval, blast radius, rate limit, lemon) longer than this is dropped
    with an ``expired`` record; 0 keeps plans forever. Measured on the monotonic clock, and
    across restarts from the plan's journal record (:mod:`remediation.clock`)."""
    max_pending_per_node: int = 4
    """At most this many plans wait at once about one node: one more is not queued (a
    ``queue_full`` decision, audited, with no notification). One sender flooding findings
    about its own node then holds only this many places, and notifies no one each time."""
    max_pending: int = 500
    """At most this many plans wait at once in all (the same ``queue_full`` past it)."""
    seen_retention_s: float = 0.0
    """Forget a decided finding's id this long after (0: never). ``gpuwarden remediate serve``
    sets it past the endpoint's ``max_finding_age_s`` plus ``max_clock_skew_s``: a re-send
    later than that is refused as stale before the engine sees it, so the id guards nothing.
    The Python API (a backtest, ``remediate apply``) keeps every id: it has no such check."""
    journal_compact_bytes: int = 0
    """Compact the audit log once it is this large and twice its size after the last
    compaction (:mod:`remediation.compact`: archived whole, the live log keeps what the engine
    still needs); 0 never. Needs ``seen_retention_s`` (without it every id is kept, and so
    every record): ``gpuwarden remediate serve`` sets both."""
    journal_archives_keep: int = 16
    """After each compaction the archives are compressed and only the newest this many kept
    (0: all). They are the operators' record, not the engine's memory: ship them elsewhere
    (or keep more) where the audit trail must outlive them."""
    approval: tuple[str, ...] = ()
    return_requires: str = "check"
    """What a node gpuwarden took out needs before it returns to service (``uncordon``):
    ``check``: a ``node_healthy`` finding that carries a passing ``gpuwarden check`` run after
    the node was taken out; ``command``: ``return_check_command`` passes when run by the engine
    just before the uncordon; ``approval``: an operator approves (``gpuwarden remediate
    approve``); ``none``: any ``node_healthy`` finding. An operator's ``undo`` always may."""
    return_check_command: tuple[str, ...] = ()
    """argv template (``{node}`` is replaced by the parsed node name, :func:`core.names.fill_argv`),
    e.g. ``ssh -- {node} gpuwarden check`` (ssh without ``--`` is refused at config load)."""
    return_check_timeout_s: float = 900.0
    return_workers: int = 2
    """Threads that run plans whose return check the engine runs (``return_requires =
    "command"``), apart from the ``workers`` that run everything else: several nodes' checks,
    each up to ``return_check_timeout_s``, then hold only these, and a fault's drain never
    waits behind them. More returns than this wait their turn (none is lost)."""
    notify_adapter: str = "webhook"
    checkpoint_adapter: str = "slurm"
    node_adapter: str = "slurm"
    workers: int = 4
    outcomes: OutcomeSettings = field(default_factory=OutcomeSettings)
    """When each removal's outcome is decided; precision's window (:mod:`remediation.outcomes`)."""
    predicted_kinds: tuple[str, ...] = ("failure_risk",)
    """Finding kinds that predict a fault rather than report one. A node taken out on one is
    held out for the prediction's horizon (its evidence's ``horizon_s``) and then offered
    back (:mod:`remediation.holds`); its outcome is judged by whether the fault came, not by
    a check (:mod:`remediation.outcomes`)."""
    max_prediction_hold_s: float = 86400.0
    """The longest a prediction holds a node out: a larger ``horizon_s`` is cut to this, and a
    prediction that states none (or not a positive number) holds this long."""

    @property
    def journal_retain_s(self) -> float:
        """How far back a compaction keeps every record: the longest window the engine or the
        outcome reader looks back over, and :data:`JOURNAL_MARGIN_S`, so that an older record
        is read by nothing but the rules :func:`remediation.compact.select` keeps it for."""
        o = self.outcomes
        return JOURNAL_MARGIN_S + max(
            self.seen_retention_s,
            self.cooldown_s,
            self.lemon_window_s,
            self.pending_expire_s,
            self.max_prediction_hold_s,
            o.window_s,
            2 * (o.quick_pass_s + o.clean_window_s),
        )


@dataclass(frozen=True)
class Decision:
    finding_id: str
    verdict: str
    """``act``, ``dry_run``, ``duplicate``, ``no_policy``, ``cooldown``, ``not_ours``,
    ``demoted`` (the policy's precision fell below its ``min_precision``: notify only),
    ``unchecked`` (a return to service without the passing check it needs: notify only),
    ``held`` (a return to service while a prediction holds the node out: notify only),
    ``approval``, ``lemon`` (a node taken out too often waits for an operator to return it),
    ``blast_radius``, ``rate_limited``, ``busy`` (another plan is acting on the node: decided
    again when it is done), ``failed`` (no such adapter) or ``unknown_node`` (the scheduler has
    no such node: nothing done, nobody told)."""
    policy: str = ""
    actions: tuple[Action, ...] = ()
    why: str = ""
    same_content: bool | None = None
    """For a ``duplicate``: whether the finding received first under this id had the same
    content (its digest); None for every other verdict."""

    @property
    def plan_id(self) -> str:
        return self.finding_id


def action_for(kind: ActionKind, finding: Finding, settings: EngineSettings) -> Action:
    """One action of a plan for ``finding``, addressed to the adapter that does ``kind``."""
    s = settings
    adapter = {
        ActionKind.NOTIFY: s.notify_adapter,
        ActionKind.CHECKPOINT: s.checkpoint_adapter,
        ActionKind.CHECKPOINT_INTERVAL: s.checkpoint_adapter,
    }
    params: dict[str, object] = {"kind": finding.kind, "subject": dict(finding.subject)}
    if finding.kind in s.predicted_kinds:
        params["hold_s"] = prediction_hold(finding, s)
    if kind is ActionKind.CHECKPOINT_INTERVAL and "advised_interval_s" in finding.evidence:
        params["interval_s"] = finding.evidence["advised_interval_s"]
    return Action(
        kind=kind,
        adapter=adapter.get(kind, s.node_adapter),
        node=finding.subject.get("node", ""),
        cluster=finding.subject.get("cluster", ""),
        job=finding.subject.get("job", ""),
        finding_id=finding.id,
        reason=f"gpuwarden: {finding.summary or finding.kind} [{finding.id[:12]}]",
        severity=str(finding.severity),
        params=params,
    )


def prediction_hold(finding: Finding, settings: EngineSettings) -> float:
    """How long a node taken out on the prediction ``finding`` stays out before it is offered
    back: the horizon the prediction states (``evidence.horizon_s``), at most
    ``max_prediction_hold_s``; a horizon that is missing or not a positive finite number (a
    broken or hostile sender) holds the longest."""
    longest = settings.max_prediction_hold_s
    horizon = finding.evidence.get("horizon_s")
    if isinstance(horizon, bool) or not isinstance(horizon, int | float):
        return longest
    try:
        value = float(horizon)
    except OverflowError:  # an integer too large for a float (JSON has no limit)
        return longest
    if not math.isfinite(value) or value <= 0:
        return longest
    return min(value, longest)


def plan(
    policies: Sequence[Policy],
    finding: Finding,
    settings: EngineSettings,
    facts: Callable[[str], NodeFacts | None] | None = None,
) -> tuple[Policy, tuple[Action, ...]] | None:
    """The first policy ``finding`` meets and its plan, or None when no policy applies."""
    policy = first_match(policies, finding, facts)
    if policy is None:
        return None
    return policy, tuple(action_for(kind, finding, settings) for kind in policy.actions)


def escalation(finding: Finding, d: Decision, settings: EngineSettings) -> Action:
    """The notification that tells a person why a plan waits (outside the plan's own ladder)."""
    return Action(
        kind=ActionKind.NOTIFY,
        adapter=settings.notify_adapter,
        node=finding.subject.get("node", ""),
        cluster=finding.subject.get("cluster", ""),
        finding_id=f"{finding.id}:{d.verdict}",
        reason=f"gpuwarden needs a human ({d.verdict}): {d.why}",
        severity="critical",
        params={"kind": finding.kind, "subject": dict(finding.subject), "plan": d.plan_id},
    )
