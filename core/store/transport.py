"""How a batch reaches the server, and what the answer means for it.

Two transports, one interface (:class:`Transport`):

* :class:`V1Transport` speaks InfluxDB's v1 ``/write`` (1.x natively; 2.x and 3.x through their
  v1 compatibility endpoints) with urllib3: database, retention policy, precision, basic auth
  or a token.
* :class:`V2Transport` uses the official ``influxdb-client`` write API (``/api/v2/write``: org,
  bucket, token) for InfluxDB 2.x/3.x users.

Every answer is classified into a :class:`SendResult` that tells the sink what to do:

==========  ==============================================================================
ok          stored; commit
partial     400 "partial write": the server stored the good lines; commit, count the bad
rejected    any other 400 or 4xx that no retry can fix: commit, count every point rejected
retry       timeout, connection error, 5xx, 429 (after Retry-After when the server gives one)
park        401, 403, 404 (auth or database missing), 413: a configuration problem. Never
            retried in a loop, never dropped: the data stays in the spool and the sink tries
            again every ``park_interval_s`` so that fixing the configuration loses nothing.
==========  ==============================================================================
"""

from __future__ import annotations

import base64
import importlib.util
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import urlencode

import urllib3

from gpuwarden.core.errors import SinkError
from gpuwarden.core.retry import parse_retry_after
from gpuwarden.core.store.lineprotocol import Precision


class Outcome(StrEnum):
    OK = "ok"
    PARTIAL = "partial"
    REJECTED = "rejected"
    RETRY = "retry"
    PARK = "park"


@dataclass(frozen=True, slots=True)
class SendResult:
    outcome: Outcome
    status: int | None = None
    message: str = ""
    rejected_points: int = 0
    retry_after_s: float | None = None


class Transport(Protocol):
    name: str

    def send(self, body: bytes, points: int) -> SendResult: ...

    def close(self) -> None: ...


_PARSE_ERRORS = re.compile(r"unable to parse")
_DROPPED = re.compile(r"dropped=(\d+)")
_V2_LINES = re.compile(r"line \d+:")


def rejected_in_partial_write(message: str, points: int) -> int:
    """How many points a 400 refused. InfluxDB 1.x lists each unparseable line ("unable to
    parse") and counts the rest (type conflicts, out-of-retention) in ``dropped=N``; 2.x
    lists ``line N:`` entries. With nothing countable, assume the whole batch."""
    counted = len(_PARSE_ERRORS.findall(message))
    dropped = _DROPPED.search(message)
    if dropped:
        counted += int(dropped.group(1))
    if counted == 0:
        counted = len(_V2_LINES.findall(message))
    return min(points, counted) if counted else points


def classify(
    status: int, body: str, points: int, headers: Mapping[str, str] | None = None
) -> SendResult:
    headers = headers or {}
    message = body.strip()
    try:
        decoded = json.loads(message) if message else {}
        if isinstance(decoded, dict):
            message = str(decoded.get("error") or decoded.get("message") or message)
    except ValueError:
        pass
    if 200 <= status < 300:
        return SendResult(Outcome.OK, status)
    retry_after = parse_retry_after(headers.get("Retry-After") or headers.get("retry-after"))
    if status == 429 or status >= 500:
        return SendResult(Outcome.RETRY, status, message, retry_after_s=retry_after)
    if status == 400:
        partial = "partial write" in message
        rejected = rejected_in_partial_write(message, points) if partial else points
        outcome = Outcome.PARTIAL if partial and rejected < points else Outcome.REJECTED
        return SendResult(outcome, status, message, rejected_points=rejected)
    if status in (401, 403, 404, 413):
        return SendResult(Outcome.PARK, status, message)
    return SendResult(Outcome.REJECTED, status, message, rejected_points=points)


