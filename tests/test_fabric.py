"""The GPU's registration with the NVLink fabric (Fabric Manager), from NVML.

The answers are CONSTRUCTED (no NVSwitch system was at hand): the 8x H100 golden recording
(registered, every health bit answered "false"), the driver-reload case (GPU 1 still
registering), and the hand-written answers below; the real path runs pynvml's structs over
the stand-in library (testbed.nvml.fakelib), which leaves the padding after the one-byte
state dirty, as the C struct allows.
"""

from __future__ import annotations

import pytest

from gpuwarden.collector.sources.nvml.poll import Device, parse_gpu
from gpuwarden.core.finding import Finding
from tests.test_golden import GOLDEN, run_case
from tests.test_nvml_real_path import collect, fake, installed

FABRIC_FIELDS = (
    "fabric_state_code",
    "fabric_registered_active",
    "fabric_status_code",
    "fabric_health_mask_code",
    "fabric_degraded_bw_active",
    "fabric_route_recovery_active",
    "fabric_route_unhealthy_active",
    "fabric_access_timeout_recovery_active",
)


def fabric(answer) -> dict:
    fields, _ = parse_gpu(Device(0), {"fabric": answer})
    return fields


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # registered; the mask answers degraded bandwidth TRUE (01), route recovery not
        # supported (00: left out), route unhealthy FALSE (10), access timeouts FALSE (10)
        (
            [3, 0, 0b10_10_00_01],
            {
                "fabric_state_code": 3,
                "fabric_registered_active": True,
                "fabric_status_code": 0,
                "fabric_health_mask_code": 0b10100001,
                "fabric_degraded_bw_active": True,
                "fabric_route_unhealthy_active": False,
                "fabric_access_timeout_recovery_active": False,
            },
        ),
        # completed with an error (NVML_ERROR_UNKNOWN): not registered, the code kept
        (
            [3, 999, None],
            {"fabric_state_code": 3, "fabric_registered_active": False, "fabric_status_code": 999},
        ),
        # not started (Fabric Manager not running): the status means nothing yet
        ([1, 0, None], {"fabric_state_code": 1, "fabric_registered_active": False}),
        ([2, 7, None], {"fabric_state_code": 2, "fabric_registered_active": False}),
        # "not supported", out of range, or garbage: nothing, never a guess
        ([0, 0, 0], {}),
        ([9, 0, 0], {}),
        (["3", 0, 0], {}),
        ([], {}),
    ],
)
def test_fabric_answers_become_fields(answer, expected):
    assert fabric(answer) == expected


def test_a_gpu_outside_a_fabric_has_no_fabric_fields(tmp_path):
    """The A100 recording answers NOT_SUPPORTED (NVML documents the call for Hopper on)."""
    lines = [line for step in run_case(GOLDEN / "nvml-a100-8gpu", tmp_path) for line in step]
    assert lines and not any("fabric_" in line for line in lines)


def test_a_gpu_still_registering_after_a_driver_reload_is_not_usable(tmp_path):
    steps = run_case(GOLDEN / "nvml-driver-reload", tmp_path)
    last = [line for line in steps[2] if line.startswith("gpu,")]
    assert "fabric_registered_active=true" in last[0]
    assert "fabric_state_code=2i" in last[1] and "fabric_registered_active=false" in last[1]


def _gpu_fields(cycles) -> list[dict]:
    return [p.fields for p in cycles[-1] if p.measurement == "gpu"]


def test_a_driver_without_the_versioned_call_still_gives_the_registration(tmp_path):
    """Drivers before the versioned call (or that refuse the v2 struct) have only
    ``nvmlDeviceGetGpuFabricInfo``: the state and status, no health mask."""
    with installed(fake("nvml-h100-8gpu")) as library:
        full = _gpu_fields(collect(library, tmp_path))
    with installed(fake("nvml-h100-8gpu", missing={"nvmlDeviceGetGpuFabricInfoV"})) as library:
        older = _gpu_fields(collect(library, tmp_path))
    assert all(f["fabric_registered_active"] and f["fabric_health_mask_code"] == 170 for f in full)
    health = set(FABRIC_FIELDS[3:])  # the mask and what is decoded from it
    for f_full, f_old in zip(full, older, strict=True):
        assert f_old == {k: v for k, v in f_full.items() if k not in health}


