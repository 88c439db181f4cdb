"""The main job, as far as it goes today: the storage path end to end on local defaults.

Starts a real influxd (Debian package) on loopback, streams simulated telemetry of a small
cluster through the sink (spooled, batched), takes the server down and back up in the middle
to show that nothing is lost, reads the data back through InfluxQL into polars, and prints a
summary. All telemetry here is simulated (collector/simulate.py), not real data.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from analytics.reader import InfluxReader
from collector.localinfluxd import LocalInfluxd
from collector.simulate import FIELDS, T0_NS, TAGS, gpu_frame
from collector.sink import InfluxSink, SinkConfig


def _say(msg: str) -> None:
    print(f"[gpuwarden demo] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--workdir", default=None, help="keep data here (default: a temp dir)")
    args = ap.parse_args(argv)
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        with LocalInfluxd(work / "influxd") as server:
            return _run(server, work, args.nodes, args.minutes)


def _run(server: LocalInfluxd, work: Path, nodes: int, minutes: int) -> int:
    server.create_database("gpuwarden")
    _say(f"influxd {server.url} (data in {work / 'influxd'})")
    config = SinkConfig(
        url=server.url,
        database="gpuwarden",
        spool_dir=str(work / "spool"),
        backoff_base_s=0.1,
        backoff_max_s=0.5,
    )
    sink = InfluxSink(config)
    written = 0
    outage_at = minutes // 2
    for minute in range(minutes):
        frame = gpu_frame(nodes, 8, 60, start_s=minute * 60)
        if minute == outage_at:
            server.stop()
            _say("influxd stopped (simulated outage): the sink spools to disk")
        sink.write_frame(frame, "gpu", tags=TAGS, fields=FIELDS)
        written += frame.height
        if minute == outage_at:
            time.sleep(1.0)
            spooled = sink.stats().spool_points
            server.start()
            _say(f"influxd back; {spooled} points were waiting in the spool")
        _say(f"minute {minute + 1}/{minutes}: {written} points handed to the sink")
    flushed = sink.close(timeout_s=120)
    stats = sink.stats()
    reader = InfluxReader(server.url, "gpuwarden")
    end = T0_NS + minutes * 60 * 10**9
    df = reader.read("gpu", T0_NS, end, fields=["power_w", "gpu_temp_c", "gpu_util_pct"])
    per_node = (
        df.group_by("node")
        .agg(
            pl.len().alias("points"),
            pl.col("power_w").mean().round(1).alias("mean_power_w"),
            pl.col("gpu_temp_c").max().alias("max_temp_c"),
        )
        .sort("node")
    )
    print(per_node.head(8))
    _say(
        f"written={stats.points_written} read_back={df.height} "
        f"dropped={stats.points_dropped} retries={stats.retries} flushed={flushed}"
    )
    ok = flushed and df.height == written and stats.points_dropped == 0
    _say("storage path OK: every point stored once (simulated data)" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
