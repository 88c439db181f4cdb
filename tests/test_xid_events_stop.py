"""The NVML XID event thread stops at once where its backend can end a wait (a recording);
the real driver's cannot, and costs up to EVENT_WAIT_MS (5 s) on stop. CONSTRUCTED backend."""

from __future__ import annotations

import logging
import threading
from typing import Any

from gpuwarden.collector.sources.base import SourceContext, WarnOnce
from gpuwarden.collector.sources.nvml.xids import XidEvents
from gpuwarden.core.xidcat import XidPolicy


class WaitsUntilWoken:
    """An event wait that returns only when woken: a stop that does not wake it leaves the
    thread waiting (EVENT_WAIT_MS, here for as long as the test runs)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.woken = False
        self.waiting = threading.Event()

    def call(self, device: int | None, name: str, *args: Any) -> Any:
        assert name == "nvmlEventSetWait"
        with self.cond:
            self.waiting.set()
            self.cond.wait_for(lambda: self.woken)
            self.woken = False
        return None

    def wake(self) -> None:
        with self.cond:
            self.woken = True
            self.cond.notify_all()


def test_stop_wakes_a_wait_that_can_be_woken() -> None:
    """Before, stop only set a flag and joined, so each close of a thread-mode source waited
    out the whole event wait (2 s, and 5 s with the longer wait: an attacker's review)."""
    backend = WaitsUntilWoken()
    events = XidEvents(SourceContext("c", "n"), XidPolicy(), "thread",
                       WarnOnce(logging.getLogger("test")))  # fmt: skip
    events.start(backend)  # type: ignore[arg-type]
    assert backend.waiting.wait(10)
    events.stop()
    assert events._waiter is not None and not events._waiter.is_alive()
