"""The fast path: post critical findings to the remediation engine the moment they happen.

``POST <remediation_url>`` with the finding's JSON (:meth:`Finding.to_json`) and, when a token
file is configured, ``Authorization: Bearer <token>``. Posting happens on its own thread so the
collection loop never waits on the network; a failed post is retried with backoff a few times
and then logged (the finding is also written to InfluxDB with the cycle, so nothing is lost:
analytics sees it on the slow path).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from core.finding import Finding

log = logging.getLogger(__name__)


class FindingPoster:
    def __init__(
        self, url: str, token_file: str = "", *, attempts: int = 4, timeout_s: float = 5.0
    ) -> None:
        self.url = url
        self.token_file = token_file
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.posted = 0
        self.failed = 0
        self._queue: queue.Queue[Finding | None] = queue.Queue(maxsize=10_000)
        self._thread: threading.Thread | None = None

    def post(self, finding: Finding) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="fastpath")
            self._thread.start()
        try:
            self._queue.put_nowait(finding)
        except queue.Full:
            self.failed += 1
            log.error("fast path queue full; finding %s only goes the slow path", finding.id)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token_file:
            token = Path(self.token_file).read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _send(self, finding: Finding) -> None:
        body = json.dumps(finding.to_json()).encode()
        for attempt in range(self.attempts):
            try:
                req = urllib.request.Request(self.url, body, self._headers(), method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    resp.read()
                self.posted += 1
                return
            except (urllib.error.URLError, OSError) as exc:
                if isinstance(exc, urllib.error.HTTPError) and exc.code == 409:
                    self.posted += 1  # the engine has it already (an earlier try got through)
                    return
                if isinstance(exc, urllib.error.HTTPError) and 400 <= exc.code < 500:
                    self.failed += 1
                    log.error("remediation refused finding %s: HTTP %s", finding.id, exc.code)
                    return
                time.sleep(min(8.0, 0.5 * 2**attempt))
                last = exc
        self.failed += 1
        log.error("could not post finding %s to %s: %s", finding.id, self.url, last)

    def _run(self) -> None:
        while (finding := self._queue.get()) is not None:
            self._send(finding)

    def close(self, timeout_s: float = 5.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
