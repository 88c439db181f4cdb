"""The agent loop survives what it is handed (issue 39): every hang is seen, and a sink that
fails does not stop it.

When a source makes no progress for ``source_timeout_s`` the supervisor leaves the loop thread
inside it and starts another. The abandoned thread's call may return later, while the new loop
thread is inside another source; it must not clear the new thread's marker, or a second hang
is never seen. The sources here are CONSTRUCTED: they block on events the test controls, so
the order of what happens is fixed by the test, not by timing.
"""

from __future__ import annotations

import threading

from gpuwarden.collector.agent import Agent
from gpuwarden.core.store.lineprotocol import Point
from tests.remediation_util import poll
from tests.test_agent import ListSink


class HangsFirst:
    """Blocks in its first call until released; returns at once after that."""

    name = "first"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.thread: threading.Thread | None = None
        self.calls = 0

    def collect(self, now_ns: int) -> list[Point]:
        self.calls += 1
        if self.calls == 1:
            self.thread = threading.current_thread()
            self.release.wait()
        return [Point("thermal", {"zone": "first"}, {"temp_c": 1.0}, now_ns)]

    def close(self) -> None:
        self.release.set()


class HangsSecond:
    """Returns in its first call; in its second (on the new loop thread) it lets ``first``'s
    hung call return, waits until that abandoned thread has ended, then blocks itself."""

    name = "second"

    def __init__(self, first: HangsFirst) -> None:
        self.first = first
        self.release = threading.Event()
        self.calls = 0

    def collect(self, now_ns: int) -> list[Point]:
        self.calls += 1
        if self.calls == 2:
            self.first.release.set()
            assert self.first.thread is not None
            self.first.thread.join()  # its call returned and it unwound: the old marker is gone
            self.release.wait()
        return [Point("thermal", {"zone": "second"}, {"temp_c": 1.0}, now_ns)]

    def close(self) -> None:
        self.release.set()


def test_a_second_hang_after_the_first_is_detected(caplog) -> None:
    caplog.set_level("WARNING", logger="gpuwarden.collector.agent")
    first = HangsFirst()
    second = HangsSecond(first)
    agent = Agent([first, second], ListSink(), cluster="c", node="n", interval_s=0.05,
                  source_timeout_s=1.0)  # fmt: skip
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    runner.start()

    def said(name: str) -> bool:
        return any(f"source {name} made no progress" in r.getMessage() for r in caplog.records)

    try:
        poll(lambda: said("first"), 60, "the first hang's warning")
        poll(lambda: said("second"), 60, "the second hang's warning")
    finally:
        stop.set()
        second.release.set()
        runner.join(30)
    assert agent.health["second"].failing == "made no progress"


class BrokenSink(ListSink):
    """Raises for its first ``failures`` batches (a full disk, an encoder's refusal...)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def write_points(self, points):
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        super().write_points(points)


class Steady:
    name = "steady"

    def collect(self, now_ns: int) -> list[Point]:
        return [Point("thermal", {"zone": "z"}, {"temp_c": 1.0}, now_ns)]

    def close(self) -> None:
        pass


def test_the_loop_survives_a_sink_that_raises_and_counts_it(caplog) -> None:
    caplog.set_level("WARNING", logger="gpuwarden.collector.agent")
    sink = BrokenSink(failures=2)
    agent = Agent([Steady()], sink, cluster="c", node="n", interval_s=0.01)
    agent.run(threading.Event(), max_cycles=4)
    assert agent.cycles == 4 and len(sink.batches) == 2 and sink.closed
    loop = [p.fields for b in sink.batches for p in b if "cycle_lag_s" in p.fields]
    assert [f["sink_errors_total"] for f in loop] == [2, 2]
    said = [r.getMessage() for r in caplog.records]
    assert sum("the sink refused a cycle's points" in m for m in said) == 1  # once per streak
    assert "the sink takes points again" in said
