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
import urllib.request
from pathlib import Path
from typing import Any

from testbed.errors import AlertmanagerError
from testbed.process import LocalProcess

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


class LocalAlertmanager(LocalProcess):
    """A real Alertmanager on 127.0.0.1 whose one receiver is ``webhook_url``."""

    name = "alertmanager"
    error = AlertmanagerError

    def __init__(self, root: str | os.PathLike[str], webhook_url: str, token_file: Path) -> None:
        super().__init__(root)
        self.webhook_url = webhook_url
        self.token_file = token_file

    def command(self) -> list[str]:
        binary = alertmanager_binary()
        if binary is None:
            raise AlertmanagerError("no Alertmanager: apt-get install prometheus-alertmanager")
        config = self.root / "alertmanager.yml"
        config.write_text(_CONFIG.format(url=self.webhook_url, token_file=self.token_file))
        return [
            binary,
            f"--config.file={config}",
            f"--storage.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]  # fmt: skip: gossip off

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Raise alerts as a Prometheus server would (``POST /api/v2/alerts``)."""
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts", json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as resp:
            if resp.status != 200:
                raise AlertmanagerError(f"alertmanager answered {resp.status} to new alerts")
