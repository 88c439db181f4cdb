"""The node agent's errors: everything it raises on purpose derives from ``CollectorError``
(itself a :class:`core.errors.GpuwardenError`)."""

from __future__ import annotations

from gpuwarden.core.errors import GpuwardenError


class CollectorError(GpuwardenError):
    """Base of every error the node agent raises on purpose."""
