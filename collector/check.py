"""``gpuwarden check``: an active node check, before a node takes work or returns to service.

Runs the configured probes (``[check] probes``) and exits 0 when none failed, 1 when one did,
with a one-screen summary (``--json``: ``{"node", "ok", "probes": [{"name", "status",
"detail", "seconds"}]}``, ``status`` one of ``pass``, ``fail``, ``unavailable``). A probe that
cannot run here (no GPU, no ``dcgmi``, no torch, no InfiniBand) says ``unavailable`` and why.
The command fails closed: ``unavailable`` is a failure for every probe the configuration asks
for, except those listed in ``[check] optional`` (by default ``infiniband``, ``dcgm``,
``gpu_matmul`` and ``allreduce``, which need an HCA, DCGM, torch or a GPU), so a node whose
GPUs NVML cannot see is not healthy. The probes run one after another; one not started by
``[check] deadline_s`` (45 s) fails as "not run", and one still running then is cut (its
timeouts are cut to what is left; one that cannot be cut is failed and left behind 2 s
later), so the defaults, with ``--report``'s ``report_timeout_s`` (4 s), end inside slurmd's 60 s
``HealthCheckProgram`` limit. The agent's own gate, ``[health] check_probes``, runs the same
strict check.

* ``gpu_count``: NVIDIA GPUs on the PCI bus, NVML's count and ``[health] expected_gpus`` agree
  (:mod:`collector.gpucount`), and every GPU NVML lists runs the same driver;
* ``infiniband``: every port (``<sysfs>/class/infiniband``) is ACTIVE and LinkUp, at
  ``[check] ib_rate_gbps`` or faster when set; InfiniBand controllers on the PCI bus (class
  0x0207) with no port fail (their driver did not come up), none at all is ``unavailable``;
  with ``[check] expected_hcas`` set, fewer physical InfiniBand devices with ports fail (one
  HCA of eight gone from the bus leaves seven that pass), and none at all fails too; only the
  devices ``[infiniband] hcas`` lists are judged, when it lists any;
* ``disk``: each of ``[check] disk_paths`` (local scratch, the shared filesystem) takes a
  1 MiB write, fsync and read back within ``disk_timeout_s`` (a hung NFS mount fails here
  instead of hanging the check);
* ``dcgm``: ``dcgmi diag -r <dcgm_level>`` when DCGM is installed;
* ``gpu_matmul``: a matrix product on every GPU checked against the CPU's, with torch and CUDA;
* ``allreduce``: two processes all-reduce a tensor through ``torch.distributed`` (NCCL on
  GPUs, gloo on CPU when there is none, so the code path runs on any machine with torch).

Slurm runs it as ``HealthCheckProgram`` or in a prolog, Kubernetes as an init container
(examples in ``deploy/``).

``--report`` also writes one ``node_check`` point per probe to InfluxDB (the agent's
``[sink]``) and posts one finding to the engine (the agent's ``remediation_url``, signed as
the fast path is): ``node_check_failed`` (critical, the failed probes as evidence) when a probe
failed, else ``node_healthy`` with ``check = "pass"`` and ``checked_ns`` in its evidence, which
is what the engine needs before it returns a node it took out (``[engine] return_requires``).
The agent runs the same check (``[health] check_probes``) before it calls a node healthy.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from gpuwarden.collector.config import AgentConfig, load_config
from gpuwarden.collector.gpucount import bus_gpus, bus_hcas
from gpuwarden.collector.sources.infiniband import discover
from gpuwarden.core.cli import UsageError, add_common, config_path, configure_logging
from gpuwarden.core.config import check_secrets
from gpuwarden.core.errors import GpuwardenError
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.poster import FindingPoster
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.sink import InfluxSink

PASS, FAIL, UNAVAILABLE = "pass", "fail", "unavailable"
T = TypeVar("T")


@dataclass
class Result:
    name: str
    status: str
    detail: str
    seconds: float = 0.0


def _nvml(config: AgentConfig) -> tuple[int, set[str]] | str:
    """NVML's device count and the drivers it reports, or why NVML cannot be read."""
    n = config["nvml"]
    try:
        backend: Any
        if n["backend"] == "recorded":
            from gpuwarden.collector.nvml.recorded import RecordedBackend

            backend = RecordedBackend(n["recording"])
        else:
            from gpuwarden.collector.nvml.real import PynvmlBackend

            backend = PynvmlBackend()
        backend.init()
        backend.begin_cycle()
        try:
            count = int(backend.call(None, "nvmlDeviceGetCount"))
            drivers = {str(backend.call(None, "nvmlSystemGetDriverVersion"))}
        finally:
            backend.shutdown()
    except Exception as exc:  # no driver, no library, a broken recording
        return f"NVML not readable: {type(exc).__name__}: {exc}"
    return count, drivers


