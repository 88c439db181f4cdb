"""Holds: a node taken out on a prediction stays out for the prediction's horizon, then is
offered back.

A prediction (``failure_risk``: "this GPU fails within ``horizon_s``") is not a fault. The node
it took out is fine until the fault comes, and its agent, which saw nothing wrong, has no
reason to say it is healthy again: without a rule of its own such a node stayed out until a
person or an agent restart brought it back. The rule:

* the removal's ``action`` record carries ``hold_s`` (the prediction's horizon, capped:
  :func:`remediation.engine.decide.prediction_hold`); the node is *held* until ``hold_s``
  after its removal. A later prediction's removal of the same node extends the hold;
* while held, no finding returns it (the ``held`` guard): a passing check says the node works
  now, not that the predicted fault will not come;
* when the hold ends with no fault since, the engine submits a ``prediction_expired`` finding
  of its own (``Engine.tick``; the endpoint refuses that kind from every sender) which the
  ``prediction-expired`` policy answers with ``notify`` and ``uncordon``, through every guard:
  with ``return_requires = "command"`` the engine runs the check and returns the node, with
  ``"check"`` it waits for a ``node_healthy`` whose passing check is newer than the hold's
  end (the notification says so), with ``"approval"`` an operator approves;
* a fault on the node while it is held (a finding a node-removing policy that is not a
  prediction matched, whatever the guards made of it) ends the hold: the node is out for the
  fault now, and returns as any node taken out for a fault does.

The state is derived from the journal alone (the outcome reader feeds it every record it
reads, on start the whole log), so a restarted engine holds the same nodes to the same times,
and asks once: a ``prediction_expired`` finding whose decision is on disk is not submitted
again. Times are placed on the monotonic clock when read, as every window of the engine's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.remediation.model import foreign_removal

EXPIRED_KIND = "prediction_expired"
"""The engine's own finding when a hold ends; no sender may send it (:mod:`.identity`)."""
REMOVING = ("cordon", "drain")


@dataclass
class Hold:
    """A node gpuwarden took out on a prediction, held until ``until_*``."""

    node: str
    plan_id: str
    cluster: str
    removed_wall: float
    until_wall: float
    until_mono: float
    asked: bool = False
    """Whether the engine's ``prediction_expired`` finding for this hold has been decided."""
    retry_mono: float = float("-inf")
    """An offer not queued (``queue_full``) is tried again from then."""


def is_prediction(decision: Mapping[str, Any]) -> bool:
    """Whether a ``decision`` record is about a prediction (``predicted``, which the engine
    writes from the finding's kind; or a plan that carries ``hold_s``: a record written before
    ``predicted`` was): a guard that cut its plan to a notification does not make it a fault."""
    return decision.get("predicted") is True or hold_of(decision.get("plan")) > 0


def hold_of(plan: object) -> float:
    """The ``hold_s`` a decision record's plan carries (0.0: not a prediction's plan)."""
    for action in plan if isinstance(plan, list) else []:
        params = action.get("params") if isinstance(action, Mapping) else None
        hold = params.get("hold_s") if isinstance(params, Mapping) else None
        if isinstance(hold, int | float) and not isinstance(hold, bool) and hold > 0:
            return float(hold)
    return 0.0


class Holds:
    """The nodes held now. ``removes(policy)``: whether a policy takes nodes out (its
    findings about a held node are faults). Not thread-safe: the engine calls it under its
    lock (through :meth:`remediation.outcomes.Outcomes.update`)."""

    def __init__(self, removes: Callable[[str], bool], longest_s: float = float("inf")) -> None:
        self.removes = removes
        self.longest_s = longest_s
        """No hold lasts longer than this from its first removal, however many predictions
        extend it (``max_prediction_hold_s``): a node the model keeps flagging is offered back
        then, taken out again if it is still flagged, and after ``lemon_count`` such removals
        waits for a person (the lemon rule)."""
        self.held: dict[str, Hold] = {}
        self._out: set[str] = set()
        """Nodes gpuwarden has out (a removal done for real, no return since)."""
        self._asks: dict[str, tuple[str, str]] = {}
        """``prediction_expired`` finding ids seen in the journal: (node, the held plan)."""
        self.fault_at: dict[str, float] = {}
        """When a fault ended a node's hold (wall time): a check from before it does not
        return the node (the return guard asks for a newer one)."""

    def observe(self, r: Mapping[str, Any], t: float, mono: float) -> None:
        """One journal record, written at wall time ``t`` (``mono`` on this process's clock)."""
        event, node = r.get("event"), str(r.get("node", ""))
        if event == "action" and r.get("outcome") == "ok" and not r.get("dry_run") and node:
            self._on_action(r, t, mono, node)
        elif event == "finding" and r.get("kind") == EXPIRED_KIND:
            subject, evidence = r.get("subject") or {}, r.get("evidence") or {}
            ask = (str(subject.get("node", "")), str(evidence.get("plan", "")))
            self._asks[str(r.get("finding_id", ""))] = ask
        elif event == "decision" and r.get("verdict") not in ("duplicate", "queue_full"):
            fid = str(r.get("finding_id", ""))
            asked = self._asks.pop(fid, None)
            if asked is not None:
                kept = self.held.get(asked[0])
                if kept is not None and kept.plan_id == asked[1]:
                    kept.asked = True  # (a later prediction's hold is not this offer's)
            elif (
                node in self.held
                and self.removes(str(r.get("policy", "")))
                and not is_prediction(r)  # a fault, not another prediction
            ):
                del self.held[node]
                self.fault_at[node] = t

    def _on_action(self, r: Mapping[str, Any], t: float, mono: float, node: str) -> None:
        action = r.get("action")
        if action == "uncordon":
            self._out.discard(node)
            self.held.pop(node, None)
            self.fault_at.pop(node, None)
            return
        if action not in REMOVING or foreign_removal(r):
            return  # (out by someone else: not gpuwarden's to hold or return)
        hold = r.get("hold_s")
        was_out = node in self._out
        self._out.add(node)
        if not isinstance(hold, int | float) or isinstance(hold, bool) or hold <= 0:
            if self.held.pop(node, None) is not None:  # out for a fault now
                self.fault_at[node] = t
            return
        kept = self.held.get(node)
        if was_out and kept is None:
            return  # out already for another reason: a prediction does not shorten that
        if kept is not None and kept.until_mono <= mono:
            kept = None  # that hold has ended (a person returned the node by hand): a new one
        removed = kept.removed_wall if kept is not None else t
        hold = min(float(hold), removed + self.longest_s - t)  # (an extension: capped)
        if kept is not None and kept.until_mono >= mono + hold:
            return
        self.held[node] = Hold(node, str(r.get("finding_id", "")), str(r.get("cluster", "")),
                               removed, t + hold, mono + hold)  # fmt: skip

    def until(self, node: str) -> Hold | None:
        """The hold on ``node``, if it is held (ended or not)."""
        return self.held.get(node)

    def due(self, now_mono: float, compacted_before: float = 0.0) -> list[Hold]:
        """Holds that have ended and whose node has not yet been offered back. A hold that
        ended before ``compacted_before`` (wall time: the journal's compacted horizon) is not
        offered: its offer, if it was made, may have been compacted away, and offering it
        again would repeat it (such a node has been out for weeks: a person's matter)."""
        return [
            h
            for h in self.held.values()
            if not h.asked
            and now_mono >= max(h.until_mono, h.retry_mono)
            and h.until_wall >= compacted_before
        ]
