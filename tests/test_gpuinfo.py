"""The ``gpu_info`` point: serial, VBIOS, driver and the GPU's modes, asked at start and every
``info_every_s``. The NVML answers are the CONSTRUCTED golden recordings (serials and VBIOS
versions made up in nvidia-smi's shapes) and the hand-written answers below."""

from __future__ import annotations

import pytest

from gpuwarden.collector import sources
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.nvml.info import parse_info
from tests.test_golden import GOLDEN
from tests.test_nvml_real_path import collect, fake, installed

S = 10**9


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {
                "serial": "1650124014249",
                "vbios": "96.00.99.00.01",
                "persistence": 1,
                "ecc_mode": [1, 0],
                "mig_mode": [0, 1],
            },
            {
                "serial": "1650124014249",
                "vbios_version": "96.00.99.00.01",
                "driver_version": "550.90.07",
                "persistence_mode_active": True,
                "ecc_mode_active": True,
                "ecc_mode_pending_active": False,  # ECC goes off at the next reset
                "mig_mode_active": False,
                "mig_mode_pending_active": True,
            },
        ),
        # not supported (None), blank, out of range or the wrong shape: left out
        (
            {"serial": None, "vbios": "  ", "persistence": 2, "ecc_mode": [1], "mig_mode": None},
            {"driver_version": "550.90.07"},
        ),
        (
            {"serial": 12345, "ecc_mode": "on", "mig_mode": [0, "x"]},
            {"driver_version": "550.90.07", "mig_mode_active": False},
        ),
    ],
)
def test_info_answers_become_fields(raw, expected):
    assert parse_info(raw, "550.90.07") == expected


def _info_points(tmp_path, every_s: float, cycles: int) -> list[int]:
    context = SourceContext("c", "n1", sysfs=tmp_path, procfs=tmp_path)
    recording = str(GOLDEN / "nvml-h100-8gpu" / "nvml.json")
    settings = {"backend": "recorded", "recording": recording, "events": "poll",
                "info_every_s": every_s}  # fmt: skip
    source = sources.create("nvml", context, settings)
    try:
        points = [p for step in range(cycles) for p in source.collect(step * 10 * S)]
    finally:
        source.close()
    return [p.time_ns // S for p in points if p.measurement == "gpu_info"]


def test_asked_at_start_and_every_info_every_s(tmp_path):
    assert _info_points(tmp_path, every_s=30, cycles=7) == [0] * 8 + [30] * 8 + [60] * 8
    assert _info_points(tmp_path, every_s=600, cycles=7) == [0] * 8


def test_a_driver_that_answers_none_of_it_costs_only_the_info(tmp_path):
    """An old driver without these functions: no gpu_info at all, every other field kept."""
    missing = {
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetMigMode",
        "nvmlSystemGetDriverVersion",
    }
    with installed(fake("nvml-h100-8gpu")) as library:
        full = collect(library, tmp_path)
    with installed(fake("nvml-h100-8gpu", missing=missing)) as library:
        older = collect(library, tmp_path)
    infos = [p for p in full[0] if p.measurement == "gpu_info"]
    assert len(infos) == 8 and all(p.fields["serial"].startswith("16501240") for p in infos)
    assert [p for p in full[0] if p.measurement != "gpu_info"] == older[0]
    assert not [p for p in older[0] if p.measurement == "gpu_info"]


def test_text_that_is_not_utf8_does_not_fail_the_call():
    """A serial or VBIOS string from an EEPROM holding garbage: replaced, not an exception
    that would fail the whole NVML source."""
    from gpuwarden.collector.nvml.real import _plain

    assert _plain(b"16501\xff\xfe24") == "16501\ufffd\ufffd24"
    assert _plain([b"\xc3", 1]) == ["\ufffd", 1]


def test_a_call_that_raises_something_unexpected_costs_only_its_answer(tmp_path, caplog):
    """Not an NVML error but an exception from the binding (say a struct it cannot decode) on
    one GPU's call: that field is left out, every other field and GPU is kept, said once."""
    from gpuwarden.collector.nvml.recorded import RecordedBackend

    class Surprising(RecordedBackend):
        def call(self, device, name, *args):
            if name == "nvmlDeviceGetPowerUsage" and device == 2:
                raise ValueError("cannot decode the answer")
            return super().call(device, name, *args)

    caplog.set_level("WARNING", logger="gpuwarden.collector.sources.nvml")
    context = SourceContext("c", "n1", sysfs=tmp_path, procfs=tmp_path)
    backend = Surprising(GOLDEN / "nvml-h100-8gpu" / "nvml.json")
    source = sources.create("nvml", context, {"backend_instance": backend, "events": "poll"})
    cycles = [source.collect(step * 10 * S) for step in range(2)]
    source.close()
    for points in cycles:
        gpus = {p.tags["gpu"]: p.fields for p in points if p.measurement == "gpu"}
        assert len(gpus) == 8 and "power_w" not in gpus["2"]
        assert all("power_w" in f for g, f in gpus.items() if g != "2")
        assert "gpu_temp_c" in gpus["2"]
    said = [r for r in caplog.records if "raised ValueError" in r.getMessage()]
    assert len(said) == 1 and source.errors == 2
