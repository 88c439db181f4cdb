"""Training side of gpuwarden's checkpoint-request protocol: "checkpoint now, a node may fail".

Dependency-free, a sibling of :mod:`collector.jobside.reporter`; the protocol itself (names,
JSON shapes) is :mod:`core.checkpoint`, which the engine's adapters import too. The remediation
engine asks in one of three ways, and this hook hears all of them:

* **a signal** (Slurm: ``scancel --full -s USR1 <job>``): sets a flag, nothing else happens in
  the signal handler;
* **a request file** ``<directory>/<job>.request`` (shared storage; Slurm and anything else);
* **a rendezvous-store key** ``<prefix>/request`` (PyTorch elastic: the engine sets it in the
  job's ``TCPStore``; pass the store, or anything with ``check``/``get``/``set``).

A request is JSON: ``{"request_id": ..., "reason": ..., "time": ...}``. After saving, the
training loop acknowledges with the step it saved, to the file ``<directory>/<job>.ack`` or the
store key ``<prefix>/ack/<request_id>``; the engine waits for that before draining the node.

Checkpointing is collective: every rank must save at the same step. Ranks can see a request
at different steps, so agree first, e.g. with ``torch.distributed.all_reduce(flag, MAX)``::

    hook = CheckpointRequests(directory="/shared/gpuwarden", store=store)
    for step in range(start, steps):
        train_step()
        flag = torch.tensor([1 if hook.pending() else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            save_checkpoint(step)
            hook.acknowledge(step)          # rank 0 only is enough; idempotent
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from types import FrameType

from gpuwarden.core.checkpoint import (
    PREFIX,
    Store,
    ack,
    ack_key,
    ack_path,
    interval_ack_key,
    interval_ack_path,
    interval_key,
    interval_path,
    read_ack,
    read_json,
    request_key,
    request_path,
    write_json_atomic,
)


class CheckpointRequests:
    def __init__(
        self,
        *,
        job: str | None = None,
        directory: str | Path | None = None,
        store: Store | None = None,
        prefix: str = PREFIX,
        signals: tuple[int, ...] = (signal.SIGUSR1,),
    ) -> None:
        self.job = job or os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
        self.directory = Path(directory) if directory else None
        if self.directory is not None and self.job:
            try:  # the job names its files: a name that cannot be one turns the files off
                request_path(self.directory, self.job)
            except ValueError as exc:
                logging.getLogger(__name__).warning(
                    "checkpoint requests by file are off for this job: %s", exc
                )
                self.directory = None
        self.store = store
        self.prefix = prefix
        self.done: set[str] = set()
        self.intervals_done: set[str] = set()
        self._signalled = False
        for signum in signals:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = True

    def _file_request(self) -> str | None:
        if self.directory is None or not self.job:
            return None
        data = read_json(request_path(self.directory, self.job))
        rid = str(data.get("request_id", "")) if data is not None else ""
        if rid and read_ack(ack_path(self.directory, self.job), rid) is not None:
            return None  # acknowledged before (by this process, or before a restart)
        return rid or None

    def _store_request(self) -> str | None:
        key = request_key(self.prefix)
        if self.store is None or not self.store.check([key]):
            return None
        try:
            data = json.loads(self.store.get(key))
        except ValueError:
            return None
        rid = str(data.get("request_id", "")) if isinstance(data, dict) else ""
        if rid and self.store.check([ack_key(rid, self.prefix)]):
            return None
        return rid or None

    def pending(self) -> str | None:
        """The id of a request not yet acknowledged (``"signal"`` for a bare signal), or None."""
        for rid in (self._store_request(), self._file_request()):
            if rid and rid not in self.done:
                return rid
        return "signal" if self._signalled else None

    def acknowledge(self, step: int, request_id: str | None = None) -> None:
        """Tell the engine the checkpoint of ``step`` is saved (answers every open request)."""
        open_ids = {r for r in (self._store_request(), self._file_request()) if r}
        if request_id:
            open_ids.add(request_id)
        saved = ack(step, self.job)
        for rid in open_ids - self.done:
            if self.store is not None:
                self.store.set(ack_key(rid, self.prefix), json.dumps(saved | {"request_id": rid}))
            if self.directory is not None and self.job:
                write_json_atomic(ack_path(self.directory, self.job), saved | {"request_id": rid})
            self.done.add(rid)
        self._signalled = False

    # -- interval requests ----------------------------------------------------------------

    def _interval_requests(self) -> list[dict[str, object]]:
        found: list[dict[str, object]] = []
        if self.store is not None and self.store.check([interval_key(self.prefix)]):
            try:
                data = json.loads(self.store.get(interval_key(self.prefix)))
            except ValueError:
                data = None
            if isinstance(data, dict):
                found.append(data)
        if self.directory is not None and self.job:
            data = read_json(interval_path(self.directory, self.job))
            if data is not None:
                found.append(data)
        return found

    def interval_request(self) -> tuple[str, float] | None:
        """``(request_id, interval_s)`` of an interval request not yet applied, or None. A
        request whose ``interval_s`` is not a positive number is ignored (and never applied)."""
        for data in self._interval_requests():
            rid = str(data.get("request_id", ""))
            value = data.get("interval_s")
            if not rid or rid in self.intervals_done:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                self.intervals_done.add(rid)
                continue
            return rid, float(value)
        return None

    def interval_applied(self, request_id: str, interval_s: float) -> None:
        """Tell the engine the job now checkpoints every ``interval_s`` seconds."""
        answer = {"request_id": request_id, "interval_s": float(interval_s), "job": self.job}
        if self.store is not None:
            self.store.set(interval_ack_key(request_id, self.prefix), json.dumps(answer))
        if self.directory is not None and self.job:
            write_json_atomic(interval_ack_path(self.directory, self.job), answer)
        self.intervals_done.add(request_id)
