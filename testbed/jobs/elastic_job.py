"""A tiny real PyTorch DDP job for torchrun (gloo, CPU) that speaks the checkpoint protocol.

Its data are SIMULATED (random tensors from a fixed seed); the distributed training, the
elastic restarts and the checkpoint-request protocol are real. Each step rank 0 appends
``step world node restart`` to ``<state_dir>/progress.log``; every rank agrees, with one
``all_reduce``, whether gpuwarden asked for a checkpoint; if so rank 0 saves
``<state_dir>/ckpt.pt`` and acknowledges in the store. A (re)started group resumes from
that checkpoint. ``GPUWARDEN_NODE`` names the simulated node an agent runs on;
``GPUWARDEN_STORE`` (host:port) is the store gpuwarden writes requests to.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gpuwarden.collector.jobside.checkpoint_hook import CheckpointRequests


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--step-s", type=float, default=0.1)
    args = p.parse_args(argv)

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ.get("GPUWARDEN_NODE", "local")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    host, _, port = os.environ.get("GPUWARDEN_STORE", "127.0.0.1:29400").rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
    hook = CheckpointRequests(store=store, signals=())

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = Path(args.state_dir)
    ckpt = state / "ckpt.pt"
    start = 0
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = int(saved["step"]) + 1
    log = (state / "progress.log").open("a", buffering=1) if rank == 0 else None
    if log:
        log.write(f"start {start} {world} {node} {restart}\n")
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(start, args.steps):
        x = torch.randn(32, 16, generator=gen)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_s)
        if log:
            log.write(f"{step} {world} {node} {restart}\n")
        flag = torch.tensor([1 if hook.pending() else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            if rank == 0:
                tmp = ckpt.with_suffix(".tmp")
                torch.save(
                    {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp
                )
                tmp.replace(ckpt)
            dist.barrier()
            if rank == 0:
                hook.acknowledge(step)
                if log:
                    log.write(f"checkpoint {step} {world} {node} {restart}\n")
            else:
                hook.done.update(r for r in [hook.pending()] if r)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
