"""The agent runs for months: its memory must not grow with the jobs that come and go.

A node sees thousands of jobs over its life, each with new process ids. Everything the agent
learns per job or per process (tag sets, job lookups) must be forgotten again. The NVML
answers are the CONSTRUCTED 8x H100 recording, except the processes on each GPU, which this
test replaces every cycle with a new process of a new Slurm job (SIMULATED)."""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuwarden.collector import sources
from gpuwarden.collector.agent import Agent
from gpuwarden.collector.nvml.recorded import RecordedBackend
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.core.store.lineprotocol import Point
from testbed.sysfstree import build_node_tree

H100 = Path(__file__).parent / "golden" / "nvml-h100-8gpu" / "nvml.json"


class NewJobEveryCycle(RecordedBackend):
    """The recording, but each GPU runs a fresh process of a fresh job on every cycle."""

    def __init__(self, path: Path, procfs: Path) -> None:
        super().__init__(path, loop=True)
        self.procfs = procfs
        self.cycle = 0

    def begin_cycle(self) -> None:
        super().begin_cycle()
        self.cycle += 1

    def call(self, device: int | None, name: str, *args: Any) -> Any:
        if name == "nvmlDeviceGetComputeRunningProcesses" and device is not None:
            pid = 10_000 + self.cycle * 8 + device
            proc = os.path.join(self.procfs, str(pid))  # not pathlib: it interns each part
            if not os.path.exists(proc):
                os.mkdir(proc)
                env = f"SLURM_JOB_ID={900_000 + self.cycle}\0SLURM_PROCID={device}\0"
                with open(os.path.join(proc, "environ"), "wb") as f:
                    f.write(env.encode())
            return [[pid, 1 << 30]]
        return super().call(device, name, *args)


class CountJobs:
    """Counts the jobs the GPU points were attributed to (one new job per cycle)."""

    def __init__(self) -> None:
        self.last = ""
        self.jobs = 0

    def write_points(self, points: Iterable[Point]) -> None:
        job = next(p.tags["job"] for p in points if p.measurement == "gpu")
        if job != self.last:
            self.last, self.jobs = job, self.jobs + 1

    def close(self, timeout_s: float = 10.0) -> bool:
        return True


def test_memory_does_not_grow_with_the_jobs_that_come_and_go(tmp_path):
    build_node_tree(tmp_path / "sys")
    procfs = tmp_path / "proc"
    procfs.mkdir()
    ctx = SourceContext("soak", "node-0", sysfs=tmp_path / "sys", procfs=procfs)
    backend = NewJobEveryCycle(H100, procfs)
    nvml = sources.create("nvml", ctx, {"backend_instance": backend, "events": "poll"})
    ib = sources.create("infiniband", ctx, {})
    sink = CountJobs()
    agent = Agent([nvml, ib], sink, cluster="soak", node="node-0", interval_s=1.0)

    def cycles(n: int) -> None:
        for _ in range(n):
            sink.write_points(agent.collect(time.time_ns()))

    tracemalloc.start()  # before the warm-up, so the state it replaces later is traced too
    try:
        cycles(120)  # warm: discovery, first reads, every per-job structure made and dropped
        before = tracemalloc.take_snapshot()
        cycles(600)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    agent.close()
    assert sink.jobs == 720  # every cycle's job was attributed: the test did what it says
    growth = after.compare_to(before, "lineno")
    grown = sum(stat.size_diff for stat in growth)
    top = "\n".join(str(stat) for stat in growth[:5])
    # each job left behind would cost about 100 kB (tag sets for 8 GPUs and their 18 NVLinks
    # each): 600 of them would be tens of megabytes
    assert grown < 256 * 1024, f"grew by {grown} bytes over 600 jobs:\n{top}"
