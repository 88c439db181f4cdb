"""Which job (and rank) is using each GPU: Slurm, torchrun and Kubernetes.

In order of preference, for each process NVML lists on a GPU:

1. the process cgroup (``<procfs>/<pid>/cgroup``): Slurm's ``job_<id>`` and Kubernetes'
   ``pod<uid>`` (the pod UID, tagged ``pod-<uid>``). The system sets it, the job cannot;
2. the process environment (``<procfs>/<pid>/environ``, readable by root): ``SLURM_JOB_ID``,
   torchrun's ``TORCHELASTIC_RUN_ID``, ``GPUWARDEN_JOB``; the rank from ``RANK``/``LOCAL_RANK``,
   or ``SLURM_PROCID``/``SLURM_LOCALID`` for ``srun`` launches (only the environment knows a
   rank). The job's user sets all of these, so they are a claim, used only where the cgroup
   names no job;
3. on Kubernetes, the kubelet's pod-resources API (:mod:`collector.podresources`), which names
   the pod holding each GPU: ``<namespace>/<pod>`` replaces a pod UID from step 1, and tags a
   GPU the pod holds while none of its processes runs;
4. for a GPU with no readable process, the job map written by the Slurm prolog
   (``deploy/slurm/prolog.sh``): one file per GPU index in ``jobmap_dir`` holding the job id.

Every value read from a process or a file passes one grammar before it becomes a tag
(:func:`job_value`, :func:`rank_value`): a job is ``[A-Za-z0-9_][A-Za-z0-9._+-]*`` (ASCII, at most
253 characters: a Slurm job id ``1234``, an array task ``1234_5``, a heterogeneous component
``1234+0``, a torchrun run id, a pod ``pod-<uid>``), a rank is 1 to 9 digits. A value that fails
it is dropped, as if the variable were not set (the next source in the order is asked): a
job's environment can hold any bytes (a line break, a trailing backslash, ``,``, ``=``, a
megabyte), and a tag that the line protocol cannot carry would otherwise stop the agent.

A pid's answer is cached while the pid stays on a GPU, so the environment is read once.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_POD_RE = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
# A cgroup path names a job only under a root the system owns: a user can create cgroups of any
# name in the subtree systemd delegates to them (``/user.slice/user-1000.slice/user@1000.service/
# .../job_77``), never under Slurm's or the kubelet's. The path is the third field of a line of
# ``/proc/<pid>/cgroup``; ``/..`` components lead it when the reader is in another cgroup
# namespace.
_CG_LINE_RE = re.compile(r"^[^:\n]*:[^:\n]*:(?:/\.\.)*(?P<path>/[^\n]*)$", re.MULTILINE)
_SLURM_CG_RE = re.compile(
    r"^/(?:system\.slice/)?slurmstepd\.scope/job_(?P<a>\d+)(?:/|$)"  # cgroup v2 (Slurm 22.05+)
    r"|^/slurm[^/]*/uid_\d+/job_(?P<b>\d+)(?:/|$)"  # cgroup v1
)
_KUBEPODS_RE = re.compile(r"^/kubepods(?:[./]|$)")
POD_UID_PREFIX = "pod-"  # the job of a process known only by its pod's cgroup


@dataclass(frozen=True, slots=True)
class JobInfo:
    job: str = ""
    rank: str = ""
    local_rank: str = ""

    def tags(self) -> dict[str, str]:
        out = {}
        if self.job:
            out["job"] = self.job
        if self.rank:
            out["rank"] = self.rank
        if self.local_rank:
            out["local_rank"] = self.local_rank
        return out


NO_JOB = JobInfo()


_JOB_VALUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,252}")
_RANK_VALUE = re.compile(r"[0-9]{1,9}")


def job_value(value: str | None) -> str:
    """``value`` if it is a job name by the grammar above, else ``""`` (no job)."""
    if value and value.isascii() and _JOB_VALUE.fullmatch(value):
        return value
    return ""


def rank_value(value: str | None) -> str:
    """``value`` if it is a rank (1 to 9 ASCII digits), else ``""`` (no rank)."""
    if value and value.isascii() and _RANK_VALUE.fullmatch(value):
        return value
    return ""


#: where a launcher puts the process's global rank, the first present winning: torchrun, Open
#: MPI, MPICH and Intel MPI (PMI), PMIx, MVAPICH, then Slurm's srun. SLURM_PROCID comes last:
#: under ``sbatch`` + ``mpirun`` every process inherits the batch step's 0. Found by a review
#: against real launchers (2026-11-28): RANK or SLURM_PROCID only made every mpirun process
#: rank 0, and analytics read their steps as restarts of one rank (MFU 0.63 reported as 0.08)
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                  "MV2_COMM_WORLD_RANK", "SLURM_PROCID")  # fmt: skip
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                        "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")  # fmt: skip


def rank_from_environ(env: Mapping[str, str], names: tuple[str, ...] = RANK_VARIABLES) -> str:
    """The process's rank from the first of ``names`` that holds one (``""``: none)."""
    for name in names:
        if rank := rank_value(env.get(name)):
            return str(int(rank))  # "007" is rank 7, as the reporter says it
    return ""


