"""Webhooks: tell people, as generic JSON, a Slack message or Alertmanager alerts.

Routing is by severity: ``routes_critical``, ``routes_warning`` and ``routes_info`` name the
targets (``generic``, ``slack``, ``alertmanager``) each severity goes to. Every body is signed
when a secret is configured::

    X-Gpuwarden-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>

A receiver recomputes the HMAC over the timestamp and the raw body, compares in constant time
and refuses timestamps older than a few minutes (:func:`verify_signature` does all of it);
binding the timestamp into the MAC is what makes a captured request useless later. Slack's
incoming webhooks and Alertmanager ignore the header.

Sending retries timeouts, connection errors, 5xx and 429 with exponential backoff and jitter;
other 4xx are not retried (the receiver will not change its mind).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from remediation.model import Action, ActionKind, AdapterError, Outcome, Status

SIGNATURE_HEADER = "X-Gpuwarden-Signature"
SLACK_COLOURS = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}


def sign(secret: bytes, body: bytes, t: int | None = None) -> str:
    t = int(time.time()) if t is None else t
    mac = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_signature(
    secret: bytes, header: str, body: bytes, *, tolerance_s: float = 300.0, now: float | None = None
) -> int:
    """Check a signature header; the signed timestamp, or ValueError saying what is wrong."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        raise ValueError(f"malformed {SIGNATURE_HEADER} header") from None
    expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given):
        raise ValueError("signature does not match the body")
    age = (time.time() if now is None else now) - t
    if abs(age) > tolerance_s:
        raise ValueError(f"signature timestamp is {age:.0f} s off (tolerance {tolerance_s:.0f} s)")
    return t


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def generic_body(action: Action, now: float) -> dict[str, Any]:
    return {"type": "gpuwarden.notification", "time": _iso(now), **action.to_json()} | {
        "finding_kind": action.params.get("kind", ""),
        "subject": dict(action.params.get("subject", {})),
        "message": action.reason,
    }


def slack_body(action: Action, now: float) -> dict[str, Any]:
    subject = dict(action.params.get("subject", {}))
    fields = [{"title": k, "value": str(v), "short": True} for k, v in subject.items()]
    return {
        "text": f"[{action.severity.upper()}] {action.reason}",
        "attachments": [
            {
                "color": SLACK_COLOURS.get(action.severity, "#7f7f7f"),
                "fields": [*fields, {"title": "finding", "value": action.finding_id}],
                "ts": int(now),
            }
        ],
    }


def alertmanager_body(action: Action, now: float) -> list[dict[str, Any]]:
    """Alertmanager's ``POST /api/v2/alerts`` body: one alert, labelled for routing."""
    subject = {k: str(v) for k, v in dict(action.params.get("subject", {})).items()}
    labels = {
        "alertname": f"gpuwarden_{action.params.get('kind', 'finding')}",
        "severity": action.severity,
        **subject,
    }
    return [
        {
            "labels": labels,
            "annotations": {"summary": action.reason, "finding_id": action.finding_id},
            "startsAt": _iso(now),
            "generatorURL": "",
        }
    ]


FORMATS = {"generic": generic_body, "slack": slack_body, "alertmanager": alertmanager_body}


class WebhookAdapter:
    name = "webhook"
    actions = frozenset({ActionKind.NOTIFY})

    def __init__(
        self,
        *,
        generic_url: str = "",
        slack_url: str = "",
        alertmanager_url: str = "",
        secret_file: str = "",
        routes_critical: Sequence[str] = ("generic", "slack", "alertmanager"),
        routes_warning: Sequence[str] = ("generic", "slack"),
        routes_info: Sequence[str] = ("generic",),
        attempts: int = 4,
        timeout_s: float = 5.0,
        backoff_s: float = 0.5,
    ) -> None:
        self.urls = {"generic": generic_url, "slack": slack_url, "alertmanager": alertmanager_url}
        self.routes = {
            "critical": tuple(routes_critical),
            "warning": tuple(routes_warning),
            "info": tuple(routes_info),
        }
        for sev, targets in self.routes.items():
            unknown = set(targets) - set(FORMATS)
            if unknown:
                raise AdapterError(f"webhook routes_{sev}: unknown targets {sorted(unknown)}")
        self.secret = Path(secret_file).read_bytes().strip() if secret_file else b""
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s

    def targets(self, severity: str) -> list[str]:
        return [t for t in self.routes.get(severity, ()) if self.urls[t]]

    def describe(self, action: Action) -> str:
        return f"notify {self.targets(action.severity) or 'nobody (no webhook configured)'}"

    def perform(self, action: Action) -> Outcome:
        now = time.time()
        results: dict[str, str] = {}
        for target in self.targets(action.severity):
            body = json.dumps(FORMATS[target](action, now)).encode()
            results[target] = self._post(self.urls[target], body)
        failed = {t: r for t, r in results.items() if r != "ok"}
        if failed:
            return Outcome(Status.FAILED, f"webhook failures: {failed}", {"targets": results})
        return Outcome(Status.OK, f"notified {sorted(results) or 'nobody'}", {"targets": results})

    def _post(self, url: str, body: bytes) -> str:
        last = ""
        for attempt in range(self.attempts):
            headers = {"Content-Type": "application/json", "User-Agent": "gpuwarden"}
            if self.secret:
                headers[SIGNATURE_HEADER] = sign(self.secret, body)
            request = urllib.request.Request(url, body, headers, method="POST")
            retry_after = None
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    resp.read()
                return "ok"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
                if exc.code != 429 and exc.code < 500:
                    return last  # the receiver will not change its mind
                retry_after = _retry_after(exc.headers)
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            if attempt + 1 < self.attempts:
                delay = self.backoff_s * 2**attempt
                time.sleep(retry_after if retry_after is not None else random.uniform(0, delay))
        return f"gave up after {self.attempts} attempts: {last}"


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return min(60.0, float(value)) if value else None
    except ValueError:
        return None
