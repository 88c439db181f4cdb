"""Grafana dashboards and alert rules as code (grafana-foundation-sdk), export and push.

Six dashboards (fleet, node & GPU, job, fabric, power & thermal, health & risk) are built in
``dashboards/<name>.py`` from catalogue names only (:mod:`dashboards.influxql`), checked by
:mod:`dashboards.check`, exported with Grafana provisioning files by ``gpuwarden dashboards``
(:mod:`dashboards.cli`), and rendered without Grafana by :mod:`dashboards.render`.
"""

from gpuwarden.dashboards.errors import (
    CatalogueNameError,
    DashboardError,
    InvalidDashboardError,
    PushError,
    QueryFailedError,
)
from gpuwarden.dashboards.export import BOARDS, encode, generate, load

__all__ = [
    "BOARDS",
    "CatalogueNameError",
    "DashboardError",
    "InvalidDashboardError",
    "PushError",
    "QueryFailedError",
    "encode",
    "generate",
    "load",
]
