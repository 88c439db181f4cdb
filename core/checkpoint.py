"""The checkpoint-request protocol: how the engine asks a running job to checkpoint, and how
the job answers. One contract, imported by both sides: the job-side hook
(:mod:`collector.jobside.checkpoint_hook`) and the engine's adapters (Slurm, PyTorch elastic).
Standard library only: a training job imports it.

Three ways to ask, one way to answer each:

* **a request file** ``<directory>/<job>.request`` on storage both sides see, answered by
  ``<directory>/<job>.ack`` (Slurm, and anything else with a shared filesystem);
* **a rendezvous-store key** ``<prefix>/request`` in the job's ``TCPStore``, answered by the
  key ``<prefix>/ack/<request_id>`` (PyTorch elastic);
* **a signal** (Slurm: ``scancel --full -s USR1 <job>``), answered through the file, if any.

A job can also be asked to change its checkpoint *interval* (``analyze``'s checkpoint advice):
the file ``<directory>/<job>.interval`` or the key ``<prefix>/interval`` holds
``{"request_id", "interval_s", "reason", "time"}``; the job answers ``<job>.interval.ack`` or
``<prefix>/interval/ack/<request_id>`` with ``{"request_id", "interval_s", "time"}`` once it
checkpoints at the new interval. A job whose hook predates this never answers: the engine
then only notifies.

A request is JSON ``{"request_id", "reason", "time"}`` (a file request also names its
``job``); an acknowledgement is ``{"step", "time", "job", "request_id"}``, ``step`` being the
step whose checkpoint is saved. Files are written whole (write, then rename), so a reader never
sees half of one.

Job names become file names only through :func:`core.names.path_inside`: a job that is not a
name without ``/`` (``../../outside/planted``, ``ns/pod``) is refused with
:class:`core.names.BadNameError`, and :func:`write_json_atomic` never follows a link (its
temporary file is created ``O_EXCL|O_NOFOLLOW`` under a random name; the rename replaces a link
at the target rather than writing through it).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Protocol

from gpuwarden.core.names import JobName, path_inside

PREFIX = "gpuwarden/checkpoint"


class Store(Protocol):
    """The subset of ``torch.distributed.Store`` the protocol uses."""

    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def set(self, key: str, value: str) -> None: ...


def request_path(directory: str | Path, job: str) -> Path:
    return path_inside(directory, JobName(job), ".request")


def ack_path(directory: str | Path, job: str) -> Path:
    return path_inside(directory, JobName(job), ".ack")


def request_key(prefix: str = PREFIX) -> str:
    return f"{prefix}/request"


def ack_key(request_id: str, prefix: str = PREFIX) -> str:
    return f"{prefix}/ack/{request_id}"


def interval_path(directory: str | Path, job: str) -> Path:
    return path_inside(directory, JobName(job), ".interval")


def interval_ack_path(directory: str | Path, job: str) -> Path:
    return path_inside(directory, JobName(job), ".interval.ack")


def interval_key(prefix: str = PREFIX) -> str:
    return f"{prefix}/interval"


def interval_ack_key(request_id: str, prefix: str = PREFIX) -> str:
    return f"{prefix}/interval/ack/{request_id}"


def interval_request(
    request_id: str, interval_s: float, reason: str, t: float | None = None
) -> dict[str, Any]:
    """An interval request's JSON object; ``interval_s`` must be a positive number."""
    if not interval_s > 0:
        raise ValueError(f"a checkpoint interval must be > 0 s, not {interval_s!r}")
    return {
        "request_id": request_id,
        "interval_s": float(interval_s),
        "reason": reason,
        "time": time.time() if t is None else t,
    }


def request(request_id: str, reason: str, t: float | None = None) -> dict[str, Any]:
    """A checkpoint request's JSON object."""
    return {"request_id": request_id, "reason": reason, "time": time.time() if t is None else t}


def ack(step: int, job: str | None, t: float | None = None) -> dict[str, Any]:
    """An acknowledgement's JSON object, without its ``request_id`` (added per request)."""
    return {"step": int(step), "time": time.time() if t is None else t, "job": job}


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write then rename, so a reader never sees half a file; never through a link.

    The temporary file gets a random name in the same folder and is created with
    ``O_CREAT|O_EXCL|O_NOFOLLOW``: a link planted at a guessed name makes the open fail instead
    of redirecting the write. It is fsynced before :func:`os.replace`, which renames over a link
    at ``path`` (the link itself goes, its target is untouched).
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """A protocol file's object, or None when it is missing, half-written, not an object, or
    a link (never followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, encoding="utf-8") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_ack(path: Path, request_id: str) -> dict[str, Any] | None:
    """The acknowledgement in ``path`` if it answers ``request_id``, else None."""
    data = read_json(path)
    return data if data is not None and data.get("request_id") == request_id else None
