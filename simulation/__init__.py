"""SIMULATED clusters: scenario specs, the generator, fault types (each owning its telemetry
signature), job timelines, calibration on REAL public data, the scenario library, and the
``gpuwarden replay`` command that generates scenarios and replays traces into InfluxDB.
Everything it produces is SIMULATED, and says so.
"""

import gpuwarden.core as _core  # noqa: F401  (its allocator default must precede polars)
