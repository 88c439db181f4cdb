"""Hardware that lies: readings no sensor can mean are left out, counted and said once.

NVML answers are the CONSTRUCTED 8x H100 recording with GPU 3's power register read as all
ones (SIMULATED); the sysfs tree is CONSTRUCTED with a thermal zone at the kernel's
THERMAL_TEMP_INVALID (-274 °C). The golden case ``sysfs-garbage`` shows the same through the
sources' line protocol.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.collector import sources
from gpuwarden.collector.agent import Agent
from gpuwarden.collector.nvml.recorded import RecordedBackend
from gpuwarden.collector.plausible import Screen
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.nvml.poll import PLAIN_CALLS, Device, parse_gpu
from gpuwarden.core.catalogue import CATALOGUE, Kind, Producer
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.lineprotocol.strict import parse_lines
from testbed.sysfstree import build_node_tree
from tests.test_agent import ListSink
from tests.test_golden import CASES, GOLDEN

H100 = GOLDEN / "nvml-h100-8gpu" / "nvml.json"


class AllOnesPower(RecordedBackend):
    def call(self, device: int | None, name: str, *args: Any) -> Any:
        if name == "nvmlDeviceGetPowerUsage" and device == 3:
            return 0xFFFFFFFF  # milliwatts: 4.3 MW
        return super().call(device, name, *args)


def test_the_agent_leaves_out_what_cannot_be_true_and_keeps_the_rest(tmp_path, caplog):
    build_node_tree(tmp_path / "sys")
    zone = tmp_path / "sys" / "class" / "thermal" / "thermal_zone0" / "temp"
    zone.write_text("-274000\n")
    ctx = SourceContext("t", "node-a", sysfs=tmp_path / "sys", procfs=tmp_path / "proc")
    nvml = sources.create(
        "nvml", ctx, {"backend_instance": AllOnesPower(H100, loop=True), "events": "off"}
    )
    thermal = sources.create("thermal", ctx, {"hwmon": False})
    sink = ListSink()
    agent = Agent([nvml, thermal], sink, cluster="t", node="node-a", interval_s=1.0)
    with caplog.at_level(logging.WARNING):
        cycles = [agent.collect(10**18 + i) for i in range(3)]
    agent.close()
    gpu3 = [p for p in cycles[-1] if p.measurement == "gpu" and p.tags["gpu"] == "3"]
    assert len(gpu3) == 1 and "power_w" not in gpu3[0].fields
    assert float(gpu3[0].fields["gpu_temp_c"]) > 0  # the rest of GPU 3 is written
    gpu2 = next(p for p in cycles[-1] if p.measurement == "gpu" and p.tags["gpu"] == "2")
    assert 0 < float(gpu2.fields["power_w"]) < 1000
    zones = {p.tags["zone"]: p.fields for p in cycles[-1] if p.measurement == "thermal"}
    assert (
        "temp_c" not in zones["thermal_zone0"] and float(zones["thermal_zone0"]["crit_temp_c"]) > 0
    )
    assert float(zones["thermal_zone1"]["temp_c"]) > 0
    own = {p.tags["source"]: p.fields for p in cycles[-1] if p.measurement == "agent"}
    assert own["nvml"]["implausible_total"] == 3 and own["thermal"]["implausible_total"] == 3
    said = [r.getMessage() for r in caplog.records if "physical range" in r.getMessage()]
    assert len(said) == 2  # once per field, not per cycle
    assert any("gpu.power_w = 4294967.295" in s and "gpu=3" in s for s in said)


def test_every_hardware_gauge_with_a_physical_unit_has_a_range():
    units = {"%", "°C", "W", "MHz", "B", "B/s"}
    hardware = {"gpu", "gpu_nvlink", "gpu_process", "ib_port", "host_power", "thermal"}
    missing = [
        f"{m.name}.{f.name}"
        for m in CATALOGUE.values()
        if m.producer is Producer.AGENT and m.name in hardware
        for f in m.fields.values()
        if f.kind is Kind.GAUGE and f.unit in units and f.valid is None
    ]
    assert missing == [] or missing == ["thermal.crit_temp_c"], missing


def test_the_ranges_keep_every_golden_reading():
    """The ranges are wide: no reading in any golden case, real or constructed, falls outside
    one except the two the sysfs-garbage case puts there on purpose."""
    screen = Screen()
    dropped = []
    for case in CASES:
        for expected in sorted((GOLDEN / case).glob("expected-*.lp")):
            for line in expected.read_text().splitlines():
                dropped += [(case, line) for _ in range(check_line(screen, line))]
    assert dropped == []


def check_line(screen: Screen, line: str) -> int:
    return screen(parse_lines(line, 0))


def test_nan_and_the_edges():
    screen = Screen()
    points = [
        Point("gpu", {"gpu": "0"}, {"gpu_util_pct": 100.0, "gpu_temp_c": math.nan}, 1),
        Point("gpu", {"gpu": "1"}, {"gpu_util_pct": 0.0, "power_w": -0.5}, 1),
        Point("thermal", {"zone": "z"}, {"temp_c": -41.0}, 1),
        Point("sink", {}, {"spool_bytes": 2**60}, 1),  # not hardware: not screened
    ]
    assert screen(points) == 3
    assert [p.fields for p in points] == [
        {"gpu_util_pct": 100.0},
        {"gpu_util_pct": 0.0},
        {"spool_bytes": 2**60},
    ]


_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=4)
)
_answer = st.one_of(
    _scalar, st.lists(_scalar, max_size=4), st.lists(st.lists(_scalar, max_size=3), max_size=3)
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from([*(c[0] for c in PLAIN_CALLS), "gpm"]), _answer))
def test_nvml_answers_of_any_shape_parse_to_fields_or_nothing(raw: dict[str, Any]) -> None:
    """A binding or a recording answering in a shape no driver gives: the parse leaves the
    field out; it never raises (numbers, lists too short or too long, None, text)."""
    fields, _ = parse_gpu(Device(0), raw)
    assert all(isinstance(v, int | float | bool) for v in fields.values())


def test_a_gpu_whose_field_batch_is_garbage_costs_only_that_gpu(tmp_path, caplog) -> None:
    """The field-value batch of GPU 4 answered with entries of the wrong shape (SIMULATED on
    the CONSTRUCTED recording): GPU 4's point is left out, said once; the other seven stay."""

    class Garbled(RecordedBackend):
        def call(self, device: int | None, name: str, *args: Any) -> Any:
            answer = super().call(device, name, *args)
            if name == "nvmlDeviceGetFieldValues" and device == 4 and len(answer) > 1:
                return [None] * len(answer)
            return answer

    caplog.set_level(logging.WARNING, logger="gpuwarden.collector.sources.nvml")
    context = SourceContext("c", "n", sysfs=tmp_path, procfs=tmp_path)
    backend = Garbled(GOLDEN / "nvml-h100-8gpu" / "nvml.json")
    source = sources.create("nvml", context, {"backend_instance": backend, "events": "poll"})
    cycles = [source.collect(step * 10**10) for step in range(2)]
    source.close()
    for points in cycles:
        assert sorted(p.tags["gpu"] for p in points if p.measurement == "gpu") == [
            "0", "1", "2", "3", "5", "6", "7"
        ]  # fmt: skip
    said = [r for r in caplog.records if "GPU 4 have a shape" in r.getMessage()]
    assert len(said) == 1
