"""How the analysis's cost grows with the fleet: one SIMULATED hour at several fleet sizes.

For each size (``--gpus``, default 1,024, 4,096 and 16,384 GPUs; 8 per node), the scenario
(the analytics benchmark's: one job on every node, a slow GPU, a congested ToR) is written
into a real influxd started here, on this machine, at ``--interval-s`` (default 10 s), then
analysed end to end (plan, read, MFU, goodput, energy, stragglers, congestion, attribution)
by the Dask runner with 1 and with 2 worker processes (LocalCluster). Reported per run: wall
time, the driver's and the workers' peak memory (each process's VmHWM), and the bytes read
from influxd (its ``httpd`` statistics, ``queryRespBytes``).

Each size is analysed with the store at rest (:func:`settle`): the hour in influxd's TSM
files, none of it in its in-memory cache, as a production store holds all but its last
minutes. A job's step log is read ``analysis.nodes_per_read`` nodes at a time (128).

Then the exponent of time against GPUs (least squares on log-log, best of the worker counts
at each size): 1.0 is linear. Last lines: ``scale_exponent=<b>`` and ``gpus_<largest>_s=<x>``
(target: <= 300 s at 16,384 GPUs; the largest size run is the one printed).
"""

from __future__ import annotations

import os

os.environ.setdefault("POLARS_MAX_THREADS", "1")

import argparse
import dataclasses
import json
import math
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from benchmarks.analytics import _spec, _summary
from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.runner import DaskExecutor, analyse
from gpuwarden.analytics.topology import write_topology
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.simulation.generator import TAGS, ScenarioGenerator
from testbed.influxd import LocalInfluxd


