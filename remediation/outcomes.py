"""Outcomes: whether each node gpuwarden took out needed it, and each policy's precision.

Every plan that took a node out (a ``cordon`` or ``drain`` done for real, with the plan's
``requeue``) gets one ``outcome`` record in the audit log once its verdict is known:

* ``confirmed``: the node failed its check (a ``node_check_failed`` finding, a ``node_healthy``
  whose check failed, or a return check that refused the ``uncordon``), faulted again (a
  finding that a node-removing policy matched, whatever the guards made of it) within
  ``clean_window_s`` after it returned, or an operator put it back saying it was repaired
  (``undo --repaired`` or ``--rma``);
* ``refuted``: the node passed its check within ``quick_pass_s`` of its removal, returned and
  ran clean for ``clean_window_s``; or an operator undid it as a false alarm
  (``undo --false-alarm``);
* ``unknown``: ``quick_pass_s + clean_window_s`` passed (after its return, ``clean_window_s``)
  with neither.

A removal on a *prediction* (its plan carries ``hold_s``: :mod:`remediation.holds`) is judged by
whether the predicted fault came, not by a check: a passing check says the node works now, and
a prediction is about the hours after. It is ``confirmed`` by a fault (as above) while the node
is out or within ``hold_s`` after its return, or by a failed check; ``refuted`` once it
returned and ran ``hold_s`` (the horizon it was held for) with no fault; ``unknown`` as above.
A prediction is never itself the fault that confirms a removal.

The verdicts are derived from the journal alone: :class:`Outcomes` reads the audit log from
where it left off (the whole log on start), so an engine restarted mid-window decides the same
outcome from the same records, and an ``outcome`` record read back closes its plan for good:
no plan gets two. A record's time is placed on the monotonic clock when it is read (as
:meth:`remediation.clock.Clock.journal_frame` does on start), so the windows are not moved by a
clock step after that.

A policy's precision is ``confirmed / (confirmed + refuted)`` over its outcomes of the last
``window_s``. A policy with ``min_precision`` whose precision falls below it (over at least
``min_samples`` outcomes) is demoted: its plans become a notification (verdict ``demoted``),
with a ``demoted`` record and a ``policy_demoted`` finding; it is promoted back (``promoted``)
once its precision reaches ``min_precision + margin``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.audit import AuditLog
from gpuwarden.remediation.clock import Clock
from gpuwarden.remediation.holds import Holds, hold_of, is_prediction
from gpuwarden.remediation.model import foreign_removal
from gpuwarden.remediation.policy import Policy

VERDICTS = ("confirmed", "refuted", "unknown")
REMOVING = ("cordon", "drain")
FOLLOWING = ("cordon", "drain", "requeue")
#: ``undo`` reasons an operator gives, and the verdict each one means
UNDO_REASONS = {"false_alarm": "refuted", "repaired": "confirmed", "rma": "confirmed"}


@dataclass(frozen=True)
class OutcomeSettings:
    quick_pass_s: float = 3600.0
    """A passing check this soon after the removal says the node was fine."""
    clean_window_s: float = 7 * 86400.0
    """How long a returned node must run clean (refuted), or within which a new fault
    confirms its removal."""
    window_s: float = 30 * 86400.0
    """Precision counts the outcomes of this long."""
    margin: float = 0.05
    """A demoted policy is promoted at ``min_precision + margin`` (hysteresis)."""


@dataclass
class Open:
    """A plan that took a node out, its verdict not yet known."""

    plan_id: str
    policy: str
    kind: str
    node: str
    action_ids: list[str]
    removed_wall: float
    removed_mono: float
    cluster: str = ""
    passed_mono: float | None = None
    returned_mono: float | None = None
    hold_s: float = 0.0
    """A prediction's removal: how long it held the node (0.0: a fault's removal)."""
    known: tuple[str, dict[str, Any]] | None = None
    """The verdict a record showed (the first one), written once the whole batch is read:
    a journal read after a restart may hold the ``outcome`` record further on."""


#: how often (engine-monotonic seconds) the bounded memory is swept: what it forgets is hours
#: old, and sweeping on every finding of a storm scanned every plan each time
FORGET_EVERY_S = 1.0


@dataclass
class Outcomes:
    audit: AuditLog
    policies: Sequence[Policy]
    clock: Clock
    settings: OutcomeSettings = field(default_factory=OutcomeSettings)
    open: dict[str, Open] = field(default_factory=dict)
    decided: dict[str, str] = field(default_factory=dict)
    """The verdict of every plan with an outcome record (each plan at most one)."""
    history: list[tuple[float, str, str]] = field(default_factory=list)
    """(monotonic time, policy, verdict) of every outcome, oldest first."""
    demoted: dict[str, str] = field(default_factory=dict)
    """Policies now demoted, and why."""
    _offset: int = 0
    _plans: dict[str, tuple[str, str, str, list[str], float, float]] = field(default_factory=dict)
    """action id → (plan id, policy, kind, the plan's cordon/drain/requeue action ids, when
    decided, the plan's ``hold_s``): until its plan takes the node out and is decided, or
    ``quick_pass_s + clean_window_s`` after a plan that never did."""
    on_outcome: Callable[[dict[str, Any]], None] | None = None
    """Called with each ``outcome`` record this process writes (InfluxDB, by the CLI)."""
    cluster: str = "default"
    """The cluster of the last plan seen (the subject of a ``policy_demoted`` finding)."""
    _forgot_at: float = float("-inf")
    holds: Holds | None = None
    """Fed every record read (:mod:`remediation.holds`: the nodes a prediction holds out)."""

    def __post_init__(self) -> None:
        self.by_name = {p.name: p for p in self.policies}

    # -- reading the journal ------------------------------------------------------------------

    def _read_new(self) -> list[dict[str, Any]]:
        """The records appended since the last read (whole lines only)."""
        path = Path(self.audit.path)
        if not path.exists():
            return []
        with path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # (JSONDecodeError, UnicodeDecodeError)
                continue  # a torn line, or one no reader can take
            if isinstance(record, dict):
                records.append(record)
        return records

    @property
    def offset(self) -> int:
        """How far into the audit log this reader has read (bytes, a line boundary)."""
        return self._offset

    def moved(self, offset: int) -> None:
        """The log was compacted (:mod:`remediation.compact`): what was read up to
        :attr:`offset` now ends at ``offset`` of the new file."""
        self._offset = offset

    def update(self, *, write: bool = True) -> list[Finding]:
        """Read what the journal gained, decide every outcome now known, and demote or
        promote policies; returns the ``policy_demoted``/``policy_promoted`` findings to
        submit (the caller holds the engine's lock). ``write=False`` only reads (``gpuwarden
        remediate precision`` beside a running engine, whose journal it is)."""
        wall_now, mono_now = self.clock.wall(), self.clock.mono()
        for record in self._read_new():
            t = float(record.get("t", 0.0))
            self._observe(record, t, mono_now - max(0.0, wall_now - t))
        if not write:
            return []
        for plan_id, o in list(self.open.items()):
            verdict, evidence = o.known or self._due(o, mono_now)
            if verdict:
                self._decide(plan_id, verdict, evidence)
        self._forget(mono_now)
        return self._judge(mono_now)

    def _forget(self, now: float) -> None:
        """Bounded memory: outcomes past ``window_s``, and the plans that never took a node
        out once their removal could no longer be judged anyway."""
        if 0 <= now - self._forgot_at < FORGET_EVERY_S:
            return  # it runs on every finding: the scan below, each time, was quadratic
        self._forgot_at = now
        s = self.settings
        while self.history and now - self.history[0][0] > s.window_s:
            self.history.pop(0)
        stale = s.quick_pass_s + s.clean_window_s
        opened = {i for o in self.open.values() for i in o.action_ids}
        for action_id in [i for i, p in self._plans.items() if now - p[4] > stale]:
            if action_id not in opened:
                del self._plans[action_id]

    def _observe(self, r: Mapping[str, Any], t: float, mono: float) -> None:
        if self.holds is not None:
            self.holds.observe(r, t, mono)
        event, node = r.get("event"), str(r.get("node", ""))
        if event == "decision" and r.get("policy") not in ("", "undo", None):
            self._on_decision(r, mono)
            hold = hold_of(r.get("plan"))
            plan = [a for a in r.get("plan") or [] if a.get("action") in FOLLOWING]
            ids = [str(a.get("action_id")) for a in plan]
            for a in plan:
                self.cluster = str(a.get("cluster") or self.cluster)
                kind = str((a.get("params") or {}).get("kind", ""))
                self._plans[str(a.get("action_id"))] = (
                    str(r.get("finding_id")), str(r.get("policy")), kind, ids, mono, hold
                )  # fmt: skip
        elif event == "outcome":
            plan_id = str(r.get("plan_id", ""))
            if plan_id in self.decided:
                return  # this process wrote it, and counted it then
            gone = self.open.pop(plan_id, None)
            self.decided[plan_id] = str(r.get("verdict", ""))
            for action_id in gone.action_ids if gone else ():
                self._plans.pop(action_id, None)
            self.history.append((mono, str(r.get("policy", "")), str(r.get("verdict", ""))))
        elif event == "demoted":
            self.demoted[str(r.get("policy", ""))] = str(r.get("why", ""))
        elif event == "promoted":
            self.demoted.pop(str(r.get("policy", "")), None)
        elif event == "action":
            self._on_action(r, t, mono, node)
        elif event == "finding":
            subject = r.get("subject") or {}
            self._on_finding(r, str(subject.get("node", "")), mono)
        elif event == "undo":
            verdict = UNDO_REASONS.get(str(r.get("reason", "")))
            for o in self._open_on(node):
                if verdict:
                    why = f"operator {r.get('by', '?')} undid it: {r.get('reason')}"
                    self._know(o, verdict, {"by": r.get("by"), "why": why})

    def _open_on(self, node: str) -> list[Open]:
        return [o for o in self.open.values() if o.node == node]

    def _on_action(self, r: Mapping[str, Any], t: float, mono: float, node: str) -> None:
        action, ok = r.get("action"), r.get("outcome") == "ok" and not r.get("dry_run")
        known = self._plans.get(str(r.get("action_id", "")))
        if action in REMOVING and ok and known is not None and not foreign_removal(r):
            plan_id, policy, kind, ids, _, hold = known
            if plan_id not in self.open and plan_id not in self.decided:
                cluster = str(r.get("cluster", ""))
                self.open[plan_id] = Open(plan_id, policy, kind, node, ids, t, mono, cluster,
                                          hold_s=hold)  # fmt: skip
        elif action == "uncordon":
            for o in self._open_on(node):
                message = str(r.get("message", ""))
                if ok and foreign_removal(r):  # someone else took it over: it never returned
                    self._know(o, "unknown", {"why": message[:300]})
                elif ok:
                    o.returned_mono = mono
                elif "return check" in message:
                    self._know(o, "confirmed", {"why": message[:300]})

    def _on_finding(self, r: Mapping[str, Any], node: str, mono: float) -> None:
        kind, evidence = str(r.get("kind", "")), r.get("evidence") or {}
        for o in self._open_on(node):
            if r.get("finding_id") == o.plan_id:
                continue
            if kind == "node_check_failed" or (
                kind == "node_healthy" and evidence.get("check") == "fail"
            ):
                why = f"{node} failed its check"
                self._know(o, "confirmed", {"why": why, "finding": r.get("finding_id")})
            elif (
                kind == "node_healthy"
                and not o.hold_s  # a check does not refute a prediction
                and o.passed_mono is None
                and mono - o.removed_mono <= self.settings.quick_pass_s
                and _passed_after(evidence, o.removed_wall)
            ):
                o.passed_mono = mono

    def _on_decision(self, r: Mapping[str, Any], mono: float) -> None:
        """A new fault: a finding about the node that a node-removing policy matched (whatever
        the guards then made of it; a prediction is not a fault), within ``clean_window_s``
        after the node returned; for a prediction's removal, while the node is out or within
        its ``hold_s`` after it returned."""
        policy = self.by_name.get(str(r.get("policy", "")))
        if policy is None or not set(map(str, policy.actions)) & set(REMOVING):
            return
        if r.get("verdict") in ("duplicate", "queue_full") or is_prediction(r):
            return
        node = str(r.get("node", ""))
        for o in self._open_on(node):
            back = o.returned_mono
            if r.get("finding_id") == o.plan_id:
                continue
            if o.hold_s and back is None:
                why = f"{node} faulted ({policy.name}) while out on the prediction"
                self._know(o, "confirmed", {"why": why, "finding": r.get("finding_id")})
            elif back is not None and mono - back <= (o.hold_s or self.settings.clean_window_s):
                why = f"{node} faulted again ({policy.name}) {mono - back:.0f} s after it returned"
                self._know(o, "confirmed", {"why": why, "finding": r.get("finding_id")})

    @staticmethod
    def _know(o: Open, verdict: str, evidence: dict[str, Any]) -> None:
        if o.known is None:
            o.known = (verdict, evidence)

    def _due(self, o: Open, now: float) -> tuple[str, dict[str, Any]]:
        """The verdict the time alone now gives ``o`` (``""``: none yet)."""
        s = self.settings
        if o.hold_s and o.returned_mono is not None and now - o.returned_mono >= o.hold_s:
            why = (f"no fault while out, nor in the {o.hold_s:g} s after its return (the "
                   "prediction's horizon)")  # fmt: skip
            return "refuted", {"why": why}
        if (
            not o.hold_s
            and o.returned_mono is not None
            and now - o.returned_mono >= s.clean_window_s
        ):
            if o.passed_mono is not None:
                why = (f"passed its check {o.passed_mono - o.removed_mono:.0f} s after removal "
                       f"and ran clean {s.clean_window_s:g} s")  # fmt: skip
                return "refuted", {"why": why}
            return "unknown", {"why": f"returned late and ran clean {s.clean_window_s:g} s"}
        if o.returned_mono is None and now - o.removed_mono >= s.quick_pass_s + s.clean_window_s:
            return "unknown", {"why": "not returned, and no check or operator said why"}
        return "", {}

    def _decide(self, plan_id: str, verdict: str, evidence: Mapping[str, Any]) -> None:
        """Write ``plan_id``'s outcome (once: the record read back closes it)."""
        o = self.open.get(plan_id)
        if o is None or plan_id in self.decided:
            return
        record = self.audit.append(
            "outcome", self.clock.wall(), plan_id=plan_id, finding_id=plan_id,
            action_ids=o.action_ids, policy=o.policy, kind=o.kind, node=o.node,
            verdict=verdict, evidence=dict(evidence), removed_t=o.removed_wall,
            cluster=o.cluster,
        )  # fmt: skip
        self.open.pop(plan_id, None)
        self.decided[plan_id] = verdict
        for action_id in o.action_ids:
            self._plans.pop(action_id, None)
        self.history.append((self.clock.mono(), o.policy, verdict))
        if self.on_outcome is not None:
            self.on_outcome(record)

    # -- precision ----------------------------------------------------------------------------

    def table(self) -> list[dict[str, Any]]:
        """Per policy with outcomes or a ``min_precision``: the counts over ``window_s``, the
        precision (None without a decided outcome) and whether it is demoted."""
        counts = self.precision()
        rows = []
        names = [p.name for p in self.policies]
        for name in names + sorted(set(counts) - set(names)):
            policy = self.by_name.get(name)
            confirmed, refuted, unknown = counts.get(name, (0, 0, 0))
            if not (confirmed + refuted + unknown) and not (policy and policy.min_precision):
                continue
            n = confirmed + refuted
            rows.append({
                "policy": name, "confirmed": confirmed, "refuted": refuted, "unknown": unknown,
                "precision": round(confirmed / n, 4) if n else None,
                "min_precision": policy.min_precision if policy else 0.0,
                "demoted": name in self.demoted,
            })  # fmt: skip
        return rows

    def precision(self, now: float | None = None) -> dict[str, tuple[int, int, int]]:
        """(confirmed, refuted, unknown) per policy over the last ``window_s``."""
        now = self.clock.mono() if now is None else now
        counts: dict[str, list[int]] = {}
        for t, policy, verdict in self.history:
            if now - t <= self.settings.window_s and verdict in VERDICTS:
                counts.setdefault(policy, [0, 0, 0])[VERDICTS.index(verdict)] += 1
        return {p: (c[0], c[1], c[2]) for p, c in counts.items()}

    def _judge(self, now: float) -> list[Finding]:
        found: list[Finding] = []
        if not any(p.min_precision > 0 for p in self.policies):
            return found  # nothing to judge: no pass over the history per finding
        counts = self.precision(now)
        for policy in self.policies:
            if policy.min_precision <= 0:
                continue
            confirmed, refuted, _ = counts.get(policy.name, (0, 0, 0))
            n = confirmed + refuted
            value = confirmed / n if n else 1.0
            said = (f"precision {value:.2f} ({confirmed} confirmed, {refuted} refuted in "
                    f"{self.settings.window_s / 86400:g} days)")  # fmt: skip
            if policy.name not in self.demoted:
                if n >= policy.min_samples and value < policy.min_precision:
                    why = f"{said} < min_precision {policy.min_precision:g}"
                    found.append(self._mark("demoted", policy, value, n, why))
            elif value >= policy.min_precision + self.settings.margin or n == 0:
                why = f"{said} >= {policy.min_precision + self.settings.margin:g}"
                found.append(self._mark("promoted", policy, value, n, why))
        return found

    def _mark(self, event: str, policy: Policy, value: float, n: int, why: str) -> Finding:
        wall = self.clock.wall()
        self.audit.append(event, wall, policy=policy.name, precision=round(value, 4),
                          samples=n, min_precision=policy.min_precision, why=why)  # fmt: skip
        if event == "demoted":
            self.demoted[policy.name] = why
        else:
            self.demoted.pop(policy.name, None)
        return Finding(
            kind=f"policy_{event}",
            subject={"cluster": self.cluster},
            severity=Severity.WARNING if event == "demoted" else Severity.INFO,
            time_ns=int(wall * 1e9),
            evidence={"policy": policy.name, "precision": round(value, 4), "samples": n},
            summary=f"policy {policy.name} {event}: {why}",
            source="gpuwarden-remediation",
            bucket_s=1,
        )


def _passed_after(evidence: Mapping[str, Any], removed_wall: float) -> bool:
    """A ``node_healthy`` counts as "passed its check" only with a check that passed after
    the removal (``check: pass``, ``checked_ns``), as the return guard asks: a node's agent
    that only says it is healthy (no ``[check]`` configured, or a forged finding) refutes
    nothing, so it cannot talk a policy into demotion."""
    checked = evidence.get("checked_ns")
    return (
        evidence.get("check") == "pass"
        and isinstance(checked, int | float)
        and checked / 1e9 >= removed_wall
    )