def probe_gpu_count(config: AgentConfig) -> Result:
    expected = int(config["health"]["expected_gpus"])
    bus = bus_gpus(config["agent"]["sysfs"])
    nvml = _nvml(config)
    if not bus and not expected:
        why = nvml if isinstance(nvml, str) else f"NVML lists {nvml[0]}"
        return Result(
            "gpu_count", UNAVAILABLE, f"no NVIDIA GPU on the PCI bus, none expected ({why})"
        )
    # no NVIDIA device on the bus at all: the bus is not readable here (a sysfs that is not
    # the host's, a simulated node), as the agent's gpu_missing rule treats it
    parts = [f"{len(bus)} on the PCI bus" if bus else "PCI bus not readable here"]
    counts = [len(bus)] if bus else []
    if isinstance(nvml, str):
        return Result("gpu_count", FAIL, f"{parts[0]}, but {nvml}")
    counts.append(nvml[0])
    parts.append(f"{nvml[0]} seen by NVML (driver {', '.join(sorted(nvml[1]))})")
    if expected:
        counts.append(expected)
        parts.append(f"{expected} expected")
    ok = len(set(counts)) == 1 and len(nvml[1]) == 1
    return Result("gpu_count", PASS if ok else FAIL, "; ".join(parts))


def probe_infiniband(config: AgentConfig) -> Result:
    root = os.path.join(config["agent"]["sysfs"], "class", "infiniband")
    # the devices the agent watches ([infiniband] hcas; [] = all) are the ones judged here
    only = frozenset(config["infiniband"]["hcas"])
    ports = discover(root, only)
    where = root  # a name there that is not the node's is said, not taken for a lost driver
    if only:
        where += f" (of [infiniband] hcas: {', '.join(sorted(only)[:8])})"
    expected = int(config["check"]["expected_hcas"])
    want_n = f"; {expected} expected ([check] expected_hcas)" if expected else ""
    if not ports:
        # InfiniBand controllers on the bus but no port: the driver did not come up, or the
        # HCAs failed. A failure, not "cannot run", so [check] optional does not pass it; nor
        # does it pass a node with none at all that was said to have some
        hcas = bus_hcas(config["agent"]["sysfs"])
        if hcas:
            return Result("infiniband", FAIL, f"{len(hcas)} InfiniBand controllers on the PCI "
                          f"bus ({', '.join(hcas[:4])}), but no port under {where}: their "
                          f"driver (mlx5_ib) is not loaded, or they failed{want_n}")  # fmt: skip
        status = FAIL if expected else UNAVAILABLE
        return Result("infiniband", status, f"no InfiniBand port under {where}, and no "
                      f"InfiniBand controller on the PCI bus{want_n}")  # fmt: skip
    want = float(config["check"]["ib_rate_gbps"])
    bad = []
    for p in ports:

        def read(name: str, port: Any = p) -> str:
            # a file caught while it is rewritten reads empty: look again before judging
            for attempt in range(3):
                try:
                    text = Path(port.path, name).read_text().strip()
                except OSError:
                    text = ""
                if text:
                    return text
                time.sleep(0.02 * (attempt + 1))
            return ""

        state, phys, rate = read("state"), read("phys_state"), read("rate")
        speed = float(rate.split()[0]) if rate[:1].isdigit() else 0.0
        if not state.startswith("4") or not phys.startswith("5") or (want and speed < want):
            bad.append(f"{p.hca}/{p.port}: {state or '?'}, {phys or '?'}, {rate or '?'}")
    said = [f"{len(bad)} of {len(ports)} ports down or slow: " + "; ".join(bad)] if bad else []
    # physical devices: an SR-IOV virtual function (device/physfn) comes and goes with
    # sriov_numvfs and with pods that take it, and is not a card that can fall off the bus
    cards = {
        p.hca for p in ports if not os.path.exists(os.path.join(root, p.hca, "device", "physfn"))
    }
    if len(cards) < expected:  # more is not a fault: a RoCE bond not formed yet, a new card
        said.insert(0, f"{len(cards)} of the {expected} InfiniBand devices expected have "
                    "ports ([check] expected_hcas)")  # fmt: skip
    if said:
        return Result("infiniband", FAIL, "; ".join(said))
    at = f" at >= {want:g} Gb/s" if want else ""
    return Result("infiniband", PASS, f"{len(ports)} ports ACTIVE and LinkUp{at}")