def _peak_rss_mib() -> float:
    """This process's resident high-water mark (VmHWM; not ru_maxrss, which Linux carries
    across fork and exec, so a spawned worker would report its parent's peak)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _resp_bytes(server: LocalInfluxd) -> int:
    """Bytes influxd has sent in answer to queries since it started."""
    url = f"{server.url}/query?" + urllib.parse.urlencode({"q": "SHOW STATS FOR 'httpd'"})
    with urllib.request.urlopen(url, timeout=30) as resp:
        data = json.loads(resp.read())
    total = 0
    for series in data["results"][0].get("series", []):
        cols = series["columns"]
        if "queryRespBytes" in cols:
            total += int(series["values"][0][cols.index("queryRespBytes")])
    return total


def fit_exponent(points: list[tuple[int, float]]) -> float:
    """The slope of log(time) against log(GPUs), least squares."""
    xs = [math.log(g) for g, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    den = sum((x - mx) ** 2 for x in xs)
    return num / den if den else float("nan")


STORE: dict[str, int | str] = {
    "cache-snapshot-memory-size": 2**30,
    "cache-max-memory-size": 4 * 2**30,
    "cache-snapshot-write-cold-duration": "10s",
}
"""influxd's ``[data]`` settings here. With its defaults (a 25 MB cache snapshot) the
16,384-GPU load ran at 2,400 points/s: every snapshot wrote a TSM file keyed by all of the
fleet's ~1.6 M series-fields with a handful of values each, then compacted it. A store for a
fleet this size needs its cache sized to hold several samples of every series. Once the load
stops, the cache is written to TSM files after 10 s (influxd's default: 10 min), and
:func:`settle` waits for that before the analysis."""


def _engine_busy(server: LocalInfluxd) -> tuple[int, int]:
    """(bytes in influxd's in-memory caches, compactions running), from ``/debug/vars``."""
    with urllib.request.urlopen(f"{server.url}/debug/vars", timeout=30) as resp:
        stats = json.loads(resp.read())
    cached = running = 0
    for key, entry in stats.items():
        values = entry.get("values", {}) if isinstance(entry, dict) else {}
        if key.startswith("tsm1_cache"):
            cached += int(values.get("memBytes", 0))
        elif key.startswith("tsm1_engine"):
            running += sum(int(v) for k, v in values.items() if k.endswith("CompactionsActive"))
    return cached, running


def settle(server: LocalInfluxd, timeout_s: float = 3600.0) -> float:
    """Wait until the store is at rest: its cache written to TSM files and no compaction
    running (three polls in a row), as a production store holds every hour but its last
    minutes. Without this the stores differ by size: the 1,024-GPU hour fits in the 1 GiB
    cache, the 16,384-GPU one half does, and a query pays to sort cached points that TSM
    files hold sorted. Seconds waited."""
    t0 = time.perf_counter()
    quiet = 0
    while quiet < 3:
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"influxd still busy after {timeout_s:.0f} s")
        quiet = quiet + 1 if _engine_busy(server) == (0, 0) else 0
        time.sleep(5.0)
    return time.perf_counter() - t0


def load(server: LocalInfluxd, gen: ScenarioGenerator, spool: Path) -> dict:
    """Write the scenario into ``server``; what was written and how long it took."""
    server.create_database("bench")
    sink = InfluxSink(SinkConfig(url=server.url, database="bench", spool_dir=str(spool),
                                 batch_size=10_000, backpressure_bytes=64 * 2**20,
                                 timeout_s=60))  # fmt: skip
    t0 = time.perf_counter()
    points = fields = 0
    for chunk in gen.chunks(ticks_per_chunk=60):
        for m, df in chunk.items():
            tags = [t for t in TAGS[m] if t in df.columns]
            sink.write_frame(df, m, tags=tags)
            points += df.height
            fields += df.height * (len(df.columns) - len(tags) - 1)
    assert sink.close(timeout_s=3600)
    return {"points": points, "fields": fields, "load_s": time.perf_counter() - t0}


def run_size(gpus: int, seconds: int, interval_s: int, workers: list[int], tmp: Path) -> list[dict]:
    """Load (or reuse, when ``tmp`` holds this size's store already) and analyse one size."""
    nodes = gpus // 8
    spec = _spec(nodes, seconds)
    spec = dataclasses.replace(spec, interval_s=interval_s).validate()
    rows = []
    root = tmp / f"influxd-{gpus}-{seconds}s-every-{interval_s}s"
    marker = root / "loaded.json"
    # a reused store replays its write-ahead log first: minutes at 16,384 GPUs
    with LocalInfluxd(root, data=STORE).start(timeout_s=1800) as server:
        gen = ScenarioGenerator(spec, seed=7)
        if marker.exists():
            loaded = json.loads(marker.read_text())
            how = f"reused from {root} (loaded earlier in {loaded['load_s']:.0f} s)"
        else:
            loaded = load(server, gen, tmp / f"spool-{gpus}")
            marker.write_text(json.dumps(loaded))
            how = f"loaded in {loaded['load_s']:.0f} s"
        points, fields, load_s = loaded["points"], loaded["fields"], loaded["load_s"]
        settled_s = settle(server)
        print(f"SIMULATED {gpus:,} GPUs ({nodes} nodes), {seconds} s every {interval_s} s: "
              f"{points:,} points, {fields:,} fields {how} "
              f"({fields / load_s:,.0f} fields/s into influxd here); at rest after "
              f"{settled_s:.0f} s more", flush=True)  # fmt: skip
        topo = tmp / f"topology-{gpus}.csv"
        write_topology(dict(zip(gen.node_names, gen.switch_of, strict=True)), topo)
        cfg = with_overrides(
            load_config(environ={}),
            influxdb={"url": server.url, "database": "bench"},
            analysis={"topology": str(topo), "write_back": False},
        )
        start, end = spec.start_ns, spec.start_ns + seconds * 10**9 + 1
        for n in workers:
            executor = DaskExecutor(workers=n)
            try:
                before = _resp_bytes(server)
                t = time.perf_counter()
                result = analyse(cfg, start, end, executor)
                took = time.perf_counter() - t
                read = _resp_bytes(server) - before
                peaks = executor.client.run(_peak_rss_mib)
            finally:
                executor.close()
            row = {"gpus": gpus, "workers": n, "seconds": took, "points": points,
                   "fields": fields, "load_s": load_s, "driver_mib": _peak_rss_mib(),
                   "worker_mib": max(peaks.values()), "read_bytes": read,
                   "summary": _summary(result)}  # fmt: skip
            print(f"  {n} worker(s): {took:.1f} s; driver peak {row['driver_mib']:.0f} MiB, "
                  f"worker peak {row['worker_mib']:.0f} MiB; {read / 2**20:.0f} MiB read; "
                  f"{row['summary']}", flush=True)  # fmt: skip
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default="1024,4096,16384")
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--interval-s", type=int, default=10)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--data-dir", help="keep each size's loaded influxd here and reuse it on a "
                    "later run (the scenario is seeded: the same sizes give the same data); "
                    "default: a temporary directory, removed at the end")  # fmt: skip
    ap.add_argument("--load-only", action="store_true", help="load (into --data-dir), no analysis")
    args = ap.parse_args()
    sizes = [int(g) for g in args.gpus.split(",")]
    workers = [] if args.load_only else [int(w) for w in args.workers.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.data_dir) if args.data_dir else Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        for gpus in sizes:
            rows += run_size(gpus, args.seconds, args.interval_s, workers, tmp)
    if args.load_only:
        return
    print(f"\n{'GPUs':>7} {'workers':>7} {'analysis s':>10} {'s/M points':>10} "
          f"{'driver MiB':>10} {'worker MiB':>10} {'read MiB':>9}")  # fmt: skip
    for r in rows:
        print(f"{r['gpus']:>7,} {r['workers']:>7} {r['seconds']:>10.1f} "
              f"{r['seconds'] / r['points'] * 1e6:>10.2f} {r['driver_mib']:>10.0f} "
              f"{r['worker_mib']:>10.0f} {r['read_bytes'] / 2**20:>9.0f}")  # fmt: skip
    best = {g: min(r["seconds"] for r in rows if r["gpus"] == g) for g in sizes}
    exponent = fit_exponent(sorted(best.items())) if len(best) > 1 else float("nan")
    if len(sizes) > 1:
        for n in workers:  # 1 worker: the whole work in turn; more: also how well it spreads
            each = sorted((r["gpus"], r["seconds"]) for r in rows if r["workers"] == n)
            print(f"exponent with {n} worker(s): {fit_exponent(each):.2f}")
    print(f"scale_exponent={exponent:.2f}")
    print(f"gpus_{max(sizes)}_s={best[max(sizes)]:.1f}")


if __name__ == "__main__":
    main()
