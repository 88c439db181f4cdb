"""The real NVML path (pynvml's wrappers and structs, then collector.nvml.real's adapters),
run on a stand-in for libnvidia-ml (testbed.nvml.fakelib) that answers from the golden
NVML recordings, which are CONSTRUCTED: no GPU was at hand. Each case must come out exactly
as it does through the recorded backend, so what the agent does with the real driver's
answers is tested wherever there is no GPU; older drivers and a driver that does not start
are played by taking functions away."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuwarden.collector import sources
from gpuwarden.collector.nvml.real import PynvmlBackend
from gpuwarden.collector.nvml.recorded import RecordedBackend
from gpuwarden.collector.sources.base import SourceContext, SourceError
from testbed.nvml.fakelib import FakeLibrary, installed
from tests.test_golden import CASES, GOLDEN, run_case

NVML_CASES = [c for c in CASES if (GOLDEN / c / "nvml.json").exists()]


class RealPath(PynvmlBackend):
    """The real backend; each cycle also moves the fake library's recording on a tick."""

    def __init__(self, recording: RecordedBackend) -> None:
        super().__init__()
        self.recording = recording

    def begin_cycle(self) -> None:
        super().begin_cycle()
        self.recording.begin_cycle()


def fake(case: str, **kwargs) -> FakeLibrary:
    recording = RecordedBackend(GOLDEN / case / "nvml.json")
    recording.init()
    return FakeLibrary(recording, **kwargs)


@pytest.mark.parametrize("case", NVML_CASES)
def test_the_real_path_gives_what_the_recorded_backend_gives(case, tmp_path):
    assert len(NVML_CASES) >= 4
    with installed(fake(case)) as library:
        real = run_case(GOLDEN / case, tmp_path / "real", RealPath(library.recording))
    recorded = run_case(GOLDEN / case, tmp_path / "recorded")
    assert any(line.startswith("gpu,") for line in real[0])
    assert real == recorded


def test_pynvmls_own_field_wrapper_gives_the_same(tmp_path, monkeypatch):
    """Where pynvml's field struct does not have the layout the fast unpacking reads, the
    backend goes through pynvml's wrapper instead; both must give the same lines."""
    from gpuwarden.collector.nvml import real

    monkeypatch.setattr(real, "_fast_fields_possible", lambda nv: False)
    case = "nvml-a100-8gpu"  # per-lane CRC counters: the most varied field answers
    with installed(fake(case)) as library:
        slow = run_case(GOLDEN / case, tmp_path / "slow", RealPath(library.recording))
    assert slow == run_case(GOLDEN / case, tmp_path / "recorded")


def test_every_nvml_value_type_is_decoded():
    """The fast path reads the 8-byte union as one unsigned number; each type converts."""
    import struct

    from gpuwarden.collector.nvml.real import _FIELD, _decode_fields

    members = [(0, "=d", -2.5), (1, "=I", 4_000_000_000), (3, "=Q", 2**64 - 1),
               (4, "=q", -(2**40)), (5, "=i", -7), (6, "=H", 65_535)]  # fmt: skip
    flat: list[int] = []
    for kind, fmt, value in members:
        raw = struct.pack(fmt, value).ljust(8, b"\0")  # the rest of the union stays zero
        flat += [1, 0, 0, 0, kind, 0, struct.unpack("=Q", raw)[0]]
    flat += [2, 0, 0, 0, 3, 3, 0]  # NOT_SUPPORTED: no value
    assert struct.calcsize("=" + _FIELD) == 40
    assert _decode_fields(tuple(flat)) == [(0, v) for _, _, v in members] + [(3, None)]


def collect(library: FakeLibrary, tmp_path: Path, cycles: int = 2) -> list[list]:
    ctx = SourceContext("c", "n", sysfs=tmp_path, procfs=tmp_path)
    settings = {"backend_instance": RealPath(library.recording), "events": "poll"}
    source = sources.create("nvml", ctx, settings)
    try:
        return [source.collect(i) for i in range(cycles)]
    finally:
        source.close()


def measurements(points) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in points:
        counts[p.measurement] = counts.get(p.measurement, 0) + 1
    return counts


def xids(points) -> list[int]:
    return [p.fields["xid_code"] for p in points if p.tags.get("event") == "xid"]


