"""Constructed NVML recordings for nodes we have no GPU for: 8x H100 SXM and 8x A100 SXM.

CONSTRUCTED, not recorded: the answers follow NVML's documented behaviour for each part (units,
which calls and field ids a Hopper or Ampere board supports, what "not supported" looks like)
with plausible values; the file says ``provenance: constructed``. Where a real recording exists
(``gpuwarden agent``'s recorder on a GPU machine) it is preferred.

    python -m testbed.nvml.construct --model h100 --ticks 3 --out h100.json
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.collector.nvml.backend import ERROR_NOT_READY, ERROR_NOT_SUPPORTED
from gpuwarden.collector.nvml.recorded import FORMAT, call_key
from gpuwarden.collector.sources.nvml.poll import (
    FI_NVLINK_LINK_COUNT,
    GPM_METRICS,
    GPU_FIELD_IDS,
    NVLINK_SCOPED,
    PLAIN_CALLS,
    STATIC_CALLS,
    field_request,
)


@dataclass(frozen=True)
class Part:
    name: str
    max_clocks: tuple[int, int, int]  # sm, mem, graphics (MHz)
    power_limit_mw: int
    mem_total: int
    links: int
    gpm: bool
    scoped_nvlink_errors: bool  # NVML_FI_DEV_NVLINK_ERROR_DL_* answered
    legacy_nvlink_crc: bool  # per-lane CRC fields answered
    pcie: tuple[int, int]  # generation, width
    vbios: str
    # nvmlDeviceGetGpuFabricInfo: [state, status, health mask] (None: not supported). NVML
    # documents it for Hopper and newer; the H100's answer is registered with every health
    # bit the mask has answered "false" (0b10), as a healthy HGX node would be
    fabric: list[int] | None


PARTS = {
    "h100": Part(
        name="NVIDIA H100 80GB HBM3",
        max_clocks=(1980, 2619, 1980),
        power_limit_mw=700_000,
        mem_total=81559 * 2**20,
        links=18,
        gpm=True,
        scoped_nvlink_errors=True,
        legacy_nvlink_crc=False,
        pcie=(5, 16),
        vbios="96.00.74.00.01",
        fabric=[3, 0, 0b10101010],
    ),
    "a100": Part(
        name="NVIDIA A100-SXM4-80GB",
        max_clocks=(1410, 1593, 1410),
        power_limit_mw=400_000,
        mem_total=81920 * 2**20,
        links=12,
        gpm=False,
        scoped_nvlink_errors=False,
        legacy_nvlink_crc=True,
        pcie=(4, 16),
        vbios="92.00.36.00.02",
        fabric=None,
    ),
}
NOT_SUPPORTED = {"e": ERROR_NOT_SUPPORTED}
RETIRED = {"retired_pages_sbe_total", "retired_pages_dbe_total", "retired_pages_pending_active"}


def _device_answers(part: Part, i: int, tick: int, rng: random.Random) -> dict[str, Any]:
    a: dict[str, Any] = {}

    def put(name: str, args: tuple[Any, ...], answer: dict[str, Any]) -> None:
        a[call_key(i, name, args)] = answer

    busy = 0.85 + 0.1 * rng.random()
    put("nvmlDeviceGetUUID", (), {"v": f"GPU-{i:08x}-0000-4000-8000-{i:012x}"})
    put("nvmlDeviceGetName", (), {"v": part.name})
    put("nvmlDeviceGetPciInfo", (), {"v": f"00000000:{0x18 + 0x10 * i:02X}:00.0"})
    sm_max, mem_max, graphics_max = part.max_clocks
    static = {
        "sm_clock_max": sm_max,
        "mem_clock_max": mem_max,
        "graphics_clock_max": graphics_max,
        "pcie_gen_max": part.pcie[0],
        "pcie_width_max": part.pcie[1],
    }
    for label, name, args in STATIC_CALLS:
        put(name, args, {"v": static[label]})
    # CONSTRUCTED identities: serials and VBIOS in the shape nvidia-smi shows them
    put("nvmlDeviceGetSerial", (), {"v": f"16501240{i:05d}"})
    put("nvmlDeviceGetVbiosVersion", (), {"v": part.vbios})
    put("nvmlDeviceGetPersistenceMode", (), {"v": 1})
    put("nvmlDeviceGetEccMode", (), {"v": [1, 1]})
    put("nvmlDeviceGetMigMode", (), {"v": [0, 0]})
    put("nvmlDeviceGetFieldValues", ([[FI_NVLINK_LINK_COUNT, 0]],), {"v": [[0, part.links]]})
    util = round(busy * 100)
    values = {
        "util": [util, round(busy * 45)],
        "memory": [part.mem_total, int(part.mem_total * 0.9)],
        "sm_clock": part.max_clocks[0] - 45,
        "mem_clock": part.max_clocks[1],
        "graphics_clock": part.max_clocks[2] - 45,
        "gpu_temp": 60 + rng.randint(0, 8),
        "power": int(part.power_limit_mw * busy * 0.95),
        "power_limit": part.power_limit_mw,
        "pstate": 0,
        "fan": None,
        "clock_events": 0x1 if util < 5 else 0x4 if busy > 0.93 else 0,
        "pcie_tx": 1_200_000 + rng.randint(0, 300_000),
        "pcie_rx": 2_400_000 + rng.randint(0, 300_000),
        "pcie_gen": part.pcie[0],
        "pcie_width": part.pcie[1],
        "processes": [[4100 + i, int(part.mem_total * 0.88)]],
        "fabric": part.fabric,
    }
    for label, name, args in PLAIN_CALLS:
        v = values[label]
        put(name, args, NOT_SUPPORTED if v is None else {"v": v})
    counters = {
        "ecc_sbe_volatile_total": 2 * i,
        "ecc_dbe_volatile_total": 0,
        "ecc_sbe_aggregate_total": 40 + 2 * i,
        "ecc_dbe_aggregate_total": 0,
        "mem_temp_c": 70 + rng.randint(0, 6),
        "energy_j_total": (3_600_000 + 6_000 * tick) * 1000 + i * 1000,
        "pcie_replay_total": i % 3,
        "remapped_rows_correctable_total": i % 2,
        "remapped_rows_uncorrectable_total": 0,
        "remapped_rows_pending_active": 0,
        "remapped_rows_failure_active": 0,
    }
    answers = []
    by_id = {fid: name for name, (fid, _) in GPU_FIELD_IDS.items()}
    scoped = {fid: name for name, fid in NVLINK_SCOPED.items()}
    for fid, scope in field_request(part.links):
        if fid in by_id:
            name = by_id[fid]
            answers.append([ERROR_NOT_SUPPORTED, None] if name in RETIRED else [0, counters[name]])
        elif fid in scoped:
            name = scoped[fid]
            if name.endswith("errors_total") and not part.scoped_nvlink_errors:
                answers.append([ERROR_NOT_SUPPORTED, None])
            elif name == "link_up_active":
                answers.append([0, 1])
            elif name.endswith("bytes_total"):
                answers.append([0, (40 + tick) * 2**30 + scope * 2**20])
            else:
                answers.append([0, 0])
        else:  # legacy per-lane CRC
            answers.append([0, 0] if part.legacy_nvlink_crc else [ERROR_NOT_SUPPORTED, None])
    put("nvmlDeviceGetFieldValues", (field_request(part.links),), {"v": answers})
    gpm_ids = list(GPM_METRICS.values())
    if not part.gpm:
        put("nvmlGpmMetricsGet", (gpm_ids,), NOT_SUPPORTED)
    elif tick == 0:
        put("nvmlGpmMetricsGet", (gpm_ids,), {"e": ERROR_NOT_READY})
    else:
        metrics = [[0, round(busy * 90, 1)], [0, 38.5], [0, round(busy * 55, 1)], [0, 61.0]]
        put("nvmlGpmMetricsGet", (gpm_ids,), {"v": metrics})
    return a


def construct(model: str, ticks: int = 2, gpus: int = 8, seed: int = 0) -> dict[str, Any]:
    part = PARTS[model]
    rng = random.Random(seed)
    out_ticks = []
    previous: dict[str, Any] = {}
    for tick in range(ticks):
        answers: dict[str, Any] = {
            call_key(None, "nvmlDeviceGetCount", ()): {"v": gpus},
            call_key(None, "nvmlSystemGetDriverVersion", ()): {"v": "550.90.07"},
        }
        for i in range(gpus):
            answers.update(_device_answers(part, i, tick, rng))
        delta = {k: v for k, v in answers.items() if previous.get(k) != v}
        previous = answers
        out_ticks.append({"answers": delta})
    return {
        "format": FORMAT,
        "provenance": "constructed",
        "note": f"CONSTRUCTED from NVML's documented behaviour: {gpus}x {part.name}, "
        f"{ticks} ticks (testbed/nvml/construct.py, seed {seed}); not a real GPU's answers",
        "ticks": out_ticks,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(PARTS), required=True)
    p.add_argument("--ticks", type=int, default=2)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    doc = construct(args.model, args.ticks, args.gpus, args.seed)
    Path(args.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
