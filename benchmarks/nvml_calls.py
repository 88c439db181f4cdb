"""What each NVML call the agent makes costs on a REAL GPU, and what the cheaper calls answer.

Needs an NVIDIA driver (exits 2 without one); run it on a lent GPU machine while the GPU is
busy (``scripts/nvml_real.sh`` starts a load). Prints, for GPU 0:

* the agent's field-value request, whole and field by field (median wall ms of ``--reps``);
* ``nvmlDeviceGetPcieThroughput`` (TX, RX): one after the other and both at once on two
  threads, beside the PCIe byte counters ``NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES`` read as
  fields, with the rate those counters give over one second (to compare with the sampled
  throughput, which is KB/s over NVML's own 20 ms window);
* the PCIe error counters (``NVML_FI_DEV_PCIE_COUNT_*``) the agent does not read yet;
* memory used by ``nvmlDeviceGetMemoryInfo`` v1 and v2 (v2 leaves the driver's reserve out, as
  nvidia-smi does);
* GPM's DRAM bandwidth between two samples 50 ms and 1 s apart.

    python3 -m benchmarks.nvml_calls [--reps 20]

The last line is ``pcie_throughput_ms=<x>`` (one call, median). Its first line labels the run:
REAL over the driver's library, CONSTRUCTED over anything else (CI runs it over a stand-in,
``python -m testbed.nvml.standin``, whose times are not a GPU's). ``benchmarks/doc_tables.py``
turns the output into docs/NVML-REAL.md's table of calls.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

AGENT_FIELDS = [3, 4, 5, 6, 29, 30, 31, 82, 83, 94, 142, 143, 144, 145]
PCIE_ERRORS = list(range(169, 184))
TX_BYTES, RX_BYTES = 197, 198


def timed(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    """(median wall ms, the last answer)."""
    spent, answer = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        answer = fn()
        spent.append((time.perf_counter() - t0) * 1000)
    return statistics.median(spent), answer


def input_label(nv: Any) -> str:
    """REAL when pynvml has the driver's library loaded (a ``ctypes.CDLL``), else what it is."""
    library = getattr(nv, "nvmlLib", None)
    if isinstance(library, ctypes.CDLL):
        return "REAL"
    return f"CONSTRUCTED: not a driver ({type(library).__name__}); the times are not a GPU's"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    import pynvml as nv

    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        print(f"nvml_calls: no NVIDIA driver here ({exc})", file=sys.stderr)
        return 2
    h = nv.nvmlDeviceGetHandleByIndex(0)
    print(f"device: {nv.nvmlDeviceGetName(h)}, driver {nv.nvmlSystemGetDriverVersion()}; "
          f"{input_label(nv)}")  # fmt: skip

    def fields(ids: list[int]) -> list[tuple[int, Any]]:
        out = []
        for v in nv.nvmlDeviceGetFieldValues(h, ids):
            out.append((v.nvmlReturn, v.value.ullVal if v.nvmlReturn == 0 else None))
        return out

    ms_one = float("nan")
    for part in (per_field, pcie, energy, memory, gpm_dram):
        try:
            got = part(nv, h, fields, args.reps)
        except Exception as exc:  # one part's failure must not lose the others'
            print(f"{part.__name__}: failed: {exc!r}")
            continue
        if part is pcie:
            ms_one = got
    print(f"pcie_throughput_ms={ms_one:.3f}")
    return 0


def per_field(nv: Any, h: Any, fields: Any, reps: int) -> None:

    ms, _ = timed(lambda: fields(AGENT_FIELDS), reps)
    print(f"agent field request ({len(AGENT_FIELDS)} fields): {ms:.3f} ms")
    for fid in [*AGENT_FIELDS, TX_BYTES, RX_BYTES, *PCIE_ERRORS]:
        ms, answer = timed(functools.partial(fields, [fid]), reps)
        print(f"  field {fid:>3}: {ms:8.3f} ms  answer {answer[0]}")


def pcie(nv: Any, h: Any, fields: Any, reps: int) -> float:
    tx = nv.NVML_PCIE_UTIL_TX_BYTES
    rx = nv.NVML_PCIE_UTIL_RX_BYTES
    ms_one, _ = timed(lambda: nv.nvmlDeviceGetPcieThroughput(h, tx), reps)
    ms_seq, _ = timed(
        lambda: (nv.nvmlDeviceGetPcieThroughput(h, tx), nv.nvmlDeviceGetPcieThroughput(h, rx)),
        max(1, reps // 4),
    )

    def both_threads() -> None:
        ts = [
            threading.Thread(target=nv.nvmlDeviceGetPcieThroughput, args=(h, c)) for c in (tx, rx)
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    ms_par, _ = timed(both_threads, max(1, reps // 4))
    print(f"pcie throughput: one call {ms_one:.3f} ms; TX then RX {ms_seq:.3f} ms; "
          f"TX and RX on two threads {ms_par:.3f} ms")  # fmt: skip
    a = fields([TX_BYTES, RX_BYTES])
    sampled = (nv.nvmlDeviceGetPcieThroughput(h, tx), nv.nvmlDeviceGetPcieThroughput(h, rx))
    t0 = time.perf_counter()
    time.sleep(1.0)
    b = fields([TX_BYTES, RX_BYTES])
    dt = time.perf_counter() - t0
    if all(code == 0 for code, _ in a + b):
        rates = [(b[i][1] - a[i][1]) / dt / 1000 for i in range(2)]
        print(f"pcie counters over {dt:.2f} s: TX {rates[0]:.0f} KB/s, RX {rates[1]:.0f} KB/s; "
              f"sampled throughput TX {sampled[0]} KB/s, RX {sampled[1]} KB/s")  # fmt: skip
    else:
        print(f"pcie counters: not answered ({a}, {b})")
    return ms_one


def energy(nv: Any, h: Any, fields: Any, reps: int) -> None:
    ms, joules = timed(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), reps)
    print(f"nvmlDeviceGetTotalEnergyConsumption: {ms:.3f} ms ({joules} mJ)")


def memory(nv: Any, h: Any, fields: Any, reps: int) -> None:
    v1 = nv.nvmlDeviceGetMemoryInfo(h)
    try:
        v2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        print(f"memory v1: total {v1.total} used {v1.used} free {v1.free}; v2: total {v2.total} "
              f"reserved {v2.reserved} used {v2.used} free {v2.free}")  # fmt: skip
    except (nv.NVMLError, AttributeError, TypeError) as exc:
        print(f"memory v1: used {v1.used}; v2 not answered: {exc}")


def gpm_dram(nv: Any, h: Any, fields: Any, reps: int) -> None:
    for gap in (0.0, 0.05, 1.0):
        s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(h, s1)
        time.sleep(gap)
        nv.nvmlGpmSampleGet(h, s2)
        m = nv.c_nvmlGpmMetricsGet_t()
        m.version = nv.NVML_GPM_METRICS_GET_VERSION
        m.numMetrics = 2
        m.sample1, m.sample2 = s1, s2
        m.metrics[0].metricId = nv.NVML_GPM_METRIC_DRAM_BW_UTIL
        m.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_UTIL
        nv.nvmlGpmMetricsGet(m)
        dram, sm = m.metrics[0], m.metrics[1]
        print(f"gpm {gap:.2f} s apart: dram_bw {dram.value} (ret {dram.nvmlReturn}), "
              f"sm_util {sm.value}")  # fmt: skip
        nv.nvmlGpmSampleFree(s1)
        nv.nvmlGpmSampleFree(s2)


if __name__ == "__main__":
    sys.exit(main())
