"""How long ``gpuwarden check`` takes on this machine, with every probe, as an operator runs it.

Runs ``gpuwarden check --json`` (the production command, a process of its own, with the agent's
default probes and settings) five times and prints each probe's status and the median of each
run's wall time. On a machine without GPUs the GPU probes say ``unavailable``; the all-reduce
runs on gloo (CPU) and is most of the time (two Python processes importing torch).

    uv run python -m benchmarks.node_check

Last line: ``check_s=<median seconds>``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    times = []
    last: dict[str, Any] = {}
    for _ in range(5):
        t0 = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "check", "--json"],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        times.append(time.monotonic() - t0)
        last = json.loads(done.stdout)
    for p in last["probes"]:
        print(f"{p['status']:<12} {p['name']:<11} {p['seconds']:6.2f} s  {p['detail']}")
    print(f"runs: {', '.join(f'{t:.2f}' for t in times)} s (ok={last['ok']})")
    print(f"check_s={statistics.median(times):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
