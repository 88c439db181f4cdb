"""Helpers for tests that run a REAL PyTorch job under torchrun (gloo, CPU, one host)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def torchrun_argv(module: str, port: int, ranks: int = 2) -> list[str]:
    """``torchrun`` on this host: ``ranks`` processes of ``python -m module``, rendezvous on
    ``127.0.0.1:port``."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc-per-node={ranks}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        "-m", module,
    ]  # fmt: skip


def step_events(log: Path) -> list[dict]:
    """The job's own log (``GW_STEPLOG``: one JSON object a line), so far."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
