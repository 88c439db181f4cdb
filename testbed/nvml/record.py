"""Record a real GPU's NVML answers as a golden case: ``python -m testbed.nvml.record DIR``.

Runs the agent's NVML source against the driver (``nvidia-ml-py``) for a few cycles with a
:class:`~collector.nvml.recorded.Recorder` in between, and writes ``DIR/nvml.json`` (every
answer and error code, per tick, device and call) and ``DIR/case.toml`` (the case's steps and
its provenance: GPU, driver, host, date). It needs nothing but the standard library,
``nvidia-ml-py`` and this package (no polars), so it runs with a GPU machine's own Python.
The expected line protocol is then written where the tests run::

    GPUWARDEN_UPDATE_GOLDEN=1 pytest tests/test_golden.py -k <case>

and the diff reviewed: a real recording is how the hardware answered, and the test keeps it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

from gpuwarden.collector.nvml.backend import NvmlBackend, NvmlError
from gpuwarden.collector.nvml.real import PynvmlBackend
from gpuwarden.collector.nvml.recorded import Recorder
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.nvml import NvmlSource
from gpuwarden.core.errors import GpuwardenError


def make_backend() -> NvmlBackend:
    """The driver (a test replaces this with a recording)."""
    return PynvmlBackend()


def _describe(backend: Recorder) -> tuple[str, str, int]:
    """(GPU names, driver version, GPU count) as the driver states them."""
    count = int(backend.call(None, "nvmlDeviceGetCount"))
    names = sorted({str(backend.call(i, "nvmlDeviceGetName")) for i in range(count)})
    driver = str(backend.call(None, "nvmlSystemGetDriverVersion"))
    return ", ".join(names), driver, count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.nvml.record", description=__doc__)
    ap.add_argument("out", type=Path, help="the case folder to write (nvml.json, case.toml)")
    ap.add_argument("--steps", type=int, default=3, help="collection cycles to record")
    ap.add_argument("--interval-s", type=float, default=2.0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(make_backend())
    context = SourceContext("recorded", platform.node() or "gpu-node")
    source = NvmlSource(context, {"backend_instance": recorder, "events": "poll"})
    lines = 0
    try:
        for step in range(args.steps):
            points = source.collect(time.time_ns())
            lines += len(points)
            print(f"step {step}: {len(points)} points", file=sys.stderr)
            if step + 1 < args.steps:
                time.sleep(args.interval_s)
        names, driver, count = _describe(recorder)
    except (NvmlError, GpuwardenError, ImportError) as exc:  # no driver, no GPU, no pynvml
        print(f"no recording: {exc}", file=sys.stderr)
        return 1
    finally:
        source.close()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    recorder.note = f"{count}x {names}, driver {driver}, host {platform.node()}, {when}"
    recorder.save(args.out / "nvml.json")
    kind = getattr(recorder.inner, "provenance", "") or "recorded"  # a replay stays what it was
    provenance = (
        f"{'REAL' if kind == 'recorded' else kind.upper()}: recorded from {recorder.note} by "
        f"python -m testbed.nvml.record ({args.steps} cycles, {args.interval_s:g} s apart)"
    )
    (args.out / "case.toml").write_text(
        f"description = {json.dumps(f'real NVML answers of {count}x {names}')}\n"
        f"provenance = {json.dumps(provenance)}\n"
        'sources = ["nvml"]\n'
        f"steps = {args.steps}\n",
        encoding="utf-8",
    )
    print(f"wrote {args.out}/nvml.json and case.toml: {provenance} ({lines} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
