"""Critical XIDs from NVML's event set, as ``gpu_event`` points.

``events = "thread"`` (the default) waits for them on a thread of their own, so the collection
loop never blocks on NVML; ``"poll"`` drains what arrived at each cycle instead (deterministic,
for tests and recordings); ``"off"`` does neither. Either way the points are handed out at the
next cycle, tagged with the job the GPU had at the look before the event.
"""

from __future__ import annotations

import queue
import threading

from gpuwarden.collector.episodes import Episodes
from gpuwarden.collector.nvml.backend import (
    ERROR_FUNCTION_NOT_FOUND,
    UNAVAILABLE,
    NvmlBackend,
    NvmlError,
)
from gpuwarden.collector.sources.base import SourceContext, WarnOnce
from gpuwarden.collector.sources.events import xid_point
from gpuwarden.collector.sources.nvml.poll import Device
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.xidcat import XidPolicy

EVENT_RETRY_S = 5.0  # the event thread's wait after a failed event wait
#: one event wait's longest block: the driver cannot be woken, so close() waits up to this for
#: the thread; longer is fewer idle wakeups (issue 37: the agent's fixed cost; at 2 s the
#: thread's wakeups cost 4.5 ms of CPU a minute on the stand-in, 9 % of the idle agent's)
EVENT_WAIT_MS = 5000
MODES = ("thread", "poll", "off")


class XidEvents:
    def __init__(
        self,
        context: SourceContext,
        policy: XidPolicy,
        mode: str,
        warn: WarnOnce,
        episodes: Episodes | None = None,
    ) -> None:
        self.context = context
        self.policy = policy
        self.mode = mode
        self._warn = warn
        self._backend: NvmlBackend | None = None
        self._events: queue.Queue[list[int]] = queue.Queue()
        self._waiter: threading.Thread | None = None
        self._stop = threading.Event()
        self.episodes = episodes

    def start(self, backend: NvmlBackend) -> None:
        """Begin listening (a thread in ``thread`` mode; nothing to start otherwise)."""
        self._backend = backend
        if self.mode == "thread":
            self._waiter = threading.Thread(target=self._wait, daemon=True, name="nvml-xid")
            self._waiter.start()

    def _wait(self) -> None:
        """The event thread: waits for critical XIDs until the source closes. A driver
        without events ends it; any other failure is retried every ``EVENT_RETRY_S``."""
        assert self._backend is not None
        while not self._stop.is_set():
            try:
                event = self._backend.call(None, "nvmlEventSetWait", EVENT_WAIT_MS)
            except NvmlError as exc:
                if exc.code in (ERROR_FUNCTION_NOT_FOUND, *UNAVAILABLE):
                    self._warn(f"events:{exc.code}", f"NVML events are not available: {exc}")
                    return
                self._warn(f"events:{exc.code}", f"NVML event wait failed ({exc}); retrying "
                           f"every {EVENT_RETRY_S:.0f} s")  # fmt: skip
                self._stop.wait(EVENT_RETRY_S)
                continue
            if event is not None:
                self._events.put(event)

    def _poll(self) -> None:
        """Drains the events that arrived since the last cycle (``events = "poll"``); a
        failure costs this cycle's events, never its GPU points."""
        assert self._backend is not None
        try:
            while (event := self._backend.call(None, "nvmlEventSetWait", 0)) is not None:
                self._events.put(event)
        except NvmlError as exc:
            self._warn(f"events:{exc.code}", f"NVML event wait failed: {exc}")

    def points(self, now_ns: int, devices: list[Device]) -> list[Point]:
        """The XIDs that arrived since the last cycle, as ``gpu_event`` points."""
        if self.mode == "off":
            return []
        if self.mode == "poll":
            self._poll()
        points = []
        while True:
            try:
                index, _etype, xid = self._events.get_nowait()
            except queue.Empty:
                break
            uuid = devices[index].uuid if 0 <= index < len(devices) else ""
            points.append(
                xid_point(
                    self.context,
                    self.policy,
                    xid=int(xid),
                    message=f"NVML critical XID event {xid}",
                    source="nvml",
                    now_ns=now_ns,
                    gpu=index,
                    uuid=uuid,
                    # it happened after the last look (this cycle's is recorded already):
                    # the job it hit is the one seen then
                    job=self.context.inventory.jobs.job_at(now_ns - 1, index),
                    episodes=self.episodes,
                )
            )
        return points

    def stop(self) -> None:
        """Stop the event thread and wait for it (before NVML is shut down: a wait must not
        be in flight then). The real driver's wait cannot be cut short, so this takes up to
        ``EVENT_WAIT_MS``; a backend that can end a wait (``wake``: a recording) ends it."""
        self._stop.set()
        wake = getattr(self._backend, "wake", None)
        if wake is not None and self._waiter is not None:
            wake()
        if self._waiter is not None:
            self._waiter.join(timeout=EVENT_WAIT_MS / 1000 + 1)
