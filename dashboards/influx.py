"""Running dashboard queries against InfluxDB's ``/query`` endpoint, as Grafana's backend does.

Used by the tests (every panel against a real ``influxd``) and by the offline renderer. Only
the collector's catalogue is shared with the rest of gpuwarden; analytics' reader is not
imported (DESIGN.md: dashboards sit beside analytics, not below it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import urllib3

from gpuwarden.core.store.transport import auth_headers
from gpuwarden.dashboards.errors import QueryFailedError


@dataclass(frozen=True)
class Series:
    """One series of an InfluxQL answer; times in ms since the epoch (``epoch=ms``)."""

    name: str
    tags: dict[str, str]
    columns: list[str]
    values: list[list[Any]]

    def non_null(self) -> int:
        """How many cells hold a value, the time column aside."""
        return sum(v is not None for row in self.values for v in row[1:])


class InfluxQLClient:
    """GET ``/query`` with ``db`` and ``epoch=ms``; basic auth or an InfluxDB 2.x/3.x token."""

    def __init__(
        self,
        url: str,
        database: str,
        *,
        username: str = "",
        password: str = "",
        token: str = "",
        timeout_s: float = 30.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise QueryFailedError(f"InfluxDB url {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self.database = database
        self.headers = auth_headers(username or None, password, token or None)
        self._http = urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout_s), retries=False)

    def series(self, query: str) -> list[Series]:
        """Every series of every statement's answer; an InfluxDB error raises with the query."""
        try:
            resp = self._http.request(
                "GET",
                f"{self.url}/query",
                fields={"db": self.database, "q": query, "epoch": "ms"},
                headers=self.headers,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise QueryFailedError(f"InfluxDB at {self.url} unreachable: {exc}") from exc
        try:
            body = json.loads(resp.data or b"{}")
        except ValueError:
            body = {}
        if resp.status != 200 or "error" in body:
            detail = body.get("error") or resp.data[:200].decode(errors="replace")
            raise QueryFailedError(f"HTTP {resp.status} from InfluxDB: {detail}; query: {query}")
        out: list[Series] = []
        for result in body.get("results", []):
            if "error" in result:
                raise QueryFailedError(f"InfluxDB: {result['error']}; query: {query}")
            for s in result.get("series", []):
                out.append(
                    Series(s.get("name", ""), s.get("tags") or {}, s["columns"], s["values"])
                )
        return out

    def close(self) -> None:
        self._http.clear()
