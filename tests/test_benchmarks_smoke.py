"""Every benchmark runs, in a short smoke mode of its own (issue 40: no benchmark ran in CI, so
``benchmarks/predict_stepfun.py`` rotted unseen: it imported ``SOURCE`` from a module it had
left). Each is started as its README line shows (``python -m benchmarks.<name>``) with small
arguments and must exit 0 and end with its ``key=value`` line. The figures a smoke run prints
mean nothing (too small to measure anything); the full runs and their figures are in
docs/BENCHMARKS.md. A benchmark added without a smoke entry here fails the last test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import doc_tables

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_H200 = "tests/golden/nvml-real-h200"

#: benchmark -> its smoke arguments
SMOKE: dict[str, list[str]] = {
    "agent_cycle": ["--cycles", "5", "--blocks", "2", "--idle-s", "3", "--idle-interval", "1"],
    "agent_footprint": ["--cycles", "20"],
    "aggregate": ["--cycles", "20"],
    "analytics": ["--nodes", "8", "--seconds", "60"],  # its faults name node 5
    "attribution": ["--seeds", "1", "--bench-nodes", "8", "--bench-seconds", "60"],
    "encode": ["--points", "20000", "--nodes", "2"],
    "exhaustion": ["--agents", "3", "--slow", "5", "--stalled", "2", "--seconds", "5"],
    "failover": ["--plans", "2"],
    "goodput": ["--seeds", "1"],
    "goodput_scale": ["--job-nodes", "128", "--days", "2", "--seeds", "1", "--measure-seeds", "1"],
    "ingest": ["--seconds", "60", "--nodes", "1", "--rounds", "1"],
    "live_loop": ["--runs", "follow", "--smoke"],
    "live_model": ["--seeds", "1"],
    "node_check": [],
    "nvml_calls": ["--reps", "2"],
    "nvml_real": ["--recording", f"{GOLDEN_H200}/nvml.json", "--cycles", "5", "--blocks", "2"],
    "predict_simulated": ["--smoke"],  # 8 nodes, 6 h days, 2 + 1 of them: 2 minutes
    "predict_stepfun": [],
    "remediation_latency": ["--trials", "1"],
    "scale": ["--gpus", "1024", "--seconds", "20", "--workers", "1"],  # its faults' nodes
    "scenario": ["--seconds", "10", "--nodes", "64"],  # its faults name node 60
    "serving": ["--agents", "10", "--window-s", "1"],
    "spares": ["--filler-s", "1"],
    "verdicts": ["--smoke"],
}
#: they measure the real NVIDIA library (their figures come from a lent GPU machine,
#: docs/NVML-REAL.md); without a driver they run over the stand-in library answering from the
#: H200's recording (testbed.nvml.standin), must say CONSTRUCTED, and their output must render
#: as the page's table (benchmarks/doc_tables.py), so neither the code nor the renderer rots
NEEDS_GPU = {"nvml_calls", "nvml_real"}
#: modules of benchmarks/ that measure nothing: doc_tables renders the docs' tables from the
#: output the benchmarks printed (tests/test_docs_tables.py runs it on every recorded output)
NOT_BENCHMARKS = {"doc_tables"}
LAST_LINE = re.compile(r"^[a-z_0-9]+=\S+( [a-z_0-9]+=\S+)*$")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_benchmark_runs(name: str, tmp_path: Path) -> None:
    command = ["-m", f"benchmarks.{name}", *SMOKE[name]]
    stand_in = name in NEEDS_GPU and not _nvml_present()
    if stand_in:
        command = ["-m", "testbed.nvml.standin", f"{GOLDEN_H200}/nvml.json", *command[1:]]
    # (a guard against a hang, not a speed limit)
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=900,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert LAST_LINE.match(last), f"last line {last!r} is not key=value"
    if name in NEEDS_GPU:
        if stand_in:  # its times are the stand-in's: the output must not pass for a GPU's
            assert "CONSTRUCTED: not a driver" in done.stdout and "REAL" not in done.stdout
        else:
            assert "REAL" in done.stdout
        table = doc_tables.TABLES[name](done.stdout).splitlines()
        # the calls the stand-in's recording holds are timed: PCIe throughput, the fields
        timed = [row for row in table[2:] if re.search(r"\| \**[\d.]+(-[\d.]+)?\** \|", row)]
        assert len(timed) >= 4, table
        if name == "nvml_calls":  # the parts the recording answers ran (energy's it does not)
            assert "memory v1: total" in done.stdout and "pcie throughput: one call" in done.stdout


def test_every_benchmark_has_a_smoke_run() -> None:
    names = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__"}
    assert names - NOT_BENCHMARKS == set(SMOKE)
    # a smoke run runs the benchmark's body: --help only parses (predict_simulated's was that,
    # and its body could rot unseen)
    assert not [name for name, args in SMOKE.items() if {"--help", "-h"} & set(args)]


def _nvml_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:
        return False
    return True
