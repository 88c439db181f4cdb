"""Power & thermal: energy per job and per token, GPU and host power, temperatures and the
thermal throttling they cause."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.dashboards.influxql import Agg, Scope, agg
from gpuwarden.dashboards.panels import board, graph, grid, states

UID = "gpuwarden-power"
S = Scope("cluster", "node", "job")


def build() -> model.Dashboard:
    per_gpu = S("gpu", Agg("mean", "power_w"), group_tags=("job", "node", "gpu"))
    per_gpu_node = S("gpu", Agg("mean", "power_w"), group_tags=("node", "gpu"))
    energy = [
        grid(
            "Energy per job",
            "Per analysis window: GPU energy (from the energy counters, reset-aware), "
            "joules per token and per step, mean power",
            S.latest(
                "energy", ("job", "energy_j", "j_per_token", "j_per_step", "power_w"), limit=100
            ),
            h=6,
        ),
        graph(
            "Joules per token",
            "Energy efficiency of each job per analysis window",
            S("energy", Agg("last", "j_per_token"), group_tags=("job",)),
            unit="suffix: J/token",
            alias="$tag_job",
            points=True,
        ),
        graph(
            "GPU power by job",
            "Sum of the mean power of the GPUs each job runs on (untagged GPUs: idle)",
            S("gpu", Agg("sum", "power_w"), inner=per_gpu, group_tags=("job",)),
            unit="watt",
            alias="$tag_job",
        ),
    ]
    power = [
        graph(
            "GPU power by node",
            "Sum over each node's GPUs",
            S("gpu", Agg("sum", "power_w"), inner=per_gpu_node, group_tags=("node",)),
            unit="watt",
            alias="$tag_node",
        ),
        graph(
            "Power headroom",
            "Per GPU: power drawn and the enforced limit (a GPU at its limit is power-capped)",
            S("gpu", agg("max", "power_w", "power_limit_w"), group_tags=("node", "gpu")),
            unit="watt",
            alias="$tag_node/$tag_gpu $col",
        ),
        graph(
            "Host power",
            "CPU packages, DRAM and board sensors",
            S("host_power", Agg("mean", "power_w"), group_tags=("node", "domain")),
            unit="watt",
            alias="$tag_node $tag_domain",
        ),
    ]
    thermal = [
        graph(
            "GPU and HBM temperature by node",
            "Hottest GPU and hottest HBM stack on each node",
            S("gpu", agg("max", "gpu_temp_c", "mem_temp_c"), group_tags=("node",)),
            unit="celsius",
            alias="$tag_node $col",
        ),
        graph(
            "Host temperatures",
            "Thermal zones and hwmon sensors",
            S("thermal", Agg("max", "temp_c"), group_tags=("node", "zone")),
            unit="celsius",
            alias="$tag_node $tag_zone",
        ),
        states(
            "Thermal and power throttling",
            "GPUs slowed by temperature (hardware or software) or by the power cap",
            S(
                "gpu",
                agg(
                    "last",
                    "clock_event_hw_thermal_slowdown_active",
                    "clock_event_sw_thermal_slowdown_active",
                    "clock_event_sw_power_cap_active",
                    "clock_event_hw_power_brake_slowdown_active",
                ),
                group_tags=("node", "gpu"),
            ),
            alias="$tag_node/$tag_gpu $col",
            h=10,
        ),
    ]
    return board(
        UID,
        "gpuwarden / Power and thermal",
        "Energy per job and token, GPU and host power, temperatures and throttling",
        [("Energy", energy), ("Power", power), ("Thermal", thermal)],
        scope=S,
    )