def job_from_environ(env: Mapping[str, str]) -> str:
    """The job a process environment names (the first of ``SLURM_JOB_ID``,
    ``TORCHELASTIC_RUN_ID``, ``GPUWARDEN_JOB`` that is a job name; ``""`` if none is); the
    agent (for the GPUs a process uses) and the training-side reporter (for its steps) both use
    this, so the two tag the same job."""
    for key in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "GPUWARDEN_JOB"):
        if job := job_value(env.get(key)):
            return job
    return ""


def parse_environ(data: bytes) -> JobInfo:
    """The job and ranks a process environment claims (each value checked; see the module)."""
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    rank = rank_from_environ(env)
    local = rank_from_environ(env, LOCAL_RANK_VARIABLES)
    return JobInfo(job_from_environ(env), rank, local)


def parse_cgroup(text: str) -> str:
    """The job a ``/proc/<pid>/cgroup`` names: Slurm's job id, or ``pod-<uid>`` of a Kubernetes
    pod; ``""`` if no line's path is under Slurm's or the kubelet's root."""
    paths = [m["path"] for m in _CG_LINE_RE.finditer(text)]
    for path in paths:
        if m := _SLURM_CG_RE.match(path):
            return m["a"] or m["b"]
    for path in paths:
        if _KUBEPODS_RE.match(path) and (p := _POD_RE.search(path)):
            return POD_UID_PREFIX + p[1].replace("_", "-")
    return ""


def job_of_pid(procfs: str, pid: int, comm: str = "") -> JobInfo:
    """The job of a running process, from its cgroup, else its environment (the rank always
    from its environment); NO_JOB if it is gone or unreadable, or (``comm`` given) if it is
    another program now (a reused pid)."""
    # plain strings, not pathlib: pathlib interns every path part, and a node sees millions
    # of pids over its life
    base = os.path.join(procfs, str(pid))
    if comm:
        try:
            with open(os.path.join(base, "comm"), "rb") as f:
                # the kernel keeps 15 bytes of the name
                if f.read().decode("utf-8", "replace").strip() != comm[:15]:
                    return NO_JOB
        except OSError:
            return NO_JOB
    info = NO_JOB
    with contextlib.suppress(OSError), open(os.path.join(base, "environ"), "rb") as f:
        info = parse_environ(f.read())
    try:
        with open(os.path.join(base, "cgroup"), "rb") as f:
            job = parse_cgroup(f.read().decode("utf-8", "replace"))
    except OSError:
        job = ""
    if job:  # the system's word on the job wins over what the process's environment says
        info = JobInfo(job, info.rank, info.local_rank)
    return info


class JobResolver:
    def __init__(self, procfs: Path, jobmap_dir: str = "") -> None:
        self.procfs = procfs
        self._procfs = str(procfs)
        self.jobmap_dir = jobmap_dir
        self._cache: dict[int, JobInfo] = {}

    def for_pid(self, pid: int) -> JobInfo:
        info = self._cache.get(pid)
        if info is None:
            info = job_of_pid(self._procfs, pid)
            self._cache[pid] = info
        return info

    def for_gpu(self, index: int) -> JobInfo:
        """The job the scheduler assigned this GPU to, from the prolog's job map."""
        if not self.jobmap_dir:
            return NO_JOB
        try:
            with open(os.path.join(self.jobmap_dir, str(index)), encoding="utf-8") as f:
                job = job_value(f.read(1024).strip())
        except (OSError, UnicodeDecodeError):
            return NO_JOB
        return JobInfo(job) if job else NO_JOB

    def forget_except(self, live: set[int]) -> None:
        """Drop cached pids no longer on any GPU (a reused pid is read afresh)."""
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]


