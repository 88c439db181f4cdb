"""Simulated per-GPU telemetry (not real data) for the storage benchmarks and the demo: the
catalogue's ``gpu`` fields with plausible ranges, 1 Hz, N nodes x 8 GPUs."""

from __future__ import annotations

import numpy as np
import polars as pl

TAGS = ["cluster", "node", "gpu", "gpu_uuid"]
FIELDS = [
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "gpu_temp_c",
    "mem_temp_c",
    "power_w",
    "energy_j_total",
    "pstate_code",
    "clock_event_reasons_code",
    "ecc_sbe_volatile_total",
    "ecc_dbe_volatile_total",
    "pcie_replay_total",
    "clock_event_hw_slowdown_active",
]
T0_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


def gpu_frame(nodes: int, gpus: int, seconds: int, start_s: int = 0, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed + start_s)
    n_dev = nodes * gpus
    n = n_dev * seconds
    dev = np.tile(np.arange(n_dev), seconds)
    t = np.repeat(np.arange(start_s, start_s + seconds), n_dev)
    node_names = np.array([f"gpu-node-{i:03d}" for i in range(nodes)])
    power = rng.normal(520.0, 60.0, n).clip(60, 700)
    return pl.DataFrame(
        {
            "time": T0_NS + t.astype(np.int64) * 1_000_000_000,
            "cluster": np.full(n, "sim"),
            "node": node_names[dev // gpus],
            "gpu": (dev % gpus).astype(str),
            "gpu_uuid": np.char.add("GPU-5e1f0000-0000-0000-0000-", (dev + 10**11).astype(str)),
            "gpu_util_pct": rng.uniform(0, 100, n).round(0),
            "mem_util_pct": rng.uniform(0, 100, n).round(0),
            "mem_used_bytes": rng.integers(0, 80 * 2**30, n),
            "sm_clock_mhz": rng.choice([1410.0, 1755.0, 1980.0], n),
            "mem_clock_mhz": np.full(n, 2619.0),
            "gpu_temp_c": rng.normal(62, 8, n).round(0),
            "mem_temp_c": rng.normal(70, 6, n).round(0),
            "power_w": power.round(3),
            # NVML counts millijoules: joules with three decimals, like the agent writes.
            "energy_j_total": (t * 520.0 + dev * 1e6 + rng.uniform(0, 1, n)).round(3),
            "pstate_code": np.zeros(n, dtype=np.int64),
            "clock_event_reasons_code": rng.choice([0, 4, 8], n, p=[0.9, 0.09, 0.01]).astype(
                np.int64
            ),
            "ecc_sbe_volatile_total": (t // 600).astype(np.int64),
            "ecc_dbe_volatile_total": np.zeros(n, dtype=np.int64),
            "pcie_replay_total": (t // 3600).astype(np.int64),
            "clock_event_hw_slowdown_active": rng.random(n) < 0.01,
        }
    )