def as_now_and_older(tmp_path: Path, missing: set[str]) -> tuple[list, list]:
    """The 8x H100 cycles from a current driver, and from one that lacks ``missing``."""
    with installed(fake("nvml-h100-8gpu")) as library:
        full = collect(library, tmp_path)
    with installed(fake("nvml-h100-8gpu", missing=missing)) as library:
        return full, collect(library, tmp_path)


def test_a_driver_without_the_v3_process_call_still_lists_processes(tmp_path):
    """pynvml raises its own NVMLLibraryMismatchError (not an NVMLError) when the unversioned
    process call's _v3 function is missing (drivers before R510)."""
    full, cycles = as_now_and_older(tmp_path, {"nvmlDeviceGetComputeRunningProcesses_v3"})
    assert cycles == full
    assert measurements(cycles[-1])["gpu_process"] >= 8


def test_a_driver_before_r535_still_gives_the_clock_event_reasons(tmp_path):
    """R535 renamed "throttle reasons" to "clock event reasons"; older drivers only have the
    old C function, which current bindings no longer call for the new name."""
    full, cycles = as_now_and_older(tmp_path, {"nvmlDeviceGetCurrentClocksEventReasons"})
    assert cycles == full
    assert all("clock_event_reasons_code" in p.fields for p in cycles[-1] if p.measurement == "gpu")


def test_a_driver_with_no_process_call_at_all_reports_everything_else(tmp_path, caplog):
    caplog.set_level("WARNING", logger="gpuwarden.collector.sources.nvml")
    missing = {f"nvmlDeviceGetComputeRunningProcesses_v{v}" for v in (2, 3)}
    with installed(fake("nvml-h100-8gpu", missing=missing)) as library:
        cycles = collect(library, tmp_path, cycles=3)
    counts = measurements(cycles[-1])
    assert counts["gpu"] == 8 and counts["gpu_nvlink"] == 8 * 18
    assert "gpu_process" not in counts
    assert all("process_count" not in p.fields for p in cycles[-1] if p.measurement == "gpu")
    said = [r.getMessage() for r in caplog.records if "ComputeRunningProcesses" in r.getMessage()]
    assert len(said) == 1 and "not in this driver" in said[0]


def test_a_driver_without_gpm_leaves_only_the_gpm_fields_out(tmp_path):
    with installed(fake("nvml-h100-8gpu", missing={"nvmlGpmQueryDeviceSupport"})) as library:
        cycles = collect(library, tmp_path)
    gpu = [p for p in cycles[-1] if p.measurement == "gpu"]
    assert len(gpu) == 8
    assert all(not any(k.startswith("gpm_") for k in p.fields) for p in gpu)
    assert all("power_w" in p.fields for p in gpu)


@pytest.mark.parametrize(
    ("code", "says"),
    [(9, "the NVIDIA kernel module is not loaded"), (18, "different driver versions")],
)
def test_a_driver_that_does_not_start_says_why(tmp_path, code, says):
    library = fake("nvml-h100-8gpu", init_error=code)
    with installed(library), pytest.raises(SourceError, match=says):
        collect(library, tmp_path, cycles=1)


def test_a_gpu_that_cannot_register_for_events_does_not_stop_the_others(tmp_path, caplog):
    """GPU 0 refuses event registration (lost): GPU 1's XID 79 at step 1 is still reported,
    and every step comes out as through the recorded backend."""
    case = GOLDEN / "nvml-gpu-lost"
    library = fake("nvml-gpu-lost", errors={("nvmlDeviceRegisterEvents", 0): 15})
    with installed(library):
        real = run_case(case, tmp_path / "real", RealPath(library.recording))
    assert real == run_case(case, tmp_path / "recorded")
    assert any("event=xid" in line and "xid_code=79i" in line for line in real[1])
    assert any("no XID events from GPU 0" in r.getMessage() for r in caplog.records)


def test_a_failing_event_wait_costs_the_events_of_that_cycle_only(tmp_path, caplog):
    library = fake("nvml-gpu-lost", errors={("nvmlEventSetWait_v2", None): 999})
    with installed(library):
        ctx = SourceContext("c", "n", sysfs=tmp_path, procfs=tmp_path)
        settings = {"backend_instance": RealPath(library.recording), "events": "poll"}
        source = sources.create("nvml", ctx, settings)
        first = source.collect(0)
        second = source.collect(1)  # the XID 79 event arrives in this tick, unseen
        library.errors.clear()
        third = source.collect(2)
        source.close()
    assert measurements(first)["gpu"] == 2 and measurements(second)["gpu"] == 1
    assert xids(second) == []
    assert xids(third) == [79]  # waiting again, the queued event is read
    assert sum("NVML event wait failed" in r.getMessage() for r in caplog.records) == 1


