"""Start and stop a real Slurm cluster (Debian's ``slurm-wlm`` 22.05 and ``munge``) on loopback.

Used by the tests, the latency benchmark and the demo: one ``munged`` with its own key and
socket, one ``slurmctld`` and one ``slurmd -N <name>`` per node name, all bound to 127.0.0.1
on free ports, with every file under one directory. Nothing touches ``/etc/slurm`` or the
system's munge: the client commands find this cluster through ``SLURM_CONF`` (see
:meth:`LocalSlurm.env`).

Settings that matter (measured on 22.05.8):

* ``CommunicationParameters=NoInAddrAny,NoCtldInAddrAny`` keeps every daemon on loopback;
* ``AuthInfo=...,cred_expire=10``: a requeued job otherwise waits 120 s before it may start;
* ``ReturnToService=2`` so nodes come up at once; gpuwarden drains (never DOWNs) a node, so a
  drain is not undone by a slurmd re-registering;
* node ``Weight``: the scheduler fills the lightest node first, which lets a test or the demo
  say where the first job lands without pinning it there (a job pinned with ``--nodelist``
  could never be requeued elsewhere).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from testbed.errors import TestbedError
from testbed.influxd import free_port

_CONF = """\
ClusterName=gpuwarden
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={short}/munge.sock,cred_expire=10
CredType=cred/munge
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation={root}/state
SlurmdSpoolDir={short}/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobRequeue=1
KillWait=5
InactiveLimit=0
MinJobAge=600
SlurmdTimeout=60
{nodes}
PartitionName={partition} Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmError(TestbedError, RuntimeError):
    """The local Slurm could not be started, or a command against it failed."""


def hostnames(hostlist: str) -> set[str]:
    """The node names a Slurm hostlist (``node-[000,002-003]``) stands for, as Slurm itself
    expands them (``scontrol show hostnames``; scontrol wants a ``slurm.conf`` even for that,
    so a minimal one is written for the call)."""
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "slurm.conf"
        conf.write_text(
            "ClusterName=hostnames\nSlurmctldHost=localhost\nNodeName=n CPUs=1\n"
            "PartitionName=p Nodes=n\n"
        )
        done = subprocess.run(
            ["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True,
            check=True, env={**os.environ, "SLURM_CONF": str(conf)},
        )  # fmt: skip
    return set(done.stdout.split())


def slurm_available() -> bool:
    return all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "scontrol", "sbatch"))


