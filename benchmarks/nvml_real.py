"""One agent collection cycle on a REAL GPU node: wall and CPU time, driver time included.

Needs a machine with an NVIDIA driver (it exits 2 without one); CI has none, so its figures come
from a lent GPU machine only (``docs/NVML-REAL.md`` says how, and what it gave).

Three things are timed, in interleaved blocks so that all see the same machine:

* ``real``: ``Agent.collect`` with the configured sources (``--sources``, default the
  agent's own default list) and the real NVML backend (pynvml over ``libnvidia-ml``);
* ``nvml``: the NVML source alone on the real backend;
* ``in_turn`` (the baseline, the agent before this benchmark existed): the NVML source alone
  with ``pcie_concurrent = false``, so each GPU's two PCIe throughput samples (20 ms each in
  the driver) are asked one after another with the other calls;
* ``recorded``: the NVML source alone on a recording of this same GPU (``--recording``, made
  by ``gpuwarden agent --record-nvml``), looped. It gives the same answers with no driver
  behind them, so ``nvml - recorded`` is what the driver costs.

Beside them, the driver calls are timed one by one (``per_call``): the ten that cost most per
cycle, with how often each is made (the PCIe samples overlap: they are asked at once).

    python3 benchmarks/nvml_real.py --recording nvml.json [--cycles 200] [--blocks 10]

The last line is ``real_cycle_ms=<x>`` (wall time of one full collection cycle, median block).
The ``input:`` line says REAL only over the driver's library; CI runs this over a stand-in
(``python -m testbed.nvml.standin``) and it says CONSTRUCTED there. ``benchmarks/doc_tables.py``
turns the output into docs/NVML-REAL.md's table of cycle times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.nvml_calls import input_label
from gpuwarden.collector import sources
from gpuwarden.collector.agent import Agent
from gpuwarden.collector.config import load_config
from gpuwarden.collector.nvml.backend import NvmlError
from gpuwarden.collector.nvml.real import PynvmlBackend
from gpuwarden.collector.sources.base import SourceContext


class Null:
    def write_points(self, points: Any) -> None:
        pass

    def close(self, timeout_s: float = 10.0) -> bool:
        return True


class TimedBackend(PynvmlBackend):
    """The real backend, each call's wall time added up by call name."""

    def __init__(self) -> None:
        super().__init__()
        self.spent: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()  # the PCIe samples are asked from threads

    def call(self, device: int | None, name: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super().call(device, name, *args)
        finally:
            with self._lock:
                self.spent[name] += time.perf_counter() - t0
                self.count[name] += 1


def block(collect: Any, cycles: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per cycle."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(cycles):
        collect(time.time_ns())
    return (
        (time.perf_counter() - w0) * 1000 / cycles,
        (time.process_time() - c0) * 1000 / cycles,
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--recording", required=True, help="a gpuwarden-nvml/1 file of this GPU")
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--sources", help="comma-separated (default: the agent's default list)")
    args = p.parse_args()
    try:
        probe = PynvmlBackend()
        probe.init()
        gpus = probe.call(None, "nvmlDeviceGetCount")
        name = probe.call(0, "nvmlDeviceGetName") if gpus else "none"
        driver = probe.call(None, "nvmlSystemGetDriverVersion")
        probe.shutdown()
    except (NvmlError, ImportError, OSError) as exc:
        print(f"nvml_real: no NVIDIA driver here ({exc}); run this on a GPU machine",
              file=sys.stderr)  # fmt: skip
        return 2
    config = load_config(None)
    names = args.sources.split(",") if args.sources else list(config["agent"]["sources"])
    per_block = max(1, args.cycles // args.blocks)
    a = config["agent"]
    with tempfile.TemporaryDirectory() as tmp:
        ctx = SourceContext("bench", "node-0", sysfs=Path(a["sysfs"]), procfs=Path(a["procfs"]),
                            kmsg=Path(a["kmsg"]))  # fmt: skip
        made = []
        for n in names:
            s = config.source_settings(n)
            if n == "nvml":
                s.update(events="off", jobmap_dir=tmp)
            if n == "xid":
                s.update(follow_s=0.0)
            made.append(sources.create(n, ctx, s))
        agent = Agent(made, Null(), cluster="bench", node="node-0", interval_s=1.0,
                      sink_stats=lambda: {"spool_bytes": 0})  # fmt: skip
        timed = TimedBackend()
        nvml_settings = config.source_settings("nvml")
        nvml_settings.update(events="off", jobmap_dir=tmp)
        nvml = sources.create("nvml", ctx, {**nvml_settings, "backend_instance": timed})
        in_turn = sources.create(
            "nvml",
            ctx,
            {**nvml_settings, "pcie_concurrent": False, "backend_instance": PynvmlBackend()},
        )
        recorded = sources.create(
            "nvml",
            ctx,
            {**nvml_settings, "backend": "recorded", "recording": args.recording, "loop": True},
        )
        for _ in range(5):  # discovery, first reads, GPM's first sample
            agent.collect(time.time_ns())
            nvml.collect(time.time_ns())
            in_turn.collect(time.time_ns())
            recorded.collect(time.time_ns())
        timed.spent.clear()
        timed.count.clear()
        real_b, nvml_b, in_turn_b, rec_b = [], [], [], []
        for _ in range(args.blocks):
            real_b.append(block(agent.collect, per_block))
            nvml_b.append(block(nvml.collect, per_block))
            in_turn_b.append(block(in_turn.collect, per_block))
            rec_b.append(block(recorded.collect, per_block))
        points = len(agent.collect(time.time_ns()))
        for source in (nvml, in_turn, recorded):
            source.close()
        agent.close()
    n_nvml = per_block * args.blocks
    print(f"device: {gpus}x {name}, driver {driver}; sources: {','.join(names)}; "
          f"{n_nvml} cycles in {args.blocks} blocks; {points} points/cycle")  # fmt: skip
    import pynvml

    label = input_label(pynvml)
    if label == "REAL":
        print("input: REAL GPU and driver through NVML; the host's real /sys, /proc and kernel log")
    else:
        print(f"input: {label}; the host's real /sys, /proc and kernel log")
    for label, blocks in (("real_full_cycle", real_b), ("nvml_source_real", nvml_b),
                          ("nvml_source_real_in_turn_baseline", in_turn_b),
                          ("nvml_source_recorded", rec_b)):  # fmt: skip
        walls = sorted(b[0] for b in blocks)
        cpus = sorted(b[1] for b in blocks)
        print(f"{label}: wall_ms median={statistics.median(walls):.3f} min={walls[0]:.3f} "
              f"max={walls[-1]:.3f} cpu_ms median={statistics.median(cpus):.3f}")  # fmt: skip
    driver_ms = statistics.median(b[0] for b in nvml_b) - statistics.median(b[0] for b in rec_b)
    print(f"driver_ms_per_cycle={driver_ms:.3f} (nvml real - recorded, wall)")
    base = statistics.median(b[0] for b in in_turn_b)
    print(f"nvml_source_speedup_vs_in_turn={base / statistics.median(b[0] for b in nvml_b):.1f}")
    print("per_call (wall ms per cycle, calls per cycle), the ten costliest:")
    top = sorted(timed.spent.items(), key=lambda kv: -kv[1])[:10]
    for call, spent in top:
        print(f"  {call:<48} {spent * 1000 / n_nvml:8.3f} ms  {timed.count[call] / n_nvml:6.1f}")
    print(f"real_cycle_ms={statistics.median(b[0] for b in real_b):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
