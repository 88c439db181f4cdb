"""The agent's node_healthy finding: said once per healthy stretch, never while a GPU is
missing, and a critical event starts the stretch again. NVML answers are the CONSTRUCTED
recordings in tests/golden; the kernel log is the REAL one from ../shared/data."""

from __future__ import annotations

import shutil
import threading

import pytest

from gpuwarden.collector import cli as agent_cli
from gpuwarden.collector.config import ConfigError, load_config
from gpuwarden.collector.health import HealthGate
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point
from tests.test_agent import GOLDEN, H100, ListSink, write_config

S = 1_000_000_000


def gpus(n: int) -> list[Point]:
    return [Point("gpu", {"gpu": str(i)}, {"power_w": 1.0}, 0) for i in range(n)]


def fatal(t: int) -> Finding:
    return Finding("gpu_xid", {"node": "n1"}, Severity.CRITICAL, t, source="agent")


def test_announced_once_after_a_healthy_stretch() -> None:
    said: list[Finding] = []
    gate = HealthGate("c", "n1", said.append, healthy_after_s=60, expected_gpus=8)
    for t in range(0, 200, 10):
        gate.cycle(t * S, gpus(8))
    assert [f.time_ns // S for f in said] == [60]
    f = said[0]
    assert (f.kind, f.severity, dict(f.subject)) == (
        "node_healthy",
        Severity.INFO,
        {"cluster": "c", "node": "n1"},
    )
    assert f.evidence == {"healthy_for_s": 60, "gpus": 8}


def test_a_critical_event_starts_the_stretch_again() -> None:
    said: list[Finding] = []
    gate = HealthGate("c", "n1", said.append, healthy_after_s=60)
    gate.cycle(0, gpus(8))
    gate.cycle(50 * S, gpus(8))
    gate.observe(fatal(-3600 * S))  # an old kernel-log record read back at start counts now
    gate.observe(Finding("gpu_slow", {"node": "n1"}, Severity.WARNING, 55 * S))  # not critical
    for t in range(60, 200, 10):
        gate.cycle(t * S, gpus(8))
    assert [f.time_ns // S for f in said] == [120]  # 60 s after the first cycle past the event
    gate.observe(fatal(130 * S))
    for t in range(200, 300, 10):
        gate.cycle(t * S, gpus(8))
    assert [f.time_ns // S for f in said] == [120, 260]
    # two stretches, two findings: the engine must not drop the second as a duplicate of the
    # first (they are 140 s apart, inside a default 300 s id bucket)
    assert said[0].id != said[1].id


def test_never_healthy_while_a_gpu_is_missing() -> None:
    said: list[Finding] = []
    gate = HealthGate("c", "n1", said.append, healthy_after_s=60, expected_gpus=8)
    for t in range(0, 250, 10):
        gate.cycle(t * S, gpus(7))  # a GPU off the bus: no critical event, just missing
    for t in range(250, 310, 10):
        gate.cycle(t * S, gpus(8))  # back after a reset: the stretch starts now
    assert said == []
    gate.cycle(310 * S, gpus(8))
    assert [f.time_ns // S for f in said] == [310]


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("fabric_registered_active", False),
        ("remapped_rows_pending_active", True),
        ("remapped_rows_failure_active", True),
        ("retired_pages_pending_active", True),
    ],
)
def test_never_healthy_while_a_gpu_waits_for_a_repair(field: str, bad: bool) -> None:
    """A node taken out for a GPU left out of the NVLink fabric, or with a remap pending a
    reset, is not offered back while that lasts, though no critical event comes."""
    said: list[Finding] = []
    gate = HealthGate("c", "n1", said.append, healthy_after_s=60, expected_gpus=8)
    for t in range(0, 250, 10):
        points = gpus(8)
        points[3] = Point("gpu", {"gpu": "3"}, {field: bad}, 0)
        gate.cycle(t * S, points)
    assert said == []
    for t in range(250, 320, 10):
        points = gpus(8)
        points[3] = Point("gpu", {"gpu": "3"}, {field: not bad}, 0)  # repaired
        gate.cycle(t * S, points)
    assert [f.time_ns // S for f in said] == [310]


@pytest.mark.parametrize("bad", [{"healthy_after_s": 0}, {"expected_gpus": -1}])
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HealthGate("c", "n1", print, **bad)  # type: ignore[arg-type]


def _run_agent(tmp_path, recording, cycles: int) -> set[str]:
    cfg = write_config(tmp_path, sources=["nvml", "xid"])
    text = cfg.read_text().replace(str(H100), str(recording))
    text += "\n[health]\nhealthy_after_s = 0.2\nexpected_gpus = 8\n"
    cfg.write_text(text)
    sink = ListSink()
    agent, _ = agent_cli.build_agent(load_config(cfg, environ={}), sink)
    agent.run(threading.Event(), max_cycles=cycles)
    return {p.tags["kind"] for b in sink.batches for p in b if p.measurement == "finding"}


def test_the_agent_says_a_healthy_node_is_healthy(tmp_path) -> None:
    # The REAL kernel log's fatal XIDs are read back on the first cycle, then 8 GPUs report.
    assert "node_healthy" in _run_agent(tmp_path, H100, cycles=12)


def test_the_agent_never_says_a_node_that_lost_a_gpu_is_healthy(tmp_path) -> None:
    kinds = _run_agent(tmp_path, GOLDEN / "nvml-gpu-lost" / "nvml.json", cycles=12)
    assert "gpu_lost" in kinds and "node_healthy" not in kinds


def test_a_probe_that_cannot_run_keeps_the_node_out(tmp_path) -> None:
    """The agent's own check before ``node_healthy`` fails closed, as ``gpuwarden check``
    does: a probe in ``[health] check_probes`` that cannot run (the HCAs gone from sysfs) is
    a failure unless ``[check] optional`` lists it. Before: ``unavailable`` passed, and a
    node whose InfiniBand ports had vanished was handed back to the engine as checked (an
    InfiniBand site takes infiniband out of the default optional list, as here)."""
    cfg = write_config(tmp_path, sources=["nvml", "xid"])
    cfg.write_text(cfg.read_text() + '\n[health]\nhealthy_after_s = 0.2\nexpected_gpus = 8\n'
                   'check_probes = ["infiniband", "disk"]\n')  # fmt: skip
    plain = cfg.read_text()
    cfg.write_text(plain + '\n[check]\noptional = ["dcgm"]\n')
    shutil.rmtree(tmp_path / "sys" / "class" / "infiniband")
    sink = ListSink()
    agent, _ = agent_cli.build_agent(load_config(cfg, environ={}), sink)
    agent.run(threading.Event(), max_cycles=12)
    findings = [p for b in sink.batches for p in b if p.measurement == "finding"]
    kinds = {p.tags["kind"] for p in findings}
    assert "node_check_failed" in kinds and "node_healthy" not in kinds, kinds
    # listed as optional (the default), the same node is healthy again
    cfg.write_text(plain)
    sink = ListSink()
    agent, _ = agent_cli.build_agent(load_config(cfg, environ={}), sink)
    agent.run(threading.Event(), max_cycles=12)
    kinds = {p.tags["kind"] for b in sink.batches for p in b if p.measurement == "finding"}
    assert "node_healthy" in kinds, kinds


def test_the_default_gate_passes_a_node_without_infiniband(tmp_path) -> None:
    """infiniband is optional by default: with the gate strict, a default that required it
    failed every node without an HCA (a cloud VM, GKE) as critical, and the engine's
    node-check-failed policy drained them (the review)."""
    cfg = write_config(tmp_path, sources=["nvml", "xid"])
    cfg.write_text(cfg.read_text() + "\n[health]\nhealthy_after_s = 0.2\nexpected_gpus = 8\n")
    shutil.rmtree(tmp_path / "sys" / "class" / "infiniband")
    sink = ListSink()
    agent, _ = agent_cli.build_agent(load_config(cfg, environ={}), sink)
    agent.run(threading.Event(), max_cycles=12)
    kinds = {p.tags["kind"] for b in sink.batches for p in b if p.measurement == "finding"}
    assert "node_healthy" in kinds and "node_check_failed" not in kinds, kinds


def test_negative_health_settings_are_a_configuration_error(tmp_path) -> None:
    cfg = write_config(tmp_path, sources=["nvml"])
    cfg.write_text(cfg.read_text() + "\n[health]\nhealthy_after_s = -1.0\n")
    with pytest.raises(ConfigError, match="healthy_after_s"):
        agent_cli.build_agent(load_config(cfg, environ={}), ListSink())


def test_reannounced_while_healthy_when_asked_and_not_otherwise() -> None:
    """``reannounce_s``: the node is said healthy again every ``reannounce_s`` while it stays
    healthy (a node the engine holds out on a prediction needs a check newer than the hold's
    end, and nothing else may run one); a critical event still starts the stretch again."""
    said: list[Finding] = []
    gate = HealthGate("c", "n1", said.append, healthy_after_s=60, reannounce_s=120)
    for t in range(0, 400, 10):
        gate.cycle(t * S, gpus(8))
    assert [f.time_ns // S for f in said] == [60, 180, 300]
    assert len({f.id for f in said}) == 3  # each its own finding, none a duplicate
    gate.observe(fatal(400 * S))
    for t in range(400, 500, 10):
        gate.cycle(t * S, gpus(8))
    assert [f.time_ns // S for f in said] == [60, 180, 300, 460]
    once: list[Finding] = []
    gate = HealthGate("c", "n1", once.append, healthy_after_s=60)
    for t in range(0, 400, 10):
        gate.cycle(t * S, gpus(8))
    assert [f.time_ns // S for f in once] == [60]
    with pytest.raises(ValueError, match="reannounce_s"):
        HealthGate("c", "n1", print, healthy_after_s=60, reannounce_s=30)
