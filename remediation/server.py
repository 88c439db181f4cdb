"""The engine's HTTP endpoint: findings in (agents, analytics, Grafana), operators' calls.

=========================================  =========================================
``POST /v1/findings``                      one finding (``Finding.to_json()``) or a list
``POST /v1/alerts/grafana``                Grafana's webhook contact-point payload
``POST /v1/alerts/alertmanager``           Alertmanager's webhook payload (``version: "4"``)
``GET  /v1/pending``                       plans waiting for approval or for room, and the
                                           nodes a prediction holds out (``held``)
``POST /v1/approve/<plan_id>``             run a plan that waits for approval
``POST /v1/undo/<node>``                   put a node gpuwarden took out back in service
``GET  /v1/stats``                         counters
``GET  /metrics``                          the same counters for Prometheus (text format)
``GET  /healthz``                          liveness (no authentication, no data)
=========================================  =========================================

With ``[engine] tls_cert_file`` and ``tls_key_file`` it serves HTTPS only, and with
``tls_client_ca_file`` every client must present a certificate that CA signed (mutual TLS).

Who may call (issue 38, :mod:`remediation.identity`): with identities configured, every
call but ``/healthz`` is signed by one identity (``X-Gpuwarden-Identity`` and an
``X-Gpuwarden-Signature`` over method, path, query, timestamp, identity and body,
:func:`core.signing.sign_request`) and served within that identity's scope (403 outside it: an
agent's findings about its own node only, analytics and alert sources their kinds only,
operators alone approve and undo; a finding that returns a node to service only from that
node's own agent); the audit records the identity's name as ``by``. A bearer token alone
reads ``/metrics`` and ``/v1/stats`` (``token_file``), or, with ``alerts_unsigned``, posts an
alert source's alerts (its own key as the token). A client certificate, when presented, must
name the identity. Without identities (the legacy mode) one bearer token serves every caller
and, with ``hmac_secret_file``, POSTs are signed with the one shared secret. Either way an
accepted signature is remembered (:mod:`remediation.replay`) before anything is acted on,
for its whole validity window, across restarts.

Requests are refused, with a JSON ``{"error": ...}`` saying why and nothing acted on, when
they are: unauthenticated (401), outside the identity's scope (403), larger than
``max_body_bytes`` (413, read no further), without a length (411), not JSON or not findings
(400/422; a subject value that is not a name of its kind, :mod:`core.names`, is 400), stale
(a finding older than ``max_finding_age_s``, or from the future: 422), or replays (a
signature seen before, or every finding in the request already received: 409, each result
saying with ``same_content`` whether the engine holds this very finding or another one under
its id). A finding the engine cannot journal (its audit log's disk is full or read-only) gets
503: nothing was decided, and the same finding, sent again once the disk is back, is decided
then (the sender signs its retry afresh: the first signature was remembered).

Alerts from Grafana and from Alertmanager become findings the same way (:func:`alert_finding`):
the kind from the rule's ``kind`` label (else its ``alertname``), the subject from the
``cluster``/``node``/``gpu``/... labels (Alertmanager's from Prometheus also from
``Hostname``, dcgm-exporter's host label, or the host of ``instance``), the severity from
``severity``. Resolved alerts are not findings: a repair is a node's own ``node_healthy``.
Neither Grafana nor Alertmanager can sign a request as gpuwarden does, so their unsigned posts
are refused unless ``[engine] alerts_unsigned`` accepts them on a bearer token alone (and TLS,
where the endpoint serves it); with identities, that token is the alert source's own key, and
it creates findings of the kinds its identity allows, no other.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
import ssl
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from typing import Any, Protocol

from gpuwarden.core.finding import Finding, FindingError, FindingNameError
from gpuwarden.core.metrics import Metric, render
from gpuwarden.core.names import BadNameError
from gpuwarden.core.signing import (
    IDENTITY_HEADER,
    SIGNATURE_HEADER,
    signature_mac,
    verify_request,
)
from gpuwarden.core.tls import GuardedHandler, http_server, per_peer_cap
from gpuwarden.remediation.alerts import alert_finding
from gpuwarden.remediation.audit import JournalError
from gpuwarden.remediation.clock import SYSTEM, Clock
from gpuwarden.remediation.engine import Engine, EngineClosedError
from gpuwarden.remediation.identity import RETURN_KINDS, Keyring, Principal
from gpuwarden.remediation.model import ActionKind
from gpuwarden.remediation.outcomes import UNDO_REASONS
from gpuwarden.remediation.replay import ReplayError, SignatureMemory

log = logging.getLogger(__name__)

#: liveness: answered without authentication, no data (the Deployment's probes point here)
HEALTH_PATH = "/healthz"


#: Series /metrics shows from the start, at 0, so that an alert on their increase fires on
#: the first one (a series that appears at 1 has not increased: Prometheus sees no change).
#: deploy/prometheus/gpuwarden.rules.yml alerts on these.
ALERTED_REFUSALS = (401, 403, 429, 503)
ALERTED_OUTCOMES = ("failed", "timeout")
ALERTED_VERDICTS = ("failed", "unknown_node")


#: the legacy mode's one credential (every scope) and the read-only monitoring token
SHARED = Principal("shared-credential", "shared")
MONITOR = Principal("monitor", "monitor")


class Headers(Protocol):
    """A ``Mapping`` or the ``email.message.Message`` that ``http.server`` hands us."""

    def get(self, name: str, default: Any = None, /) -> Any: ...


class RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


REFUSALS_LOGGED = 10
"""Refusal lines logged per status a minute (each refusal is counted in the metrics)."""


class Quotas:
    """Findings a minute per identity, by its kind (``[engine] quota_<kind>_per_min``; 0 or
    absent: no quota): a token bucket per principal that holds a minute's worth, so a burst of
    up to that many passes at once and the rate holds over any minute. A family's members
    (``agents/<node>``) each have their own bucket: one node's flood costs only that node. The
    legacy shared credential has one bucket for the whole fleet (``quota_shared_per_min``);
    operators have none. Buckets exist only for principals that
    proved who they are, so their number is bounded by the nodes and identities configured."""

    def __init__(self, per_min: Mapping[str, float], clock: Clock = SYSTEM) -> None:
        self._per_min = {k: float(v) for k, v in per_min.items() if v and v > 0}
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens left, when: monotonic)
        self._lock = threading.Lock()
        self._mono = clock.mono

    def per_min(self, principal: Principal) -> float:
        return self._per_min.get(principal.kind, 0.0)

    def empty(self, principal: Principal) -> float:
        """Seconds until ``principal`` may send one finding (0: now). Asked before a request's
        body is read, so a sender over its quota costs no read, parse or signature record."""
        rate = self.per_min(principal)
        if rate <= 0:
            return 0.0
        now = self._mono()
        with self._lock:
            tokens, then = self._buckets.get(principal.name, (rate, now))
        tokens = min(rate, tokens + (now - then) * rate / 60.0)
        return 0.0 if tokens >= 1 else max(1.0, (1 - tokens) * 60.0 / rate)

    def spend(self, principal: Principal, n: int) -> float:
        """Take ``n`` findings from ``principal``'s bucket: 0 when they fit, else the seconds
        until they would (nothing is taken then)."""
        rate = self.per_min(principal)
        if rate <= 0:
            return 0.0
        now = self._mono()
        with self._lock:
            tokens, then = self._buckets.get(principal.name, (rate, now))
            tokens = min(rate, tokens + (now - then) * rate / 60.0)
            if n > tokens:
                self._buckets[principal.name] = (tokens, now)
                return max(1.0, (min(n, rate) - tokens) * 60.0 / rate)
            self._buckets[principal.name] = (tokens - n, now)
            return 0.0


class Endpoint:
    """Request handling, independent of the HTTP server (so it can be tested directly).

    With ``keyring`` (the configured identities) every request is authenticated to one
    identity and served within its scope (:mod:`remediation.identity`); ``token`` is then
    optional and only reads (``/metrics``, ``/v1/stats``) with it. Without identities (the
    legacy mode) one bearer ``token`` and one ``secret`` serve every caller."""

    def __init__(
        self,
        engine: Engine,
        token: str,
        *,
        secret: bytes = b"",
        keyring: Keyring | None = None,
        signatures: SignatureMemory | None = None,
        max_body_bytes: int = 1 << 20,
        max_findings: int = 1000,
        max_finding_age_s: float = 3600.0,
        max_clock_skew_s: float = 300.0,
        alerts_unsigned: bool = False,
        quotas_per_min: Mapping[str, float] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.keyring = keyring if keyring else None
        if not token and self.keyring is None:
            raise ValueError(
                "the remediation endpoint needs identities (engine.identities_file or "
                "[[identity]]) or, in the legacy mode, a token (engine.token_file)"
            )
        if self.keyring is not None and secret:
            raise ValueError(
                "engine.hmac_secret_file is the legacy shared secret: with identities, each "
                "signs with its own key; remove hmac_secret_file"
            )
        self.engine = engine
        self.token = token.encode()
        self.secret = secret
        if signatures is None:  # (an empty memory is falsy: compared with None)
            signatures = SignatureMemory("", max_clock_skew_s, wall=clock.wall)
        self.signatures = signatures
        self.max_body_bytes = max_body_bytes
        self.max_findings = max_findings
        self.max_finding_age_s = max_finding_age_s
        self.max_clock_skew_s = max_clock_skew_s
        self.alerts_unsigned = alerts_unsigned
        self.clock = clock
        self.quotas = Quotas(quotas_per_min or {}, clock)
        self.rejected: dict[int, int] = {}
        # per status: (the minute's start, lines logged in it, refusals not logged in it)
        self._said: dict[int, tuple[float, int, int]] = {}
        self._lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None  # make_server's, for its counters

    # -- checks -------------------------------------------------------------------------------

    def _bearer(self, headers: Headers) -> bytes:
        scheme, _, given = str(headers.get("Authorization", "")).partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return b""
        return given.strip().encode("utf-8", "replace")

    def who(self, headers: Headers, method: str, path: str) -> tuple[Principal, bytes | None]:
        """Who the request says it comes from, before its body is read: the principal and the
        key its signature must verify with (None: no signature needed), or 401."""
        given = self._bearer(headers)
        if self.keyring is None:  # legacy: the one shared credential
            if not given:
                raise RequestError(
                    HTTPStatus.UNAUTHORIZED, "missing 'Authorization: Bearer <token>'"
                )
            if not hmac.compare_digest(given, self.token):
                raise RequestError(HTTPStatus.UNAUTHORIZED, "wrong token")
            unsigned = method != "POST" or (self.alerts_unsigned and path.startswith("/v1/alerts/"))
            key = (
                None
                if not self.secret or (unsigned and not headers.get(SIGNATURE_HEADER))
                else self.secret
            )
            return SHARED, key
        if headers.get(SIGNATURE_HEADER):
            claimed = str(headers.get(IDENTITY_HEADER, ""))
            if not claimed:
                raise RequestError(HTTPStatus.UNAUTHORIZED, f"missing {IDENTITY_HEADER}")
            found = self.keyring.lookup(claimed)
            if found is None:
                raise RequestError(HTTPStatus.UNAUTHORIZED, f"unknown identity {claimed[:80]!r}")
            return found
        if given:
            alerts = self.keyring.bearer(given)
            if alerts is not None and self.alerts_unsigned and path.startswith("/v1/alerts/"):
                return alerts, None
            if self.token and method == "GET" and hmac.compare_digest(given, self.token):
                return MONITOR, None
            raise RequestError(
                HTTPStatus.UNAUTHORIZED,
                "a bearer token alone reads /metrics and /v1/stats, or, with alerts_unsigned, "
                f"posts an alert source's alerts; anything else needs {SIGNATURE_HEADER}",
            )
        raise RequestError(HTTPStatus.UNAUTHORIZED, f"missing {SIGNATURE_HEADER}")

    def verify(
        self,
        principal: Principal,
        key: bytes | None,
        headers: Headers,
        request: tuple[str, str, bytes],
        peer_names: frozenset[str] | None = None,
    ) -> Principal:
        """Check the signature of ``(method, target, body)`` and remember it, durably, before
        anything is acted on (a signature seen before is a replay: 409); check the client
        certificate's names against the identity (403)."""
        method, target, body = request
        if (
            peer_names is not None
            and self.keyring is not None
            and principal.kind != "monitor"
            and not peer_names & principal.cert_names
        ):
            raise RequestError(
                HTTPStatus.FORBIDDEN,
                f"the client certificate names {sorted(peer_names)}, not {principal.name} "
                f"(accepted: {sorted(principal.cert_names)})",
            )
        if key is None:
            return principal
        header = str(headers.get(SIGNATURE_HEADER, ""))
        if not header:
            raise RequestError(HTTPStatus.UNAUTHORIZED, f"missing {SIGNATURE_HEADER}")
        claimed = principal.name if self.keyring is not None else ""
        try:
            t = verify_request(
                key, header, method, target, body, claimed,
                tolerance_s=self.max_clock_skew_s, now=self.clock.wall(),
            )  # fmt: skip
        except ValueError as exc:
            raise RequestError(HTTPStatus.UNAUTHORIZED, str(exc)) from None
        if method == "GET":
            return principal  # a read changes nothing: a replayed one is harmless
        try:
            # the MAC, from the header's one accepted form (_parts refuses any other)
            if not self.signatures.remember(signature_mac(header), t):
                raise RequestError(HTTPStatus.CONFLICT, "replayed request (signature seen before)")
        except ReplayError as exc:
            raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, str(exc)) from None
        return principal

    def authorize(self, principal: Principal, route: str, what: str) -> None:
        if not principal.may(route):
            raise RequestError(
                HTTPStatus.FORBIDDEN, f"{principal.name} ({principal.kind}) may not {what}"
            )

    def in_scope(self, principal: Principal, findings: list[Finding]) -> None:
        """Every finding within the principal's scope and its quota, or 403 (429) before any
        is acted on."""
        for f in findings:
            why = principal.refuses(f.kind, f.subject.get("node", ""), self._returns(f.kind))
            if why:
                raise RequestError(HTTPStatus.FORBIDDEN, f"finding {f.id}: {why}")
        rate = self.quotas.per_min(principal)
        if rate and len(findings) > rate:  # would never fit: retrying cannot help
            raise RequestError(
                HTTPStatus.UNPROCESSABLE_ENTITY,
                f"{len(findings)} findings in one request is more than {principal.name}'s quota "
                f"of {rate:g} a minute: send at most {rate:g} at once",
            )
        wait_s = self.quotas.spend(principal, len(findings))
        if wait_s > 0:
            raise RequestError(
                HTTPStatus.TOO_MANY_REQUESTS,
                f"{principal.name} is over its quota of {self.quotas.per_min(principal):g} "
                f"findings a minute; retry in {wait_s:.0f} s (nothing of this request acted on)",
                retry_after_s=wait_s,
            )

    def _quota_bound(self, principal: Principal, path: str) -> bool:
        """Whether a POST to ``path`` spends ``principal``'s quota: findings and alerts from
        anyone, and every POST of a sender that is not a person (an agent has no business on
        ``/v1/undo``). An operator's approve or undo is never held back, not even on the
        legacy shared credential the whole fleet spends."""
        if path.startswith(("/v1/findings", "/v1/alerts/")):
            return True
        return principal.kind not in ("operator", "shared", "monitor")

    def _returns(self, kind: str) -> bool:
        """Would a finding of ``kind`` put its node back in service?"""
        if kind in RETURN_KINDS:
            return True
        return any(
            kind in p.kinds and ActionKind.UNCORDON in p.actions for p in self.engine.policies
        )

    def body_length(self, headers: Headers) -> int:
        raw = headers.get("Content-Length")
        if raw is None:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
        try:
            length = int(raw)
        except ValueError:
            raise RequestError(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length < 0:
            raise RequestError(HTTPStatus.BAD_REQUEST, "bad Content-Length")
        if length > self.max_body_bytes:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {length} bytes exceeds max_body_bytes={self.max_body_bytes}",
            )
        return length

    def _json(self, body: bytes) -> Any:
        try:
            return json.loads(body)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # nested too deep
            raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}") from None

    def _fresh(self, finding: Finding) -> Finding:
        """A finding's time against the engine's wall clock: two hosts' clocks compared, the
        one place where the sender's clock matters. Older than ``max_finding_age_s``: stale;
        more than ``max_clock_skew_s`` ahead: from the future. Both are 422, nothing acted on,
        counted in ``gpuwarden_engine_requests_refused_total{status="422"}``; the fix is the
        node's clock (chrony), see docs/DURABILITY.md, "Clocks"."""
        age = self.clock.wall() - finding.time_ns / 1e9
        if age > self.max_finding_age_s:
            raise RequestError(
                HTTPStatus.UNPROCESSABLE_ENTITY,
                f"finding {finding.id} is {age:.0f} s old (max_finding_age_s="
                f"{self.max_finding_age_s:.0f}): stale, not acted on",
            )
        if age < -self.max_clock_skew_s:
            raise RequestError(
                HTTPStatus.UNPROCESSABLE_ENTITY,
                f"finding {finding.id} is {-age:.0f} s in the future (more than "
                f"max_clock_skew_s={self.max_clock_skew_s:.0f}): is the sender's clock, or the "
                "engine's, off? not acted on",
            )
        return finding

    # -- routes -------------------------------------------------------------------------------

    def findings(
        self, body: bytes, via: str = "http", principal: Principal | None = None
    ) -> tuple[HTTPStatus, dict[str, Any]]:
        data = self._json(body)
        items = data if isinstance(data, list) else [data]
        if not items or len(items) > self.max_findings:
            raise RequestError(
                HTTPStatus.UNPROCESSABLE_ENTITY, f"send 1 to {self.max_findings} findings"
            )
        try:
            parsed = [Finding.from_json(item) for item in items]
        except FindingNameError as exc:  # a name that is no name: malformed, nothing acted on
            raise RequestError(HTTPStatus.BAD_REQUEST, f"not a finding: {exc}") from None
        except (FindingError, AttributeError, TypeError) as exc:
            raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY, f"not a finding: {exc}") from None
        fresh = [self._fresh(f) for f in parsed]  # all checked before any is acted on
        self.in_scope(principal or SHARED, fresh)
        return self._submit(fresh, via)

    def _submit(
        self, findings: list[Finding], via: str = "http"
    ) -> tuple[HTTPStatus, dict[str, Any]]:
        results = []
        for f in findings:
            d = self.engine.submit(f, via=via)
            result: dict[str, Any] = {"finding_id": f.id, "verdict": d.verdict, "why": d.why}
            same = getattr(d, "same_content", None)  # Decision's; a stand-in may lack it
            if same is not None:
                result["same_content"] = same
            results.append(result)
        if any(r["verdict"] == "queue_full" for r in results):
            # not queued (too many plans wait): not delivered; the rest of the request was
            # decided and comes back as duplicates of the same content when it is sent again
            return HTTPStatus.SERVICE_UNAVAILABLE, {
                "error": "too many plans wait: try again later",
                "retry_after_s": 30.0,
                "results": results,
            }
        if results and all(r["verdict"] == "duplicate" for r in results):
            # each result says whether the engine holds this very finding (same_content: a
            # retry whose first try got through) or another one under its id
            return HTTPStatus.CONFLICT, {
                "error": "every finding in this request was already received (replay or retry)",
                "results": results,
            }
        return HTTPStatus.ACCEPTED, {"results": results}

    def alerts(
        self, body: bytes, source: str, via: str = "http", principal: Principal | None = None
    ) -> tuple[HTTPStatus, dict[str, Any]]:
        """A Grafana or Alertmanager webhook payload: each firing alert a finding."""
        data = self._json(body)
        name = "Grafana" if source == "grafana" else "Alertmanager"
        if not isinstance(data, dict) or not isinstance(data.get("alerts"), list):
            raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY, f"not {name} webhook payload")
        if source == "alertmanager" and str(data.get("version")) != "4":
            raise RequestError(
                HTTPStatus.UNPROCESSABLE_ENTITY,
                f"Alertmanager webhook version {data.get('version')!r}; this endpoint reads '4'",
            )
        findings = []
        for alert in data["alerts"]:
            if not isinstance(alert, dict) or alert.get("status") != "firing":
                continue  # resolved alerts do not undo anything by themselves
            try:
                findings.append(self._fresh(alert_finding(alert, source)))
            except FindingNameError as exc:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"bad alert: {exc}") from None
            except (FindingError, ValueError, TypeError, OverflowError) as exc:
                raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY, f"bad alert: {exc}") from None
        if not findings:
            return HTTPStatus.OK, {"results": [], "note": "no firing alerts"}
        self.in_scope(principal or SHARED, findings)
        return self._submit(findings, via)

    def handle(
        self,
        method: str,
        path: str,
        headers: Headers,
        read: Any,
        *,
        query: str = "",
        peer_names: frozenset[str] | None = None,
    ) -> tuple[HTTPStatus, dict[str, Any]]:
        """Route one request; ``read(n)`` reads the body (only after the checks allow it).
        ``peer_names``: the client certificate's CN and DNS names, when one was presented."""
        verified: Principal | None = None
        try:
            if method == "GET" and path == HEALTH_PATH:
                return HTTPStatus.OK, {"status": "ok"}
            principal, key = self.who(headers, method, path)
            sends = method == "POST" and self._quota_bound(principal, path)
            wait_s = self.quotas.empty(principal) if sends else 0.0
            if wait_s > 0:  # (the claimed identity's own bucket: a claim spends nothing)
                raise RequestError(
                    HTTPStatus.TOO_MANY_REQUESTS,
                    f"{principal.name} is over its quota; retry in {wait_s:.0f} s",
                    retry_after_s=wait_s,
                )
            body = read(self.body_length(headers)) if method == "POST" else b""
            target = path + (f"?{query}" if query else "")
            principal = self.verify(principal, key, headers, (method, target, body), peer_names)
            verified = principal if sends and key is not None else None
            if method == "GET":
                return self._get(path, principal)
            if method != "POST":
                raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} not allowed")
            try:
                status, payload = self._post(path, body, principal, signed=key is not None)
            except (EngineClosedError, JournalError) as exc:  # shutting down, or the journal
                # cannot be written (a full disk): nothing was decided, the sender retries later
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, str(exc)) from None
            if status >= 400:  # a replay: answered with the per-finding results
                self._count(method, path, status, payload["error"])
            return status, payload
        except RequestError as exc:
            self._count(method, path, exc.status, exc.message)
            if verified is not None and exc.status < 500 and exc.status != 429:
                # a request its sender signed and the engine refused costs a finding's worth:
                # its signature record was written and fsynced (found in review: 3,000 refused
                # requests in 2 s, each fsynced, and the sender's quota still full)
                self.quotas.spend(verified, 1)
            if exc.retry_after_s:
                return exc.status, {"error": exc.message, "retry_after_s": exc.retry_after_s}
            return exc.status, {"error": exc.message}
        except OSError:  # the peer went away mid-body (reset, TLS): the server's own matter
            raise
        except Exception as exc:  # a bug, not the sender's: answered and counted
            # a request no handler foresaw (an alert whose value overflowed a float ended the
            # connection unanswered, uncounted and free of quota): 500, its traceback logged
            log.exception("%s %s: unexpected %s", method, path, type(exc).__name__)
            self._count(method, path, HTTPStatus.INTERNAL_SERVER_ERROR, type(exc).__name__)
            if verified is not None:
                self.quotas.spend(verified, 1)
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error; see the log"}

    def _get(self, path: str, principal: Principal) -> tuple[HTTPStatus, dict[str, Any]]:
        if path == "/v1/pending":
            self.authorize(principal, "operator", "list pending plans")
            return HTTPStatus.OK, {"pending": self.engine.pending(), "held": self.engine.held()}
        if path == "/v1/stats":
            self.authorize(principal, "read", "read the counters")
            s = self.engine.stats
            return HTTPStatus.OK, {
                "findings": s.findings,
                "decisions": s.decisions,
                "actions": s.actions,
                "rejected": self.rejected,
            }
        raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: GET {path}")

    def metrics(
        self, headers: Headers, query: str = "", peer_names: frozenset[str] | None = None
    ) -> tuple[HTTPStatus, bytes, str]:
        """``GET /metrics``: ``(status, body, content type)``; the bearer token is required
        (Prometheus sends it with ``authorization: {credentials_file: ...}``), or, with
        identities, a signed request from any of them."""
        try:
            principal, key = self.who(headers, "GET", "/metrics")
            target = "/metrics" + (f"?{query}" if query else "")
            principal = self.verify(principal, key, headers, ("GET", target, b""), peer_names)
            self.authorize(principal, "metrics", "read /metrics")
        except RequestError as exc:
            self._count("GET", "/metrics", exc.status, exc.message)
            return exc.status, json.dumps({"error": exc.message}).encode(), "application/json"
        s = self.engine.stats
        held = self.engine.held()
        with self._lock:
            refused = dict.fromkeys(ALERTED_REFUSALS, 0) | self.rejected
        actions = {f"{k}:{o}": 0 for k in ActionKind for o in ALERTED_OUTCOMES} | s.actions
        decisions = dict.fromkeys(ALERTED_VERDICTS, 0) | s.decisions
        body, content_type = render(
            [
                Metric.one("gpuwarden_engine_findings_total", "findings received", s.findings,
                           "counter"),
                Metric("gpuwarden_engine_decisions_total", "decisions, by verdict", "counter",
                       [({"verdict": k}, v) for k, v in sorted(decisions.items())]),
                Metric("gpuwarden_engine_actions_total", "actions run, by kind and outcome",
                       "counter",
                       [({"action": k.partition(":")[0], "outcome": k.partition(":")[2]}, v)
                        for k, v in sorted(actions.items())]),
                Metric("gpuwarden_engine_requests_refused_total",
                       "requests refused, by HTTP status", "counter",
                       [({"status": str(k)}, v) for k, v in sorted(refused.items())]),
                Metric.one("gpuwarden_engine_plans_pending",
                           "plans waiting for approval or for room", len(self.engine.pending())),
                Metric("gpuwarden_engine_nodes_held",
                       "nodes a prediction holds out: holding (its horizon not yet passed) or "
                       "ended (offered back, waiting for its return check or an operator)",
                       "gauge", [({"state": state}, sum(h["ended"] == (state == "ended")
                                                       for h in held))
                                 for state in ("holding", "ended")]),
                *self._precision_metrics(),
            ]
        )  # fmt: skip
        return HTTPStatus.OK, body, content_type

    def _precision_metrics(self) -> list[Metric]:
        """Each policy's outcomes over ``[outcomes] window_s``, its precision (where it has a
        decided outcome) and whether it is demoted (:mod:`remediation.outcomes`)."""
        rows = self.engine.precision()
        return [
            Metric("gpuwarden_policy_outcomes", "outcomes in the window, by policy and verdict",
                   "gauge", [({"policy": r["policy"], "verdict": v}, r[v]) for r in rows
                             for v in ("confirmed", "refuted", "unknown")]),
            Metric("gpuwarden_policy_precision",
                   "confirmed / (confirmed + refuted) in the window, by policy", "gauge",
                   [({"policy": r["policy"]}, r["precision"]) for r in rows
                    if r["precision"] is not None]),
            Metric("gpuwarden_policy_demoted", "1 while the policy is demoted to notify",
                   "gauge", [({"policy": r["policy"]}, int(r["demoted"])) for r in rows]),
        ]  # fmt: skip

    def _count(self, method: str, path: str, status: HTTPStatus, message: str) -> None:
        """Counts a refusal (``rejected``, the metrics) and logs it: at most
        :data:`REFUSALS_LOGGED` lines a minute per status, then one that says how many more
        there were (a sender refused 6,000 times a minute wrote 6,000 lines)."""
        code = int(status)
        now = self.clock.mono()
        with self._lock:
            self.rejected[code] = self.rejected.get(code, 0) + 1
            start, said, unsaid = self._said.get(code, (-math.inf, 0, 0))
            if now - start >= 60.0:
                start, said, more, unsaid = now, 0, unsaid, 0
            else:
                more = 0
            if said >= REFUSALS_LOGGED:
                self._said[code] = (start, said, unsaid + 1)
                return
            self._said[code] = (start, said + 1, unsaid)
        also = f" ({more} more {code}s not logged in the minute before)" if more else ""
        log.warning("refused %s %s: %s %s%s", method, path, code, message, also)

    def _post(
        self, path: str, body: bytes, principal: Principal, *, signed: bool = False
    ) -> tuple[HTTPStatus, dict[str, Any]]:
        by = principal.name  # who signed (or holds the shared credential), never a header
        if self.keyring is None:
            via = "http, signed" if signed else "http"
        else:
            via = f"http, signed by {by}" if signed else f"http, bearer of {by}"
        if path == "/v1/findings":
            self.authorize(principal, "findings", "post findings")
            return self.findings(body, via, principal)
        if path in ("/v1/alerts/grafana", "/v1/alerts/alertmanager"):
            self.authorize(principal, "alerts", "post alerts")
            return self.alerts(body, path.rpartition("/")[2], via, principal)
        if m := re.fullmatch(r"/v1/approve/([0-9a-f]{8,64})", path):
            self.authorize(principal, "operator", "approve plans")
            try:
                d = self.engine.approve(m.group(1), by=by)
            except KeyError as exc:
                raise RequestError(HTTPStatus.NOT_FOUND, str(exc.args[0])) from None
            return HTTPStatus.ACCEPTED, {"plan_id": d.plan_id, "verdict": d.verdict, "why": d.why}
        if m := re.fullmatch(r"/v1/undo/([A-Za-z0-9._-]{1,253})", path):
            self.authorize(principal, "operator", "undo")
            data = self._json(body or b"{}")
            force = isinstance(data, dict) and data.get("force", False) is True
            reason = data.get("reason", "") if isinstance(data, dict) else ""
            if not isinstance(reason, str) or (reason and reason not in UNDO_REASONS):
                allowed = sorted(UNDO_REASONS)
                raise RequestError(HTTPStatus.BAD_REQUEST, f"reason must be one of {allowed}")
            try:
                d = self.engine.undo(m.group(1), by=by, force=force, reason=reason)
            except BadNameError as exc:
                raise RequestError(HTTPStatus.BAD_REQUEST, str(exc)) from None
            except KeyError as exc:
                raise RequestError(HTTPStatus.CONFLICT, str(exc.args[0])) from None
            return HTTPStatus.ACCEPTED, {"plan_id": d.plan_id, "verdict": d.verdict}
        raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: POST {path}")


