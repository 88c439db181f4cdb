"""Slurm: drain and resume nodes, ask jobs to checkpoint, requeue them, via the client commands.

Only ``scontrol``, ``scancel``, ``sinfo --json`` and ``squeue --json`` are used: Slurm 22.05's
slurmrestd has no node-update or requeue endpoint, and ``scontrol --json`` does not exist
there. Facts this module is built on (measured on 22.05.8):

* ``squeue --json`` ignores ``-w/--nodelist``: jobs are filtered here, by the allocated node
  names in ``job_resources`` (already expanded, no hostlist parsing needed);
* ``scancel -s USR1 <job>`` signals only job steps; a batch job without an ``srun`` step gets
  nothing and the command still returns 0: ``--full`` signals the batch shell and every step;
* a drained node keeps running its jobs: moving them is ``requeue``, which works only for
  jobs that allow it (``--requeue`` or ``JobRequeue=1``); a job that does not is reported,
  not killed.

Checkpoint requests follow :mod:`core.checkpoint`: a request file per job under
``checkpoint_dir`` (shared storage the job can read), and, if ``checkpoint_signal`` is set, that
signal to the batch shell and every step; the adapter then waits for the job's acknowledgement
file, up to ``checkpoint_timeout_s``. No signal is sent by default: bash dies of ``SIGUSR1``
unless the batch script traps it or ``exec``s the trainer, and killing the job is exactly what
a checkpoint request must not do. Sites whose jobs handle it (``#SBATCH --signal=USR1@120``
users, PyTorch Lightning) set ``checkpoint_signal = "USR1"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwarden.core.checkpoint import (
    ack_path,
    interval_ack_path,
    interval_path,
    interval_request,
    read_ack,
    request,
    request_path,
    write_json_atomic,
)
from gpuwarden.core.names import BadNameError, NodeName
from gpuwarden.remediation.model import (
    ALREADY_OUT,
    Action,
    ActionKind,
    AdapterError,
    Inventory,
    NodeFacts,
    Outcome,
    Status,
)

# node states and flags that mean "takes no new work"
OUT_STATES = frozenset({"down", "drained", "draining", "fail", "failing", "future", "maint"})
OUT_FLAGS = frozenset({"DRAIN", "DOWN", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED"})
SPARE_REASON = "gpuwarden: hot spare"
"""A hot spare's drain reason, matched whole: a removal's reason carries the finding's summary
(the sender's text) after ``gpuwarden: `` and its id after, so it never equals this (a prefix
match counted any summary starting "hot spare" as a spare, outside the blast-radius limit)."""
CHECK_REASON = "gpuwarden check"
"""The node check's drain reason starts so (deploy/slurm/healthcheck.sh), and that script
resumes a node whose reason does when its check passes."""
OURS = ("gpuwarden:", CHECK_REASON)
"""Every drain reason gpuwarden writes starts so (the engine's ``gpuwarden: ...``, the node
check's ``gpuwarden check: ...``, deploy/slurm/healthcheck.sh); a node out with any other reason
is someone else's (an administrator's, Slurm's own "Not responding")."""


class SlurmAdapter:
    name = "slurm"
    actions = frozenset(
        {
            ActionKind.CHECKPOINT,
            ActionKind.CORDON,
            ActionKind.DRAIN,
            ActionKind.REQUEUE,
            ActionKind.UNCORDON,
            ActionKind.CHECKPOINT_INTERVAL,
        }
    )

    def __init__(
        self,
        *,
        conf: str = "",
        checkpoint_dir: str = "",
        checkpoint_signal: str = "",
        checkpoint_timeout_s: float = 120.0,
        command_timeout_s: float = 30.0,
        poll_s: float = 0.2,
    ) -> None:
        self.conf = conf
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_signal = checkpoint_signal
        self.checkpoint_timeout_s = checkpoint_timeout_s
        self.command_timeout_s = command_timeout_s
        self.poll_s = poll_s

    # -- commands -----------------------------------------------------------------------------

    def _run(self, *argv: str) -> str:
        if self.conf and not Path(self.conf).is_file():
            # the client commands would retry for 60 s before saying so
            raise AdapterError(f"Slurm configuration {self.conf} does not exist")
        env = {**os.environ, "SLURM_CONF": self.conf} if self.conf else None
        try:
            res = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.command_timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise AdapterError(f"{argv[0]} not found: is the Slurm client installed?") from None
        except subprocess.TimeoutExpired:
            raise AdapterError(
                f"{' '.join(argv)} timed out after {self.command_timeout_s} s"
            ) from None
        if res.returncode != 0:
            raise AdapterError(
                f"{' '.join(argv)} failed (rc={res.returncode}): {res.stderr.strip()}"
            )
        return res.stdout

    def _json(self, *argv: str) -> dict[str, Any]:
        out = self._run(*argv)
        try:
            data = json.loads(out)
        except ValueError:
            raise AdapterError(f"{' '.join(argv)} did not print JSON: {out[:200]!r}") from None
        if not isinstance(data, dict):
            raise AdapterError(f"{' '.join(argv)}: unexpected JSON {type(data).__name__}")
        if data.get("errors"):
            raise AdapterError(f"{' '.join(argv)} reported errors: {data['errors']}")
        return data

    # -- what is there ------------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        # --all: nodes of hidden partitions, and of ones this user may not use, are nodes too
        # (else never drained: unknown_node); Slurm 22.05's --json may list them anyway
        nodes = self._json("sinfo", "--json", "--all").get("nodes")
        if not isinstance(nodes, list):
            raise AdapterError("sinfo --json has no 'nodes' list")
        return nodes

    def inventory(self) -> Inventory:
        partitions: dict[str, str] = {}
        out, spares, idle = set(), set(), set()
        for n in self.nodes():
            name = str(n.get("name", ""))
            parts = n.get("partitions") or [""]
            partitions[name] = str(parts[0])
            flags = {str(f).upper() for f in n.get("state_flags") or []}
            state = str(n.get("state", "")).lower()
            if state in OUT_STATES or flags & OUT_FLAGS:
                out.add(name)
                if "DRAIN" in flags and str(n.get("reason", "")) == SPARE_REASON:
                    spares.add(name)
            elif state == "idle":
                idle.add(name)
        return Inventory(partitions, frozenset(out), frozenset(spares), frozenset(idle))

    def hold_spare(self, node: str) -> None:
        """Keep ``node`` out of the general pool as a hot spare (drained, marked as ours)."""
        self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={SPARE_REASON}")

    def release_spare(self, node: str) -> None:
        self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")

    def node(self, name: str) -> dict[str, Any]:
        for n in self.nodes():
            if n.get("name") == name:
                return n
        raise AdapterError(f"Slurm has no node {name!r}")

    def node_facts(self, node: str) -> NodeFacts:
        """Its partitions and features (active and available), from ``sinfo --json``."""
        n = self.node(node)

        def names(value: Any) -> set[str]:
            if isinstance(value, str):  # Slurm 22.05: "a,b"; later: ["a", "b"]
                value = value.split(",")
            return {str(v).strip() for v in value or [] if str(v).strip()}

        features = names(n.get("features")) | names(n.get("active_features"))
        return NodeFacts(frozenset(names(n.get("partitions"))), frozenset(features))

    def jobs_on(self, node: str) -> list[dict[str, Any]]:
        """Running jobs with an allocation on ``node``."""
        jobs = self._json("squeue", "--json").get("jobs") or []
        out = []
        for job in jobs:
            if str(job.get("job_state", "")).upper() not in ("RUNNING", "SUSPENDED"):
                continue
            alloc = (job.get("job_resources") or {}).get("allocated_nodes") or []
            names = {str(a.get("nodename", "")) for a in alloc}
            if node in names or job.get("batch_host") == node:
                out.append(job)
        return out

    # -- acting -------------------------------------------------------------------------------

    def describe(self, action: Action) -> str:
        node = action.node
        return {
            ActionKind.CHECKPOINT: f"ask the jobs on {node} to checkpoint and wait up to "
            f"{self.checkpoint_timeout_s:.0f} s for their acknowledgement",
            ActionKind.CORDON: f"drain {node} (reason {action.reason!r}); its jobs keep running",
            ActionKind.DRAIN: f"drain {node} (reason {action.reason!r})",
            ActionKind.REQUEUE: f"requeue the jobs running on {node}",
            ActionKind.UNCORDON: f"resume {node}",
            ActionKind.CHECKPOINT_INTERVAL: f"ask job {action.job} to checkpoint every "
            f"{action.params.get('interval_s')} s",
        }.get(action.kind, f"{action.kind} {node}")

    def perform(self, action: Action) -> Outcome:
        if action.kind is ActionKind.CHECKPOINT_INTERVAL:
            return self._interval(action)
        if not action.node:
            raise AdapterError(f"{action.kind} needs a node; the finding named none")
        try:  # a second look: the finding parsed it (names are data, core.names)
            NodeName(action.node)
        except BadNameError as exc:
            raise AdapterError(str(exc)) from None
        if action.kind in (ActionKind.CORDON, ActionKind.DRAIN):
            return self._drain(action)
        if action.kind is ActionKind.CHECKPOINT:
            return self._checkpoint(action)
        if action.kind is ActionKind.REQUEUE:
            return self._requeue(action)
        if action.kind is ActionKind.UNCORDON:
            return self._resume(action)
        raise AdapterError(f"slurm cannot {action.kind}")

    def _drain(self, action: Action) -> Outcome:
        node = self.node(action.node)
        flags = {str(f).upper() for f in node.get("state_flags") or []}
        theirs = _theirs(node)
        if theirs:  # out already, by someone else: theirs to return
            if "DRAIN" not in flags:  # DOWN or FAIL: drained too, with their reason, so that
                # it does not come back by itself when slurmd answers (ReturnToService)
                self._run("scontrol", "update", f"NodeName={action.node}", "State=DRAIN",
                          f"Reason={theirs}")  # fmt: skip
            return Outcome(
                Status.OK,
                f"{action.node} was out already, taken out by someone else ({theirs!r}): left "
                "to them, gpuwarden does not put it back",
                {ALREADY_OUT: theirs},
            )
        was = str(node.get("reason") or "")
        if "DRAIN" in flags and was != SPARE_REASON and not was.startswith(CHECK_REASON):
            return Outcome(Status.OK, f"{action.node} already draining: {was!r}")
        # (a hot spare with a fault of its own: its reason becomes the fault's, and it leaves
        # the spare pool, which would have put it back in service for a requeue; a node the
        # node check drained: its reason becomes the fault's too, else the next passing check
        # resumed it, fault and all, past the engine's return rule)
        reason = action.reason.replace("\n", " ")[:200]
        self._run(
            "scontrol", "update", f"NodeName={action.node}", "State=DRAIN", f"Reason={reason}"
        )
        return Outcome(Status.OK, f"drained {action.node}", {"reason": reason})

    def _resume(self, action: Action) -> Outcome:
        node = self.node(action.node)
        flags = {str(f).upper() for f in node.get("state_flags") or []}
        if not flags & {"DRAIN", "DOWN", "FAIL"} and str(node.get("state")) != "down":
            return Outcome(Status.OK, f"{action.node} already in service")
        theirs = _theirs(node)
        if theirs and action.params.get("kind") != "operator_undo":
            # gpuwarden's node, taken out again by someone else since (an administrator's
            # "DO NOT RESUME"): theirs now; gpuwarden lets go of it (an operator's undo may)
            return Outcome(Status.OK, f"{action.node} was taken out again by someone else "
                           f"({theirs!r}): left to them", {ALREADY_OUT: theirs})  # fmt: skip
        self._run("scontrol", "update", f"NodeName={action.node}", "State=RESUME")
        return Outcome(Status.OK, f"resumed {action.node}")

    def _requeue(self, action: Action) -> Outcome:
        jobs = self.jobs_on(action.node)
        done, refused = [], []
        for job in jobs:
            jid = str(job["job_id"])
            if not job.get("requeue", False):
                refused.append(jid)
                continue
            self._run("scontrol", "requeue", jid)
            done.append(jid)
        details = {"requeued": done, "not_requeueable": refused}
        if refused:
            msg = f"requeued {done}; jobs {refused} do not allow requeue (left running)"
            return Outcome(Status.FAILED, msg, details)
        return Outcome(Status.OK, f"requeued {done or 'no jobs'} from {action.node}", details)

    def _await(self, paths: dict[str, Path], request_id: str) -> tuple[dict[str, Any], set[str]]:
        """Poll each job's answer file for ``request_id`` until all have answered or
        ``checkpoint_timeout_s`` has passed: the answers (with ``ack_s``), the jobs still silent."""
        started = time.monotonic()
        waiting, acks = set(paths), {}
        while waiting and time.monotonic() - started < self.checkpoint_timeout_s:
            for jid in sorted(waiting):
                ack = read_ack(paths[jid], request_id)
                if ack is not None:
                    acks[jid] = ack | {"ack_s": round(time.monotonic() - started, 3)}
                    waiting.discard(jid)
            if waiting:
                time.sleep(self.poll_s)
        return acks, waiting

    def _interval(self, action: Action) -> Outcome:
        """Write the job's interval request (``<job>.interval``) and wait for its answer."""
        value = action.params.get("interval_s")
        if not action.job or not isinstance(value, int | float) or isinstance(value, bool):
            raise AdapterError(f"checkpoint_interval needs a job and an interval, got {action}")
        if not self.checkpoint_dir:  # not set up: skipped, as on Kubernetes (warned at start)
            return Outcome(Status.SKIPPED, "no slurm.checkpoint_dir: interval requests go there")
        try:
            asked = interval_request(action.id, float(value), action.reason)
        except ValueError as exc:
            raise AdapterError(str(exc)) from None
        try:  # the job names the files: refused unless they stay inside checkpoint_dir
            asked_at = interval_path(self.checkpoint_dir, action.job)
            answer_at = interval_ack_path(self.checkpoint_dir, action.job)
        except BadNameError as exc:
            raise AdapterError(f"no interval request for job {action.job!r}: {exc}") from None
        Path(self.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(asked_at, asked | {"job": action.job})
        acks, _ = self._await({action.job: answer_at}, action.id)
        if acks:
            answer = acks[action.job]
            return Outcome(
                Status.OK,
                f"job {action.job} checkpoints every {answer.get('interval_s')} s",
                {"ack_s": answer["ack_s"]},
            )
        return Outcome(
            Status.TIMEOUT,
            f"job {action.job} did not take the interval within {self.checkpoint_timeout_s:.0f} s "
            "(its checkpoint hook may not support interval requests): people were notified",
        )

    def _checkpoint(self, action: Action) -> Outcome:
        if not self.checkpoint_dir and not self.checkpoint_signal:
            # not set up: skipped, as on Kubernetes (warned at start); the plan goes on. It
            # failed each time, and every prediction paged "action failed" (found in review)
            return Outcome(
                Status.SKIPPED, "no slurm.checkpoint_dir nor checkpoint_signal: jobs not asked"
            )
        jobs = [str(j["job_id"]) for j in self.jobs_on(action.node)]
        if not jobs:
            return Outcome(Status.OK, f"no running jobs on {action.node}")
        asked = request(action.id, action.reason)
        if self.checkpoint_dir:
            try:  # Slurm's own job ids, still parsed before they name a file
                paths = {j: request_path(self.checkpoint_dir, j) for j in jobs}
            except BadNameError as exc:
                raise AdapterError(f"checkpoint request: {exc}") from None
            Path(self.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            for jid in jobs:
                write_json_atomic(paths[jid], asked | {"job": jid})
        if self.checkpoint_signal:
            for jid in jobs:
                self._run("scancel", "--full", "-s", self.checkpoint_signal, jid)
        if not self.checkpoint_dir:
            return Outcome(Status.OK, f"signalled {jobs} (no checkpoint_dir: cannot wait)")
        acks, waiting = self._await(
            {jid: ack_path(self.checkpoint_dir, jid) for jid in jobs}, action.id
        )
        details = {"jobs": jobs, "acks": acks, "missing": sorted(waiting)}
        if waiting:
            msg = f"no checkpoint from {sorted(waiting)} within {self.checkpoint_timeout_s:.0f} s"
            return Outcome(Status.TIMEOUT, msg, details)
        steps = {j: a.get("step") for j, a in acks.items()}
        return Outcome(Status.OK, f"checkpointed {steps}", details)

    # -- after a crash (remediation.model.Reconciling) -----------------------------------------

    def observe(self, action: Action) -> dict[str, Any]:
        """Before a requeue: each job on the node and its restart count (Slurm counts a
        requeue there); before a checkpoint: the jobs asked. Nothing for the others, whose
        effect shows in the node's own state."""
        if action.kind is ActionKind.REQUEUE and action.node:
            return {"jobs": {str(j["job_id"]): _restarts(j) for j in self.jobs_on(action.node)}}
        if action.kind is ActionKind.CHECKPOINT and action.node:
            return {"jobs": [str(j["job_id"]) for j in self.jobs_on(action.node)]}
        return {}

    def reconcile(self, action: Action, before: Mapping[str, Any]) -> Outcome | None:
        """Whether ``action`` took effect after its intent was recorded, from Slurm's state."""
        kind, name = action.kind, action.node
        if kind in (ActionKind.CORDON, ActionKind.DRAIN):
            node = self.node(name)
            if "DRAIN" in {str(f).upper() for f in node.get("state_flags") or []}:
                theirs = _theirs(node)
                if theirs:
                    return Outcome(Status.OK, f"{name} is out, by someone else ({theirs!r})",
                                   {ALREADY_OUT: theirs})  # fmt: skip
                was = str(node.get("reason") or "")
                if was == SPARE_REASON or was.startswith(CHECK_REASON):
                    return None  # still a spare's, or the check's: the drain was not done
                return Outcome(Status.OK, f"{name} is draining: {node.get('reason')!r}")
            return None
        if kind is ActionKind.UNCORDON:
            node = self.node(name)
            if not {str(f).upper() for f in node.get("state_flags") or []} & {"DRAIN", "DOWN"}:
                return Outcome(Status.OK, f"{name} is in service")
            return None
        if kind is ActionKind.REQUEUE:
            counted = dict(before.get("jobs") or {})
            there = {str(j["job_id"]): j for j in self.jobs_on(name)}
            left = [
                jid for jid, restarts in counted.items()
                if jid in there and _restarts(there[jid]) <= int(restarts)
            ]  # fmt: skip
            if left:
                return None  # perform requeues the ones still running there, and only those
            done = sorted(counted)
            return Outcome(Status.OK, f"requeued {done or 'no jobs'} from {name}",
                           {"requeued": done, "not_requeueable": []})  # fmt: skip
        if kind is ActionKind.CHECKPOINT and self.checkpoint_dir:
            asked = [str(j) for j in before.get("jobs") or []]
            acks = {j: read_ack(ack_path(self.checkpoint_dir, j), action.id) for j in asked}
            if asked and all(acks.values()):
                return Outcome(Status.OK, "checkpointed before the restart",
                               {"jobs": asked, "acks": acks, "missing": []})  # fmt: skip
            return None  # asked again with the same request id: a job that saved says so
        if kind is ActionKind.CHECKPOINT_INTERVAL and self.checkpoint_dir and action.job:
            answer = read_ack(interval_ack_path(self.checkpoint_dir, action.job), action.id)
            if answer is not None:
                return Outcome(Status.OK, f"job {action.job} took the interval before the restart")
        return None


def _restarts(job: Mapping[str, Any]) -> int:
    value = job.get("restart_cnt", 0)
    if isinstance(value, dict):  # later Slurm versions: {"set": true, "number": n}
        value = value.get("number", 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _theirs(node: Mapping[str, Any]) -> str:
    """The reason of a node that is out by someone else's hand (not gpuwarden's: not a reason
    of :data:`OURS`), ``""`` if it is in service or out by gpuwarden. A node out with no
    reason is taken as gpuwarden's to act on (Slurm asks a reason of every drain and down)."""
    flags = {str(f).upper() for f in node.get("state_flags") or []}
    state = str(node.get("state", "")).lower()
    reason = str(node.get("reason") or "")
    out = state in OUT_STATES or bool(flags & OUT_FLAGS)
    return reason if out and reason and not reason.startswith(OURS) else ""
