"""Issue 37, item 3: the agent's health endpoint (``[agent] health_listen``: ``/livez``,
``/readyz``), asked of a real ``gpuwarden agent`` process.

The agent reads the CONSTRUCTED 8x H100 NVML recording (or a recording that does not exist, for
a source that fails every cycle) and writes to a loopback stand-in for InfluxDB's ``/write``
that answers 204, or 401 (which parks the sink). Before this change ``health_listen`` was an
unknown setting (exit 2) and nothing answered a probe. Every wait here ends on an event (the
answer changed, or the agent exited: then the test fails with its log), never on a clock.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuwarden.collector.agent import Agent
from gpuwarden.collector.cli import main as agent_main
from gpuwarden.collector.probes import LIVE, READY, liveness, readiness
from testbed.influxd import free_port
from tests.test_agent import ListSink

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "tests/golden/nvml-h100-8gpu/nvml.json"


class FakeWrite:
    """``/write`` answering ``status`` (204: written; 401: the sink parks and keeps the data)."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.writes = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if fake.status == 204:
                    fake.writes += 1
                body = b"" if fake.status == 204 else b'{"error":"authorization failed"}'
                self.send_response(fake.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RunningAgent:
    def __init__(self, tmp: Path, influx_url: str, recording: Path, extra: str = "") -> None:
        self.port = free_port()
        config = tmp / "agent.toml"
        config.write_text(
            f'[agent]\ncluster = "c"\nnode = "node-0"\ninterval_s = 0.2\nsources = ["nvml"]\n'
            f'reporter_listen = ""\nhealth_listen = "127.0.0.1:{self.port}"\n{extra}'
            f'[nvml]\nbackend = "recorded"\nrecording = "{recording}"\nloop = true\n'
            f'events = "poll"\njobmap_dir = "{tmp}/jobs"\n'
            f'pod_resources_socket = "{tmp}/no-kubelet.sock"\n'
            f'[sink]\nurl = "{influx_url}"\ndatabase = "d"\nspool_dir = "{tmp}/spool"\n'
            f"flush_interval_s = 0.1\npark_interval_s = 0.2\n"
        )
        self.log = tmp / "agent.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "agent", "--config", str(config)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def get(self, path: str) -> tuple[int, dict[str, object]] | None:
        """The probe's answer, or None while nothing listens yet."""
        if self.proc.poll() is not None:
            pytest.fail(f"the agent exited ({self.proc.returncode}): {self.log.read_text()}")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, json.loads(body) if resp.status in (200, 503) else {}
        except (TimeoutError, ConnectionRefusedError, ConnectionResetError):
            return None
        finally:
            conn.close()

    def until(self, path: str, want: Callable[[int, dict[str, object]], bool]) -> dict[str, object]:
        """Asks ``path`` until its answer satisfies ``want`` (or the agent exits: a failure)."""
        while True:
            got = self.get(path)
            if got is not None and want(*got):
                return got[1]
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def influx() -> Iterator[FakeWrite]:
    fake = FakeWrite(204)
    yield fake
    fake.close()


def test_a_working_agent_is_live_and_ready(tmp_path: Path, influx: FakeWrite) -> None:
    agent = RunningAgent(tmp_path, influx.url, H100)
    try:
        body = agent.until(READY, lambda status, _: status == 200)
        assert body == {"status": "ok", "reasons": []}
        assert agent.get(LIVE) == (200, {"status": "ok", "reasons": []})
        assert agent.get("/metrics") == (404, {})
    finally:
        agent.stop()
    assert influx.writes > 0


def test_a_source_failing_n_cycles_makes_it_unready_but_alive(
    tmp_path: Path, influx: FakeWrite
) -> None:
    agent = RunningAgent(
        tmp_path, influx.url, tmp_path / "no-such-recording.json", "health_fail_cycles = 2\n"
    )
    try:
        body = agent.until(
            READY, lambda status, b: status == 503 and "no cycle yet" not in json.dumps(b)
        )
        reasons = body["reasons"]
        assert isinstance(reasons, list) and len(reasons) == 1
        reason = str(reasons[0])
        assert reason.startswith("source nvml failed") and "cycles in a row" in reason
        assert "no-such-recording" not in json.dumps(body)  # messages stay in the log
        assert agent.get(LIVE) == (200, {"status": "ok", "reasons": []})
    finally:
        agent.stop()


def test_a_parked_sink_makes_it_unready_until_the_server_takes_the_data(
    tmp_path: Path, influx: FakeWrite
) -> None:
    influx.status = 401
    agent = RunningAgent(tmp_path, influx.url, H100)
    try:
        body = agent.until(READY, lambda status, b: "sink parked (HTTP 401)" in json.dumps(b))
        assert body["status"] == "fail"
        assert agent.get(LIVE) == (200, {"status": "ok", "reasons": []})
        influx.status = 204  # the operator fixed the token: the spooled data goes out
        agent.until(READY, lambda status, _: status == 200)
        assert influx.writes > 0
    finally:
        agent.stop()


class Steady:
    name = "steady"

    def collect(self, now_ns: int) -> list[object]:
        return []

    def close(self) -> None:
        pass


def test_a_loop_that_finishes_no_cycle_fails_liveness_and_readiness() -> None:
    clock = [100.0]
    agent = Agent([Steady()], ListSink(), cluster="c", node="n", interval_s=10.0,  # type: ignore[list-item]
                  source_timeout_s=5.0, monotonic=lambda: clock[0])  # fmt: skip
    assert liveness(agent, clock[0]).ok
    assert readiness(agent, clock[0], 3, "").reasons == ["no cycle yet"]
    clock[0] += 3 * 10.0 + 5.0 + 1  # three intervals and one source's timeout, and then some
    (reason,) = liveness(agent, clock[0]).reasons
    assert reason.startswith("no cycle finished for 36 s (limit 35 s)")
    agent.last_cycle_at = clock[0]
    agent.cycles = 1
    assert liveness(agent, clock[0]).ok and readiness(agent, clock[0], 3, "").ok


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("health_fail_cycles = 0", "agent.health_fail_cycles must be at least 1"),
        ('health_listen = "9467"', "agent.health_listen must be host:port"),
        ('health_listen = "127.0.0.1:99999"', "agent.health_listen must be host:port"),
    ],
)
def test_bad_probe_settings_are_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, message: str
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f"[agent]\n{setting}\n")
    assert agent_main(["--config", str(config), "--print-config"]) == 2
    assert message in capsys.readouterr().err


def test_a_probe_port_in_use_is_a_clear_exit_2(tmp_path: Path, influx: FakeWrite) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nsources = []\nreporter_listen = ""\nhealth_listen = "127.0.0.1:{port}"\n'
        f'[sink]\nurl = "{influx.url}"\nspool_dir = "{tmp_path}/spool"\n'
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "agent", "--config", str(config)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        taken.close()
    assert proc.returncode == 2, proc.stderr
    assert f"[agent] health_listen 127.0.0.1:{port}: Address already in use" in proc.stderr
