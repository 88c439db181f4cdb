"""A recording stays usable when the collector asks NVML for more fields than it did when the
recording was made: a field request the recording does not hold is answered field by field.
The recordings here are the CONSTRUCTED ones in tests/golden (not a real GPU's answers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.collector.nvml.backend import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_NOT_SUPPORTED,
    NvmlError,
)
from gpuwarden.collector.nvml.recorded import RecordedBackend
from gpuwarden.collector.sources.nvml.poll import field_request

GOLDEN = Path(__file__).parent / "golden"
PCIE_TX_BYTES = (197, 0)  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES: never asked for when recorded


def started(name: str) -> RecordedBackend:
    backend = RecordedBackend(GOLDEN / name / "nvml.json")
    backend.init()
    backend.begin_cycle()
    return backend


def test_a_larger_request_gets_the_recorded_answers_and_not_supported_for_the_rest():
    backend = started("nvml-h100-8gpu")
    links = backend.call(0, "nvmlDeviceGetFieldValues", ((91, 0),))[0][1]
    request = field_request(links)
    recorded = backend.call(0, "nvmlDeviceGetFieldValues", request)
    larger = (PCIE_TX_BYTES, *request, (91, 0))
    answers = backend.call(0, "nvmlDeviceGetFieldValues", larger)
    assert answers[0] == [ERROR_NOT_SUPPORTED, None]
    assert answers[1:-1] == recorded
    assert answers[-1] == [0, links]  # from the other request the recording holds
    # and the next tick's values, not the first's
    backend.begin_cycle()
    assert backend.call(0, "nvmlDeviceGetFieldValues", larger)[1:-1] == backend.call(
        0, "nvmlDeviceGetFieldValues", request
    )


def test_a_lost_gpu_fails_a_larger_request_too():
    backend = started("nvml-gpu-lost")
    backend.begin_cycle()  # tick 1: GPU 1 is lost
    request = (*field_request(18), PCIE_TX_BYTES)
    with pytest.raises(NvmlError) as lost:
        backend.call(1, "nvmlDeviceGetFieldValues", request)
    assert lost.value.code == ERROR_GPU_IS_LOST
    assert backend.call(0, "nvmlDeviceGetFieldValues", request)[-1] == [ERROR_NOT_SUPPORTED, None]


def test_a_device_without_any_recorded_field_values_is_not_in_the_recording():
    backend = started("nvml-h100-8gpu")
    with pytest.raises(NvmlError) as missing:
        backend.call(99, "nvmlDeviceGetFieldValues", (PCIE_TX_BYTES,))
    assert missing.value.code == ERROR_FUNCTION_NOT_FOUND


def test_an_agent_that_starts_with_a_gpu_already_lost_reports_it_and_the_rest(tmp_path):
    """Found by the twin cluster: a GPU lost before the NVML source's first cycle answered
    nothing at discovery, and the source failed as a whole (an unbound variable), every
    cycle. Now the lost GPU is a ``gpu_lost`` event and the other GPUs are read."""
    from gpuwarden.collector.nvml.backend import ERROR_GPU_IS_LOST
    from gpuwarden.collector.sources.base import SourceContext
    from gpuwarden.collector.sources.nvml import NvmlSource
    from gpuwarden.core.store.lineprotocol import encode_points

    class LostFromTheStart(RecordedBackend):
        def call(self, device, name, *args):
            if device == 2:
                from gpuwarden.collector.nvml.backend import NvmlError

                raise NvmlError(ERROR_GPU_IS_LOST, name)
            return super().call(device, name, *args)

    backend = LostFromTheStart(GOLDEN / "nvml-h100-8gpu" / "nvml.json")
    ctx = SourceContext("c", "n", sysfs=tmp_path, procfs=tmp_path)
    source = NvmlSource(ctx, {"backend_instance": backend, "events": "poll",
                              "jobmap_dir": str(tmp_path)})  # fmt: skip
    lines = encode_points(source.collect(1_763_000_000_000_000_000))
    source.close()
    assert sum(line.startswith("gpu,") for line in lines) == 7
    assert any(line.startswith("gpu_event,") and "event=gpu_lost" in line and "gpu=2" in line
               for line in lines)  # fmt: skip
