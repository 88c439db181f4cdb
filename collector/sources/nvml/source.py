"""The NVML source: one cycle over every GPU, through a
:class:`~collector.nvml.backend.NvmlBackend`.

It puts the parts together, each in its own module: polling and parsing (:mod:`.poll`), the
XID event thread (:mod:`.xids`), GPU -> job tagging (:mod:`.tagging`), the lost-GPU probe
(:mod:`.lost`), what each GPU is and how it is set up (:mod:`.info`, a ``gpu_info`` point at
start and every ``info_every_s``) and the faults seen in a GPU's own fields between cycles
(:mod:`.watch`). Every process on a GPU also gets its own ``gpu_process`` point.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuwarden.collector.attribution import JobInfo
from gpuwarden.collector.episodes import Episodes
from gpuwarden.collector.nvml.backend import INIT_HINTS, NvmlBackend, NvmlError
from gpuwarden.collector.sources.base import SourceContext, SourceError, WarnOnce, normalise_pci
from gpuwarden.collector.sources.nvml.info import driver_version, info_point, parse_info, read_info
from gpuwarden.collector.sources.nvml.lost import answers_again, lost_point
from gpuwarden.collector.sources.nvml.poll import (
    FI_NVLINK_LINK_COUNT,
    STATIC_CALLS,
    Device,
    FieldLayout,
    GpuLostError,
    PcieSampler,
    Reader,
    field_request,
    parse_gpu,
    read_gpu,
)
from gpuwarden.collector.sources.nvml.tagging import JobTagger
from gpuwarden.collector.sources.nvml.watch import GpuWatch
from gpuwarden.collector.sources.nvml.xids import MODES, XidEvents
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.xidcat import DEFAULT_FATAL_XIDS, XidPolicy

log = logging.getLogger("gpuwarden.collector.sources.nvml")


class NvmlSource:
    name = "nvml"

    def __init__(self, context: SourceContext, settings: dict[str, Any]) -> None:
        self.context = context
        self.settings = settings
        self.nvlink = bool(settings.get("nvlink", True))
        self.gpm = bool(settings.get("gpm", True))
        self.processes = bool(settings.get("processes", True))
        self.pcie_concurrent = bool(settings.get("pcie_concurrent", True))
        self._pcie = PcieSampler()
        self.events = str(settings.get("events", "thread"))
        if self.events not in MODES:
            raise SourceError(f"nvml.events must be thread, poll or off, got {self.events!r}")
        self.policy = XidPolicy(
            settings.get("fatal_xids", DEFAULT_FATAL_XIDS),
            settings.get("extra_fatal_xids", ()),
            settings.get("not_fatal_xids", ()),
        )
        self.watch = GpuWatch(context, float(settings.get("fabric_grace_s", 600.0)))
        self.info_every_ns = int(float(settings.get("info_every_s", 600.0)) * 1e9)
        self._driver = ""
        self.tagger = JobTagger(context, settings)
        self._backend: NvmlBackend | None = settings.get("backend_instance")
        self._devices: list[Device] | None = None
        self._warn = WarnOnce(log)
        self._reader: Reader | None = None
        self.xids = XidEvents(
            context, self.policy, self.events, self._warn,
            Episodes(
            recovery_s=float(settings.get("xid_recovery_s", 300.0)),
            resend_s=float(settings.get("xid_resend_s", 600.0)),
        ),
        )  # fmt: skip

    # -- set-up ---------------------------------------------------------------------------

    def _make_backend(self) -> NvmlBackend:
        kind = self.settings.get("backend", "pynvml")
        if kind == "recorded":
            from gpuwarden.collector.nvml.recorded import RecordedBackend

            path = self.settings.get("recording", "")
            if not path:
                raise SourceError("nvml.backend = 'recorded' needs nvml.recording = FILE")
            return RecordedBackend(
                path,
                loop=bool(self.settings.get("loop", False)),
                follow=bool(self.settings.get("follow", False)),
            )
        if kind == "pynvml":
            from gpuwarden.collector.nvml.real import PynvmlBackend

            return PynvmlBackend()
        raise SourceError(f"nvml.backend must be 'pynvml' or 'recorded', got {kind!r}")

    def _start(self) -> list[Device]:
        if self._backend is None:
            self._backend = self._make_backend()
        try:
            self._backend.init()
        except NvmlError as exc:
            hint = INIT_HINTS.get(exc.code)
            raise SourceError(
                f"NVML did not initialise: {exc}" + (f" ({hint})" if hint else "")
            ) from exc
        self._reader = Reader(self._backend, self._warn)
        self._backend.begin_cycle()
        count = int(self._backend.call(None, "nvmlDeviceGetCount"))
        devices = [self._discover(i) for i in range(count)]
        self.xids.start(self._backend)
        return devices

    def _discover(self, index: int) -> Device:
        assert self._reader is not None
        dev = Device(index)
        r = self._reader
        pci = None  # a GPU lost already when the agent starts answers nothing at all
        try:
            dev.uuid = r.ask(dev, "uuid", "nvmlDeviceGetUUID") or ""
            dev.model = r.ask(dev, "name", "nvmlDeviceGetName") or ""
            pci = r.ask(dev, "pci", "nvmlDeviceGetPciInfo")
            for label, name, args in STATIC_CALLS:
                dev.static[label] = r.ask(dev, label, name, *args)
            if self.nvlink:
                count = r.ask(
                    dev, "links", "nvmlDeviceGetFieldValues", ((FI_NVLINK_LINK_COUNT, 0),)
                )
                if count and count[0][0] == 0:
                    dev.links = int(count[0][1])
        except GpuLostError:
            pass  # the first cycle's read meets it again and reports the GPU lost
        dev.field_ids = field_request(dev.links)
        dev.layout = FieldLayout.of(dev.field_ids, dev.links)
        if pci:
            with self.context.inventory.lock:
                self.context.inventory.gpus_by_pci[normalise_pci(str(pci))] = (index, dev.uuid)
        return dev

    # -- the cycle ------------------------------------------------------------------------

    def collect(self, now_ns: int) -> list[Point]:
        if self._devices is None:
            self._devices = self._start()
        else:
            assert self._backend is not None
            self._backend.begin_cycle()
        assert self._reader is not None and self._backend is not None
        points: list[Point] = []
        reads: list[tuple[Device, dict[str, Any]] | Point] = []  # a Point: the GPU was lost
        driver_asked = False
        pcie = {}
        if self.pcie_concurrent and getattr(self._backend, "concurrent_calls", False):
            pcie = self._pcie.start(self._reader, self._devices)
        for dev in self._devices:
            if dev.lost and not answers_again(self._backend, dev):
                continue
            try:
                raw = read_gpu(self._reader, dev, self.gpm, pcie.get(dev.index))
                if dev.info_ns is None or now_ns - dev.info_ns >= self.info_every_ns:
                    if not driver_asked:  # once for all the GPUs that are due
                        self._driver, driver_asked = driver_version(self._reader), True
                    raw["info"] = read_info(self._reader, dev)
                    dev.info_ns = now_ns
                reads.append((dev, raw))
            except GpuLostError as lost:
                reads.append(lost_point(self.context, dev, lost.call, now_ns))
        live = {
            pid
            for read in reads
            if not isinstance(read, Point)
            for pid, _ in read[1].get("processes") or ()
        }
        self.tagger.begin_cycle(live)
        gpu_jobs: dict[int, JobInfo] = {}
        pid_jobs: dict[int, JobInfo] = {}
        for read in reads:
            if isinstance(read, Point):
                points.append(read)
                continue
            dev, raw = read
            try:
                fields, links = parse_gpu(dev, raw)
            except (TypeError, ValueError, IndexError, OverflowError) as exc:
                # answers of a shape no driver gives (a hand-edited recording, a binding's
                # surprise): this GPU's point is left out, the others are kept
                self._warn(f"parse:{dev.index}:{type(exc).__name__}", f"NVML answers of GPU "
                           f"{dev.index} have a shape gpuwarden does not know ({exc!r}); its "
                           "point is left out while they do")  # fmt: skip
                continue
            procs = raw.get("processes") or []
            watched = self.watch.check(dev.index, dev.uuid, fields, now_ns)
            job = gpu_jobs[dev.index] = self.tagger.gpu_job(dev, procs)
            tags, link_tags = self.tagger.tag_set(dev, job)
            points.append(Point("gpu", tags, fields, now_ns))
            points += watched
            if "info" in raw:
                point = info_point(tags, parse_info(raw["info"], self._driver), now_ns)
                if point is not None:
                    points.append(point)
            for link, lf in links.items():
                points.append(Point("gpu_nvlink", link_tags[link], lf, now_ns))
            for pid, mem in procs:
                info = pid_jobs[pid] = self.tagger.process_job(dev, pid)
                if self.processes:
                    ptags = self.tagger.tag_set(dev, info)[0] if info.job and info != job else tags
                    pf: dict[str, Any] = {"pid": int(pid)}
                    if isinstance(mem, int):
                        pf["used_mem_bytes"] = mem
                    points.append(Point("gpu_process", ptags, pf, now_ns))
        self.tagger.end_cycle(live)
        self.context.inventory.jobs.saw(now_ns, gpu_jobs, pid_jobs)
        points += self.xids.points(now_ns, self._devices)
        return points

    @property
    def errors(self) -> int:
        return self._reader.errors if self._reader else 0

    def close(self) -> None:
        self._pcie.close()
        self.xids.stop()
        self.tagger.close()
        if self._backend is not None and self._devices is not None:
            self._backend.shutdown()
