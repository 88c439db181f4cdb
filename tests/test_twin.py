"""The twin cluster's hardware (simulation/twin): a SIMULATED scenario played in real time onto
nodes that the real agent reads through its production code.

The agent is built as ``gpuwarden agent`` builds it, from a configuration that points it at
one node's files (``[nvml] backend = "recorded"``, ``follow = true``; its sysfs; its kernel
log). The job process here is a real process (``sleep``) whose environment names a Slurm job;
the agent finds its job through the real ``/proc``, as it would a training rank's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.live import twin_scenario
from gpuwarden.collector.cli import build_agent
from gpuwarden.collector.config import load_config
from gpuwarden.collector.nvml.recorded import FORMAT, RecordedBackend
from gpuwarden.core.finding import Finding
from gpuwarden.core.store.lineprotocol import encode_points
from gpuwarden.simulation.twin.hardware import Twin, bind
from tests.remediation_util import poll

SCENARIO = twin_scenario(
    "twin-test",
    60,
    [{"type": "xid79", "at_s": 4, "duration_s": 6, "node": 1, "gpu": 5}],
    nodes=2,
    hcas=2,
    links=2,
)


class Findings:
    def __init__(self) -> None:
        self.points: list = []
        self.found: list[Finding] = []

    def write_points(self, points) -> None:
        self.points += list(points)

    def close(self, timeout_s: float = 10.0) -> bool:
        return True


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[Twin]:
    t = Twin(SCENARIO, 1, tmp_path)
    t.start()
    yield t
    t.stop()


def agent_for(twin: Twin, node: str, tmp: Path):
    p = twin.paths(node)
    config = tmp / f"{node}.toml"
    config.write_text(
        f'[agent]\ncluster = "twin"\nnode = "{node}"\nsysfs = "{p.sysfs}"\nkmsg = "{p.kmsg}"\n'
        f'[nvml]\nbackend = "recorded"\nrecording = "{p.nvml}"\nfollow = true\n'
        f'events = "poll"\njobmap_dir = "{tmp}/jobs"\npod_resources_socket = ""\n'
        f"[xid]\nfollow_s = 0.0\n[health]\nhealthy_after_s = 0.0\n"
    )
    sink = Findings()
    agent, _ = build_agent(load_config(config), sink)
    return agent, sink


@pytest.fixture
def rank() -> Iterator[subprocess.Popen]:
    """A real process that a Slurm job's rank would be (its environment names the job)."""
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_PROCID": "8", "SLURM_LOCALID": "0"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    yield proc
    proc.kill()
    proc.wait()


def test_the_agent_reads_a_twin_node_through_its_own_code(twin, rank, tmp_path) -> None:
    # node-000: the scenario's fault is on node-001 at 4 s, which a loaded machine's slow
    # start could reach before the collect below (the GPU then gone, the rank killed)
    bind(twin.paths("node-000").gpu_procs, rank.pid, list(range(8)))
    bound_at = twin.tick  # a loaded machine may start the rank after the twin's first ticks
    agent, _ = agent_for(twin, "node-000", tmp_path)
    poll(lambda: twin.tick >= max(1, bound_at + 2), 20, "two of the twin's ticks after the bind")
    lines = encode_points(agent.collect(time.time_ns()))
    agent.close()
    measurement = [line.split(",", 1)[0] for line in lines]
    assert measurement.count("gpu") == 8 and measurement.count("gpu_nvlink") == 16
    assert measurement.count("ib_port") == 2 and measurement.count("gpu_process") == 8
    gpus = [line for line in lines if line.startswith("gpu,")]
    assert all("job=77" in line and "rank=8" in line for line in gpus)  # the real /proc
    sources = [line for line in lines if "collect_success_active" in line]
    assert len(sources) == 6  # nvml, xid, infiniband, power, thermal, host
    assert all("collect_success_active=true" in line for line in sources), sources


