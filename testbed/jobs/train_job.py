"""A tiny REAL data-parallel training job (PyTorch, gloo, CPU) for the live loop, run by Slurm.

One process per node (``srun``): each trains the same small MLP on its own SIMULATED batches
and all-reduces its gradients every step; a step is paced to ``GW_STEP_S`` (1 s). It does
what a production job does with gpuwarden:

* reports each step, and a heartbeat, through its node's agent (the job-side reporter; the
  relay's address in ``GPUWARDEN_REPORTER_URL``);
* checkpoints with a real :func:`torch.save` every ``GW_CKPT_EVERY_S`` seconds, and at once
  when the engine asks through the checkpoint hook (request files in ``GW_REQUEST_DIR``);
  every rank agrees first (an all-reduce of the flags), rank 0 writes and reports how long the
  save held training up (``Reporter.checkpoint``: analytics advises the interval from it);
* checkpoints at a new interval when asked (``<job>.interval`` request files, answered once
  applied; rank 0 alone decides when a save is due, so it alone applies it);
* with ``GW_CKPT_ASYNC=1``, saves on its cadence in the background
  (:class:`collector.jobside.background_save.BackgroundSave`): training waits only for the copy
  of the state, and the ``save`` line is written once the checkpoint is on disk; a save the
  engine asked for is made durable before it is acknowledged. ``GW_CKPT_WRITE_DELAY_S`` adds
  that many seconds to every write (SIMULATED slow shared storage: this job's checkpoint is
  a few hundred kB);
* starts from the newest checkpoint in ``GW_CKPT_DIR`` (after a requeue: the last save);
* dies when its process on a broken GPU is killed, or, on the other ranks, when the
  all-reduce finds that peer gone: srun then ends the step and the batch script exits 42,
  which Slurm's ``RequeueExit`` requeues, as a production setup would.

Rank 0 appends one JSON line per event to ``GW_STEPLOG`` (``start``, ``step``, ``save``,
``interval``, ``done``) with the wall-clock time: the job's own log, from which work lost is read.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpuwarden.collector.jobside.background_save import BackgroundSave
from gpuwarden.collector.jobside.checkpoint_hook import CheckpointRequests
from gpuwarden.collector.jobside.reporter import Reporter

BATCH, WIDTH = 64, 128


class StepLog:
    """The job's own log, one JSON object a line; only rank 0 writes it."""

    def __init__(self, path: str, rank: int) -> None:
        self.path = Path(path) if path and rank == 0 else None

    def write(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": event, "t": time.time(), **fields})
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def newest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("ckpt-*.pt"))
    return found[-1] if found else None


def state_of(step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"step": step, "model": model.state_dict(), "opt": opt.state_dict()}


def snapshot(step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """A copy of the state that the next optimizer steps cannot change (a background save)."""
    return copy.deepcopy(state_of(step, model, opt))


def save(directory: Path, saved: dict[str, Any], delay_s: float = 0.0) -> None:
    """Write then rename: a requeue never finds half a checkpoint. The last three are kept."""
    if delay_s > 0:
        time.sleep(delay_s)  # SIMULATED slow storage (GW_CKPT_WRITE_DELAY_S)
    directory.mkdir(parents=True, exist_ok=True)
    step = int(saved["step"])
    tmp = directory / f".ckpt-{step:08d}.pt.tmp"
    torch.save(saved, tmp)
    tmp.replace(directory / f"ckpt-{step:08d}.pt")
    for old in sorted(directory.glob("ckpt-*.pt"))[:-3]:
        old.unlink(missing_ok=True)


def main() -> None:
    env = os.environ
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    step_s = float(env.get("GW_STEP_S", "1.0"))
    ckpt_dir = Path(env["GW_CKPT_DIR"])
    every_s = float(env.get("GW_CKPT_EVERY_S", "60"))
    delay_s = float(env.get("GW_CKPT_WRITE_DELAY_S", "0"))
    saver = BackgroundSave() if env.get("GW_CKPT_ASYNC", "0") == "1" else None
    total = int(env.get("GW_STEPS", "100000"))
    log = StepLog(env.get("GW_STEPLOG", ""), rank)
    hook = CheckpointRequests(directory=env["GW_REQUEST_DIR"])
    rep = Reporter(rank=rank, flush_interval_s=1.0, heartbeat_s=5.0)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    latest = newest_checkpoint(ckpt_dir)
    if latest is not None:
        state = torch.load(latest, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
    log.write(
        "start",
        job=env.get("SLURM_JOB_ID", ""),
        restart=int(env.get("SLURM_RESTART_COUNT", "0")),
        resume_step=start,
        checkpoint=latest.name if latest else "",
        nodes=env.get("SLURM_JOB_NODELIST", ""),
        world=world,
    )
    rep.model(params=sum(p.numel() for p in model.parameters()), layers=2, hidden_size=WIDTH,
              heads=1, seq_len=1, world_size=world, dtype="fp32")  # fmt: skip
    torch.manual_seed(1000 + rank)
    saved_at = time.monotonic()
    for step in range(start + 1, total + 1):
        t0 = time.monotonic()
        with rep.timed_step(step, tokens=BATCH * WIDTH, samples=BATCH):
            x = torch.randn(BATCH, WIDTH)
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)  # a dead peer ends this (and the job) here
                p.grad /= world
            opt.step()
            time.sleep(max(0.0, step_s - (time.monotonic() - t0)))
        log.write("step", step=step, loss=round(float(loss.detach()), 4))
        asked = hook.pending() is not None
        if rank == 0 and (change := hook.interval_request()) is not None:
            every_s = change[1]  # rank 0 alone decides when a save is due
            hook.interval_applied(*change)
            log.write("interval", every_s=every_s, request=change[0])
        due = rank == 0 and time.monotonic() - saved_at >= every_s
        flags = torch.tensor([int(asked), int(due)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # every rank saves at the same step
        if flags.any():
            if rank == 0:
                why = "request" if flags[0] else "cadence"
                t_save = time.monotonic()
                if saver is not None and not flags[0]:  # behind training; logged when durable

                    def write(saved: dict[str, Any], why: str = why) -> None:
                        save(ckpt_dir, saved, delay_s)
                        log.write("save", step=int(saved["step"]), why=why, background=True)

                    held_s = saver.save(step, functools.partial(snapshot, step, model, opt), write)
                else:  # the engine waits for this one: durable before the acknowledgement
                    if saver is not None:
                        saver.wait()
                    save(ckpt_dir, state_of(step, model, opt), delay_s)
                    held_s = time.monotonic() - t_save
                    log.write("save", step=step, why=why)
                rep.checkpoint(step, held_s, every_s)
            dist.barrier()
            hook.acknowledge(step)
            saved_at = time.monotonic()
    if saver is not None:
        saver.wait()
    log.write("done", step=total)
    rep.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
