"""Health & risk: the failure predictor's risk per node and GPU, predictions against the
hardware events that followed, and what the remediation engine did about them."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.dashboards.influxql import Agg, Cond, Scope
from gpuwarden.dashboards.panels import board, graph, grid, heat, marks

UID = "gpuwarden-health"
S = Scope("cluster", "node")


def build() -> model.Dashboard:
    risk = [
        heat(
            "Failure risk by node",
            "Highest predicted probability of a hardware fault within the horizon, per node",
            S("failure_risk", Agg("max", "probability_ratio"), group_tags=("node",)),
            unit="percentunit",
            alias="$tag_node",
            w=12,
        ),
        graph(
            "Failure risk by GPU and horizon",
            "Each scored GPU (gpu empty: the node as a whole), per prediction horizon",
            S(
                "failure_risk",
                Agg("max", "probability_ratio"),
                group_tags=("node", "gpu", "horizon"),
            ),
            unit="percentunit",
            alias="$tag_node/$tag_gpu $tag_horizon",
        ),
        grid(
            "Highest risk per GPU",
            "Each scored GPU's highest risk in the range and the model that gave it (sort by "
            "the risk column)",
            S(
                "failure_risk",
                Agg("max", "probability_ratio"),
                Agg("last", "model_version"),
                group_tags=("node", "gpu", "horizon"),
                every=False,
            ),
        ),
    ]
    outcomes = [
        graph(
            "Predictions against hardware events",
            "A: highest risk on the cluster. B: hardware faults (fatal XIDs, lost GPUs) as "
            "they happened",
            S("failure_risk", Agg("max", "probability_ratio", "highest_risk")),
            S(
                "gpu_event",
                Agg("count", "fatal_active", "fatal_events"),
                where=(Cond("fatal_active", "=", True),),
            ),
            unit="none",
            alias="$col",
            w=24,
        ),
        graph(
            "Injected faults (simulated scenarios only)",
            "Ground truth of a replayed scenario: the faults it injected, by kind. Empty on "
            "a real cluster",
            S("scenario_fault", Agg("count", "fault_id", "faults"), group_tags=("kind",)),
            unit="none",
            alias="$tag_kind",
            bars=True,
        ),
        graph(
            "Fatal events by node",
            "Fatal GPU events: XIDs the catalogue (or your fatal list) counts as fatal, lost "
            "GPUs, new uncorrectable ECC errors, failed row remaps",
            S(
                "gpu_event",
                # counted on fatal_active, set on every event: a lost GPU has no xid_code
                Agg("count", "fatal_active", "fatal_events"),
                where=(Cond("fatal_active", "=", True),),
                group_tags=("node",),
            ),
            unit="none",
            alias="$tag_node",
            bars=True,
        ),
    ]
    actions = [
        graph(
            "Remediation actions",
            "Actions per interval by action and outcome (dry-run actions included)",
            S(
                "remediation_action",
                Agg("count", "action_id", "actions"),
                group_tags=("action", "outcome"),
            ),
            unit="none",
            alias="$tag_action $tag_outcome",
            bars=True,
        ),
        graph(
            "Action duration",
            "How long each action took, from decision to outcome",
            S("remediation_action", Agg("max", "duration_s"), group_tags=("action",)),
            unit="s",
            alias="$tag_action",
            points=True,
        ),
        graph(
            "Action outcomes",
            "Each node the engine took out, once its verdict is known: confirmed (it failed its "
            "check, faulted again, or was repaired), refuted (it passed its check at once and ran "
            "clean, or an operator called it a false alarm) or unknown, per policy",
            S(
                "remediation_outcome",
                Agg("count", "finding_id", "outcomes"),
                group_tags=("policy", "verdict"),
            ),
            unit="none",
            alias="$tag_policy $tag_verdict",
            bars=True,
        ),
        grid(
            "Outcomes and their evidence",
            "Per plan that took a node out: its verdict and what decided it, newest first",
            S.latest(
                "remediation_outcome",
                ("node", "policy", "kind", "verdict", "after_removal_s", "message", "finding_id"),
                limit=500,
            ),
            w=12,
        ),
        grid(
            "Audit trail",
            "Finding -> action -> outcome, newest first (the engine's audit log, as events)",
            S.latest(
                "remediation_action",
                (
                    "node",
                    "job",
                    "action",
                    "adapter",
                    "outcome",
                    "dry_run_active",
                    "duration_s",
                    "message",
                    "finding_id",
                    "action_id",
                ),
                limit=500,
            ),
        ),
    ]
    return board(
        UID,
        "gpuwarden / Health and risk",
        "Failure risk per node and GPU, predictions against events, remediation actions",
        [("Risk", risk), ("Predictions and events", outcomes), ("Remediation", actions)],
        scope=S,
        annotations=[
            marks(S, "Remediation actions", "remediation_action", "message", "action", "purple"),
            marks(
                S,
                "Fatal XIDs",
                "gpu_event",
                "message",
                "event",
                "red",
                where=(Cond("fatal_active", "=", True),),
            ),
        ],
    )