def test_a_fatal_fault_writes_its_xid_loses_the_gpu_and_kills_what_runs_there(
    twin, rank, tmp_path
) -> None:
    bind(twin.paths("node-001").gpu_procs, rank.pid, list(range(8)))
    agent, _ = agent_for(twin, "node-001", tmp_path)
    poll(lambda: rank.poll() is not None, 30, "the fault to kill the bound process")
    assert rank.returncode == -9  # SIGKILL, as a GPU off the bus ends its CUDA processes
    kmsg = twin.paths("node-001").kmsg.read_text()
    # the driver's wording (GPU 5), and nothing of the scenario's own (issue 40)
    assert "NVRM: Xid (PCI:0000:68:00): 79, pid=" in kmsg and "GPU has fallen off the bus." in kmsg
    what = [(h.node, h.what) for h in twin.log]
    assert ("node-001", "xid") in what and ("node-001", "kill") in what
    xid_at = next(h.t for h in twin.log if h.what == "xid")
    kill_at = next(h.t for h in twin.log if h.what == "kill")
    assert xid_at <= kill_at  # the XID is logged before the process dies
    lines = encode_points(agent.collect(time.time_ns()))
    agent.close()
    events = [line for line in lines if line.startswith("gpu_event,")]
    assert any("event=xid" in e and "xid_code=79i" in e for e in events)
    assert any("event=gpu_lost" in e and "gpu=5" in e for e in events)
    assert sum(line.startswith("gpu,") for line in lines) == 7  # GPU 5 answers nothing now
    assert not any(h.node == "node-000" for h in twin.log if h.what == "kill")
    # no string of the scenario's fault list reaches what the agent writes to InfluxDB or
    # posts to the engine: the ground truth is the twin's alone (before: "SIMULATED xid79")
    secrets = {f.type.lower() for f in SCENARIO.faults} | {"simulated"}
    secrets |= {f"f{i:04d}-{f.type}".lower() for i, f in enumerate(SCENARIO.faults)}  # fault ids
    said = "\n".join(lines).lower() + kmsg.lower()
    assert not [s for s in secrets if s in said], secrets


def test_a_followed_recording_delivers_each_event_once(tmp_path) -> None:
    """Ticks carry ids; a rewrite that keeps earlier ticks' events does not repeat them, and a
    cycle between writes misses none. A file that cannot be read keeps the last state."""
    path = tmp_path / "nvml.json"

    def write(ticks: list[dict]) -> None:
        doc = {"format": FORMAT, "provenance": "simulated", "ticks": ticks}
        tmp = tmp_path / ".tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)
        time.sleep(0.01)  # a new mtime

    count = {"-|nvmlDeviceGetCount|[]": {"v": 1}}
    write([{"id": 0, "answers": count}])
    b = RecordedBackend(path, follow=True)
    b.init()
    b.begin_cycle()
    assert b.call(None, "nvmlDeviceGetCount") == 1
    write([{"id": 1, "answers": {}, "events": [[0, 8, 79]]}, {"id": 2, "answers": count}])
    b.begin_cycle()
    write([{"id": 1, "answers": {}, "events": [[0, 8, 79]]}, {"id": 3, "answers": count,
          "events": [[0, 8, 48]]}])  # fmt: skip
    b.begin_cycle()
    events = []
    while (e := b.call(None, "nvmlEventSetWait", 0)) is not None:
        events.append(e)
    assert events == [[0, 8, 79], [0, 8, 48]]
    path.write_text("{not json")
    b.begin_cycle()
    assert b.call(None, "nvmlDeviceGetCount") == 1


def test_a_generated_trace_carries_the_drivers_words_not_the_fault_names() -> None:
    """The replay path's gpu_event points (what ``gpuwarden replay`` writes to InfluxDB) say
    what the driver says; before, their message ended "simulated xid79" (issue 40)."""
    from gpuwarden.simulation.generator import ScenarioGenerator

    gen = ScenarioGenerator(SCENARIO, 1)
    secrets = {f.type.lower() for f in gen.faults} | {f.fault_id.lower() for f in gen.faults}
    messages = []
    for chunk in gen.chunks():
        events = chunk.get("gpu_event")
        if events is not None and "message" in events.columns:
            messages += [str(m) for m in events["message"].to_list()]
    assert any("GPU has fallen off the bus." in m for m in messages), messages
    text = "\n".join(messages).lower()
    assert not [s for s in secrets | {"simulated"} if s in text]
