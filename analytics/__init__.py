"""Dask analytics over the telemetry in InfluxDB: MFU, goodput, stragglers, congestion, risk."""

import collector as _collector  # noqa: F401  (its allocator default must precede polars)
