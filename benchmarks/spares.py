"""Seconds from a fatal XID finding to the job running elsewhere, with a hot spare and without,
on a busy cluster.

A REAL local Slurm 22.05 (slurmctld + 4 slurmd on loopback, ``testbed/slurm.py``); a 2-node
stand-in job (SIMULATED work) on gpu01-02; the rest of the cluster busy with filler jobs that
end ``--filler-s`` after they start (other people's work). A CONSTRUCTED XID 79 finding for
gpu02 goes through the live engine: notify, drain, requeue.

* **with a spare** (``[engine] spares = 1``): gpu04 is held out of the pool before the job
  starts (one filler on gpu03); the engine puts it back just before the requeue;
* **without** (``spares = 0``): fillers on gpu03 and gpu04; the requeued job waits in the
  queue until one of them ends.

Both include Slurm's ``cred_expire`` (10 s in the local config, 120 s by default), which
holds a requeued job before it may start again. Without a spare, the wait is whatever the
queue takes to free a node: here the filler's remaining time, on a real cluster the queue's.

    uv run python -m benchmarks.spares [--filler-s 90]

Last line: ``finding_to_running_with_spare_s=<x>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.remediation_latency import Quiet, wait_for
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.adapters.slurm import SlurmAdapter
from gpuwarden.remediation.audit import AuditLog
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import Adapter
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from testbed.slurm import LocalSlurm

WEIGHTS = {"gpu01": 1, "gpu02": 2, "gpu03": 3, "gpu04": 4}


def trial(root: Path, spares: int, filler_s: float) -> float:
    with LocalSlurm(root / "slurm", weights=WEIGHTS) as slurm:
        adapter = SlurmAdapter(conf=str(slurm.conf), checkpoint_dir=str(root / "ckpt"))
        settings = EngineSettings(dry_run=False, spares=spares, max_nodes_out=2,
                                  max_fraction_out=1.0, approval=())  # fmt: skip
        adapters: dict[str, Adapter] = {"slurm": adapter, "webhook": Quiet()}  # type: ignore[dict-item]
        engine = Engine(
            load_policies(DEFAULT_POLICIES), adapters, AuditLog(root / "audit.jsonl"), settings
        )
        engine.tick()  # holds the spare, if any
        job = slurm.sbatch(root, "train", 2,
                     f"exec {sys.executable} -m testbed.jobs.sim_job --state-dir {root}/state "
                     f"--checkpoint-dir {root}/ckpt --step-s 0.1")  # fmt: skip
        fillers = [slurm.sbatch(root, f"filler{i}", 1, f"sleep {filler_s}")
                   for i in range(2 - spares)]  # fmt: skip
        wait_for(lambda: slurm.where(job) == ("RUNNING", "gpu[01-02]"), 60)
        for f in fillers:
            wait_for(lambda f=f: slurm.where(f)[0] == "RUNNING", 60)  # type: ignore[misc]
        finding = Finding(
            kind="gpu_xid",
            subject={"cluster": "bench", "node": "gpu02", "gpu": "3"},
            severity=Severity.CRITICAL,
            time_ns=time.time_ns(),
            evidence={"xid": 79},
            confidence=1.0,
            summary="XID 79 on gpu02 (CONSTRUCTED)",
            source="agent",
        )
        t0 = time.monotonic()
        engine.submit(finding)
        ran = wait_for(
            lambda: (w := slurm.where(job))[0] == "RUNNING" and w[1] != "gpu[01-02]",
            filler_s + 120,
        )
        engine.close()
        slurm.run("scancel", job, *fillers)
        return ran - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--filler-s", type=float, default=90.0)
    args = ap.parse_args(argv)
    results = {}
    for spares in (1, 0):
        with tempfile.TemporaryDirectory() as tmp:
            results[spares] = trial(Path(tmp), spares, args.filler_s)
        label = "with a hot spare" if spares else "without (busy cluster)"
        print(f"{label:<24} finding -> running elsewhere {results[spares]:6.1f} s", flush=True)
    print(f"finding_to_running_without_spare_s={results[0]:.1f}")
    print(f"finding_to_running_with_spare_s={results[1]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
