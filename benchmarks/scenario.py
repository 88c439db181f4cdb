"""Generate one SIMULATED hour of 64 nodes x 8 GPUs at 1 Hz (gpu, gpu_event, ib_port,
job_step, job_model, ground truth; a 448-GPU job and a slow GPU) and print the rate.

The generator's marginals come from the real AcmeTrace CDFs; the output is simulated.
Last line: ``points_per_s=<x>``.
"""

from __future__ import annotations

import argparse
import time

from gpuwarden.simulation.generator import ScenarioGenerator
from gpuwarden.simulation.spec import parse_spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--nodes", type=int, default=64)
    args = ap.parse_args()
    spec = parse_spec(
        {
            "name": "bench",
            "nodes": args.nodes,
            "duration_s": args.seconds,
            "interval_s": 1,
            "measurements": [
                "gpu",
                "gpu_event",
                "ib_port",
                "job_step",
                "job_model",
                "scenario_fault",
            ],
            "jobs": [
                {"name": "llm", "nodes": args.nodes - 8, "tp": 8, "pp": 8, "step_time_s": 6.0}
            ],
            "faults": [
                {"type": "slow_gpu", "at_s": args.seconds // 4, "node": 3, "gpu": 2},
                {"type": "xid79", "at_s": args.seconds // 2, "node": 60, "gpu": 1},
            ],
        }
    )
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    counts: dict[str, int] = {}
    for chunk in ScenarioGenerator(spec, seed=0).chunks():
        for m, df in chunk.items():
            counts[m] = counts.get(m, 0) + df.height
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    total = sum(counts.values())
    print(f"SIMULATED {args.nodes} nodes x 8 GPUs, {args.seconds} s at 1 Hz")
    for m, n in sorted(counts.items()):
        print(f"  {m:16s} {n:>12,}")
    print(f"{total:,} points in {wall:.1f} s wall, {cpu:.1f} s CPU")
    print(f"points_per_s={total / wall:.0f}")


if __name__ == "__main__":
    main()
