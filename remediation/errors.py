"""The remediation engine's errors: everything it raises on purpose derives from
``RemediationError`` (itself a :class:`core.errors.GpuwardenError`)."""

from __future__ import annotations

from gpuwarden.core.errors import GpuwardenError


class RemediationError(GpuwardenError):
    """Base of every error the engine, its policies and adapters raise on purpose."""
