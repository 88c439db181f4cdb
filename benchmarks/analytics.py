"""One SIMULATED hour of 1,024 GPUs (128 nodes x 8) at 1 Hz, plus their InfiniBand counters and
the steps of one 1,024-rank training job, written into the real InfluxDB (Debian's influxd,
started here); then analysed end to end (plan + read + MFU + goodput + energy + stragglers +
congestion + attribution) by the Dask runner (LocalCluster, 2 worker processes) and by the
same tasks in one plain polars process, side by side over the same data.

The scenario injects a slow GPU and a congested ToR, and the run checks both analyses find
them. It also measures, once, the port counters' ``last()`` per 10 s done by influxd (InfluxQL
``GROUP BY time``) against the same done here from the raw points (what the analysis does),
and the raw export of every field.

Last line: ``dask_over_polars=<ratio>`` (target <= 1.2; end to end target <= 60 s).
"""

from __future__ import annotations

import os

os.environ.setdefault("POLARS_MAX_THREADS", "1")

import argparse
import tempfile
import time
from pathlib import Path

from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.congestion import RATE_COUNTERS
from gpuwarden.analytics.runner import Analysis, DaskExecutor, LocalExecutor, analyse
from gpuwarden.analytics.topology import write_topology
from gpuwarden.core.store.reader import InfluxReader
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.simulation.generator import TAGS, ScenarioGenerator
from gpuwarden.simulation.spec import ScenarioSpec, parse_spec
from testbed.influxd import LocalInfluxd


def _spec(nodes: int, seconds: int) -> ScenarioSpec:
    return parse_spec(
        {
            "name": "bench-analytics",
            "nodes": nodes,
            "duration_s": seconds,
            "interval_s": 1,
            "measurements": ["gpu", "ib_port", "job_step", "job_model"],
            "jobs": [
                {
                    "name": "llm",
                    "nodes": nodes,
                    "tp": 8,
                    "pp": 4,
                    "step_time_s": 4.0,
                    "params_count": 13_000_000_000,
                    "layers_count": 40,
                    "hidden_size_count": 5120,
                    "heads_count": 40,
                    "tokens_per_step": 49_152 * nodes,  # about 40 % MFU on A100s
                }
            ],
            "faults": [
                {"type": "slow_gpu", "at_s": seconds // 4, "node": 5, "gpu": 3},
                {
                    "type": "tor_congestion",
                    "at_s": seconds // 2,
                    "duration_s": seconds // 4,
                    "node": nodes * 5 // 16,
                },
            ],
        }
    )


def _summary(a: Analysis) -> str:
    job = a.job("llm")
    hot = [s.switch for s in a.switches if s.hot]
    causes: dict[str, list[str]] = {}
    for s in job.stragglers:
        key = f"stage:{s.stage}" if s.kind == "stage" else (s.worker or "")
        cause = a.attributions.get(("llm", key), ("-",))[0]
        causes.setdefault(f"{s.kind}/{cause}", []).append(s.worker or str(s.stage))
    slow = "; ".join(
        f"{k}: {len(v)} ({', '.join(sorted(v, key=lambda w: (len(w), w))[:3])}...)"
        if len(v) > 3
        else f"{k}: {', '.join(v)}"
        for k, v in sorted(causes.items())
    )
    mfu = job.mfu.mfu if job.mfu else float("nan")
    return f"MFU {mfu:.3f}; stragglers (kind/cause) {slow or 'none'}; hot switches {hot}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--seconds", type=int, default=3600)
    args = ap.parse_args()
    spec = _spec(args.nodes, args.seconds)
    with tempfile.TemporaryDirectory() as tmp, LocalInfluxd(Path(tmp) / "influxd") as server:
        server.create_database("bench")
        gen = ScenarioGenerator(spec, seed=7)
        sink = InfluxSink(
            SinkConfig(
                url=server.url,
                database="bench",
                spool_dir=str(Path(tmp) / "spool"),
                batch_size=10_000,
                backpressure_bytes=64 * 2**20,
            )
        )
        t0 = time.perf_counter()
        counts: dict[str, int] = {}
        for chunk in gen.chunks(ticks_per_chunk=60):
            for m, df in chunk.items():
                sink.write_frame(df, m, tags=[t for t in TAGS[m] if t in df.columns])
                counts[m] = counts.get(m, 0) + df.height
        assert sink.close(timeout_s=1800)
        load_s = time.perf_counter() - t0
        print(
            f"SIMULATED {args.nodes} nodes x 8 GPUs, {args.seconds} s at 1 Hz: "
            + ", ".join(f"{m} {n:,}" for m, n in sorted(counts.items()))
            + f" points; loaded in {load_s:.0f} s"
        )
        topo = Path(tmp) / "topology.csv"
        write_topology(dict(zip(gen.node_names, gen.switch_of, strict=True)), topo)
        cfg = with_overrides(
            load_config(environ={}),
            influxdb={"url": server.url, "database": "bench"},
            analysis={"topology": str(topo), "write_back": False},
        )
        start, end = spec.start_ns, spec.start_ns + args.seconds * 10**9 + 1

        # The port counters of 16 nodes, last() per 10 s: by influxd (InfluxQL GROUP BY time),
        # from the raw points here (what the analysis does), and the raw export of every field.
        reader = InfluxReader(server.url, "bench")
        few = gen.node_names[:16]
        last = {c: f"last:{c}" for c in (*RATE_COUNTERS, "rate_gbps")}
        took = {}
        for how, here in (("influxd", False), ("here", True)):
            t = time.perf_counter()
            keys = ["node", "hca", "port"]
            reader.aggregate("ib_port", last, start, end, every_s=10, group_tags=keys,
                             where={"node": few}, here=here)  # fmt: skip
            took[how] = time.perf_counter() - t
        t = time.perf_counter()
        raw = reader.read("ib_port", start, end, where={"node": few})
        raw_s = time.perf_counter() - t
        print(
            f"ib_port of 16 nodes, last() per 10 s: by influxd {took['influxd']:.2f} s, "
            f"from the points here {took['here']:.2f} s; raw export of {raw.height:,} rows, "
            f"every field, {raw_s:.2f} s"
        )

        t = time.perf_counter()
        dask = DaskExecutor(workers=2)
        start_s = time.perf_counter() - t
        try:
            t = time.perf_counter()
            by_dask = analyse(cfg, start, end, dask)
            dask_s = time.perf_counter() - t
        finally:
            dask.close()
        t = time.perf_counter()
        by_polars = analyse(cfg, start, end, LocalExecutor())
        polars_s = time.perf_counter() - t
        print(
            f"dask (LocalCluster, 2 workers; cluster start {start_s:.1f} s not counted): "
            f"{dask_s:.1f} s end to end -> {_summary(by_dask)}"
        )
        print(f"plain polars, one process: {polars_s:.1f} s end to end -> {_summary(by_polars)}")
        same = _summary(by_dask) == _summary(by_polars)
        print(f"same results: {same}")
        print(f"dask_over_polars={dask_s / polars_s:.2f}")


if __name__ == "__main__":
    main()
