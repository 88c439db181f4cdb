"""Grafana-managed alert rules for the rule-based conditions and contact points for the webhooks,
in Grafana's file-provisioning format; each rule names its contact point itself.

Routing never touches the organisation's notification policy tree. In Grafana the whole tree
is one resource: a provisioning file with ``policies:`` (or a PUT of
``/api/v1/provisioning/policies``) replaces every route the site had, and Grafana cannot
provision a subtree. So each rule carries ``notification_settings`` (Grafana's "simplified
routing", Grafana 11 and later): its contact point by severity (:data:`ROUTING`), with its
grouping and repeat interval, and Grafana routes it through a policy it manages itself beside
the site's tree. Critical rules go to the engine's webhook; warnings to Slack where
``[alerts] slack_url_file`` is set, else they carry no routing of their own and the site's
tree routes them (never to the engine, whose ``alerts`` identity takes critical kinds only).
A site that wants gpuwarden's alerts in its own tree instead gets the routes as a snippet
to paste (:func:`route_snippet`, exported beside the provisioning files, never in them).

Each rule is the SDK's ``Rule``: query A (InfluxQL, one series per node/GPU/port), B reduces
each series to one number, C compares it with a threshold; the rule fires per series. Rules
that the failure predictor and analytics replace with findings (stragglers, risk) are still
here because an operator wants a page even when analytics is down. Thresholds come from
``[alerts]`` in the dashboards configuration.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from grafana_foundation_sdk.builders import alerting as al
from grafana_foundation_sdk.builders import expr
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as am

from gpuwarden.dashboards.influxql import Agg, Cond, Select, Target

GROUP = "gpuwarden"
Op = Literal["gt", "lt"]


@dataclass(frozen=True)
class RuleSpec:
    uid: str
    title: str
    query: Select
    op: Op
    threshold: float
    severity: Literal["critical", "warning"]
    summary: str
    for_: str = "0s"
    window_s: int = 600
    no_data: Literal["OK", "NoData", "Alerting"] = "OK"

    @property
    def kind(self) -> str:
        """The finding kind the remediation engine makes of this alert (its ``kind`` label)."""
        return FINDING_KINDS.get(self.uid, self.uid.removeprefix("gw-").replace("-", "_"))


# alerts that mean the same as a finding gpuwarden itself emits share its kind, so one policy
# covers both (the engine's cooldown keeps a node from being acted on twice for one fault)
FINDING_KINDS = {
    "gw-fatal-xid": "gpu_xid",
    "gw-fatal-sxid": "nvswitch_sxid",
    "gw-ib-link-down": "link_down",
    "gw-congested-switch": "link_congested",
    "gw-failure-risk": "failure_risk",
}


def _count_true(
    measurement: str, flag: str, alias: str, tags: tuple[str, ...], counted: str = ""
) -> Select:
    """Per series: how many samples in the window had ``flag`` set."""
    return Select(
        measurement,
        (Agg("count", counted or flag, alias),),
        where=(Cond(flag, "=", True),),
        group_tags=tags,
        every=False,
    )


def _growth(measurement: str, counter: str, alias: str, tags: tuple[str, ...]) -> Select:
    """Per series: how much a counter grew in the window (max - min; a reset also shows)."""
    return Select(measurement, (Agg("spread", counter, alias),), group_tags=tags, every=False)


def rule_specs(cfg: Mapping[str, Mapping[str, Any]]) -> list[RuleSpec]:
    a = cfg["alerts"]
    gpu = ("cluster", "node", "gpu")
    port = ("cluster", "node", "hca", "port")
    node = ("cluster", "node")
    return [
        RuleSpec(
            "gw-fatal-xid",
            "Fatal XID",
            _count_true("gpu_event", "fatal_active", "fatal_xids", node, counted="xid_code"),
            "gt",
            0,
            "critical",
            "{{ $labels.node }}: a fatal XID in the last 10 minutes; drain and reset the GPU",
        ),
        RuleSpec(
            "gw-fatal-sxid",
            "Fatal NVSwitch error",
            _count_true("nvswitch_event", "fatal_active", "fatal_sxids", node, counted="sxid_code"),
            "gt",
            0,
            "critical",
            "{{ $labels.node }}: a fatal NVSwitch error (SXid) in the last 10 minutes; NVLink is "
            "down for the node's GPUs: drain the node and reset its GPUs",
        ),
        RuleSpec(
            "gw-fabric-unregistered",
            "GPU not registered with the NVLink fabric",
            # a GPU that answered "not registered" in each of the last windows: a driver
            # reload's few seconds of registration never page, a stopped Fabric Manager does
            Select(
                "gpu",
                (Agg("count", "fabric_state_code", "unregistered"),),
                where=(Cond("fabric_registered_active", "=", False),),
                group_tags=gpu,
                every=False,
            ),
            "gt",
            0,
            "critical",
            "{{ $labels.node }} GPU {{ $labels.gpu }}: not registered with the NVLink fabric; "
            "CUDA programs cannot start on it. Check that nvidia-fabricmanager runs and its log",
            for_="10m",
            window_s=300,
        ),
        RuleSpec(
            "gw-row-remap-failure",
            "Row remap failure",
            _count_true("gpu", "remapped_rows_failure_active", "remap_problems", gpu),
            "gt",
            0,
            "critical",
            "{{ $labels.node }} GPU {{ $labels.gpu }}: row remapping failed; replace the GPU",
        ),
        RuleSpec(
            "gw-ecc-dbe",
            "Uncorrectable ECC errors",
            _growth("gpu", "ecc_dbe_volatile_total", "dbe_new", gpu),
            "gt",
            0,
            "critical",
            "{{ $labels.node }} GPU {{ $labels.gpu }}: new double-bit ECC errors",
        ),
        RuleSpec(
            "gw-pcie-downtrained",
            "GPU PCIe link trained down",
            _count_true("gpu", "pcie_link_downtrained_active", "downtrained", gpu),
            "gt",
            0,
            "warning",
            "{{ $labels.node }} GPU {{ $labels.gpu }}: the PCIe link runs narrower than the GPU "
            "and its slot allow; check the riser, slot and GPU at the next maintenance",
            for_="10m",
        ),
        RuleSpec(
            "gw-gpu-hot",
            "GPU temperature high",
            Select("gpu", (Agg("max", "gpu_temp_c"),), group_tags=gpu, every=False),
            "gt",
            float(a["gpu_temp_c"]),
            "warning",
            "{{ $labels.node }} GPU {{ $labels.gpu }} above the configured temperature",
            for_="5m",
        ),
        RuleSpec(
            "gw-thermal-slowdown",
            "GPU thermal slowdown",
            _count_true("gpu", "clock_event_hw_thermal_slowdown_active", "slowed", gpu),
            "gt",
            0,
            "warning",
            "{{ $labels.node }} GPU {{ $labels.gpu }} is slowed by hardware thermal protection",
            for_="5m",
        ),
        RuleSpec(
            "gw-ib-link-down",
            "InfiniBand link went down",
            _growth("ib_port", "link_downed_total", "link_downs", port),
            "gt",
            0,
            "critical",
            "{{ $labels.node }} {{ $labels.hca }}/{{ $labels.port }}: the link went down",
        ),
        RuleSpec(
            "gw-ib-symbol-errors",
            "InfiniBand symbol errors",
            _growth("ib_port", "symbol_error_total", "symbol_errors", port),
            "gt",
            float(a["symbol_errors_per_10m"]),
            "warning",
            "{{ $labels.node }} {{ $labels.hca }}/{{ $labels.port }}: symbol errors climbing "
            "(a cable or transceiver going bad)",
        ),
        RuleSpec(
            "gw-congested-switch",
            "Congested leaf switch",
            Select(
                "congestion",
                (Agg("max", "score_ratio"),),
                group_tags=("cluster", "switch"),
                every=False,
            ),
            "gt",
            float(a["congestion_score"]),
            "warning",
            "switch {{ $labels.switch }}: ports waiting for credits",
            window_s=1800,
        ),
        RuleSpec(
            "gw-failure-risk",
            "High predicted failure risk",
            # the scorer marks risks at or above the model's own operating threshold (chosen
            # for precise alerts); the probabilities are calibrated and small, so a fixed
            # probability threshold here would either never fire or fire on noise
            _count_true("failure_risk", "alert_active", "risk_alerts", node, "probability_ratio"),
            "gt",
            0,
            "warning",
            "{{ $labels.node }}: the predictor expects a hardware fault; checkpoint soon",
            window_s=1800,
        ),
        RuleSpec(
            "gw-agent-silent",
            "Agent stopped reporting",
            Select(
                "agent",
                (Agg("count", "cycle_lag_s", "cycles"),),
                group_tags=("cluster", "node"),
                every=False,
            ),
            "lt",
            1,
            "warning",
            "{{ $labels.node }}: no agent cycle in 10 minutes (agent, node or network down)",
            no_data="Alerting",
        ),
        RuleSpec(
            "gw-sink-dropping",
            "Agent dropping data",
            _growth("sink", "points_dropped_total", "dropped", node),
            "gt",
            0,
            "warning",
            "{{ $labels.node }}: the spool overflowed while InfluxDB was unreachable",
        ),
        RuleSpec(
            "gw-sensor-implausible",
            "A sensor reads impossible values",
            # per source: each has its own counter
            _growth("agent", "implausible_total", "implausible", (*node, "source")),
            "gt",
            0,
            "warning",
            "{{ $labels.node }} ({{ $labels.source }}): a sensor reads values no hardware can "
            "have (left out of the data; the agent log names it once): a broken sensor or a "
            "driver problem",
        ),
    ]


def _rule(spec: RuleSpec, datasource_uid: str) -> al.Rule:
    query = (
        al.Query("A")
        .datasource_uid(datasource_uid)
        .relative_time_range(am.RelativeTimeRange(from_val=spec.window_s, to=0))
        .model(Target(spec.query, "A", datasource_uid=datasource_uid))
    )
    reduce = (
        al.Query("B")
        .datasource_uid("__expr__")
        .model(expr.TypeReduce().ref_id("B").expression("A").reducer("last"))
    )
    evaluator = expr.ExprTypeThresholdConditionsEvaluator().type(spec.op).params([spec.threshold])
    threshold = (
        al.Query("C")
        .datasource_uid("__expr__")
        .model(
            expr.TypeThreshold()
            .ref_id("C")
            .expression("B")
            .conditions([expr.ExprTypeThresholdConditions().evaluator(evaluator)])
        )
    )
    return (
        al.Rule(spec.title)
        .uid(spec.uid)
        .queries([query, reduce, threshold])
        .condition("C")
        .for_val(spec.for_)
        .no_data_state(spec.no_data)
        .exec_err_state("Error")
        .labels({"severity": spec.severity, "source": "gpuwarden", "kind": spec.kind})
        .annotations({"summary": spec.summary})
    )


#: severity -> (contact point, group_wait, repeat_interval); a warning goes to Slack when
#: ``[alerts] slack_url_file`` is set. Grouping is per node: one page per sick node.
ROUTING: Mapping[str, tuple[str, str, str]] = {
    "critical": ("gpuwarden-webhook", "0s", "1h"),
    "warning": ("gpuwarden-slack", "30s", "4h"),
}
GROUP_BY = ["alertname", "cluster", "node"]


def receiver(cfg: Mapping[str, Mapping[str, Any]], severity: str) -> str:
    """The contact point a rule of ``severity`` notifies; ``""``: none of gpuwarden's (a
    warning without Slack goes through the organisation's own notification policy). Warnings
    never go to the engine: its ``alerts`` identity takes the critical rules' kinds only, so a
    warning there was refused with 403, retried, and reached nobody (found in review)."""
    name = ROUTING[severity][0]
    if name == "gpuwarden-slack" and not cfg["alerts"]["slack_url_file"]:
        return ""
    return name


def notification_settings(
    cfg: Mapping[str, Mapping[str, Any]], severity: str
) -> dict[str, Any] | None:
    """A rule's own routing (Grafana's ``notification_settings``): no policy tree involved;
    None where gpuwarden has no contact point for it (then the organisation's tree routes
    it, to its default contact point unless a route matches)."""
    _, wait, repeat = ROUTING[severity]
    name = receiver(cfg, severity)
    if not name:
        return None
    return {
        "receiver": name,
        "group_by": list(GROUP_BY),
        "group_wait": wait,
        "repeat_interval": repeat,
    }


def route_snippet(cfg: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """For a site that routes through its own policy tree: the child routes to paste under
    its default policy (matching the rules' ``source = gpuwarden`` and ``severity`` labels).
    Never a provisioning file: provisioned, a ``policies:`` file replaces the whole tree."""
    return {
        "routes": [
            {
                "receiver": receiver(cfg, severity),
                "object_matchers": [["source", "=", "gpuwarden"], ["severity", "=", severity]],
                "group_by": list(GROUP_BY),
                "group_wait": wait,
                "repeat_interval": repeat,
            }
            for severity, (_, wait, repeat) in ROUTING.items()
            if receiver(cfg, severity)
        ]
    }


def _plain(obj: object) -> Any:
    return json.loads(JSONEncoder().encode(obj))


def rules_file(cfg: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Alert rules in Grafana's provisioning format (``provisioning/alerting/*.yaml``)."""
    uid = cfg["grafana"]["datasource_uid"]
    rules = []
    for spec in rule_specs(cfg):
        r = _plain(_rule(spec, uid).build())
        rules.append(
            {
                "uid": r["uid"],
                "title": r["title"],
                "condition": r["condition"],
                "data": r["data"],
                "for": r["for"],
                "noDataState": r["noDataState"],
                "execErrState": r["execErrState"],
                "labels": r["labels"],
                "annotations": r["annotations"],
                "isPaused": False,
            }
            | (
                {"notification_settings": ns}
                if (ns := notification_settings(cfg, spec.severity)) is not None
                else {}
            )
        )
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": cfg["grafana"]["org_id"],
                "name": GROUP,
                "folder": cfg["grafana"]["folder"],
                "interval": cfg["alerts"]["evaluate_every"],
                "rules": rules,
            }
        ],
    }


