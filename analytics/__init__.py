"""Dask analytics over the telemetry in InfluxDB: MFU, goodput, stragglers, congestion, risk."""

import gpuwarden.core as _core  # noqa: F401  (its allocator default must precede polars)
