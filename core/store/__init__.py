"""The store path, shared by every writer and reader of InfluxDB.

Writing: :mod:`.lineprotocol` (per point, vectorised, and the strict reader) ->
:mod:`.sink` (batches, retries, back-pressure) -> :mod:`.spool` (append-only, on disk, survives
outages and restarts) -> :mod:`.transport` (v1 ``/write`` with urllib3, v2 with
``influxdb-client``). Reading: :mod:`.reader` (chunked-CSV InfluxQL into typed polars frames).
Recorded telemetry on disk: :mod:`.trace`.
"""
