"""Post findings to the remediation engine, on a thread of its own, retried and signed.

Two senders use it: the agent's fast path (critical events the moment they happen) and the
analyze service (its findings after each analysis). ``POST <url>`` with the finding's JSON
(:meth:`Finding.to_json`); with a token file, ``Authorization: Bearer <token>`` (read at each
post, so a rotated token is picked up); with a secret file, the body is signed
(:mod:`core.signing`), which an engine that has ``hmac_secret_file`` set requires.

Posting never blocks the caller: findings queue (up to 10,000) and a thread sends them. A post
that times out, cannot connect, or gets 429/5xx is retried by the shared policy
(:mod:`core.retry`: four tries by default); a 409 means the engine has it already (an earlier
try got through), which counts as delivered; any other 4xx is refused for good and logged. A
finding that could not be delivered is not lost: it is also written to InfluxDB with the
cycle's data, so analytics and the dashboards see it on the slow path.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path
from typing import Any

from core.finding import Finding
from core.retry import Backoff
from core.signing import SIGNATURE_HEADER, sign

log = logging.getLogger(__name__)

#: four tries, 0 s / 1 s / 2 s apart (urllib3's schedule for base 0.5 s), at most 8 s apart
DEFAULT_RETRY = Backoff(base_s=0.5, max_s=8.0, attempts=4)


class FindingPoster:
    def __init__(
        self,
        url: str,
        token_file: str = "",
        *,
        secret_file: str = "",
        retry: Backoff = DEFAULT_RETRY,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = url
        self.token_file = token_file
        self.secret_file = secret_file
        self.retry = retry
        self.timeout_s = timeout_s
        self.posted = 0
        self.failed = 0
        self._queue: queue.Queue[Finding | None] = queue.Queue(maxsize=10_000)
        self._thread: threading.Thread | None = None
        self._http: Any = None

    def post(self, finding: Finding) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="fastpath")
            self._thread.start()
        try:
            self._queue.put_nowait(finding)
        except queue.Full:
            self.failed += 1
            log.error("findings queue full; finding %s only goes the slow path", finding.id)

    def _headers(self, body: bytes) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "gpuwarden"}
        if self.token_file:
            token = Path(self.token_file).read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        if self.secret_file:
            secret = Path(self.secret_file).read_bytes().strip()
            headers[SIGNATURE_HEADER] = sign(secret, body)
        return headers

    def _send(self, finding: Finding) -> None:
        import urllib3

        if self._http is None:
            self._http = urllib3.PoolManager(
                timeout=urllib3.Timeout(total=self.timeout_s), retries=self.retry.urllib3_retry()
            )
        body = json.dumps(finding.to_json()).encode()
        try:
            resp = self._http.request("POST", self.url, body=body, headers=self._headers(body))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self.failed += 1
            log.error("could not post finding %s to %s: %s", finding.id, self.url, exc)
            return
        if resp.status < 300 or resp.status == 409:  # 409: the engine has it already
            self.posted += 1
            return
        self.failed += 1
        text = resp.data[:200].decode("utf-8", "replace")
        log.error("remediation refused finding %s: HTTP %s %s", finding.id, resp.status, text)

    def _run(self) -> None:
        while (finding := self._queue.get()) is not None:
            self._send(finding)

    def close(self, timeout_s: float = 5.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
