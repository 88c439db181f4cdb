"""The metric catalogue's own rules: names carry units, tags are declared, types are checked."""

from __future__ import annotations

import re

import pytest

from gpuwarden.core.catalogue import CATALOGUE, TAGS, FieldType, Kind, check_point, measurement
from gpuwarden.core.finding import Finding, FindingError, Severity

SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
# A field name ends in its unit or says what kind of number it is.
UNIT_SUFFIXES = (
    "_w",
    "_j",
    "_c",
    "_mhz",
    "_bytes",
    "_pct",
    "_ratio",
    "_s",
    "_gbps",
    "_per_s",
    "_total",
    "_count",
    "_code",
    "_active",
    "_tokens",
    "_index",
    "_per_token",
    "_per_step",
)
TEXT_FIELDS = {
    "message",
    "key",
    "detail",
    "resolution",
    "summary",
    "evidence_json",
    "finding_id",
    "fault_id",
    "action_id",
    "model_version",
    "gpu_model",
    "pci_bus_id",
    "serial",
    "vbios_version",
    "driver_version",
    "cause",
    "pid",
    "flops_assumption",
}


def test_names_are_snake_case_and_carry_units():
    for m in CATALOGUE.values():
        assert SNAKE.match(m.name), m.name
        for f in m.fields.values():
            assert SNAKE.match(f.name), f"{m.name}.{f.name}"
            assert f.name.endswith(UNIT_SUFFIXES) or f.name in TEXT_FIELDS, f"{m.name}.{f.name}"
            assert f.description, f"{m.name}.{f.name} needs a description"


def test_counters_are_totals_and_totals_are_counters():
    for m in CATALOGUE.values():
        for f in m.fields.values():
            assert (f.kind is Kind.COUNTER) == f.name.endswith("_total"), f"{m.name}.{f.name}"
            if f.name.endswith("_active"):
                assert f.type is FieldType.BOOLEAN


def test_tags_declared_and_never_clash_with_fields():
    for m in CATALOGUE.values():
        for t in m.tags:
            assert t in TAGS, f"{m.name}: tag {t!r} is not described in TAGS"
            assert t not in m.fields, f"{m.name}: {t!r} is both a tag and a field"


def test_the_agent_and_analytics_measurements_exist():
    for name in (
        "gpu",
        "gpu_event",
        "ib_port",
        "host_power",
        "thermal",
        "job_step",
        "agent",
        "sink",
        "finding",
        "mfu",
        "straggler",
        "congestion",
        "failure_risk",
        "remediation_action",
    ):
        assert name in CATALOGUE
    assert measurement("ib_port").field("port_xmit_data_bytes_total").unit == "B"


def test_check_point_finds_undeclared_and_mistyped():
    assert check_point("gpu", {"node": "n"}, {"power_w": 1.0}) == []
    problems = check_point("gpu", {"nodename": "n"}, {"power_w": 1, "watts": 2.0})
    assert any("nodename" in p for p in problems)
    assert any("power_w: declared float, written as integer" in p for p in problems)
    assert any("'watts' is not declared" in p for p in problems)
    assert check_point("nope", {}, {}) == ["measurement 'nope' is not in the catalogue"]


def test_finding_fits_the_catalogue_and_has_a_stable_id():
    f = Finding(
        "failure_risk",
        {"cluster": "c", "node": "gpu02"},
        Severity.CRITICAL,
        time_ns=10**18,
        probability=0.93,
        evidence={"ecc_sbe_rate": 12.5},
    )
    tags, fields = f.to_point()
    assert check_point("finding", tags, fields) == []
    again = Finding.from_json(f.to_json())
    assert again.id == f.id
    later = Finding(
        "failure_risk",
        {"cluster": "c", "node": "gpu02"},
        Severity.CRITICAL,
        time_ns=10**18 + 10**9,
        probability=0.95,
    )
    assert later.id == f.id  # same observation, same 5-minute bucket: de-duplicated
    with pytest.raises(FindingError, match="probability"):
        Finding("x", {"node": "n"}, Severity.INFO, 0, probability=1.5)
    with pytest.raises(FindingError, match="does not match"):
        Finding.from_json({**f.to_json(), "id": "forged"})
