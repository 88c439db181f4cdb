"""A stand-in training job for Slurm: SIMULATED work (it sleeps), the REAL checkpoint protocol.

Run as a Slurm batch job (``exec python -m testbed.jobs.sim_job ...`` so the signal reaches
Python, not a shell that would die of it). Each step appends ``job node step restarts`` to
``<state_dir>/progress.log``; when gpuwarden asks (:class:`collector.jobside.checkpoint_hook.
CheckpointRequests`), it saves ``<state_dir>/<job>.ckpt`` (the next step to run) and
acknowledges. Started again (a requeue), it resumes from its checkpoint, so the log shows
which steps a remediation lost and which it saved. Used by the tests, the latency benchmark and
the demo.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

from gpuwarden.collector.jobside.checkpoint_hook import CheckpointRequests
from gpuwarden.core.checkpoint import write_json_atomic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--checkpoint-dir", required=True, help="where gpuwarden's requests arrive")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--step-s", type=float, default=0.2)
    args = p.parse_args(argv)

    job = os.environ.get("SLURM_JOB_ID", "local")
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    ckpt = state / f"{job}.ckpt"
    start = json.loads(ckpt.read_text())["next_step"] if ckpt.exists() else 0
    hook = CheckpointRequests(job=job, directory=args.checkpoint_dir)
    with (state / "progress.log").open("a", encoding="utf-8", buffering=1) as log:
        log.write(f"{job} {node} start {start} {restarts}\n")
        for step in range(start, args.steps):
            time.sleep(args.step_s)
            log.write(f"{job} {node} {step} {restarts}\n")
            if hook.pending():
                write_json_atomic(ckpt, {"next_step": step + 1, "node": node})
                hook.acknowledge(step)
                log.write(f"{job} {node} checkpoint {step} {restarts}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
