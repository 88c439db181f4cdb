"""Simulation's errors: everything it raises on purpose derives from ``SimulationError`` (itself
a :class:`core.errors.GpuwardenError`)."""

from __future__ import annotations

from gpuwarden.core.errors import GpuwardenError


class SimulationError(GpuwardenError):
    """Base of every error the scenario generator and replay raise on purpose."""
