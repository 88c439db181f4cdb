"""Issue 37, item 9: the agent's fixed cost. Between cycles its threads sleep until there is
work: the HTTP servers (probes, relay) and their deadline reaper, the sink's sender on an
empty spool, the kernel-log follower on /dev/kmsg, and the supervisor between cycles.

A sleeping thread makes no context switches, so each test counts a thread's voluntary
context switches (``/proc/self/task/<tid>/status``) over an idle stretch: not a timing, a
count. Before, the servers woke every 0.5 s, the reaper every 0.5 s, the sender every 1 s,
the follower every 0.1 s and the supervisor every source_timeout_s / 4.
``benchmarks/agent_cycle.py`` measures what that costs (``idle_cpu_ratio``).
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from gpuwarden.collector.agent import Agent
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.xid import KmsgXidSource
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.tls import http_server
from testbed.influxd import free_port
from tests.scripted_server import Reply, ScriptedServer

IDLE_S = 1.5
#: a thread asleep until there is work may still be switched once (a signal, the GIL's
#: hand-over as it goes to sleep); the periodic wakeups before were 3 to 15 in IDLE_S
AT_MOST = 1


def switches(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    line = next(ln for ln in status.splitlines() if ln.startswith("voluntary_ctxt_switches"))
    return int(line.split()[1])


def idle_switches(*threads: threading.Thread) -> list[int]:
    time.sleep(0.3)  # let each settle into its sleep
    before = [switches(t) for t in threads]
    time.sleep(IDLE_S)
    return [switches(t) - b for t, b in zip(threads, before, strict=True)]


def thread_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def test_an_idle_http_server_and_its_reaper_sleep_and_still_serve_and_stop() -> None:
    before = set(thread_named("http-deadlines"))
    server = http_server(("127.0.0.1", free_port()), Hello, request_deadline_s=15.0)
    serving = threading.Thread(target=server.serve_forever, daemon=True, name="idle-http")
    serving.start()
    (reaper,) = set(thread_named("http-deadlines")) - before
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.read() == b"ok"
    assert max(idle_switches(serving, reaper)) <= AT_MOST
    with urllib.request.urlopen(url, timeout=10) as resp:  # a client still wakes it
        assert resp.read() == b"ok"
    server.shutdown()  # woken, not polled: returns (a hang would fail the join below)
    server.server_close()
    serving.join(timeout=30)
    reaper.join(timeout=30)
    assert not serving.is_alive() and not reaper.is_alive()


def test_a_server_never_served_shuts_down_at_once() -> None:
    """(socketserver's own shutdown() waits forever for a loop that never ran.)"""
    server = http_server(("127.0.0.1", free_port()), Hello)
    stopping = threading.Thread(target=server.shutdown, daemon=True)
    stopping.start()
    stopping.join(timeout=30)  # a guard against a hang, not a speed limit
    assert not stopping.is_alive()
    server.server_close()


def test_the_sender_sleeps_on_an_empty_spool_and_wakes_for_the_next_point(
    tmp_path: Path,
) -> None:
    with ScriptedServer([], default=Reply(204)) as influx:
        sink = InfluxSink(SinkConfig(url=influx.url, spool_dir=str(tmp_path / "spool")))
        sink.write_points([Point("m", {"node": "a"}, {"v": 1.0}, 1)])
        assert sink.flush(timeout_s=30)
        sender = thread_named("gpuwarden-sink")
        assert sender
        assert max(idle_switches(*sender)) <= AT_MOST
        # the next point after a quiet spell is sent (on the flush timer it starts), not
        # left until a batch fills
        sink.write_points([Point("m", {"node": "a"}, {"v": 2.0}, 2)])
        deadline = time.monotonic() + 30
        while len(influx.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(influx.requests) == 2
        sink.close()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="needs a readable /dev/kmsg (root)")
def test_the_kernel_log_follower_sleeps_until_the_kernel_logs(tmp_path: Path) -> None:
    ctx = SourceContext("c", "n", sysfs=tmp_path, procfs=tmp_path, kmsg=Path("/dev/kmsg"))
    source = KmsgXidSource(ctx, {"follow_s": 0.1, "lookback_s": 1.0})
    source.collect(time.time_ns())  # opens /dev/kmsg and starts the follower
    (follower,) = [t for t in thread_named("kmsg") if t is source._follower]
    # the kernel may log while we watch (another test, a device): a few, not one per 0.1 s
    assert max(idle_switches(follower)) <= 3
    source.close()
    follower.join(timeout=30)
    assert not follower.is_alive()  # close() woke it


class Quick:
    name = "quick"

    def collect(self, now_ns: int) -> list[Point]:
        return [Point("q", {"node": "n"}, {"v": 1.0}, now_ns)]

    def close(self) -> None:
        pass


class Nowhere:
    def write_points(self, points: object) -> None:
        pass

    def close(self, timeout_s: float = 10.0) -> bool:
        return True


def test_the_supervisor_sleeps_between_cycles() -> None:
    agent = Agent([Quick()], Nowhere(), cluster="c", node="n", interval_s=10.0,
                  source_timeout_s=1.0)  # fmt: skip
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), daemon=True, name="supervisor")
    runner.start()
    deadline = time.monotonic() + 30
    while agent.cycles < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent.cycles >= 1
    # before: a look every source_timeout_s / 4 (6 in IDLE_S); now: asleep until a call
    # that starts at the next cycle could pass its timeout
    assert max(idle_switches(runner)) <= AT_MOST
    stop.set()
    runner.join(timeout=60)
    assert not runner.is_alive()
