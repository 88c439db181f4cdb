"""Start and stop a real Alertmanager (Debian's ``prometheus-alertmanager``, 0.25) on loopback.

Used by the test that drives the engine from an existing Prometheus stack: Alertmanager routes
every alert to one webhook receiver (the engine's ``/v1/alerts/alertmanager``) with the
engine's bearer token read from a file, and sends each group at once (``group_wait`` 0 s).
Its HA gossip, which would listen on every interface, is switched off.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from testbed.errors import AlertmanagerError
from testbed.influxd import free_port

_CONFIG = """\
route:
  receiver: engine
  group_by: [alertname, cluster, node]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: engine
    webhook_configs:
      - url: {url}
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials_file: {token_file}
"""


def alertmanager_binary() -> str | None:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class LocalAlertmanager:
    """A real Alertmanager on 127.0.0.1 whose one receiver is ``webhook_url``."""

    def __init__(self, root: str | os.PathLike[str], webhook_url: str, token_file: Path) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.webhook_url = webhook_url
        self.token_file = token_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> LocalAlertmanager:
        binary = alertmanager_binary()
        if binary is None:
            raise AlertmanagerError("no Alertmanager: apt-get install prometheus-alertmanager")
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "alertmanager.yml"
        config.write_text(_CONFIG.format(url=self.webhook_url, token_file=self.token_file))
        log = open(self.root / "alertmanager.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.path={self.root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = (self.root / "alertmanager.log").read_text(errors="replace")[-2000:]
                raise AlertmanagerError(
                    f"alertmanager exited with {self.process.returncode}:\n{tail}"
                )
            if self.ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise AlertmanagerError(f"alertmanager did not become ready on {self.url}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Raise alerts as a Prometheus server would (``POST /api/v2/alerts``)."""
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts", json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as resp:
            if resp.status != 200:
                raise AlertmanagerError(f"alertmanager answered {resp.status} to new alerts")

    def log(self) -> str:
        return (self.root / "alertmanager.log").read_text(errors="replace")

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

    def __enter__(self) -> LocalAlertmanager:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
