"""How the live loop's training job is launched under Slurm: a batch script and a task script.

The batch script is what a user submits: one task per node (``srun``), ended as a whole when
any task fails (``--kill-on-bad-exit``), and an exit code of 42 on failure, which the
cluster's ``RequeueExit=42`` requeues by itself (what a production setup does so a crashed
job comes back from its last checkpoint without a person).

The task script runs on each node. On a twin node it first binds the task to the node's
simulated GPUs (its pid in the node's ``gpu-procs/``: what opening the devices does on a real
node, the file format of :func:`simulation.twin.hardware.bind`), and points the job-side
reporter at that node's agent (its relay's address, from a ``node url`` table); then it
``exec``s Python, so the bound pid is the training process itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: the exit code the batch script gives on failure, and slurm.conf's RequeueExit
REQUEUE_EXIT = 42


def task_script(path: Path, *, twin_root: Path, relays: Path, gpus: int) -> Path:
    bound = ",".join(str(g) for g in range(gpus))
    path.write_text(
        "#!/bin/bash\n"
        "# one training task on its node (SIMULATED GPUs: bound through the twin's files)\n"
        "set -e\n"
        f'procs="{twin_root}/nodes/$SLURMD_NODENAME/gpu-procs"\n'
        'mkdir -p "$procs"\n'
        f'echo "{bound}" > "$procs/.$$" && mv "$procs/.$$" "$procs/$$"\n'
        f"export GPUWARDEN_REPORTER_URL=$(awk -v n=\"$SLURMD_NODENAME\" '$1 == n {{print $2}}' "
        f'"{relays}")\n'
        "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID\n"
        f"exec {sys.executable} -m testbed.jobs.train_job\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def batch_script(path: Path, *, task: Path) -> Path:
    path.write_text(
        "#!/bin/bash\n"
        "# the user's job: one task per node; a failed run exits 42 (RequeueExit=42 requeues it)\n"
        "export MASTER_ADDR=127.0.0.1\n"
        f'export MASTER_PORT=$({sys.executable} -c "import socket; s = socket.socket(); '
        "s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])\")\n"
        f'srun --kill-on-bad-exit=1 --ntasks-per-node=1 "{task}"\n'
        "rc=$?\n"
        f"[ $rc -eq 0 ] || exit {REQUEUE_EXIT}\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path
