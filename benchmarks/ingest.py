"""Write one hour of 64 nodes x 8 GPUs at 1 Hz (1.84M points, synthetic) through the sink into
the real InfluxDB (Debian's influxd, started here), and compare the CPU the client spends
(encoding + spool + HTTP, all threads) with the CPU the server spends ingesting.

Two modes, each into a fresh server, interleaved over ``--rounds`` rounds: every batch written
to the on-disk spool before it is sent (``spool_write_behind_s = 0``), and the default
write-behind (batches wait in memory while the server keeps up). Client and server share this
2-core machine, so single passes move by several per cent; the result is the sum of CPU over
all rounds.

Last line: ``client_cpu_over_server_cpu=<ratio>`` of the default (target <= 0.1).
"""

from __future__ import annotations

import os

# The writer runs polars on one thread, as the node agent does: an idle rayon pool spins and
# burns CPU that a GPU node's training job should have (measured here: 0.31 vs 0.19 CPU-s
# per 100k points).
os.environ.setdefault("POLARS_MAX_THREADS", "1")

import argparse
import tempfile
import time
from pathlib import Path

from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.simulation.synthetic import FIELDS, TAGS, gpu_frame
from testbed.influxd import LocalInfluxd


def run(frames: list, batch_size: int, write_behind_s: float) -> tuple[float, float, float]:
    """One pass through a fresh influxd: (wall s, client CPU s, server CPU s)."""
    total = sum(f.height for f in frames)
    with tempfile.TemporaryDirectory() as tmp, LocalInfluxd(Path(tmp) / "influxd") as server:
        server.create_database("bench")
        sink = InfluxSink(
            SinkConfig(
                url=server.url,
                database="bench",
                spool_dir=f"{tmp}/spool",
                batch_size=batch_size,
                spool_max_bytes=1 * 2**30,
                spool_write_behind_s=write_behind_s,
                # The hour is produced far faster than real time: hold the writer back while
                # 24 MiB are unsent, as the replayer does, instead of spooling 800 MB to disk.
                backpressure_bytes=24 * 2**20,
                flush_interval_s=0.5,
            )
        )
        server_cpu0, client_cpu0, wall0 = (
            server.cpu_seconds(),
            time.process_time(),
            time.monotonic(),
        )
        for frame in frames:
            sink.write_frame(frame, "gpu", tags=TAGS, fields=FIELDS)
        assert sink.close(timeout_s=3600)
        wall = time.monotonic() - wall0
        client_cpu = time.process_time() - client_cpu0
        server_cpu = server.cpu_seconds() - server_cpu0
        stats = sink.stats()
        assert stats.points_written == total, stats
    return wall, client_cpu, server_cpu


MODES = {
    "disk-first (spool_write_behind_s=0)": 0.0,
    "default, write-behind (spool_write_behind_s=5)": 5.0,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2, help="passes per mode, interleaved")
    args = ap.parse_args()
    step = 60
    frames = [
        gpu_frame(args.nodes, 8, min(step, args.seconds - s), start_s=s)
        for s in range(0, args.seconds, step)
    ]
    total = sum(f.height for f in frames)
    print(f"points={total} ({args.nodes} nodes x 8 GPUs x {args.seconds} s, synthetic data)")
    per100k = 100_000 / total
    sums = {label: [0.0, 0.0] for label in MODES}
    for round_ in range(1, args.rounds + 1):  # interleaved, so drift of the machine hits both
        for label, write_behind_s in MODES.items():
            wall, client_cpu, server_cpu = run(frames, args.batch_size, write_behind_s)
            sums[label][0] += client_cpu
            sums[label][1] += server_cpu
            print(
                f"round {round_}, {label}: {total / wall:,.0f} points/s; CPU per 100k points: "
                f"client {client_cpu * per100k:.3f} s, server {server_cpu * per100k:.3f} s "
                f"(ratio {client_cpu / server_cpu:.3f})"
            )
    for label, (client_cpu, server_cpu) in sums.items():
        print(f"{label}, all rounds: client/server CPU = {client_cpu / server_cpu:.3f}")
    client_cpu, server_cpu = sums[next(reversed(MODES))]
    print(f"client_cpu_over_server_cpu={client_cpu / server_cpu:.3f}")


if __name__ == "__main__":
    main()
