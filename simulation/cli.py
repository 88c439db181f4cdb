"""``gpuwarden replay``: generate simulated scenarios, and replay traces into InfluxDB.

    gpuwarden replay list                                  # the scenario library
    gpuwarden replay generate week-mixed --seed 3 --out /tmp/week
    gpuwarden replay replay /tmp/week --url http://127.0.0.1:8086 --database gpuwarden \\
        --start 2026-11-01T00:00:00Z --speed 0
    gpuwarden replay run slow-gpu --end now --speed 0     # generate and stream, no files
    gpuwarden replay truth /tmp/week                       # what was injected, where, when

Everything a scenario produces is SIMULATED; its statistics are drawn from real cluster data
(see simulation/data/SOURCES.md). Output says so.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl

from gpuwarden.core.cli import add_common, configure_logging
from gpuwarden.core.errors import GpuwardenError
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.store.trace import NS, ReplayStats, TraceReader, TraceWriter, replay
from gpuwarden.core.timeparse import parse_when
from gpuwarden.simulation.errors import SimulationError
from gpuwarden.simulation.generator import TAGS, ScenarioGenerator
from gpuwarden.simulation.spec import ScenarioSpec, library_names, load_spec


def generate_trace(scenario: str | Path, seed: int, out: str | Path) -> TraceReader:
    spec = load_spec(scenario)
    gen = ScenarioGenerator(spec, seed)
    writer = TraceWriter(out, f"simulated: scenario {spec.name} seed {seed}", simulated=True)
    for chunk in gen.chunks():
        for m, df in chunk.items():
            writer.write_frame(df, m, tags=[t for t in TAGS[m] if t in df.columns])
        writer.next_chunk()
    writer.close(scenario=spec.name, seed=seed, description=spec.description)
    return TraceReader(out)


def stream_scenario(
    scenario: str | Path | ScenarioSpec,
    seed: int,
    url: str,
    database: str,
    spool_dir: str | Path,
    *,
    shift_ns: int = 0,
) -> ReplayStats:
    """Generate a scenario and write it into InfluxDB as fast as the server takes it, losing
    nothing (the sink waits on a full spool instead of dropping). SIMULATED data."""
    spec = scenario if isinstance(scenario, ScenarioSpec) else load_spec(scenario)
    gen = ScenarioGenerator(spec, seed)
    sink = InfluxSink(
        SinkConfig(
            url=url,
            database=database,
            spool_dir=str(spool_dir),
            batch_size=20_000,
            spool_max_bytes=1 * 2**30,
            backpressure_bytes=64 * 2**20,
        )
    )
    try:
        stats = replay(gen.chunks(), TAGS, sink, shift_ns=shift_ns)
    finally:
        flushed = sink.close(timeout_s=600)
    lost = sink.stats().points_dropped
    if not flushed or lost:
        raise SimulationError(f"scenario {spec.name} seed {seed}: {lost} points dropped or unsent")
    return stats


def _shift(start_ns: int, end_ns: int, args: argparse.Namespace) -> int:
    """Shift so the trace starts at --start or ends at --end (a past window ending now)."""
    if args.start:
        return parse_when(args.start) - start_ns
    if args.end:
        return parse_when(args.end) - end_ns
    return 0


def _sink(args: argparse.Namespace) -> InfluxSink:
    return InfluxSink(
        SinkConfig(
            url=args.url,
            database=args.database,
            spool_dir=args.spool_dir,
            batch_size=10_000,
            spool_max_bytes=1 * 2**30,
            backpressure_bytes=32 * 2**20,  # a replay can outrun any server: wait for it
        )
    )


def _progress(total: int) -> object:
    t0 = time.monotonic()

    def show(stats: ReplayStats) -> None:
        done = stats.total
        rate = done / max(time.monotonic() - t0, 1e-9)
        of = f"/{total:,} points ({100.0 * done / total:5.1f} %)" if total else " points"
        print(f"\r  {done:,}{of}, {rate:,.0f} points/s", end="", file=sys.stderr, flush=True)

    return show


def _stream(
    chunks: Iterator[dict[str, pl.DataFrame]],
    tags: dict[str, list[str]],
    total: int,
    shift: int,
    args: argparse.Namespace,
) -> ReplayStats:
    sink = _sink(args)
    try:
        stats = replay(
            chunks,
            tags,
            sink,
            shift_ns=shift,
            speed=args.speed,
            progress=_progress(total),  # type: ignore[arg-type]
        )
    finally:
        flushed = sink.close(timeout_s=600)
    print(file=sys.stderr)
    s = sink.stats()
    print(
        f"replayed {stats.total:,} points in {stats.wall_s:.1f} s; written {s.points_written:,},"
        f" rejected {s.points_rejected:,}, dropped {s.points_dropped:,}"
        + ("" if flushed else "; NOT all flushed (kept in the spool)")
    )
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpuwarden replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(ap, config=False)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the named scenario library")
    g = sub.add_parser("generate", help="generate a scenario into a trace directory")
    g.add_argument("scenario", help="library name or path to a .toml file")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", required=True)
    t = sub.add_parser("truth", help="print a trace's ground truth (injected faults)")
    t.add_argument("trace")
    for name, helptext in (
        ("replay", "replay a trace directory"),
        ("run", "generate a scenario and stream it, no files"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("trace" if name == "replay" else "scenario")
        if name == "run":
            p.add_argument("--seed", type=int, default=0)
        p.add_argument("--url", default="http://127.0.0.1:8086")
        p.add_argument("--database", default="gpuwarden")
        p.add_argument("--spool-dir", default="/var/lib/gpuwarden/replay-spool")
        p.add_argument(
            "--speed",
            type=float,
            default=0.0,
            help="0: as fast as the server takes it; 1: real time; 60: 1 h/min",
        )
        w = p.add_mutually_exclusive_group()
        w.add_argument("--start", help="shift so the trace starts here (ISO time or 'now')")
        w.add_argument("--end", help="shift so the trace ends here, e.g. 'now'")
    for sp in sub.choices.values():
        add_common(sp, sub=True, config=False)
    args = ap.parse_args(argv)
    configure_logging(args)
    try:
        if args.cmd == "list":
            for n in library_names():
                spec = load_spec(n)
                print(
                    f"{n:22s} {spec.nodes:4d} nodes {spec.duration_s / 3600:7.1f} h  "
                    f"{spec.description}"
                )
        elif args.cmd == "generate":
            r = generate_trace(args.scenario, args.seed, args.out)
            m = r.manifest
            print(f"SIMULATED trace {args.out}: {m.points:,} points in {m.chunks} chunks")
            for k, i in m.measurements.items():
                print(f"  {k:16s} {i.points:>12,}")
        elif args.cmd == "truth":
            r = TraceReader(args.trace)
            frames = [c["scenario_fault"] for c in r.chunks() if "scenario_fault" in c]
            if not frames:
                print("no ground truth in this trace (a recording, or a fault-free scenario)")
            else:
                with pl.Config(tbl_rows=-1, fmt_str_lengths=60, tbl_width_chars=200):
                    print(
                        pl.concat(frames).select(
                            "time",
                            "node",
                            "gpu",
                            "hca",
                            "kind",
                            "fault_id",
                            "phase_code",
                            "xid_code",
                        )
                    )
        elif args.cmd == "replay":
            r = TraceReader(args.trace)
            m = r.manifest
            print(("SIMULATED" if m.simulated else "RECORDED") + f" trace: {m.origin}")
            shift = _shift(m.start_ns or 0, m.end_ns or 0, args)
            _stream(
                r.chunks(), {k: i.tags for k, i in m.measurements.items()}, m.points, shift, args
            )
        elif args.cmd == "run":
            spec = load_spec(args.scenario)
            gen = ScenarioGenerator(spec, args.seed)
            print(f"SIMULATED scenario {spec.name} seed {args.seed}: {spec.description}")
            start = spec.start_ns
            shift = _shift(start, start + spec.duration_s * NS, args)
            _stream(gen.chunks(), TAGS, 0, shift, args)
    except GpuwardenError as exc:
        print(f"gpuwarden replay: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
