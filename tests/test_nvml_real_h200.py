"""What the first REAL NVML recording (tests/golden/nvml-real-h200*: one H200, driver
580.159.04, recorded by scripts/nvml_real.sh) taught the agent, each as a test:

* ``nvmlDeviceGetPcieThroughput`` samples 20 ms in the driver per call (20.8 ms measured; the
  other calls take microseconds). The NVML source now asks every GPU's TX and RX at once
  (:class:`collector.sources.nvml.poll.PcieSampler`) where the backend can take concurrent
  calls; the tests here prove the calls were in flight together with a barrier, not a clock.
* ``nvmlDeviceGetMemoryInfo`` v1 counts the driver's reserve as used (1.57 GB against
  nvidia-smi's 0.93 GB); the agent reads v2 and reports the reserve apart.
* GPM answers NaN (return code success) for samples taken too close together: no reading.

The golden cases themselves (line protocol per step, and the real path over the stand-in
library) are checked by test_golden.py and test_nvml_real_path.py.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

from gpuwarden.collector import cli
from gpuwarden.collector.nvml.backend import ERROR_GPU_IS_LOST, NvmlError
from gpuwarden.collector.nvml.recorded import RecordedBackend
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.nvml import NvmlSource
from gpuwarden.collector.sources.nvml.poll import GPM_METRICS, Device, parse_gpu
from testbed.nvml.fakelib import installed
from tests.test_golden import GOLDEN, run_case
from tests.test_nvml_real_path import RealPath, fake

H100 = GOLDEN / "nvml-h100-8gpu" / "nvml.json"
REAL = GOLDEN / "nvml-real-h200"
T0 = 1_763_000_000_000_000_000


class Concurrent(RecordedBackend):
    """A recorded backend that says it takes concurrent calls, as the real one does. Each
    PCIe throughput call waits at a barrier for all the others: were they asked one after
    another, the first would wait alone until the barrier's timeout broke it."""

    concurrent_calls = True

    def __init__(self, path: Path, parties: int, lost: int | None = None) -> None:
        super().__init__(path, loop=True)
        self.barrier = threading.Barrier(parties, timeout=60)
        self.lost = lost
        self.threads: set[str] = set()

    def call(self, device, name, *args):
        if name == "nvmlDeviceGetPcieThroughput":
            self.threads.add(threading.current_thread().name)
            self.barrier.wait()  # BrokenBarrierError: not all in flight at once
            if device == self.lost:
                raise NvmlError(ERROR_GPU_IS_LOST, name)
        return super().call(device, name, *args)


def source(tmp_path: Path, backend, **settings) -> NvmlSource:
    ctx = SourceContext("c", "n", sysfs=tmp_path, procfs=tmp_path)
    return NvmlSource(ctx, {"backend_instance": backend, "events": "off",
                            "jobmap_dir": str(tmp_path), **settings})  # fmt: skip


def test_every_gpus_pcie_samples_are_in_flight_at_once(tmp_path):
    backend = Concurrent(H100, parties=16)  # 8 GPUs, TX and RX
    src = source(tmp_path, backend)
    for cycle in range(2):
        gpus = [p for p in src.collect(T0 + cycle) if p.measurement == "gpu"]
        assert len(gpus) == 8
        for p in gpus:
            assert float(p.fields["pcie_tx_bytes_per_s"]) > 0
            assert float(p.fields["pcie_rx_bytes_per_s"]) > 0
    src.close()
    assert len(backend.threads) == 16
    assert all(name.startswith("nvml-pcie") for name in backend.threads)
    assert backend.barrier.broken is False


def test_asked_in_turn_when_switched_off(tmp_path):
    """``pcie_concurrent = false``: on the caller's thread, one after another (a barrier of
    one party passes each call alone)."""
    backend = Concurrent(H100, parties=1)
    src = source(tmp_path, backend, pcie_concurrent=False)
    gpus = [p for p in src.collect(T0) if p.measurement == "gpu"]
    src.close()
    assert all("pcie_tx_bytes_per_s" in p.fields for p in gpus)
    assert backend.threads == {threading.current_thread().name}


def test_a_recorded_backend_is_asked_in_turn(tmp_path):
    """Recordings answer at once: no threads for them (the agent's cycle benchmark runs on
    one, and the pool would cost it CPU for nothing)."""
    src = source(tmp_path, RecordedBackend(H100))
    src.collect(T0)
    assert src._pcie._pool is None
    src.close()


def test_a_gpu_lost_during_its_pcie_sample_is_reported_lost_and_the_others_read(tmp_path):
    backend = Concurrent(H100, parties=16, lost=5)
    src = source(tmp_path, backend)
    points = src.collect(T0)
    src.close()
    gpus = {p.tags["gpu"] for p in points if p.measurement == "gpu"}
    assert gpus == {str(i) for i in range(8)} - {"5"}
    lost = [p for p in points if p.measurement == "gpu_event" and p.tags.get("event") == "gpu_lost"]
    assert [p.tags["gpu"] for p in lost] == ["5"]


def test_memory_v2_reports_the_reserve_apart_and_v1_counts_it_as_used(tmp_path):
    recorded = json.loads((REAL / "nvml.json").read_text())["ticks"][0]["answers"]
    total, used, reserved = recorded["0|nvmlDeviceGetMemoryInfo|[]"]["v"]
    v2 = run_case(REAL, tmp_path / "v2")[0][0]
    assert f"mem_used_bytes={used}i" in v2 and f"mem_reserved_bytes={reserved}i" in v2
    # a driver without v2, through the real path: v1's used is used + reserved, no reserve
    with installed(fake("nvml-real-h200", missing={"nvmlDeviceGetMemoryInfo_v2"})) as library:
        v1 = run_case(REAL, tmp_path / "v1", RealPath(library.recording))[0][0]
    assert f"mem_used_bytes={used + reserved}i" in v1
    assert "mem_reserved_bytes" not in v1
    assert f"mem_total_bytes={total}i" in v1


def test_gpm_nan_is_no_reading():
    answers = [[0, math.nan], [0, 13.6], [0, 89.4], [0, 15.6]]
    fields, _ = parse_gpu(Device(0), {"gpm": answers})
    names = list(GPM_METRICS)
    assert names[0] not in fields
    assert [fields[n] for n in names[1:]] == [13.6, 89.4, 15.6]


def test_print_with_cycles_records_nvml_without_a_store(tmp_path, monkeypatch, capsys):
    """How scripts/nvml_real.sh records on a GPU node: ``--print --cycles 3 --record-nvml``."""
    monkeypatch.setenv("GPUWARDEN_NVML_BACKEND", "recorded")
    monkeypatch.setenv("GPUWARDEN_NVML_RECORDING", str(REAL / "nvml.json"))
    monkeypatch.setenv("GPUWARDEN_AGENT_INTERVAL_S", "0.05")
    monkeypatch.setenv("GPUWARDEN_AGENT_SOURCES", "nvml")
    monkeypatch.setenv("GPUWARDEN_AGENT_REPORTER_LISTEN", "")
    out = tmp_path / "again.json"
    assert cli.main(["--print", "--cycles", "3", "--record-nvml", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("gpu,") for line in printed) == 3
    again = json.loads(out.read_text())
    assert len(again["ticks"]) == 3
    assert again["provenance"] == "recorded"  # a re-recording keeps what it came from
