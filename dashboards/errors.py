"""The dashboards package's errors: all derive from ``DashboardError`` (itself a
:class:`core.errors.GpuwardenError`)."""

from __future__ import annotations

from gpuwarden.core.errors import GpuwardenError


class DashboardError(GpuwardenError):
    """Base of every error the dashboards package raises."""


class CatalogueNameError(DashboardError):
    """A query names a measurement, field or tag that is not in the metric catalogue."""


class InvalidDashboardError(DashboardError):
    """Generated dashboard JSON failed a structural check (ids, grid, datasources, variables).

    ``problems`` lists every failure, one line each, so a user sees them all at once."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class QueryFailedError(DashboardError):
    """InfluxDB answered a dashboard query with an error (the statement is in the message)."""


class PushError(DashboardError):
    """Grafana's HTTP API refused a dashboard, folder or provisioning object."""
