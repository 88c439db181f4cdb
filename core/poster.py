"""Post findings to the remediation engine, on a thread of its own, retried and signed.

Two senders use it: the agent's fast path (critical events the moment they happen) and the
analyze service (its findings after each analysis). ``POST <url>`` with the finding's JSON
(:meth:`Finding.to_json`); with a token file, ``Authorization: Bearer <token>`` (read at each
post, so a rotated token is picked up); with a secret file, the request is signed
(:func:`core.signing.sign_request`: method, path, query, timestamp, identity and body) as
``identity``, this sender's own identity at an engine with identities (its key in the secret
file, read at each post), or, with no identity, with the legacy shared secret. Each try is
signed afresh (a new nonce), so a retry is never taken for a replay. An
``https`` URL is verified against ``ca_file`` (the system's CAs when empty), and ``cert_file``
and ``key_file`` are this sender's certificate for an engine that requires one (mutual TLS).
A server that fails verification is retried like one that is down, and says why.

``url`` may list several engines (an acting one and its standbys: space- or comma-separated):
each try goes to the engine that answered last, then to the others in order, so the sender
finds whichever engine holds the lease (:mod:`remediation.lease`; a standby does not listen).

Posting never blocks the caller: findings queue (up to 10,000) and a thread sends them,
critical ones first, then in order; a finding queued or sent lately, word for word, is not
queued again. A burst of warnings cannot hold a fatal XID behind it. A post that times out,
cannot connect, or gets 429/5xx is tried again with the shared backoff (:mod:`core.retry`: 0.5
s doubling to 10 s, jittered) for as long as the finding is younger than ``max_age_s`` (the
engine's own ``max_finding_age_s``: it refuses older ones), so an engine that restarts, or is
down for minutes, still gets every finding when it is back (and acts on each once: it remembers
finding ids). A 409 counts as delivered only when the engine says it holds this very finding
(every result ``same_content``: an earlier try got through); a 409 for another finding under
the same id, or a 409 that says nothing of the content (a replayed signature), is not
delivered: counted in ``conflicts`` and ``failed``, and logged; unless this poster delivered a
finding under that id before (the XID both the NVML events and the kernel log report): the
engine holds ours, and this one is counted in ``conflicts`` and logged, not ``failed``. Any
other 4xx is refused for good and logged. A finding that could not be delivered is not lost: it
is also written to InfluxDB with the cycle's data, so analytics and the dashboards see it on
the slow path.

With an ``outbox`` folder (the agent's: ``<[sink] spool_dir>/findings``), a critical finding is
written there (fsynced) before it is queued and removed once the engine took it, refused it,
or it grew too old; a poster started on the folder posts again what is left (:class:`Outbox`).
Found by a review of what a crash loses (2026-11-28): a fatal XID's finding lived only in this
queue, retried for up to an hour while the engine was down or failing over, and nothing on the
slow path drains a node for an XID: an agent killed or restarted meanwhile lost the drain.
A 409 for another finding under the id of one that predates this poster's start is a conflict,
not a failure (the other path's copy, delivered before a restart).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from gpuwarden.core.checkpoint import read_json, write_json_atomic
from gpuwarden.core.config import ConfigError, read_secret
from gpuwarden.core.finding import Finding, FindingError, Severity
from gpuwarden.core.retry import RETRY_STATUSES, Backoff
from gpuwarden.core.signing import request_target, sign_request
from gpuwarden.core.tls import client_context

log = logging.getLogger(__name__)

RECENT_IDS = 20_000
"""Findings remembered as queued or sent (a queue's worth and as many sent before)."""

#: between tries of one finding: 0.5 s doubling to 10 s, full jitter, until it is too old
DEFAULT_RETRY = Backoff(base_s=0.5, max_s=10.0)


#: critical findings an outbox holds at most (a node's fatal XIDs are one per GPU and episode)
OUTBOX_MAX = 1000


class Outbox:
    """Critical findings not yet delivered, a file each (``<sha256 of id:digest>.json``) in a
    folder only this agent writes (made ``0700``). Files are written atomically and fsynced
    (:func:`~core.checkpoint.write_json_atomic`), read without following links, and one that does
    not parse as a finding is removed and logged. At most :data:`OUTBOX_MAX`; past that a
    finding is queued in memory only (and logged)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        # one poster per folder: a second agent on the same configuration (run by hand) would
        # post the first one's findings and remove their files as it settled them
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        self._lock_fd = os.open(self.folder / ".lock", flags, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise OSError(f"{self.folder} is another running agent's") from None
        self._names = {p.name for p in self.folder.glob("*.json")}

    @staticmethod
    def name(finding: Finding) -> str:
        return hashlib.sha256(f"{finding.id}:{finding.digest}".encode()).hexdigest()[:32] + ".json"

    def keep(self, finding: Finding) -> None:
        name = self.name(finding)
        if name in self._names:
            return
        if len(self._names) >= OUTBOX_MAX:
            log.error("findings outbox %s is full (%d); finding %s is kept in memory only",
                      self.folder, OUTBOX_MAX, finding.id)  # fmt: skip
            return
        try:
            write_json_atomic(self.folder / name, finding.to_json())
        except (OSError, TypeError, ValueError) as exc:  # (evidence JSON cannot hold)
            log.error("cannot keep finding %s in %s (%s): kept in memory only", finding.id,
                      self.folder, getattr(exc, "strerror", None) or exc)  # fmt: skip
            return
        self._names.add(name)

    def done(self, finding: Finding) -> None:
        name = self.name(finding)
        if name in self._names:
            self._names.discard(name)
            try:
                os.unlink(self.folder / name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("cannot remove %s from %s: %s", name, self.folder, exc)

    def close(self) -> None:
        """Let another poster have the folder (this process stops posting)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def left(self) -> list[Finding]:
        """What an earlier poster kept and did not deliver, oldest first."""
        out = []
        for name in sorted(self._names):
            data = read_json(self.folder / name)
            try:
                if data is None:
                    raise FindingError("not a JSON object (or a link)")
                finding = Finding.from_json(data)
                if self.name(finding) != name:
                    raise FindingError("its content is not the finding its name says")
            except (FindingError, ValueError, TypeError) as exc:
                log.error("findings outbox: %s removed: %s", name, exc)
                self._names.discard(name)
                (self.folder / name).unlink(missing_ok=True)
                continue
            out.append(finding)
        return sorted(out, key=lambda f: f.time_ns)


class FindingPoster:
    def __init__(
        self,
        url: str,
        token_file: str = "",
        *,
        secret_file: str = "",
        identity: str = "",
        retry: Backoff = DEFAULT_RETRY,
        timeout_s: float = 5.0,
        max_age_s: float = 3600.0,
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
        outbox: str = "",
    ) -> None:
        self.urls = engine_urls(url)
        self.url = self.urls[0]
        """The engine posted to now: the first of ``urls`` until it fails, then the next."""
        self.ca_file, self.cert_file, self.key_file = ca_file, cert_file, key_file
        self.token_file = token_file
        self.secret_file = secret_file
        self.identity = identity
        self.retry = retry
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.posted = 0
        self.failed = 0
        self.retries = 0
        self.conflicts = 0
        """409s for content the engine does not hold (another finding took the id)."""
        self.merged = 0
        """Findings not sent again: the same finding (id and content) was queued or sent
        lately."""
        # (0 for critical, else 1; arrival; the finding, None to stop)
        self._queue: queue.PriorityQueue[tuple[int, int, Finding | None]] = queue.PriorityQueue(
            maxsize=10_000
        )
        self._seq = 0
        self._ids: dict[str, None] = {}  # "id:digest" queued or sent lately, oldest first
        self._delivered: dict[str, None] = {}  # ids the engine took from us lately
        self._ids_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._http: Any = None
        self._started_ns = time.time_ns()
        self.resumed: list[Finding] = []
        """Findings an earlier run kept in the outbox and this one posts again."""
        self.outbox: Outbox | None = None
        try:
            self.outbox = Outbox(outbox) if outbox else None
        except OSError as exc:
            log.error("cannot use the findings outbox %s (%s): critical findings wait in memory "
                      "only until the engine takes them", outbox, exc.strerror or exc)  # fmt: skip
        if self.outbox is not None:
            self.resumed = self.outbox.left()
            if self.resumed:
                log.warning("posting %d critical finding(s) an earlier run did not deliver",
                            len(self.resumed))  # fmt: skip
            for finding in self.resumed:
                self.post(finding)

    def post(self, finding: Finding) -> None:
        key = f"{finding.id}:{finding.digest}"
        with self._ids_lock:  # several threads post (the kernel-log reader, the loop, ...)
            if self._thread is None:  # one sender only: it alone takes from the queue
                self._thread = threading.Thread(target=self._run, daemon=True, name="fastpath")
                self._thread.start()
            if key in self._ids:
                self.merged += 1
                return
            _remember(self._ids, key)
            self._seq += 1
            critical = finding.severity is Severity.CRITICAL
            entry = (0 if critical else 1, self._seq, finding)
        if critical and self.outbox is not None:
            self.outbox.keep(finding)  # on disk before it is queued: a crash cannot lose it
        try:
            self._queue.put_nowait(entry)
        except queue.Full:  # (its outbox file stays: the next start posts it)
            self._forget(finding)  # not queued: the same finding posted later is taken
            self.failed += 1
            log.error("findings queue full; finding %s only goes the slow path", finding.id)

    def _headers(self, body: bytes, url: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "gpuwarden"}
        # read at each post (a rotated file is picked up); each command checks them at start
        if self.token_file:
            token = read_secret(self.token_file, "token_file")
            headers["Authorization"] = f"Bearer {token}"
        if self.secret_file:
            key = read_secret(self.secret_file, "hmac_secret_file").encode()
            headers |= sign_request(key, "POST", request_target(url), body, self.identity)
        return headers

    def _send(self, finding: Finding, priority: int = 1) -> None:
        """Deliver one finding: tried until the engine answers, it is too old, or we close.
        Between its tries, critical findings queued meanwhile are sent first (a warning the
        engine will not take for an hour must not hold a fatal XID behind it)."""
        body = json.dumps(finding.to_json()).encode()
        tries = 0
        while True:
            tries += 1
            verdict, detail = self._try(body)
            if verdict != "retry":
                self._settled(finding)
            if verdict == "delivered":
                self.posted += 1
                with self._ids_lock:
                    _remember(self._delivered, finding.id)
                return
            with self._ids_lock:
                # ours: delivered from here, or (the agent's poster) before it started: the
                # other path's copy of a kernel record read again after a restart
                ours = finding.id in self._delivered or (
                    self.outbox is not None and finding.time_ns < self._started_ns
                )
            if verdict == "conflict" and ours:
                # the engine holds what this agent sent first under this id (the XID that the
                # NVML events and the kernel log both report, one node-wide id for two GPUs the
                # agent could not map): the engine was reached, not a failure (it raised the
                # cannot-reach-engine alert on every fatal XID); what this one says more is
                # not acted on, so it is said
                self.conflicts += 1
                log.warning("finding %s not taken: the engine holds another this agent sent "
                            "under its id first (%s)", finding.id, detail)  # fmt: skip
                return
            if verdict == "conflict":
                self._forget(finding)
                self.failed += 1
                self.conflicts += 1
                log.error("finding %s not delivered: the engine holds other content under its "
                          "id (%s)", finding.id, detail)  # fmt: skip
                return
            if verdict == "refused":
                self._forget(finding)
                self.failed += 1
                log.error("remediation refused finding %s: %s", finding.id, detail)
                return
            age_s = time.time() - finding.time_ns / 1e9
            if age_s > self.max_age_s or self._closing.is_set():
                if age_s > self.max_age_s:  # closing: the outbox keeps it for the next start
                    self._settled(finding)
                self._forget(finding)
                self.failed += 1
                log.error("could not post finding %s to %s (%d tries, last: %s); it goes the "
                          "slow path", finding.id, self.url, tries, detail)  # fmt: skip
                return
            self.retries += 1
            if tries == 1:
                log.warning("posting finding %s to %s failed (%s); trying again", finding.id,
                            self.url, detail)  # fmt: skip
            self._closing.wait(self.retry.delay(tries))
            while (urgent := self._more_urgent(priority)) is not None:
                self._send(urgent, 0)

    def _settled(self, finding: Finding) -> None:
        """``finding`` is done with (taken, refused, too old): out of the outbox."""
        if self.outbox is not None and finding.severity is Severity.CRITICAL:
            self.outbox.done(finding)

    def _forget(self, finding: Finding) -> None:
        """``finding`` was not delivered: the same finding posted again is queued."""
        with self._ids_lock:
            self._ids.pop(f"{finding.id}:{finding.digest}", None)

    def _more_urgent(self, priority: int) -> Finding | None:
        """The next queued finding if it is more urgent than ``priority`` (taken off)."""
        with self._queue.mutex:  # a look at the head, under the queue's own lock
            head = self._queue.queue[0] if self._queue.queue else None
        if head is None or head[0] >= priority:
            return None
        return self._queue.get_nowait()[2]  # only this thread takes: still the head

    def _try(self, body: bytes) -> tuple[str, str]:
        """One round: the engine that answered last, then the others in order, until one takes
        the finding: ``delivered``, ``refused`` (for good), ``conflict`` (a 409 for content the
        engine does not hold) or ``retry``, and what happened. Another engine in the list
        becomes the one posted to only by taking a finding: its refusal (a stale address now
        serving something else, a 404, a 401) is not believed over the engine posted to."""
        verdict, detail = self._try_one(self.url, body)
        if verdict != "retry":
            return verdict, detail
        for url in [u for u in self.urls if u != self.url]:
            other, said = self._try_one(url, body)
            if other == "delivered":
                log.warning("remediation engine %s took a finding; posting there from now on",
                            url)  # fmt: skip
                self.url = url
                return other, said
            detail = f"{detail}; {url}: {said or other}"
        return verdict, detail

    def _try_one(self, url: str, body: bytes) -> tuple[str, str]:
        import urllib3

        if self._http is None:
            tls = None
            if any(u.startswith("https:") for u in self.urls):
                tls = client_context(self.ca_file, self.cert_file, self.key_file)
            self._http = urllib3.PoolManager(
                timeout=urllib3.Timeout(total=self.timeout_s), retries=False, ssl_context=tls
            )
        try:
            resp = self._http.request("POST", url, body=body, headers=self._headers(body, url))
        except (urllib3.exceptions.HTTPError, OSError, ConfigError) as exc:
            return "retry", f"{type(exc).__name__}: {exc}"
        if resp.status < 300:
            return "delivered", ""
        if resp.status == 409:
            return _duplicate(resp.data)
        text = f"HTTP {resp.status} {resp.data[:200].decode('utf-8', 'replace')}"
        return ("retry" if resp.status in RETRY_STATUSES else "refused"), text

    def _run(self) -> None:
        while True:
            priority, _, finding = self._queue.get()
            if finding is None:
                return
            self._send(finding, priority)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued for up to ``timeout_s``, then stop: a finding still failing
        then is given up (it went to InfluxDB too)."""
        if self._thread is not None:
            self._queue.put((2, 0, None))  # after everything queued
            self._thread.join(timeout_s)
            self._closing.set()
            self._thread.join(timeout_s)
        if self.outbox is not None:
            self.outbox.close()


def _remember(recent: dict[str, None], key: str) -> None:
    """Add ``key`` to an ordered set of at most :data:`RECENT_IDS`, the oldest going first."""
    recent[key] = None
    while len(recent) > RECENT_IDS:
        del recent[next(iter(recent))]


def engine_urls(setting: str) -> list[str]:
    """The engines a sender posts to: one URL, or several separated by spaces or commas (an
    acting engine and its standbys, docs/DURABILITY.md), tried in order."""
    urls = [u for u in setting.replace(",", " ").split() if u]
    if not urls:
        raise ConfigError("no remediation engine URL given")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ConfigError(f"remediation engine URL {u!r}: not http:// or https://")
    if len({u.split(":", 1)[0] for u in urls}) > 1:  # a failover must not drop to cleartext
        raise ConfigError(f"remediation engine URLs mix http and https: {urls}; the token and "
                          "signed findings would go in clear to the http ones")  # fmt: skip
    return urls


def _duplicate(data: bytes) -> tuple[str, str]:
    """A 409's verdict: ``delivered`` when every result says the engine holds this very
    finding (``same_content``), else ``conflict`` with the engine's words."""
    try:
        answer = json.loads(data)
        results = answer.get("results") if isinstance(answer, dict) else None
    except ValueError:
        results = None
    if (
        isinstance(results, list)
        and results
        and all(isinstance(r, dict) and r.get("same_content") is True for r in results)
    ):
        return "delivered", "already received (same content)"
    return "conflict", f"HTTP 409 {data[:300].decode('utf-8', 'replace')}"