def contact_points_file(
    cfg: Mapping[str, Mapping[str, Any]], read: Callable[[str], str] | None = None
) -> dict[str, Any]:
    """The contact points (the webhook; Slack when configured), and nothing else: no
    ``policies`` (that would replace the organisation's whole notification policy tree; the
    rules name their contact point themselves, see :func:`notification_settings`).

    The secrets (the webhook's bearer token, the Slack URL, which is a credential) stay in
    their files: a provisioning file gets ``$__file{...}``, which Grafana reads itself, so they
    never land in the exported files. ``read`` (for ``push`` over the API, which does not
    interpolate) returns a file's content instead."""
    a = cfg["alerts"]
    org = cfg["grafana"]["org_id"]

    def secret(path: str) -> str:
        return read(path) if read is not None else "$__file{" + path + "}"

    settings: dict[str, Any] = {"url": a["webhook_url"], "httpMethod": "POST"}
    if a["webhook_token_file"]:
        settings["authorization_scheme"] = "Bearer"
        settings["authorization_credentials"] = secret(a["webhook_token_file"])
    points = [
        (
            "gpuwarden-webhook",
            al.ContactPoint()
            .name("gpuwarden-webhook")
            .type("webhook")
            .uid("gpuwarden-webhook")
            .settings(settings),
        ),
    ]
    if a["slack_url_file"]:
        points.append(
            (
                "gpuwarden-slack",
                al.ContactPoint()
                .name("gpuwarden-slack")
                .type("slack")
                .uid("gpuwarden-slack")
                .settings({"url": secret(a["slack_url_file"])}),
            )
        )
    contact_points = []
    for name, cp in points:
        p = _plain(cp.build())
        receiver = {
            "uid": p["uid"],
            "type": p["type"],
            "settings": p["settings"],
            "disableResolveMessage": False,
        }
        contact_points.append({"orgId": org, "name": name, "receivers": [receiver]})
    return {"apiVersion": 1, "contactPoints": contact_points}