def _bounded(
    timeout_s: float, work: Callable[[], T], started: list[threading.Thread] | None = None
) -> tuple[str, T | str]:
    """Run ``work`` on a thread, in this context (a strict check's deadline with it), for at
    most ``timeout_s``: ``("done", its answer)``, ``("raised", the error)`` or ``("late",
    why)``. A call still running is left behind (a daemon thread): the check still answers,
    in time, whatever the call does (an NVML init that hangs, a server that trickles)."""
    out: list[tuple[str, T | str]] = []
    ctx = contextvars.copy_context()

    def run() -> None:
        try:
            out.append(("done", ctx.run(work)))
        except BaseException as exc:  # SystemExit too: it ends this thread only, said here
            out.append(("raised", f"{type(exc).__name__}: {exc}"))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    if started is not None:
        started.append(t)
    t.join(max(0.0, timeout_s))
    if not out:
        return "late", f"no answer within {timeout_s:g} s"
    return out[0]


#: how long past the deadline a probe that cuts itself has to say so, before it is left behind
GRACE_S = 2.0

#: the monotonic time a strict check ends its probes by (``[check] deadline_s``); None: no end
_ENDS: contextvars.ContextVar[float | None] = contextvars.ContextVar("check_ends", default=None)


def _timeout(setting: float) -> tuple[float, str]:
    """A probe's own timeout cut to what is left of a strict check's ``deadline_s`` (so a
    probe started late cannot carry the check past slurmd's limit), and which one it is."""
    ends = _ENDS.get()
    if ends is None or setting <= ends - time.monotonic():
        return setting, f"{setting:g} s"
    left = max(0.0, ends - time.monotonic())
    return left, f"{left:.1f} s, what was left of the check's deadline_s"


def probe_disk(config: AgentConfig) -> Result:
    c = config["check"]
    paths = list(c["disk_paths"])
    if not paths:
        return Result("disk", UNAVAILABLE, "no [check] disk_paths")
    payload = os.urandom(1 << 20)
    problems: list[str] = []
    fine: list[str] = []
    for path in paths:

        def io(path: str = path) -> str:
            t0 = time.monotonic()
            with tempfile.NamedTemporaryFile(dir=path, prefix=".gpuwarden-check-") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
                fh.seek(0)
                if fh.read() != payload:
                    raise OSError("read back differs from what was written")
            return f"{path} {time.monotonic() - t0:.3f} s"

        key = f"disk:{path}"
        with _BEHIND_LOCK:
            if _still_running(key):
                problems.append(f"{path}: an earlier write there has not returned yet")
                continue
            threads: list[threading.Thread] = []
            _LEFT_BEHIND[key] = threads
        state, said = _bounded(_timeout(float(c["disk_timeout_s"]))[0], io, threads)
        ok = state == "done"
        (fine if ok else problems).append(str(said) if ok else f"{path}: {said}")
    if problems:
        return Result("disk", FAIL, "; ".join(problems))
    return Result("disk", PASS, "1 MiB written, fsynced, read back: " + ", ".join(fine))


