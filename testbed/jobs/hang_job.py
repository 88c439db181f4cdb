"""A tiny REAL data-parallel training job (torchrun, gloo, CPU) that hangs on purpose.

Each rank trains a linear model on SIMULATED data, all-reduces its gradients inside
:meth:`Reporter.timed_step` and reports every step to InfluxDB. At step ``GW_HANG_AT`` rank
``GW_HANG_RANK`` stops between steps (as a rank stuck in data loading would) and sleeps; the
other ranks enter the next step and block in its all-reduce, waiting for it. The reporters'
threads keep beating meanwhile, which is what ``tests/test_hangs.py`` checks analytics sees.

Placement is SIMULATED: rank r reports itself on node ``host-<r>`` (all run on this machine).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from gpuwarden.collector.jobside.reporter import Reporter


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    hang_rank, hang_at = int(os.environ["GW_HANG_RANK"]), int(os.environ["GW_HANG_AT"])
    rep = Reporter(
        os.environ["GW_JOB"],
        rank,
        url=os.environ["GW_INFLUX_URL"],
        database=os.environ["GW_INFLUX_DB"],
        cluster="test",
        node=f"host-{rank}",
        flush_interval_s=0.1,
        heartbeat_s=0.5,
    )
    torch.manual_seed(rank)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10_000):
        if rank == hang_rank and step == hang_at + 1:
            time.sleep(3600)  # stuck between steps; the test kills the job long before
        with rep.timed_step(step, tokens=32 * 16, samples=32):
            x = torch.randn(32, 16)
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)  # the others wait here for the stuck rank
                p.grad /= world
            opt.step()
        time.sleep(0.02)


if __name__ == "__main__":
    main()
