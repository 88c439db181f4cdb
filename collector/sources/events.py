"""GPU events (XIDs, a lost GPU) as ``gpu_event`` points, and the fast path to remediation.

Both the NVML event set and the kernel log report XIDs; each writes its own point (``source``
tag ``nvml`` or ``kmsg``) so an operator sees which path saw it. A fatal event also becomes a
:class:`~collector.finding.Finding` handed to ``context.emit_finding`` at once; the finding's
id depends only on kind, subject and time bucket, so the engine de-duplicates the two paths.
"""

from __future__ import annotations

from typing import Any

from collector.finding import Finding, Severity
from collector.lineprotocol import Point
from collector.sources.base import SourceContext
from collector.xidcat import XidPolicy


def gpu_event(
    context: SourceContext,
    *,
    event: str,
    severity: str,
    source: str,
    now_ns: int,
    gpu: int | None = None,
    uuid: str = "",
    fields: dict[str, Any],
) -> Point:
    tags = context.base_tags() | {"event": event, "severity": severity, "source": source}
    if gpu is not None:
        tags["gpu"] = str(gpu)
    if uuid:
        tags["gpu_uuid"] = uuid
    return Point("gpu_event", tags, fields, now_ns)


def xid_point(
    context: SourceContext,
    policy: XidPolicy,
    *,
    xid: int,
    message: str,
    source: str,
    now_ns: int,
    gpu: int | None = None,
    uuid: str = "",
    pid: int | None = None,
) -> Point:
    """The ``gpu_event`` point of an XID, and the fast-path finding if it is fatal."""
    severity, resolution, fatal = policy.describe(xid)
    fields: dict[str, Any] = {
        "xid_code": xid,
        "message": message,
        "resolution": resolution,
        "fatal_active": fatal,
    }
    if pid is not None:
        fields["pid"] = pid
    point = gpu_event(
        context,
        event="xid",
        severity=severity,
        source=source,
        now_ns=now_ns,
        gpu=gpu,
        uuid=uuid,
        fields=fields,
    )
    if fatal:
        where = gpu if gpu is not None else uuid
        evidence = {"xid": xid, "gpu_uuid": uuid, "message": message, "resolution": resolution}
        emit(
            context,
            "gpu_xid",
            gpu,
            now_ns,
            f"XID {xid} on GPU {where}",
            evidence | {"source": source},
        )
    return point


def emit(
    context: SourceContext,
    kind: str,
    gpu: int | None,
    now_ns: int,
    summary: str,
    evidence: dict[str, Any],
) -> None:
    if context.emit_finding is None:
        return
    subject = context.base_tags()
    if gpu is not None:
        subject["gpu"] = str(gpu)
    context.emit_finding(
        Finding(
            kind=kind,
            subject=subject,
            severity=Severity.CRITICAL,
            time_ns=now_ns,
            evidence=evidence,
            confidence=1.0,
            summary=summary,
            source="agent",
        )
    )
