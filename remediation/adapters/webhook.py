"""Webhooks: tell people, as generic JSON, a Slack message or Alertmanager alerts.

Routing is by severity: ``routes_critical``, ``routes_warning`` and ``routes_info`` name the
targets (``generic``, ``slack``, ``alertmanager``) each severity goes to. Every body is signed
when a secret is configured::

    X-Gpuwarden-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>

A receiver recomputes the HMAC over the timestamp and the raw body, compares in constant time
and refuses timestamps older than a few minutes (:func:`core.signing.verify_signature` does
all of it); binding the timestamp into the MAC is what makes a captured request useless later.
Slack's incoming webhooks and Alertmanager ignore the header.

A notification is sent at least once: an engine that stops after sending and before its
outcome is on disk sends it again when the plan resumes (and a retry whose answer was lost is a
second delivery too). Every request carries ``Idempotency-Key: <action id>`` (the same for
every send of one notification; the generic body's ``action_id``), so a receiver can drop the
second; Alertmanager groups identical alerts itself, Slack does not.

Sending retries timeouts, connection errors, 5xx and 429 with the shared policy
(:mod:`core.retry`: exponential backoff with jitter, a receiver's Retry-After honoured up to a
minute); other 4xx are not retried (the receiver will not change its mind).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuwarden.core.config import read_secret
from gpuwarden.core.retry import RETRY_STATUSES, Backoff
from gpuwarden.core.signing import SIGNATURE_HEADER, sign
from gpuwarden.remediation.model import Action, ActionKind, AdapterError, Outcome, Status

SLACK_COLOURS = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def generic_body(action: Action, now: float) -> dict[str, Any]:
    return {"type": "gpuwarden.notification", "time": _iso(now), **action.to_json()} | {
        "finding_kind": action.params.get("kind", ""),
        "subject": dict(action.params.get("subject", {})),
        "message": action.reason,
    }


def slack_escape(text: str) -> str:
    """Text for Slack's ``mrkdwn`` as text, not markup: ``&``, ``<`` and ``>`` escaped as Slack
    documents ("Escaping text"). A sender's summary reaches the reason: unescaped,
    ``<!channel>`` paged the whole room and ``<https://evil|docs.internal>`` showed a link
    under a label of the sender's choosing."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(action: Action, now: float) -> dict[str, Any]:
    subject = dict(action.params.get("subject", {}))
    fields = [{"title": k, "value": slack_escape(str(v)), "short": True}
              for k, v in subject.items()]  # fmt: skip
    return {
        "text": f"[{action.severity.upper()}] {slack_escape(action.reason)}",
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
        slack_url_file: str = "",
        alertmanager_url: str = "",
        secret_file: str = "",
        routes_critical: Sequence[str] = ("generic", "slack", "alertmanager"),
        routes_warning: Sequence[str] = ("generic", "slack"),
        routes_info: Sequence[str] = ("generic",),
        attempts: int = 4,
        timeout_s: float = 5.0,
        backoff_s: float = 0.5,
    ) -> None:
        # a Slack incoming-webhook URL is a credential: kept in a file, read (and checked) here
        slack_url = read_secret(slack_url_file, "webhook.slack_url_file")
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
        # a receiver's Retry-After is honoured up to a minute: a notification must not wait
        # behind a receiver that asks for an hour
        self.retry = Backoff(base_s=backoff_s, max_s=30.0, attempts=attempts, retry_after_max_s=60)
        self._http: Any = None

    def targets(self, severity: str) -> list[str]:
        return [t for t in self.routes.get(severity, ()) if self.urls[t]]

    def describe(self, action: Action) -> str:
        return f"notify {self.targets(action.severity) or 'nobody (no webhook configured)'}"

    def perform(self, action: Action) -> Outcome:
        now = time.time()
        results: dict[str, str] = {}
        for target in self.targets(action.severity):
            body = json.dumps(FORMATS[target](action, now)).encode()
            results[target] = self._post(self.urls[target], body, action.id)
        failed = {t: r for t, r in results.items() if r != "ok"}
        if failed:
            return Outcome(Status.FAILED, f"webhook failures: {failed}", {"targets": results})
        return Outcome(Status.OK, f"notified {sorted(results) or 'nobody'}", {"targets": results})

    def _post(self, url: str, body: bytes, key: str = "") -> str:
        import urllib3

        if self._http is None:
            self._http = urllib3.PoolManager(
                timeout=urllib3.Timeout(total=self.timeout_s), retries=self.retry.urllib3_retry()
            )
        headers = {"Content-Type": "application/json", "User-Agent": "gpuwarden"}
        if key:
            headers["Idempotency-Key"] = key
        if self.secret:
            headers[SIGNATURE_HEADER] = sign(self.secret, body)
        try:
            resp = self._http.request("POST", url, body=body, headers=headers)
        except urllib3.exceptions.MaxRetryError as exc:
            return f"gave up after {self.attempts} attempts: {exc.reason}"
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return f"gave up: {exc}"
        if resp.status < 300:
            return "ok"
        if resp.status in RETRY_STATUSES:  # still failing when the tries ran out
            return f"gave up after {self.attempts} attempts: HTTP {resp.status}"
        return f"HTTP {resp.status}"  # the receiver will not change its mind