class JobHistory:
    """The job each GPU had at each look, and the job of each process seen on a GPU, over the
    last ``keep_s``: an event read after the fact is tagged with the job it hit.

    A kernel-log XID is often read after the process it killed has gone, and NVML's event
    thread reports an XID at the next cycle, when the GPU's job is no job, or the next one.
    So the NVML source records what it saw at every look (only changes are kept) and an
    event at time ``t`` gets:

    1. the job of the pid the event names, if that pid was on a GPU within ``keep_s``;
    2. else the job the GPU had at the agent's last look at or before ``t``;
    3. else no job: ``t`` is before the agent first looked at the GPU, or too long ago.

    Events are read within a cycle or two of happening, so five minutes is plenty; the
    history is also bounded in entries (``max_changes`` per GPU, ``max_pids``), so a node whose
    jobs churn by the second holds a few tens of kB at most, and an event older than what
    is kept gets no job rather than a wrong one. Shared by the sources through
    :class:`collector.sources.base.Inventory`; thread-safe.
    """

    def __init__(self, keep_s: float = 300.0, max_pids: int = 256, max_changes: int = 16) -> None:
        self.keep_ns = int(keep_s * 1e9)
        self.max_pids = max_pids
        self.max_changes = max_changes
        self._gpus: dict[int, list[tuple[int, JobInfo]]] = {}  # (since, job), oldest first
        self._pids: dict[int, tuple[int, JobInfo]] = {}  # pid -> (last seen, job), oldest first
        # a pod's cgroup job (pod-<uid>) -> its <namespace>/<pod>, where the kubelet named the
        # pod holding a GPU that pod's processes used (last seen, name), oldest first
        self._pods: dict[str, tuple[int, str]] = {}
        self._last_ns: int | None = None
        self._lock = threading.Lock()

    def saw(self, now_ns: int, gpus: Mapping[int, JobInfo], pids: Mapping[int, JobInfo]) -> None:
        """One look: each GPU's job (NO_JOB for an idle GPU) and each GPU process's job."""
        horizon = now_ns - self.keep_ns
        with self._lock:
            self._last_ns = now_ns
            for gpu, job in gpus.items():
                changes = self._gpus.setdefault(gpu, [])
                if not changes or changes[-1][1] != job:
                    changes.append((now_ns, job))
                # the state at the horizon is the newest change at or before it
                while len(changes) > self.max_changes or (
                    len(changes) > 1 and changes[1][0] <= horizon
                ):
                    del changes[0]
            for pid, job in pids.items():
                self._pids.pop(pid, None)  # re-inserted: the dict stays in last-seen order
                self._pids[pid] = (now_ns, job)
            while self._pids and (
                len(self._pids) > self.max_pids or next(iter(self._pids.values()))[0] < horizon
            ):
                del self._pids[next(iter(self._pids))]

    def named_pod(self, now_ns: int, uid_job: str, name: str) -> None:
        """The kubelet named ``name`` the one pod holding a GPU whose process's cgroup is the
        pod ``uid_job`` (``pod-<uid>``): that pod's reports over the relay's socket are
        ``name``'s, and no other job's. Kept for ``keep_s`` after the last sighting."""
        horizon = now_ns - self.keep_ns
        with self._lock:
            before = self._pods.pop(uid_job, None)
            if before is not None and before[1] != name and before[0] >= horizon:
                # one pod UID seen under two pods' names (it ran on GPUs the kubelet gives to
                # another pod): it is held to neither, and the relay's socket rule for an
                # unknown pod applies to it
                self._pods[uid_job] = (now_ns, "")
            else:
                self._pods[uid_job] = (now_ns, name)
            while self._pods and (
                len(self._pods) > self.max_pids or next(iter(self._pods.values()))[0] < horizon
            ):
                del self._pods[next(iter(self._pods))]

    def pods_named(self) -> dict[str, str]:
        """Each pod (``pod-<uid>``) seen on this node's GPUs within the kept window, and the
        ``<namespace>/<pod>`` the kubelet named it (:meth:`named_pod`)."""
        with self._lock:
            horizon = (self._last_ns or 0) - self.keep_ns
            return {uid: name for uid, (t, name) in self._pods.items() if t >= horizon and name}

    def jobs_seen(self) -> set[str]:
        """Every job a GPU or a GPU process of this node had within the kept window (the
        relay takes reports from these jobs only)."""
        with self._lock:
            jobs = {j.job for changes in self._gpus.values() for _, j in changes if j.job}
            return jobs | {j.job for _, j in self._pids.values() if j.job}

    def job_at(self, when_ns: int, gpu: int | None = None, pid: int | None = None) -> JobInfo:
        """The job an event at ``when_ns`` on ``gpu`` (naming ``pid``, if it does) hit."""
        with self._lock:
            if self._last_ns is None or when_ns < self._last_ns - self.keep_ns:
                return NO_JOB
            seen = self._pids.get(pid) if pid is not None else None
            if seen is not None and seen[1].job:
                return seen[1]
            for since, job in reversed(self._gpus.get(gpu, ()) if gpu is not None else ()):
                if since <= when_ns:
                    return job
            return NO_JOB
