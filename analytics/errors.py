"""Analytics' errors: everything it raises on purpose derives from ``AnalyticsError`` (itself a
:class:`core.errors.GpuwardenError`)."""

from __future__ import annotations

from gpuwarden.core.errors import GpuwardenError


class AnalyticsError(GpuwardenError):
    """Base of every error analytics raises on purpose."""