def probe_dcgm(config: AgentConfig) -> Result:
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        return Result("dcgm", UNAVAILABLE, "dcgmi not installed (NVIDIA DCGM)")
    level = int(config["check"]["dcgm_level"])
    timeout, within = _timeout(float(config["check"]["probe_timeout_s"]))
    try:
        done = subprocess.run(
            [dcgmi, "diag", "-r", str(level)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Result("dcgm", FAIL, f"dcgmi diag -r {level} did not finish in {within}")
    last = (done.stdout.strip().splitlines() or [""])[-1][:200]
    return Result("dcgm", PASS if done.returncode == 0 else FAIL,
                  f"dcgmi diag -r {level}: exit {done.returncode} {last}")  # fmt: skip


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def probe_gpu_matmul(config: AgentConfig) -> Result:
    torch = _torch()
    if torch is None:
        return Result("gpu_matmul", UNAVAILABLE, "torch not installed")
    if not torch.cuda.is_available():
        return Result("gpu_matmul", UNAVAILABLE, "torch sees no CUDA GPU")
    a = torch.randn(1024, 1024, dtype=torch.float32)
    b = torch.randn(1024, 1024, dtype=torch.float32)
    want = a @ b
    bad = []
    for i in range(torch.cuda.device_count()):
        got = (a.to(f"cuda:{i}") @ b.to(f"cuda:{i}")).cpu()
        if not torch.allclose(got, want, rtol=1e-3, atol=1e-2):
            bad.append(str(i))
    n = torch.cuda.device_count()
    if bad:
        return Result("gpu_matmul", FAIL, f"wrong product on GPU {', '.join(bad)} of {n}")
    return Result("gpu_matmul", PASS, f"1024x1024 fp32 product right on {n} GPUs")


_ALLREDUCE = """
import os, sys, torch, torch.distributed as dist
cuda = torch.cuda.is_available() and torch.cuda.device_count() >= 2
dist.init_process_group("nccl" if cuda else "gloo")
rank = dist.get_rank()
t = torch.ones(1 << 20, device=f"cuda:{rank}" if cuda else "cpu")
dist.all_reduce(t)
ok = bool((t == dist.get_world_size()).all())
print(("nccl" if cuda else "gloo"), ok)
dist.destroy_process_group()
sys.exit(0 if ok else 3)
"""


def probe_allreduce(config: AgentConfig) -> Result:
    if _torch() is None:
        return Result("allreduce", UNAVAILABLE, "torch not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ALLREDUCE],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    timeout, within = _timeout(float(config["check"]["probe_timeout_s"]))
    ends = time.monotonic() + timeout  # one end for both ranks, not a timeout each
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.0, ends - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return Result("allreduce", FAIL, f"all-reduce did not finish in {within}")
        outs.append((p.returncode, out.strip(), err.strip().splitlines()[-1:] or [""]))
    if all(rc == 0 for rc, _, _ in outs):
        backend = outs[0][1].split()[0]
        return Result("allreduce", PASS, f"2 ranks, 4 MiB all-reduced right over {backend}")
    said = [f"rank {i}: exit {rc} {out} {err[0]}" for i, (rc, out, err) in enumerate(outs)]
    return Result("allreduce", FAIL, "; ".join(said))


PROBES: dict[str, Callable[[AgentConfig], Result]] = {
    "gpu_count": probe_gpu_count,
    "infiniband": probe_infiniband,
    "disk": probe_disk,
    "dcgm": probe_dcgm,
    "gpu_matmul": probe_gpu_matmul,
    "allreduce": probe_allreduce,
}


def run_checks(config: AgentConfig, names: list[str], *, strict: bool = False) -> list[Result]:
    """Run ``names`` in turn. ``strict`` (``gpuwarden check`` and the agent's gate): a probe
    asked for that cannot run fails unless ``[check] optional`` lists it, a probe not started
    by ``[check] deadline_s`` fails as not run, and a probe's own timeouts are cut to what is
    left of it; one that cannot be cut (NVML's init, the matrix product: in this process) is
    waited for until the deadline and :data:`GRACE_S`, then failed and left behind."""
    c = config["check"]
    optional = set(c["optional"])
    started = time.monotonic()
    token = _ENDS.set(started + float(c["deadline_s"]) if strict else None)
    try:
        return _run_each(config, names, strict, optional, started)
    finally:
        _ENDS.reset(token)


def _run_each(
    config: AgentConfig, names: list[str], strict: bool, optional: set[str], started: float
) -> list[Result]:
    c = config["check"]
    deadline = float(c["deadline_s"])
    out = []
    for name in names:
        t0 = time.monotonic()
        if strict and t0 - started > deadline:
            out.append(Result(name, FAIL, f"not run: the check passed its deadline_s "
                              f"({deadline:g} s)"))  # fmt: skip
            continue
        r = _strict_probe(config, name, started + deadline - t0) if strict else _probe(config, name)
        if strict and r.status == UNAVAILABLE and name not in optional:
            r = Result(name, FAIL, f"could not run: {r.detail} (asked for and not in "
                       "[check] optional)")  # fmt: skip
        r.seconds = round(time.monotonic() - t0, 3)
        out.append(r)
    return out


def _probe(config: AgentConfig, name: str) -> Result:
    try:
        return PROBES[name](config)
    except Exception as exc:  # a probe's own bug is a failed check, not a crash
        return Result(name, FAIL, f"the probe failed: {type(exc).__name__}: {exc}")


#: the thread each probe (or disk path) last ran on, by name: one still running is not
#: started again (a hung probe, a hung mount, would pile up one thread a gate run)
_LEFT_BEHIND: dict[str, list[threading.Thread]] = {}
_BEHIND_LOCK = threading.Lock()


def _strict_probe(config: AgentConfig, name: str, left_s: float) -> Result:
    """The probe, waited for until the deadline and :data:`GRACE_S` whether or not its own
    timeouts can cut it (NVML's init and the matrix product run in this process; GRACE_S lets
    one that cuts itself, a killed dcgmi, say so first). One left behind is not started again
    while it runs (the agent's gate runs the check again and again): that check fails it."""
    with _BEHIND_LOCK:  # two checks at once (the gate's, overlapping) start it once
        if _still_running(name):
            return Result(name, FAIL, "still running since an earlier check stopped waiting "
                          "for it; not started again")  # fmt: skip
        threads: list[threading.Thread] = []
        _LEFT_BEHIND[name] = threads
    state, got = _bounded(left_s + GRACE_S, partial(_probe, config, name), threads)
    if state == "done":
        assert isinstance(got, Result)
        return got
    if state == "raised":
        return Result(name, FAIL, f"the probe failed: {got}")
    return Result(name, FAIL, f"did not finish by the check's deadline_s "
                  f"({float(config['check']['deadline_s']):g} s); left running")  # fmt: skip


def _still_running(key: str) -> bool:
    """Whether the work last started under ``key`` is still running (or about to start)."""
    threads = _LEFT_BEHIND.get(key)
    return threads is not None and (not threads or threads[0].is_alive())


def passed(results: list[Result]) -> bool:
    return all(r.status != FAIL for r in results)


def check_points(cluster: str, node: str, results: list[Result], now_ns: int) -> list[Point]:
    """One ``node_check`` point per probe."""
    return [
        Point(
            "node_check",
            {"cluster": cluster, "node": node, "probe": r.name, "status": r.status},
            {
                "passed_active": r.status != FAIL,
                "duration_s": float(r.seconds),
                "detail": r.detail[:500],
            },
            now_ns,
        )
        for r in results
    ]


def check_finding(cluster: str, node: str, results: list[Result], now_ns: int) -> Finding:
    """``node_check_failed`` (critical) when a probe failed, else ``node_healthy`` carrying
    the passing check (``check = "pass"``, ``checked_ns``) the engine asks for."""
    failed = [r for r in results if r.status == FAIL]
    probes = {r.name: r.status for r in results}
    subject = {"cluster": cluster, "node": node}
    if failed:
        reason = "; ".join(f"{r.name}: {r.detail}" for r in failed)
        return Finding(
            kind="node_check_failed", subject=subject, severity=Severity.CRITICAL, time_ns=now_ns,
            evidence={"check": "fail", "checked_ns": now_ns, "probes": probes,
                      "failed": [r.name for r in failed]},
            confidence=1.0, summary=f"node check failed: {reason}"[:300], source="check",
        )  # fmt: skip
    ran = [r.name for r in results if r.status == PASS]
    return Finding(
        kind="node_healthy", subject=subject, severity=Severity.INFO, time_ns=now_ns,
        evidence={"check": "pass", "checked_ns": now_ns, "probes": probes},
        confidence=1.0, summary=f"{node}: node check passed ({', '.join(ran) or 'no probe ran'})",
        source="check", bucket_s=60,
    )  # fmt: skip


def report(
    config: AgentConfig,
    node: str,
    results: list[Result],
    now_ns: int,
    budget: float | None = None,
) -> str:
    """Post the finding to the engine and write the results to InfluxDB, within ``budget``
    (default ``[check] report_timeout_s``; ``main`` passes what reading the secret files
    left of it) in all, however the two answer (a server that trickles, a resolver
    that hangs: the report runs on a thread the check stops waiting for). The probes had
    ``deadline_s``: together they end inside slurmd's limit. What was done, as far as it got;
    what InfluxDB did not take stays in the check's own spool for the next ``--report``."""
    setting = float(config["check"]["report_timeout_s"])
    budget = setting if budget is None else budget
    within = f"[check] report_timeout_s ({budget:g} s)"
    if budget != setting:  # what reading the secret files left of it
        within = f"what was left of [check] report_timeout_s ({budget:g} of {setting:g} s)"
    done: list[str] = []
    posters: list[FindingPoster] = []
    work = partial(_report, config, node, results, now_ns, budget, within, done, posters)
    state, said = _bounded(budget, work)
    if state == "done":
        return "; ".join(done)
    if state == "late":
        said = f"not finished within {within}"
    if posters and posters[0].posted and not any("posted to" in d for d in done):
        done.append(f"{'node_check_failed' if not passed(results) else 'node_healthy'} "
                    f"posted to {posters[0].url}")  # fmt: skip
    return "; ".join([*done, f"the report stopped: {said}"])


def _report(
    config: AgentConfig,
    node: str,
    results: list[Result],
    now_ns: int,
    budget: float,
    within: str,
    done: list[str],
    posters: list[FindingPoster],
) -> None:
    ends = time.monotonic() + budget

    def left() -> float:
        return max(0.0, ends - time.monotonic())

    cluster = str(config["agent"]["cluster"])
    a = config["agent"]
    finding = check_finding(cluster, node, results, now_ns)
    # the engine first (a passing check is what returns the node), on its own thread while
    # InfluxDB is written
    poster = config.fast_path_poster(node, timeout_s=budget)
    if poster is not None:
        posters.append(poster)
        poster.post(finding)
    # a spool of its own beside the agent's (the running agent holds its spool's lock), with
    # the points on disk before the first send (no write-behind), so a report cut off
    # mid-send leaves them for the next one; each request inside a quarter of the budget.
    # With no [sink] spool_dir, a temporary one (not the working directory: slurmd's)
    spool = config.sink.spool_dir
    own = f"{spool.rstrip('/')}-check" if spool else tempfile.mkdtemp(prefix="gpuwarden-check-")
    sink = InfluxSink(replace(config.sink, spool_dir=own,
                              timeout_s=min(config.sink.timeout_s, budget / 4),
                              spool_write_behind_s=0.0))  # fmt: skip
    points = check_points(cluster, node, results, now_ns)
    try:
        sink.write_points(points)
        sink.flush(timeout_s=left() / 2)  # the rest: the close, the engine's answer
    finally:
        sink.close(timeout_s=0.0)
    stats = sink.stats()
    if stats.points_written == len(points):
        done.append(f"{len(points)} node_check points written")
    elif stats.points_rejected:  # InfluxDB said no (a field type conflict, a redirect)
        done.append(f"{stats.points_rejected} of {len(points)} node_check points REFUSED "
                    "by InfluxDB")  # fmt: skip
    else:
        done.append(f"{len(points)} node_check points spooled" + ("" if spool else f" in {own}"))
    if poster is not None:
        poster.close(timeout_s=left() / 2)  # it may wait twice: for the queue, then the try
        if poster.posted:
            done.append(f"{finding.kind} posted to {poster.url}")
        else:
            done.append(f"{finding.kind} NOT delivered to {a['remediation_url']} within "
                        f"{within}")  # fmt: skip


#: what ``--report`` reads: the sink's credentials and the fast path's
REPORT_SECRETS = (
    "sink.password_file",
    "sink.token_file",
    "agent.remediation_token_file",
    "agent.remediation_hmac_secret_file",
    "agent.remediation_key_file",
)


def _secrets_read(config: AgentConfig, budget: float) -> float:
    """Read ``--report``'s secret files within ``budget`` (a bounded thread: a secret on a
    hung network mount must not hold the check past slurmd's limit, nor before the probes).
    ``budget`` when they are read and good; 0.0, said on stderr, when the report is off (the
    verdict stands either way)."""

    def read() -> str:  # "" when every file is read and good, else what is wrong, as said
        try:
            check_secrets(config.sections, only=REPORT_SECRETS)
        except GpuwardenError as exc:
            return str(exc)
        return ""

    state, said = _bounded(budget, read)
    if state == "done" and not said:
        return budget
    if state == "late":
        said = f"its secret files were not read within [check] report_timeout_s ({budget:g} s)"
    print(f"gpuwarden check: the results will not be reported: {said}", file=sys.stderr)
    return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpuwarden check", description=__doc__.split("\n")[0])
    add_common(ap, config_help="the agent's TOML (its [check], [health], [nvml], sysfs)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--probes", help="comma-separated, instead of [check] probes")
    ap.add_argument(
        "--report",
        action="store_true",
        help="also write the results to InfluxDB and post the finding to the engine",
    )
    args = ap.parse_args(argv)
    configure_logging(args)
    try:
        config = load_config(config_path(args))
    except (GpuwardenError, UsageError) as exc:
        print(f"gpuwarden check: {exc}", file=sys.stderr)
        return 2
    given = args.probes.split(",") if args.probes is not None else config["check"]["probes"]
    names = [n.strip() for n in given if n.strip()]  # "gpu_count, disk," as well
    if not names:  # "healthy" after checking nothing would fail open
        print("gpuwarden check: no probes to run ([check] probes or --probes)", file=sys.stderr)
        return 2
    unknown = sorted(set(names) - set(PROBES))
    if unknown:
        print(f"gpuwarden check: unknown probes {unknown}; known: {sorted(PROBES)}",
              file=sys.stderr)  # fmt: skip
        return 2
    report_s = float(config["check"]["report_timeout_s"])
    if args.report:  # its secret files, read before the probes run (not after 45 s)
        started = time.monotonic()
        report_s = _secrets_read(config, report_s)
        args.report = report_s > 0.0
        report_s -= time.monotonic() - started  # the report's budget covers the read too
    results = run_checks(config, names, strict=True)
    ok = passed(results)
    node = config["agent"]["node"] or socket.gethostname()
    if args.report:
        try:
            said = report(config, node, results, time.time_ns(), max(0.0, report_s))
            print(f"gpuwarden check: {said}", file=sys.stderr)
        except (GpuwardenError, OSError) as exc:  # the verdict stands; the report is extra
            print(f"gpuwarden check: the results were not reported: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps({"node": node, "ok": ok, "probes": [asdict(r) for r in results]},
                         indent=2))  # fmt: skip
    else:
        for r in results:
            print(f"{r.status.upper():<12} {r.name:<11} {r.detail}  ({r.seconds:.2f} s)")
        print(f"{node}: {'healthy' if ok else 'NOT healthy'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
