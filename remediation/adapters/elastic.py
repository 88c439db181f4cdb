"""PyTorch elastic (torchrun): ask the job to checkpoint through its store; exclude a node.

* **checkpoint**: sets ``<prefix>/request`` in the job's ``TCPStore`` (the rendezvous store, or
  any store the workers read) and waits for ``<prefix>/ack/<request_id>``, which the training
  side (:mod:`collector.jobside.checkpoint_hook`, speaking :mod:`core.checkpoint`) sets once
  every rank has saved. Measured here: the acknowledgement arrives within a step or two.
* **drain / cordon**: stops that node's elastic agent (``torchrun``), so the remaining agents
  re-form the group without it (the job must run with ``--nnodes=MIN:MAX`` and MIN below the
  node count) and their workers restart from the checkpoint just taken. How the agent is
  stopped: ``stop_command`` (an argv template with ``{node}``, e.g. ``ssh -- {node} systemctl
  stop torchrun-job`` or a ``scancel`` of that node's step), or else SIGTERM to the pid in
  ``<pid_dir>/<node>.pid`` when the engine runs on the same host (tests, the demo). The agent
  itself is signalled, never its workers: torchrun stops them on SIGTERM (SIGUSR1 to the agent
  would kill it and orphan them).

Names are data (:mod:`core.names`): the node is parsed into a :class:`NodeName` (never begins
with ``-``, no ``/``) before it fills ``{node}``, as one argv element, never through a shell;
``ssh`` in ``stop_command`` must have ``--`` before ``{node}`` (refused at construction and at
config load otherwise: ``-oProxyCommand=...`` as a host is a command); the pid file is
``path_inside(pid_dir, node, ".pid")``, refused if it would lead out of ``pid_dir``.

``torch`` is imported only here, only when a checkpoint is requested: it is the training job's
own dependency, not the engine's (``scripts/bootstrap.sh`` installs the CPU build for tests).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from datetime import timedelta
from typing import Any

from gpuwarden.core.checkpoint import PREFIX, ack_key, request, request_key
from gpuwarden.core.names import (
    BadNameError,
    NodeName,
    check_argv_template,
    fill_argv,
    path_inside,
)
from gpuwarden.remediation.model import Action, ActionKind, AdapterError, Outcome, Status


class ElasticAdapter:
    name = "elastic"
    actions = frozenset({ActionKind.CHECKPOINT, ActionKind.CORDON, ActionKind.DRAIN})

    def __init__(
        self,
        *,
        store_host: str = "127.0.0.1",
        store_port: int = 29400,
        prefix: str = PREFIX,
        checkpoint_timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        stop_command: str = "",
        pid_dir: str = "",
        stop_timeout_s: float = 60.0,
        poll_s: float = 0.05,
    ) -> None:
        self.store_host = store_host
        self.store_port = store_port
        self.prefix = prefix
        self.checkpoint_timeout_s = checkpoint_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.stop_command = stop_command
        self._stop_argv = shlex.split(stop_command)
        check_argv_template(self._stop_argv, "elastic.stop_command")
        self.pid_dir = pid_dir
        self.stop_timeout_s = stop_timeout_s
        self.poll_s = poll_s
        self._store: Any = None

    def describe(self, action: Action) -> str:
        if action.kind is ActionKind.CHECKPOINT:
            return (
                f"set {self.prefix}/request in the store at {self.store_host}:{self.store_port} "
                f"and wait up to {self.checkpoint_timeout_s:.0f} s for the job's acknowledgement"
            )
        return f"stop the elastic agent on {action.node} so the job re-forms without it"

    def perform(self, action: Action) -> Outcome:
        if action.kind is ActionKind.CHECKPOINT:
            return self._checkpoint(action)
        if action.kind in (ActionKind.CORDON, ActionKind.DRAIN):
            return self._stop_agent(action)
        raise AdapterError(f"elastic cannot {action.kind}")

    def _connect(self) -> Any:
        if self._store is None:
            try:
                from torch.distributed import TCPStore
            except ImportError:
                raise AdapterError("the elastic adapter needs torch (pip install torch)") from None
            try:
                self._store = TCPStore(
                    self.store_host,
                    self.store_port,
                    is_master=False,
                    timeout=timedelta(seconds=self.connect_timeout_s),
                    wait_for_workers=False,
                )
            except (RuntimeError, OSError) as exc:
                raise AdapterError(
                    f"cannot reach the job's store at {self.store_host}:{self.store_port}: {exc}"
                ) from None
        return self._store

    def _checkpoint(self, action: Action) -> Outcome:
        store = self._connect()
        asked = request(action.id, action.reason)
        answer = ack_key(action.id, self.prefix)
        started = time.monotonic()
        try:
            store.set(request_key(self.prefix), json.dumps(asked))
            while not store.check([answer]):
                if time.monotonic() - started > self.checkpoint_timeout_s:
                    return Outcome(
                        Status.TIMEOUT,
                        f"no checkpoint acknowledgement within {self.checkpoint_timeout_s:.0f} s",
                    )
                time.sleep(self.poll_s)
            ack = json.loads(store.get(answer))
        except (RuntimeError, OSError, ValueError) as exc:
            self._store = None
            raise AdapterError(f"store {self.store_host}:{self.store_port}: {exc}") from None
        elapsed = round(time.monotonic() - started, 3)
        return Outcome(
            Status.OK,
            f"checkpoint of step {ack.get('step')} acknowledged",
            ack | {"ack_s": elapsed},
        )

    def _stop_agent(self, action: Action) -> Outcome:
        if not action.node:
            raise AdapterError("stopping an elastic agent needs a node")
        try:
            node = NodeName(action.node)
        except BadNameError as exc:
            raise AdapterError(str(exc)) from None
        if self._stop_argv:
            argv = fill_argv(self._stop_argv, node)
            res = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.stop_timeout_s, check=False
            )
            if res.returncode != 0:
                raise AdapterError(f"{' '.join(argv)}: rc={res.returncode}: {res.stderr.strip()}")
            return Outcome(Status.OK, f"stopped the elastic agent on {action.node} ({argv[0]})")
        if not self.pid_dir:
            raise AdapterError("set elastic.stop_command or elastic.pid_dir")
        try:
            pid_file = path_inside(self.pid_dir, node, ".pid")
        except BadNameError as exc:
            raise AdapterError(f"no pid file for {node!r}: {exc}") from None
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            raise AdapterError(f"no agent pid for {action.node} in {pid_file}") from None
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return Outcome(Status.OK, f"the agent on {action.node} (pid {pid}) was already gone")
        deadline = time.monotonic() + self.stop_timeout_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return Outcome(Status.OK, f"stopped the elastic agent on {action.node} (pid {pid})")
            time.sleep(0.1)
        return Outcome(Status.TIMEOUT, f"agent pid {pid} still running after SIGTERM")


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # our child (tests): reap it
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
