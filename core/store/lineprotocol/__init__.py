"""InfluxDB line protocol, one family of modules under one name.

* :mod:`.encode`: a point at a time (stdlib only; the agent, the relay and the job-side
  reporter use it). Its names are re-exported here.
* :mod:`.frame`: a polars frame at a time, vectorised (replay, analytics write-back).
* :mod:`.strict`: the strict reader, for lines that come from outside (the relay).

Importing this package loads only :mod:`.encode`: polars is loaded by :mod:`.frame` alone.
"""

from gpuwarden.core.store.lineprotocol.encode import (
    INT64_MAX,
    INT64_MIN,
    EncodeStats,
    FieldValue,
    Point,
    Precision,
    check_name,
    encode_point,
    encode_points,
    escape_key,
    escape_measurement,
    escape_string,
    format_field_value,
)

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "EncodeStats",
    "FieldValue",
    "Point",
    "Precision",
    "check_name",
    "encode_point",
    "encode_points",
    "escape_key",
    "escape_measurement",
    "escape_string",
    "format_field_value",
]