def test_a_driver_with_no_fabric_call_reports_everything_else(tmp_path, caplog):
    caplog.set_level("WARNING", logger="gpuwarden.collector.sources.nvml")
    missing = {"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"}
    with installed(fake("nvml-h100-8gpu")) as library:
        full = _gpu_fields(collect(library, tmp_path))
    with installed(fake("nvml-h100-8gpu", missing=missing)) as library:
        older = _gpu_fields(collect(library, tmp_path))
    for f_full, f_old in zip(full, older, strict=True):
        assert f_old == {k: v for k, v in f_full.items() if k not in FABRIC_FIELDS}
    said = [r for r in caplog.records if "nvmlDeviceGetGpuFabricInfo" in r.getMessage()]
    assert len(said) == 1  # once, not per GPU and cycle


def test_the_alert_cordons_the_node_through_the_default_policy():
    """Grafana's rule fires per GPU; the remediation endpoint turns the firing alert into a
    ``fabric_unregistered`` finding, and the default policy stops new work on the node
    without touching what runs there."""
    from gpuwarden.dashboards.alerts import rules_file
    from gpuwarden.dashboards.config import load_config
    from gpuwarden.remediation.policy import DEFAULT_POLICIES, first_match, load_policies
    from gpuwarden.remediation.server import alert_finding

    rules = rules_file(load_config(environ={}))["groups"][0]["rules"]
    rule = next(r for r in rules if r["uid"] == "gw-fabric-unregistered")
    alert = {
        "status": "firing",
        "labels": rule["labels"] | {"alertname": rule["title"], "node": "gpu-17", "gpu": "3"},
        "startsAt": "2026-11-22T10:00:00Z",
        "values": {"B": 5, "C": 1},
    }
    finding = alert_finding(alert)
    assert finding.kind == "fabric_unregistered" and finding.subject["node"] == "gpu-17"
    policy = first_match(load_policies(DEFAULT_POLICIES), finding)
    assert policy is not None and policy.name == "nvlink-fabric-unregistered"
    assert [str(a) for a in policy.actions] == ["notify", "cordon"]


def test_a_gpu_left_out_of_the_fabric_is_a_finding_on_the_fast_path(tmp_path, caplog):
    """GPU 1 of the CONSTRUCTED driver-reload case is still registering at its last step: with
    a grace shorter than that, the agent raises one ``fabric_unregistered`` finding for it (the
    registered GPU 0 raises none); a longer grace raises nothing."""
    from gpuwarden.collector import sources
    from gpuwarden.collector.sources.base import SourceContext

    def findings(grace_s: float, cycles: int) -> list[Finding]:
        found: list[Finding] = []
        context = SourceContext("c", "n1", sysfs=tmp_path, procfs=tmp_path)
        context.emit_finding = found.append
        recording = str(GOLDEN / "nvml-driver-reload" / "nvml.json")
        settings = {"backend": "recorded", "recording": recording, "events": "poll",
                    "fabric_grace_s": grace_s}  # fmt: skip
        source = sources.create("nvml", context, settings)
        for step in range(cycles):  # the recording stays on its last tick after it
            source.collect(step * 10 * 10**9)
        source.close()
        return found

    found = findings(grace_s=15, cycles=6)  # unregistered from t=20 s: said at t=40 s, once
    assert [(f.kind, f.subject["gpu"], f.time_ns // 10**9) for f in found] == [
        ("fabric_unregistered", "1", 40)
    ]
    assert found[0].severity == "critical" and found[0].evidence["fabric_state_code"] == 2
    assert "nvidia-fabricmanager" in found[0].summary
    assert findings(grace_s=600, cycles=6) == []
