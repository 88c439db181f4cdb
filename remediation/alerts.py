"""Alerts from Grafana's webhook contact point and Alertmanager's webhook receiver as
findings (``POST /v1/alerts/grafana``, ``/v1/alerts/alertmanager``, :mod:`.server`): kind from
the rule's ``kind`` label, subject from the series labels, evidence from its values or
annotations."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gpuwarden.core.finding import SUBJECT_KEYS, Finding, Severity
from gpuwarden.core.timeparse import parse_iso


def _subject(labels: Mapping[str, str], source: str) -> dict[str, str]:
    subject = {k: labels[k] for k in SUBJECT_KEYS if labels.get(k)}
    if "node" not in subject:  # Prometheus' own names for the host
        host = labels.get("Hostname") or labels.get("hostname")
        if not host and labels.get("instance"):
            host = labels["instance"].rsplit(":", 1)[0] if ":" in labels["instance"] else ""
        if host:
            subject["node"] = host
    if not subject:  # a grouping only: a folder title ("GPU alerts") made a name
        group = labels.get("grafana_folder") or labels.get("job") or source
        subject = {"cluster": re.sub(r"[^A-Za-z0-9._-]", "_", group).lstrip("-.")[:253] or source}
    return subject


def alert_finding(alert: Mapping[str, Any], source: str = "grafana") -> Finding:
    """One firing Grafana or Alertmanager alert as a finding: kind from the rule's ``kind``
    label, subject from the series labels, evidence from its values (Grafana's reduced
    expressions) or annotations, and for risk alerts the probability (Grafana's ``B``
    expression, or a ``probability`` annotation)."""
    labels = {str(k): str(v) for k, v in dict(alert.get("labels") or {}).items()}
    kind = re.sub(
        r"[^a-z0-9_]", "_", labels.get("kind") or labels.get("alertname", "alert").lower()
    )
    starts = str(alert.get("startsAt", ""))
    try:
        t_ns = int(parse_iso(starts).timestamp() * 1e9)
    except ValueError:
        raise ValueError(f"startsAt {starts!r} is not a time") from None
    values = {str(k): v for k, v in dict(alert.get("values") or {}).items()}
    annotations = {str(k): str(v) for k, v in dict(alert.get("annotations") or {}).items()}
    probability = None
    if kind == "failure_risk":
        reduced: Any = values.get("B", annotations.get("probability"))
        try:
            p = float(reduced)
        except (TypeError, ValueError, OverflowError):  # (an int of 400 digits: overflow)
            p = math.nan
        if 0.0 <= p <= 1.0:
            probability = p
    severity = labels.get("severity", "warning")
    evidence: dict[str, Any] = {
        "alertname": labels.get("alertname", ""),
        "fingerprint": str(alert.get("fingerprint", "")),
        "values": values,
    }
    if source != "grafana":
        evidence["labels"] = labels
        evidence["generator_url"] = str(alert.get("generatorURL", ""))
    return Finding(
        kind=kind,
        subject=_subject(labels, source),
        severity=Severity(severity)
        if severity in Severity.__members__.values()
        else Severity.WARNING,
        time_ns=t_ns,
        evidence=evidence,
        probability=probability,
        summary=annotations.get("summary", labels.get("alertname", "")),  # (cut to its bound)
        source=source,
    )
