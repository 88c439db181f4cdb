"""The live loop: gpuwarden run as it runs in production, on a twin cluster whose hardware
alone is SIMULATED, against a real training job. ``gpuwarden demo`` (``scripts/demo.sh``).

What is real, each started by its production command with a production-style config file:
one ``gpuwarden agent`` per node; Debian's ``influxd``; ``dask scheduler`` and two
``dask worker`` processes, which ``gpuwarden analyze run --every`` reaches by address;
``gpuwarden remediate serve`` with HMAC signatures required, acting on a real Slurm
(``slurmctld`` and a ``slurmd`` per node); and a real PyTorch job (gloo, CPU) under
``sbatch``, with the job-side reporter and checkpoint hook.

What is SIMULATED: the nodes' hardware (:mod:`simulation.twin`): NVML, sysfs and the kernel
log, played from a scenario in real time, and the GPU losses that kill the job's processes.
The scenario's faults are known to the twin alone: the findings come from the agents and the
analyze service, and work lost is read from the job's own step log (:mod:`demo.steplog`).

Each *arm* is a full live run on the same scenario and seed: ``reactive`` (the engine only
notifies; the job keeps its checkpoint cadence; Slurm requeues a failed job by itself) and
``proactive`` (the shipped policies).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demo.steplog import WorkLost, work_lost
from gpuwarden.remediation.audit import read_records
from gpuwarden.remediation.policy import DEFAULT_POLICIES
from gpuwarden.simulation.spec import ScenarioSpec, parse_spec
from gpuwarden.simulation.twin.hardware import Twin
from testbed.influxd import LocalInfluxd, free_port
from testbed.jobs.launch import REQUEUE_EXIT, batch_script, task_script
from testbed.slurm import LocalSlurm

ROOT = Path(__file__).resolve().parent.parent
GPUWARDEN = [sys.executable, "-m", "gpuwarden"]
DASK = [str(Path(sys.executable).with_name("dask"))]
#: the loop's declared time compression: one second of the loop stands for a minute of a real
#: cluster (checkpoints every 60 s stand for hourly ones; a 13B job's 276 s save is 4.6 s)
TIME_SCALE = 60.0
SINK_FLUSH_S = 1.0  # the agents' [sink] flush_interval_s


@dataclass(frozen=True)
class Settings:
    """The live loop's knobs. The defaults fit 2 cores: 4 nodes (an agent, a slurmd and, on
    three of them, a training rank each, beside influxd, Dask and the engine)."""

    step_s: float = 1.0
    checkpoint_every_s: float = 60.0
    #: SIMULATED slow storage: seconds added to each checkpoint write (the job's state is a few
    #: hundred kB; a 13B job's synchronous save, 276 s, is 4.6 s at the loop's 60x scale)
    checkpoint_write_s: float = 0.0
    #: the proactive arm saves on its cadence in the background (the ``async_save`` lever:
    #: ``collector.jobside.background_save``); the reactive arm saves synchronously
    background_saves: bool = True
    agent_interval_s: float = 1.0
    xid_follow_s: float = 0.1  # the agents' [xid] follow_s
    analyze_every_s: float = 15.0
    analyze_window_s: float = 120.0
    healthy_after_s: float = 20.0
    silent_after_s: float = 10.0  # ten agent cycles
    #: the agents' sink retries InfluxDB at most this far apart (the product's 30 s at the
    #: loop's scale, like ``silent_after_s``'s 60 s): after an outage a sink must have sent again
    #: before a second analysis, or a node with nothing wrong is named silent twice, confirmed
    sink_backoff_max_s: float = 5.0
    checkpoint_timeout_s: float = 20.0
    #: checkpoint advice at the live time scale: never under 10 s (a compressed 10 minutes),
    #: and StepFun's per-node fault rate (the fleet prior) times the loop's declared time
    #: compression, 60x, and nothing else: the analyze service learns this run's faults from
    #: what it sees in its own store. (Before issue 40 this was 3.1e4, chosen from the
    #: scenario's own fault count: the service was told the run's fault rate.)
    cadence_min_interval_s: float = 10.0
    cadence_prior_scale: float = TIME_SCALE
    model: str = ""  # a failure-risk model trained at the live time scale ("" = none)
    #: the analyze service's [predictor] settings for that model (its time scale)
    predictor: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        # node_silent is confirmed by two analyses running; a sink that waits longer than an
        # analysis interval to send again after an InfluxDB outage is named silent (CI met it
        # once with the product's 30 s against analyses every 15 s: up to about 5 % of outages
        # per node, replayed in tests/test_live_silence.py; any backoff under the interval
        # cannot be seen twice, and the flush is margin)
        if self.sink_backoff_max_s + SINK_FLUSH_S >= self.analyze_every_s:
            raise ValueError(
                f"sink_backoff_max_s ({self.sink_backoff_max_s:g} s) plus a flush "
                f"({SINK_FLUSH_S:g} s) must be under analyze_every_s ({self.analyze_every_s:g} s)"
            )


def placed(spec: ScenarioSpec, seed: int, jitter_s: float = 25.0) -> ScenarioSpec:
    """The scenario's faults placed by ``seed``: each onset moved by up to ``jitter_s`` either
    way, each on its own node of the job (never the spare, the last node, so there is
    somewhere to move to) and a GPU of that node. Seeds then differ where it matters: how a
    fault falls against the job's checkpoints, and where. Seed 0 keeps the file's placement."""
    if seed == 0 or not spec.faults:
        return spec
    rng = random.Random(seed)
    job_nodes = list(range(spec.nodes - 1))
    rng.shuffle(job_nodes)
    faults = []
    for i, f in enumerate(spec.faults):
        lo = f.precursor_s if f.precursor_s > 0 else 0.0
        at = max(lo + 30.0, f.at_s + rng.uniform(-jitter_s, jitter_s))
        node = job_nodes[i % len(job_nodes)]
        faults.append(dataclasses.replace(f, at_s=round(at), node=node,
                                          gpu=rng.randrange(spec.gpus_per_node)))  # fmt: skip
    return dataclasses.replace(spec, faults=tuple(faults))


def reactive_policies() -> list[dict[str, Any]]:
    """The shipped policies with every action but ``notify`` taken out: the engine tells
    people and does nothing else; the job and Slurm recover by themselves."""
    return [{**p, "actions": ["notify"]} for p in DEFAULT_POLICIES]


@dataclass
class Drain:
    node: str
    t: float
    state: str


@dataclass
class ArmResult:
    arm: str
    twin_log: list[Any]
    faults: list[Any]
    started_at: float
    audit: list[dict[str, Any]]
    drains: list[Drain]
    lost: WorkLost
    gpus: int
    analyze_log: str
    engine_log: str

    def xid_to_drain_s(self) -> list[tuple[str, float]]:
        """For each XID the twin wrote: seconds until Slurm showed that node draining, if
        the node was not already out (a drain before the XID is a prediction's, not the
        fast path's). XIDs with no drain after them are left out (the reactive arm)."""
        out = []
        for h in self.twin_log:
            if h.what != "xid":
                continue
            earlier = [d for d in self.drains if d.node == h.node and d.t <= h.t]
            later = [d for d in self.drains if d.node == h.node and d.t > h.t]
            if earlier and (not later or earlier[-1].t >= later[0].t - 1e-9):
                continue
            if later:
                out.append((h.node, later[0].t - h.t))
        return out


class Services:
    """Child processes, each with its log file, stopped in reverse order."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        out = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(list(argv), env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        out.close()
        self.procs.append((name, proc))

    def kill(self, name: str) -> None:
        for n, proc in self.procs:
            if n == name and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def running(self, name: str) -> bool:
        return any(n == name and p.poll() is None for n, p in self.procs)

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def stop(self, name: str | None = None, timeout_s: float = 20.0) -> None:
        chosen = [(n, p) for n, p in reversed(self.procs) if name is None or n == name]
        for _, proc in chosen:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in chosen:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def signals_held(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Stop every part without being cut short: a second Ctrl-C (or a SIGTERM) while the parts
    are being stopped would end the cleanup half way and leave Slurm, the agents and Dask
    running. Such a signal is noted, and raised as :class:`KeyboardInterrupt` once the block is
    done. Outside the main thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if caught:
        raise KeyboardInterrupt(f"signal {caught[0]} while every part was being stopped")


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"live loop: timed out after {timeout_s:.0f} s waiting for {what}")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class LiveArm:
    """One arm of the live loop, in ``work``: start, run the scenario through, stop."""

    def __init__(
        self,
        arm: str,
        spec: ScenarioSpec,
        seed: int,
        work: Path,
        influxd: LocalInfluxd,
        settings: Settings,
        say: Callable[[str], None],
    ) -> None:
        self.arm = arm
        self.spec = spec
        self.seed = seed
        self.work = work
        self.influxd = influxd
        self.s = settings
        self.say = say
        self.db = f"live_{arm}"
        if work.exists():  # a kept --workdir: an old step log or checkpoint would mix in
            shutil.rmtree(work)
        self.services = Services(work / "logs")
        self.twin = Twin(spec, seed, work / "twin")
        self.nodes = self.twin.nodes
        self.job_nodes = len(self.nodes) - 1  # one spare
        self.slurm: LocalSlurm | None = None
        self.drains: list[Drain] = []
        self.relays: dict[str, int] = {}
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.job_id = ""

    # -- starting -----------------------------------------------------------------------------

    def start(self) -> None:
        w = self.work
        (w / "secrets").mkdir(parents=True, exist_ok=True)
        (w / "secrets" / "token").write_text(os.urandom(16).hex() + "\n")
        for name in [*self.nodes, "analyze"]:  # one identity, with its own key, per sender
            (w / "secrets" / f"key-{name}").write_text(os.urandom(32).hex() + "\n")
        (w / "requests").mkdir(exist_ok=True)
        self.influxd.query(f'DROP DATABASE "{self.db}"')  # a kept --workdir's old data
        self.influxd.create_database(self.db)
        self.slurm = LocalSlurm(
            w / "slurm", self.nodes, extra=[f"RequeueExit={REQUEUE_EXIT}"],
            weights={self.nodes[-1]: 20},  # the spare is taken last
        ).start()  # fmt: skip
        self._start_engine()
        self._start_dask()
        self.twin.start()
        for node in self.nodes:
            self._start_agent(node)
        wait_for(lambda: all(listening(p) for p in self.relays.values()), 60, "the agents")
        self._start_analyze()
        self._submit_job()
        self._watcher = threading.Thread(target=self._watch_drains, daemon=True)
        self._watcher.start()

    def _engine_config(self) -> Path:
        w = self.work
        self.engine_port = free_port()
        policies = reactive_policies() if self.arm == "reactive" else list(DEFAULT_POLICIES)
        lines = [
            "[engine]",
            f'listen = "127.0.0.1:{self.engine_port}"',
            f'token_file = "{w}/secrets/token"',
            f'identities_file = "{self._identities()}"',
            f'audit_log = "{w}/audit.jsonl"',
            "dry_run = false",
            'notify_adapter = "webhook"',
            'checkpoint_adapter = "slurm"',
            'node_adapter = "slurm"',
            "approval = []  # nobody watches the live loop: a healthy node returns by itself",
            "tick_s = 1.0",
            "[guards]",
            "max_nodes_out = 2",
            "max_fraction_out = 0.5",
            "cooldown_s = 30.0",
            "actions_per_minute = 30",
            "[slurm]",
            f'conf = "{self.slurm.conf if self.slurm else ""}"',
            f'checkpoint_dir = "{w}/requests"',
            f"checkpoint_timeout_s = {self.s.checkpoint_timeout_s}",
            "[influxdb]",
            f'url = "{self.influxd.url}"',
            f'database = "{self.db}"',
            f'spool_dir = "{w}/engine-spool"',
        ]
        for p in policies:
            lines += ["[[policy]]", f'name = "{p["name"]}"', f"kinds = {json.dumps(p['kinds'])}"]
            for key in ("min_severity", "min_probability"):
                if key in p:
                    lines.append(f"{key} = {json.dumps(p[key])}")
            if "requires" in p:
                lines.append(f"requires = {json.dumps(p['requires'])}")
            if "evidence" in p:
                inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in p["evidence"].items())
                lines.append(f"evidence = {{ {inner} }}")
            lines.append(f"actions = {json.dumps(p['actions'])}")
        path = w / "remediation.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _identities(self) -> Path:
        """Each agent speaks for its own node, the analyze service for analytics' kinds, each
        with a key of its own (docs/SECURITY.md, "Identities and scopes")."""
        w = self.work
        tables = [
            f'[[identity]]\nname = "{node}"\nkind = "agent"\nnode = "{node}"\n'
            f'secret_file = "{w}/secrets/key-{node}"\n'
            for node in self.nodes
        ]
        tables.append(
            f'[[identity]]\nname = "analyze"\nkind = "analytics"\n'
            f'secret_file = "{w}/secrets/key-analyze"\n'
        )
        path = w / "identities.toml"
        path.write_text("\n".join(tables))
        return path

    def _start_engine(self, config: Path | None = None) -> None:
        config = config or self._engine_config()
        self.engine_config = config
        self.services.start("engine", [*GPUWARDEN, "remediate", "--config", str(config), "serve"])
        wait_for(lambda: listening(self.engine_port), 60, "the engine")

    # -- software faults (the tests inject them) ----------------------------------------------

    def stop_engine(self) -> None:
        """Stop the engine as an operator or a crash would (SIGTERM: it finishes what runs)."""
        self.services.stop("engine")

    def start_engine_again(self) -> None:
        """The same engine again: same configuration, same audit log."""
        self._start_engine(self.engine_config)

    def kill_agent(self, node: str) -> None:
        """SIGKILL a node's agent: no flush, no goodbye, as a crash or the OOM killer."""
        self.services.kill(f"agent-{node}")

    def _start_dask(self) -> None:
        self.scheduler_port = free_port()
        self.scheduler = f"tcp://127.0.0.1:{self.scheduler_port}"
        self.services.start("dask-scheduler", [*DASK, "scheduler", "--host", "127.0.0.1",
                            "--port", str(self.scheduler_port), "--no-dashboard"])  # fmt: skip
        wait_for(lambda: listening(self.scheduler_port), 60, "the Dask scheduler")
        env = {**os.environ, "POLARS_MAX_THREADS": "1"}
        for i in range(2):
            self.services.start(f"dask-worker-{i}", [*DASK, "worker", self.scheduler,
                                "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                                "--memory-limit", "2GiB", "--name", f"w{i}"], env)  # fmt: skip
        # both registered before the analyze service starts (it says how many it found, and a
        # worker still starting on a loaded machine would leave it with one for a while)
        from distributed import Client

        with Client(self.scheduler, timeout=60) as client:  # type: ignore[no-untyped-call]
            client.wait_for_workers(2, timeout=120)

    def _start_agent(self, node: str) -> None:
        p = self.twin.paths(node)
        w = self.work
        self.relays[node] = free_port()
        config = w / f"agent-{node}.toml"
        config.write_text(
            "[agent]\n"
            f'cluster = "{self.spec.cluster}"\nnode = "{node}"\n'
            f"interval_s = {self.s.agent_interval_s}\n"
            f'sysfs = "{p.sysfs}"\nprocfs = "/proc"\nkmsg = "{p.kmsg}"\n'
            f'remediation_url = "http://127.0.0.1:{self.engine_port}/v1/findings"\n'
            f'remediation_identity = "{node}"\n'
            f'remediation_hmac_secret_file = "{w}/secrets/key-{node}"\n'
            f'reporter_listen = "127.0.0.1:{self.relays[node]}"\n'
            "[nvml]\n"
            f'backend = "recorded"\nrecording = "{p.nvml}"\nfollow = true\n'
            f'jobmap_dir = "{w}/jobmap"\npod_resources_socket = ""\n'
            f"[xid]\nlookback_s = 0.0\nfollow_s = {self.s.xid_follow_s}\n"
            f"[health]\nhealthy_after_s = {self.s.healthy_after_s}\n"
            f"expected_gpus = {self.spec.gpus_per_node}\n"
            "[sink]\n"
            f'url = "{self.influxd.url}"\ndatabase = "{self.db}"\n'
            f'spool_dir = "{w}/spool-{node}"\nflush_interval_s = {SINK_FLUSH_S}\n'
            f"backoff_max_s = {self.s.sink_backoff_max_s}\n"
        )
        self.services.start(f"agent-{node}", [*GPUWARDEN, "agent", "--config", str(config)])

    def _start_analyze(self) -> None:
        w = self.work
        config = w / "analytics.toml"
        predictor = ""
        if self.s.model:
            predictor = f'[predictor]\nmodel = "{self.s.model}"\n' + "".join(
                f"{k} = {json.dumps(v)}\n" for k, v in self.s.predictor
            )
        config.write_text(
            f'[influxdb]\nurl = "{self.influxd.url}"\ndatabase = "{self.db}"\n'
            f'[dask]\nscheduler = "{self.scheduler}"\n'
            f'[analysis]\ncluster = "{self.spec.cluster}"\n'
            f"window_s = {self.s.analyze_window_s}\n"
            f'spool_dir = "{w}/analytics-spool"\nnodes_per_task = 2\n'
            f"silent_after_s = {self.s.silent_after_s}\n"
            f'[findings]\nurl = "http://127.0.0.1:{self.engine_port}/v1/findings"\n'
            f'identity = "analyze"\nhmac_secret_file = "{w}/secrets/key-analyze"\n'
            f"[cadence]\nprior_scale = {self.s.cadence_prior_scale:g}\n"
            f"min_interval_s = {self.s.cadence_min_interval_s}\n"
            f"lookback_s = {float(self.spec.duration_s)}\n" + predictor
        )
        self.services.start("analyze", [*GPUWARDEN, "analyze", "run", "--config", str(config),
                            "--every", f"{self.s.analyze_every_s:g}s"])  # fmt: skip

    def _submit_job(self) -> None:
        assert self.slurm is not None
        w = self.work
        relays = w / "relays.txt"
        relays.write_text("".join(f"{n} http://127.0.0.1:{p}\n" for n, p in self.relays.items()))
        task = task_script(w / "task.sh", twin_root=self.twin.root, relays=relays,
                           gpus=self.spec.gpus_per_node)  # fmt: skip
        batch = batch_script(w / "train.sh", task=task)
        env = {
            **self.slurm.env(),
            "GW_CKPT_DIR": str(w / "checkpoints"),
            "GW_REQUEST_DIR": str(w / "requests"),
            "GW_STEPLOG": str(w / "steps.jsonl"),
            "GW_CKPT_EVERY_S": str(self.s.checkpoint_every_s),
            "GW_CKPT_WRITE_DELAY_S": str(self.s.checkpoint_write_s),
            "GW_CKPT_ASYNC": "1" if self.arm != "reactive" and self.s.background_saves else "0",
            "GW_STEP_S": str(self.s.step_s),
            "GPUWARDEN_CLUSTER": self.spec.cluster,
        }
        out = subprocess.run(
            ["sbatch", "--parsable", "--requeue", f"-N{self.job_nodes}", "-J", "train",
             "--chdir", str(ROOT), "-o", str(w / "job-%j.out"), str(batch)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        self.job_id = out.stdout.strip()

    # -- watching -----------------------------------------------------------------------------

    def _node_states(self) -> dict[str, str]:
        assert self.slurm is not None
        out = self.slurm.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def _watch_drains(self) -> None:
        """When Slurm first shows each node draining: polled every 50 ms in the ten seconds
        after an XID (the fast path's latency is measured there), every 0.5 s otherwise."""
        out: set[str] = set()
        while not self._watch_stop.is_set():
            now = time.time()
            try:
                states = self._node_states()
            except Exception:  # a slow or stopping slurmctld: try again
                states = {}
            for node, state in states.items():
                draining = state.startswith("drain")
                if draining and node not in out:
                    out.add(node)
                    self.drains.append(Drain(node, now, state))
                elif not draining and node in out and state in ("idle", "mixed", "allocated"):
                    out.discard(node)
            recent = any(h.what == "xid" and now - h.t < 10 for h in self.twin.log)
            self._watch_stop.wait(0.05 if recent else 0.5)

    # -- running ------------------------------------------------------------------------------

    def run(self, schedule: Sequence[tuple[float, Callable[[], None]]] = ()) -> None:
        """Until the scenario has played out, with a progress line every 15 s; ``schedule``
        runs each callable once the twin has played that many seconds (tests inject faults
        in the software this way)."""
        last = 0.0
        todo = sorted(schedule, key=lambda s: s[0])
        while not self.twin.done():
            time.sleep(0.2)
            while todo and self.twin.elapsed() >= todo[0][0]:
                _, action = todo.pop(0)
                what = action.__doc__ or getattr(action, "__name__", "an injected fault")
                self.say(f"{self.arm} t={self.twin.elapsed():.0f} s: {what}")
                action()
            if time.monotonic() - last >= 15.0:
                last = time.monotonic()
                self.say(self.progress())

    def progress(self) -> str:
        lost = work_lost(self.work / "steps.jsonl", step_s=self.s.step_s, gpus=1)
        audit = read_audit(self.work / "audit.jsonl")
        found = sum(r["event"] == "finding" for r in audit)
        acted = [r for r in audit if r["event"] == "action" and r.get("outcome") == "ok"
                 and r.get("action") != "notify"]  # fmt: skip
        out = sorted({d.node for d in self.drains})
        step = lost.steps_done
        return (f"{self.arm:<9} t={self.twin.elapsed():5.0f}/{self.spec.duration_s} s  "
                f"job step {step:4d} (run {max(len(lost.runs), 1)})  findings {found:3d}  "
                f"actions {len(acted):2d}  drained {','.join(out) or '-'}")  # fmt: skip

    def stop(self) -> ArmResult:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self.twin.stop()
        for name in ("analyze",):
            self.services.stop(name)
        if self.slurm is not None:
            self.slurm.stop()
        self.services.stop()
        (self.work / "twin-log.json").write_text(json.dumps({
            "started_at": self.twin.started_at,
            "duration_s": self.spec.duration_s,
            "happened": [dataclasses.asdict(h) for h in self.twin.log],
            "drains": [dataclasses.asdict(d) for d in self.drains],
        }, indent=1))  # fmt: skip
        return ArmResult(
            arm=self.arm,
            twin_log=list(self.twin.log),
            faults=self.twin.faults,
            started_at=self.twin.started_at,
            audit=read_audit(self.work / "audit.jsonl"),
            drains=list(self.drains),
            lost=work_lost(
                self.work / "steps.jsonl",
                step_s=self.s.step_s,
                gpus=self.job_nodes * self.spec.gpus_per_node,
                end=self.twin.started_at + self.spec.duration_s,  # both arms, the same span
            ),
            gpus=self.job_nodes * self.spec.gpus_per_node,
            analyze_log=self.services.log("analyze"),
            engine_log=self.services.log("engine"),
        )


def read_audit(path: Path) -> list[dict[str, Any]]:
    return list(read_records(path))


def twin_scenario(
    name: str,
    duration_s: int,
    faults: list[dict[str, Any]],
    *,
    nodes: int = 4,
    hcas: int = 4,
    links: int = 4,
) -> ScenarioSpec:
    """A scenario shaped like the live loop's (H100 nodes, telemetry only, a simulated job
    that keeps every GPU busy), with the given faults: for tests and benchmarks."""
    return parse_spec(
        {
            "name": name,
            "cluster": "twin",
            "nodes": nodes,
            "gpus_per_node": 8,
            "hcas_per_node": hcas,
            "nvlink_links": links,
            "gpu_model": "H100",
            "duration_s": duration_s,
            "measurements": ["gpu", "gpu_info", "gpu_nvlink", "gpu_event", "ib_port"],
            "jobs": [{"name": "load", "nodes": nodes, "step_time_s": 1.0, "restart_s": 5}],
            "faults": faults,
        }
    )


@dataclass
class LiveLoop:
    spec: ScenarioSpec
    seed: int
    work: Path
    settings: Settings = field(default_factory=Settings)
    say: Callable[[str], None] = print

    def run_arm(
        self,
        arm: str,
        influxd: LocalInfluxd,
        schedule: Callable[[LiveArm], Sequence[tuple[float, Callable[[], None]]]] | None = None,
    ) -> ArmResult:
        """One arm; ``schedule(live)`` may name software faults to inject (tests)."""
        live = LiveArm(arm, self.spec, self.seed, self.work / arm, influxd, self.settings,
                       self.say)  # fmt: skip
        self.current = live
        try:
            live.start()
            self.say(f"{arm}: every part started; the scenario plays for "
                     f"{self.spec.duration_s} s")  # fmt: skip
            live.run(schedule(live) if schedule is not None else ())
        finally:
            with signals_held():
                result = live.stop()
        return result
