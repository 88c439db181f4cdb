"""Issue 37, item 5: dcgm-exporter's own dashboard reads a gpuwarden node, and the three names
the issue found missing are exported.

The names come from NVIDIA's dashboard JSON (``tests/data/dcgm_exporter_dashboard_metrics.txt``
says where and at which commit). The agent's points are the golden cases' expected line
protocol: REAL (one H200, ``nvml-real-h200``, which has GPM) and CONSTRUCTED kernel-log XIDs
(``xid-kmsg-job``). Before this change ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``,
``DCGM_FI_DEV_FB_FREE`` and ``DCGM_FI_DEV_XID_ERRORS`` were missing while the README said the
dashboards read a gpuwarden node unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.collector.agent import Agent
from gpuwarden.collector.metrics import agent_metrics
from gpuwarden.core.metrics import render
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.lineprotocol.strict import parse_lines
from tests.test_agent import ListSink
from tests.test_prometheus import parse

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "tests/data/dcgm_exporter_dashboard_metrics.txt"


def dashboard_names() -> set[str]:
    lines = DASHBOARD.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def golden(case: str, step: int, measurement: str) -> list[Point]:
    text = (ROOT / f"tests/golden/{case}/expected-{step}.lp").read_text()
    return [p for p in parse_lines(text, 0) if p.measurement == measurement]


class Replay:
    """A source that hands the agent fixed points, one list per cycle."""

    def __init__(self, name: str, cycles: list[list[Point]]) -> None:
        self.name, self.cycles = name, cycles

    def collect(self, now_ns: int) -> list[Point]:
        return self.cycles.pop(0) if self.cycles else []

    def close(self) -> None:
        pass


def scrape(agent: Agent) -> dict[str, list[tuple[dict[str, str], float]]]:
    body, _ = render(agent_metrics(agent, None, gpu=True))
    return parse(body)


def test_the_names_file_is_dcgm_exporters_dashboard() -> None:
    names = dashboard_names()
    assert len(names) == 6 and all(n.startswith("DCGM_FI_") for n in names)
    assert "d5e5f510a1b6b393f39a43293ccd9dc985defc79" in DASHBOARD.read_text()


def test_every_name_dcgm_exporters_dashboard_reads_is_exported() -> None:
    gpus = golden("nvml-real-h200", 1, "gpu")
    agent = Agent([Replay("nvml", [gpus]), Replay("xid", [[]])], ListSink(), cluster="c",
                  node="n")  # fmt: skip
    agent.collect(1)
    got = scrape(agent)
    assert dashboard_names() <= set(got), dashboard_names() - set(got)
    for name in dashboard_names():
        assert {labels["gpu"] for labels, _ in got[name]} == {p.tags["gpu"] for p in gpus}


def test_tensor_activity_free_memory_and_the_last_xid() -> None:
    gpus = golden("xid-kmsg-job", 1, "gpu")
    events = golden("xid-kmsg-job", 1, "gpu_event")
    xid_by_gpu = {e.tags["gpu"]: e.fields["xid_code"] for e in events}
    assert xid_by_gpu, "the case has XIDs"
    real = golden("nvml-real-h200", 1, "gpu")[0]
    agent = Agent([Replay("nvml", [gpus, gpus]), Replay("xid", [events, []])],
                  ListSink(), cluster="c", node="n")  # fmt: skip
    agent.collect(1)
    agent.collect(2)  # the XID was in the cycle before: it is remembered, as DCGM's gauge is
    got = scrape(agent)
    xids = {labels["gpu"]: v for labels, v in got["DCGM_FI_DEV_XID_ERRORS"]}
    assert {g: v for g, v in xids.items() if v} == {g: float(x) for g, x in xid_by_gpu.items()}
    assert set(xids) == {p.tags["gpu"] for p in gpus}
    f = gpus[0].fields
    free = {labels["gpu"]: v for labels, v in got["DCGM_FI_DEV_FB_FREE"]}
    total, used = float(f["mem_total_bytes"]), float(f["mem_used_bytes"])
    expected = (total - used - float(f.get("mem_reserved_bytes", 0))) / 2**20
    assert free[gpus[0].tags["gpu"]] == pytest.approx(expected)
    # GPM's tensor activity, a percentage in the catalogue, is DCGM's ratio
    agent2 = Agent([Replay("nvml", [[real]])], ListSink(), cluster="c", node="n")
    agent2.collect(1)
    ((_, ratio),) = scrape(agent2)["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    assert ratio == pytest.approx(float(real.fields["gpm_tensor_active_pct"]) / 100)


def test_no_xid_gauge_without_a_working_xid_source() -> None:
    """0 would claim that no XID happened; without the kernel log the agent cannot know."""
    gpus = golden("nvml-real-h200", 1, "gpu")
    agent = Agent([Replay("nvml", [gpus])], ListSink(), cluster="c", node="n")
    agent.collect(1)
    assert "DCGM_FI_DEV_XID_ERRORS" not in scrape(agent)
