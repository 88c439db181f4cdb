"""The twin cluster's hardware: a scenario played in real time onto simulated GPU nodes.

Every tick (the scenario's ``interval_s``, taken as real seconds: a live scenario is written
at the time scale it runs at), for every node, the twin writes what its hardware would show:

* ``nvml.json``: the node's NVML answers (:mod:`.nvml`), which the node's real agent reads
  with ``[nvml] backend = "recorded"`` and ``follow = true``, and NVML's critical-XID events;
* ``sys/``: its InfiniBand ports and host sensors (:mod:`.sysfs`);
* ``kmsg.log``: the kernel log, which gets the driver's ``NVRM: Xid`` line at a fault's onset.

Processes bind to a node's GPUs by writing their pid into ``gpu-procs/`` (what opening the
device does on a real node; :func:`bind`); the twin lists them in NVML's process list, so the
agent attributes them to their job through the real ``/proc``, and shows their GPUs busy and
the others idle. A fatal fault kills the processes bound to its node when it starts, and any
that bind there while it lasts, as a GPU that fell off the bus kills the CUDA processes on it:
a training job breaks there as it would in production, and its scheduler sees the same.

What the twin did is kept in :attr:`Twin.log` (each XID line's write time, each kill), for the
report and for measuring how fast the rest of the system reacts. The scenario's faults are
ground truth: the twin knows them, nothing else in the live loop may.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from gpuwarden.collector.nvml.recorded import FORMAT
from gpuwarden.simulation.faulttypes import Fault
from gpuwarden.simulation.generator import NS, ScenarioGenerator
from gpuwarden.simulation.spec import ScenarioSpec
from gpuwarden.simulation.twin.nvml import NodeNvml, driver_text, xid_event, xid_line
from gpuwarden.simulation.twin.sysfs import write_host, write_ports

log = logging.getLogger(__name__)

#: ticks whose NVML events stay in a node's file, so an agent cycle between writes misses none
EVENT_TICKS = 8


def bind(proc_dir: Path, pid: int, gpus: list[int]) -> None:
    """Bind process ``pid`` to ``gpus`` of the node whose ``gpu-procs`` directory this is."""
    proc_dir.mkdir(parents=True, exist_ok=True)
    tmp = proc_dir / f".{pid}.tmp"
    tmp.write_text(",".join(map(str, gpus)))
    tmp.replace(proc_dir / str(pid))


@dataclass(frozen=True)
class Happened:
    """One thing the twin did: ``what`` is ``xid``, ``kill``, ``fault_on`` or ``fault_off``."""

    t: float  # wall-clock seconds (time.time())
    tick: int
    node: str
    what: str
    detail: str


@dataclass(frozen=True)
class NodePaths:
    root: Path

    @property
    def nvml(self) -> Path:
        return self.root / "nvml.json"

    @property
    def sysfs(self) -> Path:
        return self.root / "sys"

    @property
    def kmsg(self) -> Path:
        return self.root / "kmsg.log"

    @property
    def gpu_procs(self) -> Path:
        return self.root / "gpu-procs"


class Twin:
    def __init__(self, spec: ScenarioSpec, seed: int, root: Path) -> None:
        self.spec = spec
        self.gen = ScenarioGenerator(spec, seed)
        self.root = root
        self.nodes = list(self.gen.node_names)
        g = spec.gpus_per_node
        self.nvml = {
            node: NodeNvml(
                g,
                spec.nvlink_links,
                self.gen.profile,
                [self.gen._uuid(n * g + i) for i in range(g)],
                serial_base=1_650_124_000_000 + n * 100,
            )
            for n, node in enumerate(self.nodes)
        }
        self.ticks = spec.duration_s // spec.interval_s
        self.log: list[Happened] = []
        self.started_at = 0.0
        self.tick = -1
        self._events: dict[str, list[tuple[int, list[int]]]] = {n: [] for n in self.nodes}
        self._info: dict[str, dict[int, dict[str, Any]]] = {n: {} for n in self.nodes}
        self._frames = self._tick_frames()
        self._head: tuple[int, dict[str, pl.DataFrame]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        for node in self.nodes:
            p = self.paths(node)
            p.gpu_procs.mkdir(parents=True, exist_ok=True)
            p.kmsg.touch()

    @property
    def faults(self) -> list[Fault]:
        """The scenario's faults: ground truth, for the report only."""
        return list(self.gen.faults)

    def paths(self, node: str) -> NodePaths:
        return NodePaths(self.root / "nodes" / node)

    # -- running ------------------------------------------------------------------------------

    def start(self) -> None:
        """Write the first tick (so the agents find hardware), then play the rest live."""
        self.started_at = time.time()
        self._write_tick(0)
        self._thread = threading.Thread(target=self._run, daemon=True, name="twin")
        self._thread.start()

    def _run(self) -> None:
        for k in range(1, self.ticks):
            due = self.started_at + k * self.spec.interval_s
            if self._stop.wait(max(0.0, due - time.time())):
                return
            try:
                self._write_tick(k)
            except Exception:  # the hardware must keep ticking: say it, carry on
                log.exception("twin tick %d failed", k)

    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def elapsed(self) -> float:
        return time.time() - self.started_at

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- one tick -----------------------------------------------------------------------------

    def _tick_frames(self) -> Iterator[tuple[int, dict[str, pl.DataFrame]]]:
        """Each tick's frames, in order, from the generator's chunks."""
        dt_ns = self.spec.interval_s * NS
        for chunk in self.gen.chunks(ticks_per_chunk=30):
            parts: dict[str, dict[Any, pl.DataFrame]] = {
                m: dict(df.partition_by("time", as_dict=True)) for m, df in chunk.items()
            }
            times = sorted({t for p in parts.values() for (t,) in p})
            for t in times:
                k = (int(t) - self.spec.start_ns) // dt_ns
                yield k, {m: p[(t,)] for m, p in parts.items() if (t,) in p}

    def _frames_at(self, k: int) -> dict[str, pl.DataFrame]:
        """The frames of tick ``k`` (ticks without any frame: empty)."""
        frames: dict[str, pl.DataFrame] = {}
        while True:
            if self._head is None:
                self._head = next(self._frames, None)
            head = self._head
            if head is None or head[0] > k:
                return frames
            self._head = None
            if head[0] == k:
                return head[1]

    def _write_tick(self, k: int) -> None:
        with self._lock:
            self.tick = k
            frames = self._frames_at(k)
            by_node = {m: dict(df.partition_by("node", as_dict=True)) for m, df in frames.items()}
            t_s = float(k * self.spec.interval_s)
            for n, node in enumerate(self.nodes):
                self._node_tick(k, t_s, n, node, {m: p.get((node,)) for m, p in by_node.items()})

    def _node_tick(
        self, k: int, t_s: float, n: int, node: str, frames: dict[str, pl.DataFrame | None]
    ) -> None:
        paths = self.paths(node)
        procs = self._bound(paths.gpu_procs)
        broken = [f for f in self.gen.faults if f.node == n and f.fatal and f.active(t_s)]
        self._fault_edges(k, t_s, n, node)
        events = frames.get("gpu_event")
        if events is not None:
            for ev in events.iter_rows(named=True):
                self._xid(k, node, paths, int(ev["gpu"]), int(ev["xid_code"]), procs)
        if broken:
            for pid in sorted({pid for gpu_procs in procs.values() for pid, _ in gpu_procs}):
                self._kill(k, node, pid, broken[0])
            procs = {}
        rows = {}
        gpu = frames.get("gpu")
        if gpu is not None:
            for row in gpu.iter_rows(named=True):
                g = int(row["gpu"])
                rows[g] = row if procs.get(g) else _idle(row, self.gen.profile)
        links = {}
        nvl = frames.get("gpu_nvlink")
        if nvl is not None:
            for row in nvl.iter_rows(named=True):
                links[(int(row["gpu"]), int(row["link"]))] = row
        info = frames.get("gpu_info")
        if info is not None:
            for row in info.iter_rows(named=True):
                self._info[node][int(row["gpu"])] = row
        answers = self.nvml[node].answers(rows, links, self._info[node], procs)
        self._write_nvml(paths.nvml, k, answers, self._events[node])
        ib = frames.get("ib_port")
        if ib is not None:
            write_ports(paths.sysfs, {str(r["hca"]): r for r in ib.iter_rows(named=True)})
        write_host(paths.sysfs, t_s)

    def _fault_edges(self, k: int, t_s: float, n: int, node: str) -> None:
        dt = self.spec.interval_s
        for f in self.gen.faults:
            if f.node != n:
                continue
            if f.onset_s <= t_s < f.onset_s + dt:
                self._say(k, node, "fault_on", f"{f.fault_id} gpu {f.gpu}")
            if f.end_s <= t_s < f.end_s + dt and f.end_s < self.spec.duration_s:
                self._say(k, node, "fault_off", f"{f.fault_id} gpu {f.gpu}")

    def _xid(
        self,
        k: int,
        node: str,
        paths: NodePaths,
        gpu: int,
        xid: int,
        procs: dict[int, list[tuple[int, int]]],
    ) -> None:
        pid = procs[gpu][0][0] if procs.get(gpu) else None
        # the driver's own words for the code (the XID catalogue's description), never the
        # scenario's name for the fault: the product must not read the ground truth there
        with paths.kmsg.open("a", encoding="utf-8") as f:
            f.write(xid_line(gpu, xid, pid, "python" if pid else "", driver_text(xid)))
            f.flush()
        self._events[node].append((k, xid_event(gpu, xid)))
        self._say(k, node, "xid", f"gpu {gpu} xid {xid}")

    def _kill(self, k: int, node: str, pid: int, fault: Fault) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self._say(k, node, "kill", f"pid {pid} ({fault.type} on gpu {fault.gpu})")

    def _say(self, k: int, node: str, what: str, detail: str) -> None:
        self.log.append(Happened(time.time(), k, node, what, detail))
        log.info("twin tick %d %s: %s %s", k, node, what, detail)

    @staticmethod
    def _bound(proc_dir: Path) -> dict[int, list[tuple[int, int]]]:
        """The live processes bound to each GPU of a node: ``gpu -> [(pid, bytes)]``."""
        out: dict[int, list[tuple[int, int]]] = {}
        for entry in os.scandir(proc_dir):
            if entry.name.startswith("."):
                continue
            pid = int(entry.name)
            if not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            try:
                gpus = [int(g) for g in Path(entry.path).read_text().split(",") if g]
            except (OSError, ValueError):
                continue
            for g in gpus:
                out.setdefault(g, []).append((pid, 60 * 2**30))
        return out

    def _write_nvml(
        self, path: Path, k: int, answers: dict[str, Any], events: list[tuple[int, list[int]]]
    ) -> None:
        del events[: max(0, len(events) - 64)]
        recent = [(tick, ev) for tick, ev in events if tick > k - EVENT_TICKS]
        ticks: list[dict[str, Any]] = []
        for tick in sorted({tick for tick, _ in recent}):
            ticks.append({"id": tick, "answers": {}, "events": [e for t, e in recent if t == tick]})
        current = next((t for t in ticks if t["id"] == k), None)
        if current is None:
            ticks.append({"id": k, "answers": answers})
        else:
            current["answers"] = answers
            ticks.remove(current)
            ticks.append(current)
        doc = {
            "format": FORMAT,
            "provenance": "simulated",
            "note": f"SIMULATED: scenario {self.spec.name}, live tick {k} (simulation/twin)",
            "ticks": ticks,
        }
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
        tmp.replace(path)


def _idle(row: dict[str, Any], profile: Any) -> dict[str, Any]:
    """A GPU no process has bound: idle, whatever the scenario's own job would have it do."""
    out = dict(row)
    out.update(
        gpu_util_pct=0.0,
        mem_util_pct=0.0,
        mem_used_bytes=0,
        sm_clock_mhz=profile.sm_idle,
        power_w=min(float(row["power_w"]), 70.0),
        clock_event_reasons_code=0x1,
        gpm_sm_util_pct=0.0,
        gpm_sm_occupancy_pct=0.0,
        gpm_tensor_active_pct=0.0,
    )
    return out