class _Handler(GuardedHandler):
    endpoint: Endpoint
    timeout = 10  # a client silent this long on one read is dropped (and see request_deadline_s)
    server_version = "gpuwarden remediate"

    def _peer_names(self) -> frozenset[str] | None:
        """The client certificate's CN and DNS names (None: no certificate presented)."""
        getpeercert = getattr(self.connection, "getpeercert", None)
        cert = getpeercert() if getpeercert is not None else None
        if not cert:
            return None
        names = {v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"}
        names |= {v for k, v in cert.get("subjectAltName", ()) if k == "DNS"}
        return frozenset(names)

    def _serve(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        peer = self._peer_names()

        def read(n: int) -> bytes:
            body = self.rfile.read(n)
            self.done_reading()
            return bytes(body)

        if method != "POST":
            self.done_reading()  # no body: the request line and headers were the request
        retry_after = 1.0
        if method == "GET" and path == "/metrics":
            status, body, content_type = self.endpoint.metrics(self.headers, query, peer)
        else:
            status, payload = self.endpoint.handle(
                method, path, self.headers, read, query=query, peer_names=peer
            )
            retry_after = float(payload.get("retry_after_s", 1.0))
            body, content_type = json.dumps(payload).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if status in (HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE):
            self.send_header("Retry-After", str(max(1, math.ceil(retry_after))))
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._serve("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def make_server(
    endpoint: Endpoint,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
    *,
    max_connections: int = 128,
    max_connections_per_peer: int = 0,
    request_deadline_s: float = 15.0,
) -> ThreadingHTTPServer:
    """The endpoint's HTTP server (HTTPS with ``tls``: :func:`core.tls.server_context`), at
    most ``max_connections`` at once (``max_connections_per_peer`` from one address; 0: a
    quarter of them), each request read within ``request_deadline_s``."""
    handler = type("Handler", (_Handler,), {"endpoint": endpoint})
    server = http_server(
        (host, port),
        handler,
        tls,
        max_connections=max_connections,
        max_per_peer=max_connections_per_peer,
        request_deadline_s=request_deadline_s,
    )
    # said at start: a proxy's or a NAT's one address is one peer, for the whole fleet
    log.info(
        "serving at most %d connections at once, at most %d of them from one peer (an IP "
        "address); behind a TLS proxy or NAT every sender is that one peer: raise [engine] "
        "max_connections_per_peer there",
        max_connections,
        per_peer_cap(max_connections, max_connections_per_peer),
    )
    endpoint.server = server
    return server