def auth_headers(
    username: str | None = None, password: str | None = None, token: str | None = None
) -> dict[str, str]:
    """``Authorization`` for InfluxDB: a token (2.x/3.x, or 1.x with auth) or basic auth."""
    if token:
        return {"Authorization": f"Token {token}"}
    if username is not None:
        raw = f"{username}:{password or ''}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
    return {}


class V1Transport:
    """POST line protocol to ``{url}/write`` (InfluxDB 1.x API, or the compatibility API)."""

    name = "v1"

    def __init__(
        self,
        url: str,
        database: str,
        *,
        retention_policy: str | None = None,
        precision: Precision = Precision.NS,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
        gzip: bool = False,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"InfluxDB url must start with http:// or https://, got {url!r}")
        if not database:
            raise ValueError("the v1 write API needs a database")
        params = {"db": database, "precision": str(precision)}
        if retention_policy:
            params["rp"] = retention_policy
        self.write_url = f"{url.rstrip('/')}/write?{urlencode(params)}"
        self.headers = {"Content-Type": "text/plain; charset=utf-8"}
        self.headers.update(auth_headers(username, password, token))
        if gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.gzip = gzip
        self.timeout = urllib3.Timeout(connect=min(timeout_s, 5.0), read=timeout_s)
        self._pool: urllib3.PoolManager | None = None

    def send(self, body: bytes, points: int) -> SendResult:
        if self._pool is None:
            self._pool = urllib3.PoolManager(num_pools=2, maxsize=1, retries=False)
        if self.gzip:
            import gzip as _gzip

            body = _gzip.compress(body, compresslevel=1)
        try:
            resp = self._pool.request(
                "POST", self.write_url, body=body, headers=self.headers, timeout=self.timeout
            )
        except urllib3.exceptions.HTTPError as exc:
            return SendResult(Outcome.RETRY, None, f"{type(exc).__name__}: {exc}")
        return classify(resp.status, resp.data.decode("utf-8", "replace"), points, resp.headers)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.clear()
            self._pool = None


class V2Transport:
    """Write through influxdb-client's v2 write API (org, bucket, token)."""

    name = "v2"

    def __init__(
        self,
        url: str,
        *,
        org: str,
        bucket: str,
        token: str | None = None,
        precision: Precision = Precision.NS,
        timeout_s: float = 10.0,
    ) -> None:
        if not bucket:
            raise ValueError("the v2 write API needs a bucket")
        if importlib.util.find_spec("influxdb_client") is None:
            raise SinkError(
                "sink.api = 'v2' writes through influxdb-client, which is not installed: "
                "install 'gpuwarden[v2]', or use api = 'v1' (InfluxDB 2.x and 3.x serve it too)"
            )
        self.url, self.org, self.bucket, self.token = url, org, bucket, token
        self.precision = precision
        self.timeout_ms = int(timeout_s * 1000)
        self._client: Any = None
        self._write: Any = None

    def send(self, body: bytes, points: int) -> SendResult:
        from influxdb_client.rest import ApiException  # heavy import: first use only

        if self._client is None:
            from influxdb_client.client.influxdb_client import InfluxDBClient
            from influxdb_client.client.write_api import SYNCHRONOUS

            # retries=False: our sink owns retries, backoff and the spool.
            self._client = InfluxDBClient(
                url=self.url,
                token=self.token or "",
                org=self.org,
                timeout=self.timeout_ms,
                retries=False,
            )
            self._write = self._client.write_api(write_options=SYNCHRONOUS)
        try:
            self._write.write(
                bucket=self.bucket, org=self.org, record=body, write_precision=str(self.precision)
            )
        except ApiException as exc:
            text = exc.body.decode() if isinstance(exc.body, bytes) else str(exc.body or "")
            return classify(int(exc.status or 0), text, points, dict(exc.headers or {}))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return SendResult(Outcome.RETRY, None, f"{type(exc).__name__}: {exc}")
        return SendResult(Outcome.OK, 204)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = self._write = None
