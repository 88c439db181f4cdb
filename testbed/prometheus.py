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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
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

    def __init__(
        self, root: str | os.PathLike[str], targets: list[Target], rule_files: Sequence[str] = ()
    ) -> None:
        super().__init__(root)
        self.targets = targets
        self.rule_files = list(rule_files)
        """Alerting rules it evaluates every second (``alerts()`` reads what they raise)."""

    def _config(self) -> str:
        lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s",
                 "  evaluation_interval: 1s"]  # fmt: skip
        if self.rule_files:
            lines += ["rule_files:", *(f"  - {json.dumps(str(f))}" for f in self.rule_files)]
        lines.append("scrape_configs:")
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
        result: list[dict[str, Any]] = self._api(
            "query?" + urllib.parse.urlencode({"query": promql})
        )["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts its rules raise now, pending or firing (``/api/v1/alerts``): each with
        ``labels``, ``annotations`` (templates expanded) and ``state``."""
        result: list[dict[str, Any]] = self._api("alerts")["alerts"]
        return result

    def evaluated(self) -> list[float]:
        """When each rule group was last evaluated (seconds since the epoch; -inf: never)."""
        groups = self._api("rules")["groups"]
        return [_epoch(g.get("lastEvaluation", "")) for g in groups]

    def now(self) -> float:
        """Prometheus' own ``time()``."""
        return float(self._api("query?query=time%28%29")["result"][1])

    def _api(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=10) as resp:
            answer = json.loads(resp.read())
        if answer.get("status") != "success":
            raise PrometheusError(f"/api/v1/{path} failed: {answer}")
        data: dict[str, Any] = answer["data"]
        return data


def _epoch(rfc3339: str) -> float:
    """``2026-11-28T00:10:11.123456789Z`` in seconds (Python keeps microseconds); Go's zero
    time (``0001-01-01T00:00:00Z``, never evaluated) is -inf."""
    try:
        t = datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("-inf")
    return t if t > 0 else float("-inf")
