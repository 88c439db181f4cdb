"""Seconds from a failure-risk finding to a drained node, and to the job running elsewhere.

A REAL local Slurm 22.05 (slurmctld + 4 slurmd on loopback, ``testbed/slurm.py``); a
stand-in job (SIMULATED work, real checkpoint protocol, ``testbed/jobs/sim_job.py``) lands on
gpu02; a SIMULATED failure-risk finding for its node goes through the engine (live, not dry-run):
notify → checkpoint (the job acknowledges) → drain → requeue. Per trial it prints

* ``checkpoint_s``: the checkpoint request acknowledged (the job saves at its next step);
* ``finding_to_drain_s``: the finding received → the node drained (the audit log's timing);
* ``finding_to_running_elsewhere_s``: → the requeued job RUNNING on another node (squeue).

The requeued job cannot start before Slurm's ``cred_expire`` (10 s in the local config; 120 s
by default) has passed since it was killed, which dominates the last number.

    uv run python benchmarks/remediation_latency.py [--trials 3]

The last line is ``finding_to_drain_s=<median>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.adapters.slurm import SlurmAdapter
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import Adapter, Outcome, Status
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from testbed.slurm import LocalSlurm


class Quiet:
    """Notifications go nowhere (no receiver in a benchmark)."""

    name = "webhook"
    actions = frozenset({"notify"})

    def describe(self, action: object) -> str:
        return "notify nobody"

    def perform(self, action: object) -> Outcome:
        return Outcome(Status.OK, "not sent (benchmark)")


def wait_for(check: Callable[[], object], timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError


def trial(slurm: LocalSlurm, root: Path, n: int) -> dict[str, float]:
    work = root / f"trial{n}"
    work.mkdir()
    script = work / "job.sh"
    script.write_text(
        f"#!/bin/bash\nexec {sys.executable} -m testbed.jobs.sim_job --state-dir {work}/state "
        f"--checkpoint-dir {work}/ckpt --step-s 0.1\n"
    )
    job = slurm.run("sbatch", "--parsable", "--requeue", "--exclusive", "-o", f"{work}/%j.out",
                    str(script)).strip()  # fmt: skip

    def where() -> list[str]:
        return slurm.run("squeue", "-h", "-j", job, "-o", "%T %N").split()

    wait_for(lambda: where()[:1] == ["RUNNING"], 60)
    node = where()[1]  # gpu02 (the lightest) on a fresh cluster; wherever Slurm put it after
    wait_for((work / "state" / "progress.log").exists, 60)
    adapter = SlurmAdapter(conf=str(slurm.conf), checkpoint_dir=str(work / "ckpt"))
    audit = AuditLog(work / "audit.jsonl")
    adapters: dict[str, Adapter] = {"slurm": adapter, "webhook": Quiet()}  # type: ignore[dict-item]
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        adapters,
        audit,
        EngineSettings(dry_run=False, max_nodes_out=2, max_fraction_out=0.5, cooldown_s=0),
    )
    finding = Finding(
        kind="failure_risk",
        subject={"cluster": "bench", "node": node, "gpu": "0"},
        severity=Severity.WARNING,
        time_ns=time.time_ns(),
        probability=0.95,
        summary=f"trial {n}: SIMULATED 95% risk on {node}",
        source="benchmark",
    )
    t0 = time.monotonic()
    engine.submit(finding)
    running = wait_for(lambda: (w := where()) and w[0] == "RUNNING" and w[1] != node, 180)
    engine.wait(60)
    engine.close()
    actions = {r["action"]: r for r in read_records(audit.path) if r["event"] == "action"}
    if any(actions[a]["outcome"] != "ok" for a in ("checkpoint", "drain", "requeue")):
        raise RuntimeError(f"trial {n} did not go through: {actions}")
    slurm.run("scancel", job)
    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    wait_for(lambda: "idle" in slurm.run("sinfo", "-h", "-n", node, "-o", "%T"), 60)
    return {
        "checkpoint_s": float(actions["checkpoint"]["duration_s"]),
        "finding_to_drain_s": float(actions["drain"]["since_finding_s"]),
        "finding_to_running_elsewhere_s": running - t0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with LocalSlurm(root / "slurm", weights={"gpu02": 1, "gpu01": 5}) as slurm:
            results = []
            for n in range(args.trials):
                r = trial(slurm, root, n)
                print(" ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
                results.append(r)
    for key in ("checkpoint_s", "finding_to_running_elsewhere_s"):
        print(f"median {key}={statistics.median(r[key] for r in results):.3f}")
    print(f"finding_to_drain_s={statistics.median(r['finding_to_drain_s'] for r in results):.3f}")


if __name__ == "__main__":
    main()