class LocalSlurm:
    """A Slurm cluster of ``nodes`` on this host; a context manager.

    ``weights`` maps node names to scheduling weights (lower fills first; default 10);
    ``extra`` lines are added to ``slurm.conf`` (``RequeueExit=42``: a batch job that exits with
    42 is requeued by Slurm itself).
    """

    def __init__(
        self,
        root: str | Path,
        nodes: Sequence[str] = ("gpu01", "gpu02", "gpu03", "gpu04"),
        *,
        partition: str = "gpu",
        weights: Mapping[str, int] | None = None,
        cpus: int = 2,
        extra: Sequence[str] = (),
        features: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        if not slurm_available():
            raise SlurmError(
                "Slurm is not installed (need slurmctld, slurmd, munged, scontrol, sbatch): "
                "scripts/bootstrap.sh installs the Debian packages slurm-wlm and munge"
            )
        self.root = Path(root).resolve()
        self.nodes = list(nodes)
        self.partition = partition
        self.weights = dict(weights or {})
        self.cpus = cpus
        self.extra = list(extra)
        self.features = {n: list(f) for n, f in (features or {}).items()}
        self.conf = self.root / "slurm.conf"
        # Unix sockets (munge's, slurmstepd's in the spool) must have paths under 108 bytes:
        # they live in a short directory of their own, removed on stop
        self.short = Path(tempfile.mkdtemp(prefix="gwslurm-"))
        self._procs: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        """The environment for Slurm client commands (``scontrol``, ``sbatch``...) to reach us."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        for sub in ("state", "log", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        lines = []
        for name in self.nodes:
            (self.short / name).mkdir(exist_ok=True)
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} "
                f"CPUs={self.cpus} RealMemory=1000 Weight={self.weights.get(name, 10)} "
                + (f"Feature={','.join(self.features[name])} " if self.features.get(name) else "")
                + "State=UNKNOWN"
            )
        self.conf.write_text(
            _CONF.format(
                root=self.root,
                short=self.short,
                ctld_port=free_port(),
                nodes="\n".join(lines),
                partition=self.partition,
                node_list=",".join(self.nodes),
            )
            + "".join(f"{line}\n" for line in self.extra),
            encoding="utf-8",
        )
        key = self.root / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(128))
            key.chmod(0o600)

    def _spawn(self, *argv: str) -> None:
        log = (self.root / "log" / f"{Path(argv[0]).name}-{len(self._procs)}.out").open("ab")
        self._procs.append(
            subprocess.Popen(
                argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        log.close()

    def start(self, timeout_s: float = 30.0) -> LocalSlurm:
        self._write_config()
        munge_dir = self.root / "munge"
        munge_dir.mkdir(mode=0o700, exist_ok=True)
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--socket={self.short}/munge.sock",
            f"--key-file={self.root}/munge.key",
            f"--pid-file={munge_dir}/munged.pid",
            f"--seed-file={munge_dir}/munged.seed",
            f"--log-file={self.root}/log/munged.log",
        )
        self._wait((self.short / "munge.sock").exists, timeout_s, "munged socket")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        for name in self.nodes:
            self._spawn("slurmd", "-D", "-N", name, "-f", str(self.conf))
        self._wait(self._all_idle, timeout_s, "all nodes idle (or drained by a health check)")
        return self

    def _all_idle(self) -> bool:
        for proc in self._procs:
            if proc.poll() is not None:
                raise SlurmError(f"{proc.args!r} exited with {proc.returncode}; {self.logs()}")
        res = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"],
            env=self.env(),
            capture_output=True,
            text=True,
            check=False,
        )
        states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        # drained: a node its HealthCheckProgram took out at start is up, and responding
        up = ("idle", "drained")
        return res.returncode == 0 and all(states.get(n) in up for n in self.nodes)

    def _wait(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.1)
        raise SlurmError(f"local Slurm: timed out waiting for {what}; {self.logs()}")

    def logs(self) -> str:
        """The daemons' log tails, for error messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-8:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def run(self, *argv: str, check: bool = True) -> str:
        """Run a Slurm client command against this cluster; stdout."""
        res = subprocess.run(argv, env=self.env(), capture_output=True, text=True, check=False)
        if check and res.returncode != 0:
            raise SlurmError(f"{' '.join(argv)}: rc={res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def sbatch(self, workdir: Path, name: str, nodes: int, command: str) -> str:
        """Submit ``command`` as a requeueable, exclusive batch job on ``nodes`` nodes; its id.
        The script and its output go to ``workdir``."""
        script = workdir / f"{name}.sh"
        script.write_text(f"#!/bin/bash\n{command}\n")
        out = self.run("sbatch", "--parsable", "--requeue", "--exclusive", f"-N{nodes}",
                       "-J", name, "-o", f"{workdir}/{name}-%j.out", str(script))  # fmt: skip
        return out.strip().split(";")[0]

    def where(self, job: str) -> tuple[str, str]:
        """A job's state and node list (``"", ""`` once Slurm has forgotten it)."""
        line = self.run("squeue", "-h", "-j", job, "-o", "%T %N").split()
        return (line[0], line[1]) if len(line) == 2 else (line[0] if line else "", "")

    def stop(self) -> None:
        # Jobs run under slurmstepd in sessions of their own: cancel them first, or they
        # outlive the daemons (and a job that loops forever runs on for hours).
        if self._procs and all(p.poll() is None for p in self._procs):
            self.run("scancel", "--full", "-p", self.partition, check=False)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.run("squeue", "-h", check=False).strip():
                time.sleep(0.2)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()
        shutil.rmtree(self.short, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
