"""Start and stop a real Prometheus (Debian's ``prometheus`` package, 2.42) on loopback.

Used by the test that scrapes gpuwarden's ``/metrics``: every target is scraped every second,
each with the bearer token file it needs, and the values are read back through Prometheus'
own HTTP API (``/api/v1/query``), as a dashboard or an alert rule would read them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from testbed.errors import PrometheusError
from testbed.influxd import free_port


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port
    token_file: str = ""


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class LocalPrometheus:
    """A real Prometheus on 127.0.0.1 scraping ``targets`` every second."""

    def __init__(self, root: str | os.PathLike[str], targets: list[Target]) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.targets = targets
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> str:
        lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s", "scrape_configs:"]
        for t in self.targets:
            lines += [f"  - job_name: {t.job}", "    static_configs:",
                      f"      - targets: ['{t.address}']"]  # fmt: skip
            if t.token_file:
                lines += ["    authorization:", f"      credentials_file: {t.token_file}"]
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 60.0) -> LocalPrometheus:
        binary = prometheus_binary()
        if binary is None:
            raise PrometheusError("no Prometheus: apt-get install prometheus")
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "prometheus.yml"
        config.write_text(self._config())
        log = open(self.root / "prometheus.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={self.root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.process.returncode}:\n"
                                      f"{self.log()[-2000:]}")  # fmt: skip
            if self.ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise PrometheusError(f"prometheus did not become ready on {self.url}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` gives now: ``[{"metric": {...}, "value": [t, "v"]}]``."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            answer = json.loads(resp.read())
        if answer.get("status") != "success":
            raise PrometheusError(f"query {promql!r} failed: {answer}")
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def log(self) -> str:
        return (self.root / "prometheus.log").read_text(errors="replace")

    def stop(self, timeout_s: float = 15.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
