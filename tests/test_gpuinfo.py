"""The ``gpu_info`` point: serial, VBIOS, driver and the GPU's modes, asked at start and every
``info_every_s``. The NVML answers are the CONSTRUCTED golden recordings (serials and VBIOS
versions made up in nvidia-smi's shapes) and the hand-written answers below."""

from __future__ import annotations

import pytest

from collector import sources
from collector.sources.base import SourceContext
from collector.sources.gpuinfo import parse_info
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
