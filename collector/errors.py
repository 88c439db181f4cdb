"""The collector's error tree: everything it raises on purpose derives from ``CollectorError``."""

from __future__ import annotations


class CollectorError(Exception):
    """Base of every error the collector package raises on purpose."""


class LineProtocolError(CollectorError, ValueError):
    """A name or value that line protocol cannot represent (the message says which and why)."""


class SinkError(CollectorError):
    """The sink was misconfigured or used after close."""


class SpoolError(CollectorError):
    """The on-disk spool cannot be used (bad directory, corrupt state, bound too small)."""


class InfluxdError(CollectorError):
    """A local influxd could not be started or did not become ready."""
