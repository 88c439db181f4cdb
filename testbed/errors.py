"""The testbed's errors: a local server that did not start, a fake used wrongly. All derive
from ``TestbedError`` (itself a :class:`core.errors.GpuwardenError`)."""

from __future__ import annotations

from gpuwarden.core.errors import GpuwardenError


class TestbedError(GpuwardenError):
    """Base of every error the testbed raises on purpose."""

    __test__ = False  # not a pytest test class, whatever its name says


class InfluxdError(TestbedError):
    """A local influxd could not be started or did not become ready."""


class AlertmanagerError(TestbedError):
    """A local Alertmanager could not be started or did not become ready."""


class PrometheusError(TestbedError):
    """A local Prometheus could not be started or did not become ready."""
