"""gpuwarden's one error tree. Everything any package raises on purpose derives from
:class:`GpuwardenError`, so a command can catch it once and print a clear line.

    GpuwardenError
    ├── ConfigError            a setting, file or secret that cannot be used (core.config)
    ├── StoreError             the write and read path to InfluxDB (core.store)
    │   ├── LineProtocolError  a name or value line protocol cannot carry
    │   ├── SinkError, SpoolError, TraceError, QueryError
    ├── CollectorError         the node agent (collector.errors)
    ├── AnalyticsError         analytics (analytics.errors)
    ├── RemediationError       the engine and its adapters (remediation.errors)
    ├── DashboardError         dashboards and alert rules (dashboards.errors)
    ├── SimulationError        scenarios and replay (simulation.errors)
    └── TestbedError           local servers and fakes (testbed.errors)

Errors that also answer to a builtin (``ValueError`` for bad input, ``RuntimeError`` for a
failed call) keep that base too, so callers that catch the builtin keep working.
"""

from __future__ import annotations


class GpuwardenError(Exception):
    """Base of every error gpuwarden raises on purpose."""


class ConfigError(GpuwardenError):
    """A configuration file or override that cannot be used (the message names the setting)."""


class StoreError(GpuwardenError):
    """Base of the store path's errors (line protocol, sink, spool, traces, queries)."""


class LineProtocolError(StoreError, ValueError):
    """A name or value that line protocol cannot represent (the message says which and why)."""


class SinkError(StoreError):
    """The sink was misconfigured or used after close."""


class SpoolError(StoreError):
    """The on-disk spool cannot be used (bad directory, corrupt state, bound too small)."""
