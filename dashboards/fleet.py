"""Fleet: is the cluster healthy and busy, what did gpuwarden find, is the agent itself well,
and is every GPU set up the same."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.dashboards.influxql import Agg, Cond, Scope, agg
from gpuwarden.dashboards.panels import board, graph, grid, marks, single, states, unit_of

UID = "gpuwarden-fleet"
S = Scope("cluster")


def build() -> model.Dashboard:
    gpus_now = S("gpu", Agg("last", "power_w"), group_tags=("node", "gpu"), every=False)
    nodes_now = S("gpu", Agg("last", "gpu_util_pct"), group_tags=("node",), every=False)
    power_per_gpu = S("gpu", Agg("mean", "power_w"), group_tags=("node", "gpu"))
    now = [
        single(
            "GPUs reporting",
            "GPUs with at least one sample in the time range",
            S("gpu", Agg("count", "power_w", "gpus"), inner=gpus_now, every=False),
            unit="none",
        ),
        single(
            "Nodes reporting",
            "Nodes with at least one GPU sample in the time range",
            S("gpu", Agg("count", "gpu_util_pct", "nodes"), inner=nodes_now, every=False),
            unit="none",
        ),
        single(
            "Mean GPU utilisation",
            "Mean NVML utilisation over every GPU and the whole range",
            S("gpu", Agg("mean", "gpu_util_pct"), every=False),
            unit="percent",
        ),
        single(
            "GPU power now",
            "Sum over GPUs of each GPU's last power reading",
            S("gpu", Agg("sum", "power_w"), inner=gpus_now, every=False),
            unit="watt",
        ),
        single(
            "Fatal XIDs",
            "GPU events whose XID the catalogue (or your fatal list) counts as fatal",
            S(
                "gpu_event",
                Agg("count", "xid_code", "fatal_xids"),
                where=(Cond("fatal_active", "=", True),),
                every=False,
            ),
            unit="none",
            thresholds=((None, "green"), (1, "red")),
        ),
        single(
            "Findings",
            "Findings written by analytics and the agents' fast path in the range",
            S("finding", Agg("count", "finding_id", "findings"), every=False),
            unit="none",
            thresholds=((None, "green"), (1, "orange")),
        ),
    ]
    usage = [
        graph(
            "GPU utilisation by node",
            "Mean over each node's GPUs",
            S("gpu", Agg("mean", "gpu_util_pct"), group_tags=("node",)),
            unit="percent",
            alias="$tag_node",
        ),
        graph(
            "GPU power, cluster total",
            "Sum over GPUs of each GPU's mean power per interval",
            S("gpu", Agg("sum", "power_w"), inner=power_per_gpu),
            unit="watt",
            alias="GPU power",
        ),
        graph(
            "Hottest GPU per node",
            "Maximum GPU temperature on each node",
            S("gpu", Agg("max", "gpu_temp_c"), group_tags=("node",)),
            unit="celsius",
            alias="$tag_node",
        ),
        graph(
            "GPU memory used by node",
            "Mean framebuffer memory in use per GPU",
            S("gpu", Agg("mean", "mem_used_bytes"), group_tags=("node",)),
            unit=unit_of("gpu", "mem_used_bytes"),
            alias="$tag_node",
        ),
    ]
    health = [
        graph(
            "XIDs by node",
            "GPU events (XIDs, lost GPUs) per interval",
            S("gpu_event", Agg("count", "xid_code", "xids"), group_tags=("node",)),
            unit="none",
            alias="$tag_node",
            bars=True,
        ),
        graph(
            "Findings by kind",
            "Findings per interval, by kind",
            S("finding", Agg("count", "finding_id", "findings"), group_tags=("kind",)),
            unit="none",
            alias="$tag_kind",
            bars=True,
        ),
        grid(
            "Latest findings",
            "Newest first: what analytics and the agents found, on what, and how sure",
            S.latest(
                "finding",
                (
                    "severity",
                    "kind",
                    "node",
                    "gpu",
                    "job",
                    "summary",
                    "probability_ratio",
                    "confidence_ratio",
                    "finding_id",
                ),
                limit=200,
            ),
        ),
    ]
    agent = [
        graph(
            "Collection time per source",
            "How long each agent source took per cycle (slowest node)",
            S("agent", Agg("max", "collect_duration_s"), group_tags=("source",)),
            unit="s",
            alias="$tag_source",
        ),
        graph(
            "Agent cycle lag",
            "How late each agent cycle started against its schedule",
            S("agent", Agg("max", "cycle_lag_s"), group_tags=("node",)),
            unit="s",
            alias="$tag_node",
        ),
        states(
            "Source success",
            "Whether each source's last collection in the interval worked",
            S("agent", Agg("last", "collect_success_active"), group_tags=("node", "source")),
            alias="$tag_node $tag_source",
            w=12,
        ),
        graph(
            "Sink spool and drops",
            "Bytes waiting in the on-disk spool, and points the sink had to drop",
            S(
                "sink",
                Agg("max", "spool_bytes"),
                Agg("increase", "points_dropped_total", "points_dropped"),
                group_tags=("node",),
            ),
            unit="bytes",
            alias="$tag_node $col",
        ),
        graph(
            "Implausible readings",
            "Readings the agents left out as physically impossible (a sensor's sentinel or a "
            "broken sensor; the agent log names each field once)",
            S(
                "agent",
                Agg("increase", "implausible_total", "implausible"),
                group_tags=("node", "source"),
            ),
            unit="none",
            alias="$tag_node $tag_source",
        ),
    ]
    setup = [
        grid(
            "GPU configuration",
            "Per GPU, as its agent last read it: driver and VBIOS versions and the modes a fleet "
            "keeps the same everywhere (sort a column to see the odd one out: a node left on an "
            "old driver, ECC or persistence mode off, MIG on)",
            S(
                "gpu_info",
                agg(
                    "last",
                    "driver_version",
                    "vbios_version",
                    "persistence_mode_active",
                    "ecc_mode_active",
                    "mig_mode_active",
                ),
                group_tags=("node", "gpu"),
                every=False,
            ),
        ),
        grid(
            "Configuration drift",
            "Newest first: nodes whose GPUs gpuwarden-analyze found set up unlike the rest of "
            "their model's fleet, or waiting for a GPU reset to change a mode (config_drift)",
            S.latest(
                "finding",
                ("node", "summary", "confidence_ratio"),
                limit=100,
                where=(Cond("kind", "=", "config_drift"),),
            ),
        ),
        grid(
            "Jobs on GPUs set up unlike each other",
            "Newest first: jobs whose GPUs do not all agree on driver, VBIOS or a mode "
            "(job_config_mixed); severity warning when no config_drift finding explains it (no "
            "clear fleet setting, e.g. a driver rollout the job straddles)",
            S.latest(
                "finding",
                ("job", "severity", "summary"),
                limit=100,
                where=(Cond("kind", "=", "job_config_mixed"),),
            ),
        ),
    ]
    return board(
        UID,
        "gpuwarden / Fleet",
        "Cluster health, utilisation, power and findings; the agents' own health; GPU setup",
        [
            ("Now", now),
            ("Utilisation and power", usage),
            ("Health", health),
            ("Agent", agent),
            ("Configuration", setup),
        ],
        scope=S,
        annotations=[
            marks(
                S,
                "Critical findings",
                "finding",
                "summary",
                "kind",
                "red",
                where=(Cond("severity", "=", "critical"),),
            ),
            marks(S, "Remediation actions", "remediation_action", "message", "action", "purple"),
        ],
    )
