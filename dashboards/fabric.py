"""Fabric: InfiniBand/RoCE throughput, congestion (xmit_wait, ECN, CNPs) with a heatmap by
switch, and every port error counter the agent collects, as rates."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.dashboards.influxql import Agg, Cond, Scope, agg
from gpuwarden.dashboards.panels import board, graph, heat, marks, states

UID = "gpuwarden-fabric"
S = Scope("cluster", "node", "hca")
PORT = ("node", "hca", "port")
PER_PORT = "$tag_node $tag_hca/$tag_port $col"

PHYSICAL = (
    "symbol_error_total",
    "link_error_recovery_total",
    "link_downed_total",
    "local_link_integrity_errors_total",
    "excessive_buffer_overrun_errors_total",
    "port_rcv_errors_total",
    "port_rcv_remote_physical_errors_total",
)
DISCARDS = (
    "port_xmit_discards_total",
    "port_rcv_discards_total",
    "port_rcv_switch_relay_errors_total",
    "port_xmit_constraint_errors_total",
    "port_rcv_constraint_errors_total",
    "vl15_dropped_total",
)
TRANSPORT = (
    "out_of_sequence_total",
    "packet_seq_err_total",
    "local_ack_timeout_err_total",
    "implied_nak_seq_err_total",
    "rnr_nak_retry_err_total",
    "duplicate_request_total",
    "req_cqe_error_total",
    "resp_cqe_error_total",
)
PACKETS = (
    "port_xmit_packets_total",
    "port_rcv_packets_total",
    "port_unicast_xmit_packets_total",
    "port_unicast_rcv_packets_total",
    "port_multicast_xmit_packets_total",
    "port_multicast_rcv_packets_total",
)


def build() -> model.Dashboard:
    throughput = [
        graph(
            "Port throughput",
            "Data transmitted and received per port (counters as rates; a counter reset "
            "drops one interval instead of showing a negative spike)",
            S(
                "ib_port",
                agg("rate", "port_xmit_data_bytes_total", "port_rcv_data_bytes_total"),
                group_tags=PORT,
            ),
            unit="Bps",
            alias=PER_PORT,
        ),
        graph(
            "Packets per second",
            "All, unicast and multicast packets",
            S("ib_port", agg("rate", *PACKETS), group_tags=PORT),
            unit="pps",
            alias=PER_PORT,
        ),
        states(
            "Port state",
            "Logical state (4 = active), physical state (5 = link up) and the link rate",
            S(
                "ib_port",
                agg("last", "state_code", "phys_state_code", "rate_gbps"),
                group_tags=PORT,
            ),
            alias=PER_PORT,
        ),
    ]
    congestion = [
        heat(
            "Congestion heatmap by switch",
            "Per leaf switch: the median congestion score of its hosts' ports (share of time "
            "the port had data but no credit to send, from xmit_wait)",
            S("congestion", Agg("max", "score_ratio"), group_tags=("switch",)),
            unit="percentunit",
            alias="$tag_switch",
        ),
        graph(
            "xmit_wait per port",
            "Raw: port_xmit_wait ticks per second. Analytics: share of bandwidth lost to waiting",
            S(
                "ib_port",
                Agg("rate", "port_xmit_wait_total", "xmit_wait_ticks_per_s"),
                group_tags=PORT,
            ),
            S(
                "congestion",
                agg("max", "xmit_wait_ratio", "xmit_util_ratio", "rcv_util_ratio"),
                group_tags=PORT,
            ),
            unit="none",
            alias=PER_PORT,
        ),
        graph(
            "ECN and CNPs",
            "RoCE congestion control: ECN-marked packets, CNPs sent/handled/ignored per second",
            S(
                "ib_port",
                agg(
                    "rate",
                    "np_ecn_marked_roce_packets_total",
                    "np_cnp_sent_total",
                    "rp_cnp_handled_total",
                    "rp_cnp_ignored_total",
                ),
                group_tags=PORT,
            ),
            S("congestion", agg("max", "cnp_per_s", "ecn_marked_per_s"), group_tags=PORT),
            unit="cps",
            alias=PER_PORT,
        ),
    ]
    errors = [
        graph(
            "Physical-layer errors per second",
            "Symbol errors, link recoveries and link-downs precede flapping links",
            S("ib_port", agg("rate", *PHYSICAL), group_tags=PORT),
            S("congestion", Agg("max", "symbol_errors_per_s"), group_tags=PORT),
            unit="cps",
            alias=PER_PORT,
        ),
        graph(
            "Discards and constraint errors per second",
            "Packets dropped by the port",
            S("ib_port", agg("rate", *DISCARDS), group_tags=PORT),
            unit="cps",
            alias=PER_PORT,
        ),
        graph(
            "Transport (RoCE) errors per second",
            "Retransmission, sequence and completion errors from the HCA's hw_counters",
            S("ib_port", agg("rate", *TRANSPORT), group_tags=PORT),
            unit="cps",
            alias=PER_PORT,
        ),
    ]
    return board(
        UID,
        "gpuwarden / Fabric",
        "InfiniBand and RoCE ports: throughput, congestion by switch, errors",
        [("Throughput", throughput), ("Congestion", congestion), ("Errors", errors)],
        scope=S,
        annotations=[
            marks(
                S,
                "Congestion findings",
                "finding",
                "summary",
                "kind",
                "orange",
                where=(Cond("kind", "=", "link_congested"),),
            ),
        ],
    )
