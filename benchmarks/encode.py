"""Encode >= 1M realistic GPU points (catalogue fields; 64 nodes x 8 GPUs) with our vectorised
encoder, our per-point encoder, and influxdb-client's ``Point`` loop, in one run.

Data is synthetic (benchmarks/gpu_data.py). Last line: ``ratio=<ours/Point>`` (target >= 10).
"""

from __future__ import annotations

import argparse
import statistics
import time

from influxdb_client.client.write.point import Point as ClientPoint
from influxdb_client.domain.write_precision import WritePrecision

from gpuwarden.core.store.lineprotocol import Point, encode_points
from gpuwarden.core.store.lineprotocol.frame import encode_frame
from gpuwarden.simulation.synthetic import FIELDS, TAGS, gpu_frame


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--nodes", type=int, default=64)
    args = ap.parse_args()
    seconds = -(-args.points // (args.nodes * 8))
    df = gpu_frame(args.nodes, 8, seconds)
    n = df.height
    print(f"points={n} fields_per_point={len(FIELDS)} tags={len(TAGS)} (synthetic data)")

    encode_frame(df.head(1000), "gpu", tags=TAGS, fields=FIELDS)  # warm polars' thread pool
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        lines = encode_frame(df, "gpu", tags=TAGS, fields=FIELDS)
        runs.append(time.perf_counter() - t)
    ours_s = statistics.median(runs)
    assert len(lines) == n
    print(
        f"gpuwarden vectorised (polars): {n / ours_s:,.0f} points/s (median of 3: {ours_s:.2f} s)"
    )

    rows = df.rows(named=True)
    t = time.perf_counter()
    scalar = encode_points(
        Point("gpu", {k: r[k] for k in TAGS}, {k: r[k] for k in FIELDS}, r["time"]) for r in rows
    )
    scalar_s = time.perf_counter() - t
    assert len(scalar) == n  # tests/test_lineprotocol.py checks the two agree line by line
    print(f"gpuwarden per-point:           {n / scalar_s:,.0f} points/s ({scalar_s:.2f} s)")

    t = time.perf_counter()
    out = []
    for r in rows:
        p = ClientPoint("gpu")
        for k in TAGS:
            p = p.tag(k, r[k])
        for k in FIELDS:
            p = p.field(k, r[k])
        out.append(p.time(r["time"], WritePrecision.NS).to_line_protocol())
    client_s = time.perf_counter() - t
    print(f"influxdb-client Point loop:    {n / client_s:,.0f} points/s ({client_s:.2f} s)")
    print(f"ratio={client_s / ours_s:.1f}")


if __name__ == "__main__":
    main()
