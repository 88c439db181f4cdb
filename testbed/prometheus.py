"""Start and stop a real Prometheus (Debian's ``prometheus`` package, 2.42) on loopback.

Used by the test that scrapes gpuwarden's ``/metrics``: every target is scraped every second,
each with the bearer token file it needs, and the values are read back through Prometheus'
own HTTP API (``/api/v1/query``), as a dashboard or an alert rule would read them.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from testbed.errors import PrometheusError
from testbed.process import LocalProcess


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port
    token_file: str = ""


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class LocalPrometheus(LocalProcess):
    """A real Prometheus on 127.0.0.1 scraping ``targets`` every second."""

    name = "prometheus"
    error = PrometheusError

    def __init__(self, root: str | os.PathLike[str], targets: list[Target]) -> None:
        super().__init__(root)
        self.targets = targets

    def _config(self) -> str:
        lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s", "scrape_configs:"]
        for t in self.targets:
            lines += [f"  - job_name: {t.job}", "    static_configs:",
                      f"      - targets: ['{t.address}']"]  # fmt: skip
            if t.token_file:
                lines += ["    authorization:", f"      credentials_file: {t.token_file}"]
        return "\n".join(lines) + "\n"

    def command(self) -> list[str]:
        binary = prometheus_binary()
        if binary is None:
            raise PrometheusError("no Prometheus: apt-get install prometheus")
        config = self.root / "prometheus.yml"
        config.write_text(self._config())
        return [binary, f"--config.file={config}", f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}"]  # fmt: skip

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` gives now: ``[{"metric": {...}, "value": [t, "v"]}]``."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            answer = json.loads(resp.read())
        if answer.get("status") != "success":
            raise PrometheusError(f"query {promql!r} failed: {answer}")
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result