def test_the_event_thread_retries_after_a_failed_wait(tmp_path, monkeypatch):
    from gpuwarden.collector.sources.nvml import xids as nvml_source

    monkeypatch.setattr(nvml_source, "EVENT_RETRY_S", 0.01)
    library = fake("nvml-gpu-lost", errors={("nvmlEventSetWait_v2", None): 999})
    with installed(library):
        ctx = SourceContext("c", "n", sysfs=tmp_path, procfs=tmp_path)
        settings = {"backend_instance": RealPath(library.recording), "events": "thread"}
        source = sources.create("nvml", ctx, settings)
        source.collect(0)
        source.collect(1)  # the XID 79 event is now waiting in the driver
        library.errors.clear()
        seen = []
        for step in range(2, 500):  # the thread picks it up once its wait works again
            seen = xids(source.collect(step))
            if seen:
                break
            time.sleep(0.02)
        source.close()
    assert seen == [79]


def test_gpm_without_permission_is_skipped_and_leaks_no_driver_memory(tmp_path, caplog):
    """In a container without profiling permission NVML answers NO_PERMISSION for GPM: it is
    said once and not asked again, and no GPM sample (driver memory) is left allocated."""
    library = fake("nvml-h100-8gpu", errors={("nvmlGpmSampleGet", None): 4})
    with installed(library):
        cycles = collect(library, tmp_path, cycles=3)
    gpu = [p for p in cycles[-1] if p.measurement == "gpu"]
    assert len(gpu) == 8 and all("power_w" in p.fields for p in gpu)
    assert all(not any(k.startswith("gpm_") for k in p.fields) for p in gpu)
    assert library.allocated == set()
    assert library.calls["nvmlGpmSampleGet"] == 8  # once per GPU, then not asked again
    said = [r.getMessage() for r in caplog.records if "no permission" in r.getMessage()]
    assert len(said) == 1


def test_gpm_samples_are_freed_when_the_source_closes(tmp_path):
    library = fake("nvml-h100-8gpu")
    with installed(library):
        cycles = collect(library, tmp_path, cycles=3)
    assert any(k.startswith("gpm_") for k in cycles[-1][0].fields)
    assert library.allocated == set()


def test_recording_through_the_real_path_replays_the_same_and_is_never_called_real(
    tmp_path, monkeypatch
):
    """What a GPU session will run (python -m testbed.nvml.record), here with the real
    backend on the stand-in library: the new case replays to the lines of the one it was
    recorded from, and its provenance says CONSTRUCTED, not REAL."""
    import tomllib

    from testbed.nvml import record

    source = GOLDEN / "nvml-h100-8gpu"
    library = fake("nvml-h100-8gpu")
    monkeypatch.setattr(record, "make_backend", lambda: RealPath(library.recording))
    out = tmp_path / "case"
    with installed(library):
        assert record.main([str(out), "--steps", "2", "--interval-s", "0"]) == 0
    spec = tomllib.loads((out / "case.toml").read_text(encoding="utf-8"))
    assert spec["provenance"].startswith("CONSTRUCTED: recorded from 8x NVIDIA H100")
    (out / "proc.csv").write_bytes((source / "proc.csv").read_bytes())  # the jobs' /proc
    assert run_case(out, tmp_path / "replayed") == run_case(source, tmp_path / "original")


def test_the_recorder_needs_no_polars(tmp_path):
    """A GPU node's own Python has nvidia-ml-py but not polars: the recorder must import and
    start there. (Without a GPU it then stops at NVML's start, which is past the imports.)"""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['polars'] = None\n"
        "from testbed.nvml import record\n"
        f"raise SystemExit(record.main([{str(tmp_path / 'case')!r}, '--steps', '1']))\n"
    )
    root = Path(__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=root, capture_output=True, text=True
    )
    no_driver = done.returncode == 1 and "no recording: NVML did not initialise" in done.stderr
    assert no_driver or done.returncode == 0, done.stderr  # 0: run where a GPU is, it recorded
