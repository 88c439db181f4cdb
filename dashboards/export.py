"""Build every dashboard, check it, and turn it into JSON (and back, through the SDK)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.dashboards import fabric, fleet, health, job, node, power
from gpuwarden.dashboards.check import problems_across
from gpuwarden.dashboards.errors import InvalidDashboardError
from gpuwarden.dashboards.influxql import register

#: name -> builder, in the order the dashboards link to each other
BOARDS: dict[str, Callable[[], model.Dashboard]] = {
    "fleet": fleet.build,
    "node": node.build,
    "job": job.build,
    "fabric": fabric.build,
    "power": power.build,
    "health": health.build,
}


def encode(obj: object) -> str:
    """Stable JSON (sorted keys) so an export diffs cleanly in version control."""
    return JSONEncoder(sort_keys=True, indent=2).encode(obj) + "\n"


def generate() -> dict[str, dict[str, Any]]:
    """Every dashboard as JSON; raises :class:`InvalidDashboardError` listing all problems."""
    boards = {name: json.loads(encode(build())) for name, build in BOARDS.items()}
    found = problems_across(boards)
    if found:
        raise InvalidDashboardError(found)
    return boards


def load(data: dict[str, Any]) -> model.Dashboard:
    """Dashboard JSON back into the SDK's model (our InfluxQL targets included)."""
    register_default_plugins()
    register()
    return model.Dashboard.from_json(data)
