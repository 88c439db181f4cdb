"""A writer process for the outage tests: streams numbered points through the sink at a
steady rate; on SIGTERM it stops, closes the sink (what cannot be sent stays spooled) and
prints where it stopped. Run as ``python -m tests.outage_writer``."""

from __future__ import annotations

import argparse
import json
import signal
import time

from gpuwarden.core.store.sink import InfluxSink, SinkConfig

BASE_NS = 1_700_000_000_000_000_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--spool", required=True)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=10**9)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--spool-max-bytes", type=int, default=64 * 2**20)
    args = ap.parse_args()

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    cfg = SinkConfig(
        url=args.url,
        database=args.db,
        spool_dir=args.spool,
        batch_size=500,
        flush_interval_s=0.1,
        backoff_base_s=0.05,
        backoff_max_s=0.3,
        timeout_s=2.0,
        spool_max_bytes=args.spool_max_bytes,
        spool_segment_bytes=max(1024, args.spool_max_bytes // 16),
    )
    sink = InfluxSink(cfg)
    seq, end = args.start, args.start + args.count
    tick, per_tick = 0.01, max(1, int(args.rate * 0.01))
    next_at = time.monotonic()
    print(json.dumps({"started": True}), flush=True)
    while not stopping and seq < end:
        n = min(per_tick, end - seq)
        sink.write_lines(
            [f"seq,writer=w seq={i}i {BASE_NS + i * 1000}" for i in range(seq, seq + n)]
        )
        seq += n
        next_at += tick
        time.sleep(max(0.0, next_at - time.monotonic()))
    flushed = sink.close(timeout_s=1.0 if stopping else 60.0)
    stats = sink.stats()
    print(
        json.dumps(
            {
                "next": seq,
                "flushed": flushed,
                "dropped_total": stats.points_dropped,
                "written": stats.points_written,
                "spooled": stats.spool_points,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
