"""Hot spares on a REAL Slurm (slurmctld + 4 slurmd on loopback): the engine holds an idle node
out of the general pool, puts it back just before it requeues a job off a node whose GPU fell
off the bus, and refills the pool when the repaired node returns. The cluster is kept busy (a
filler job on the one other node), so without the spare the requeued job would wait in the
queue. The job is the stand-in (SIMULATED work); the XID finding is CONSTRUCTED."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.adapters.slurm import SPARE_REASON, SlurmAdapter
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from testbed.slurm import LocalSlurm, slurm_available
from tests.remediation_util import RecordingAdapter, poll

pytestmark = pytest.mark.skipif(not slurm_available(), reason="scripts/bootstrap.sh installs Slurm")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    # the job lands on the lightest nodes: gpu01 and gpu02
    weights = {"gpu01": 1, "gpu02": 2, "gpu03": 3, "gpu04": 4}
    with LocalSlurm(tmp_path_factory.mktemp("slurm-spares"), weights=weights) as s:
        yield s


def xid(node: str) -> Finding:
    return Finding(
        kind="gpu_xid",
        subject={"cluster": "test", "node": node, "gpu": "3"},
        severity=Severity.CRITICAL,
        time_ns=1_790_000_000_000_000_000,
        evidence={"xid": 79},
        confidence=1.0,
        summary=f"XID 79 on {node} GPU 3: fallen off the bus (CONSTRUCTED)",
        source="agent",
    )


def test_a_requeued_job_starts_on_a_hot_spare_and_the_pool_refills(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    adapter = SlurmAdapter(conf=str(slurm.conf), checkpoint_dir=str(tmp_path / "ckpt"))
    settings = EngineSettings(
        dry_run=False, spares=1, max_nodes_out=1, max_fraction_out=1.0, approval=()
    )
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": adapter, "webhook": RecordingAdapter("webhook")},
        AuditLog(tmp_path / "audit.jsonl"),
        settings,
    )
    # the pool: the last idle node in Slurm's order
    assert engine.spares.refill() == ["gpu04"]
    assert adapter.inventory().spares == {"gpu04"}
    assert SPARE_REASON in slurm.run("sinfo", "-h", "-R", "-n", "gpu04", "-o", "%E")
    assert engine.spares.refill() == []  # full

    job = slurm.sbatch(tmp_path, "train", 2,
                 f"exec {sys.executable} -m testbed.jobs.sim_job --state-dir {tmp_path}/state "
                 f"--checkpoint-dir {tmp_path}/ckpt --step-s 0.1")  # fmt: skip
    filler = slurm.sbatch(tmp_path, "filler", 1, "sleep 600")
    poll(lambda: slurm.where(job) == ("RUNNING", "gpu[01-02]"), 30, "the job on gpu01-02")
    poll(lambda: slurm.where(filler) == ("RUNNING", "gpu03"), 30, "the filler on gpu03")

    # gpu02's GPU falls off the bus: drain it, put the spare back, requeue (max_nodes_out=1
    # and the spare is out already: a spare does not count against the limit)
    decision = engine.submit(xid("gpu02"))
    assert decision.verdict == "act", decision.why
    assert engine.wait(60)
    moved = poll(lambda: (w := slurm.where(job))[0] == "RUNNING" and w[1] != "gpu[01-02]" and w,
                 60, "the job running again")  # fmt: skip
    assert moved == ("RUNNING", "gpu[01,04]")  # on the spare, not queued behind the filler
    spare_events = [
        (r["op"], r["node"], r.get("for_node", ""), r["outcome"])
        for r in read_records(tmp_path / "audit.jsonl")
        if r.get("event") == "spare"
    ]
    assert spare_events == [("hold", "gpu04", "", "ok"), ("release", "gpu04", "gpu02", "ok")]
    actions = [
        (r["action"], r["outcome"])
        for r in read_records(tmp_path / "audit.jsonl")
        if r.get("event") == "action"
    ]
    assert actions == [("notify", "ok"), ("drain", "ok"), ("requeue", "ok")]

    # gpu02 repaired: back in service, and the pool refills from the idle nodes (gpu02 now)
    healthy = Finding(kind="node_healthy", subject={"cluster": "test", "node": "gpu02"},
                      severity=Severity.INFO, time_ns=1_790_000_100_000_000_000,
                      evidence={"check": "pass", "checked_ns": time.time_ns()})  # fmt: skip
    assert engine.submit(healthy).verdict == "act"
    assert engine.wait(30)
    poll(lambda: "gpu02" in adapter.inventory().idle, 30, "gpu02 idle again")
    engine.tick()
    assert adapter.inventory().spares == {"gpu02"}
    engine.close()
    slurm.run("scancel", job, filler)
