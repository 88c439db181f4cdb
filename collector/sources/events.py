"""GPU events (XIDs, a lost GPU) as ``gpu_event`` points, and the fast path to remediation.

Both the NVML event set and the kernel log report XIDs; each writes its own point (``source``
tag ``nvml``, or ``kmsg`` or ``journal`` for the kernel log read from ``/dev/kmsg`` or a file,
or from the host's systemd journal) so an operator sees which path saw it. Each is tagged with
the job (and rank) it hit, from :class:`~collector.attribution.JobHistory`: the job the GPU had when
the event happened, not the one found when it was read. A fatal event also becomes a
:class:`~core.finding.Finding` handed to ``context.emit_finding`` at once, with the job
in its evidence; the finding's id depends only on kind, subject and time bucket (not the job,
which the two paths may see differently), so the engine de-duplicates the two paths.

A storm (one XID code on one GPU, again and again: XID 95 can repeat hundreds of thousands of
times) is one episode (:mod:`collector.episodes`): one fast-path finding at its first XID, and
none again until the GPU has been quiet of that code for ``[xid] xid_recovery_s``. Every XID
still writes its point.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.collector.attribution import NO_JOB, JobInfo
from gpuwarden.collector.episodes import Episodes
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.kmsg import SxidLine
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.xidcat import XidPolicy


def gpu_event(
    context: SourceContext,
    *,
    event: str,
    severity: str,
    source: str,
    now_ns: int,
    gpu: int | None = None,
    uuid: str = "",
    job: JobInfo = NO_JOB,
    fields: dict[str, Any],
) -> Point:
    tags = context.base_tags() | {"event": event, "severity": severity, "source": source}
    if gpu is not None:
        tags["gpu"] = str(gpu)
    if uuid:
        tags["gpu_uuid"] = uuid
    return Point("gpu_event", tags | job.tags(), fields, now_ns)


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
    job: JobInfo = NO_JOB,
    episodes: Episodes | None = None,
    device: str = "",
) -> Point:
    """The ``gpu_event`` point of an XID, and the fast-path finding if it is fatal. With
    ``episodes``, one code repeating on one GPU is one episode: the finding goes out at its
    first XID only (every XID's point is still written). ``device`` names the GPU where
    neither its index nor its UUID is known (the kernel log's PCI address), so two GPUs
    nobody mapped are still two episodes."""
    severity, resolution, fatal = policy.describe(xid, message)
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
        job=job,
        fields=fields,
    )
    if fatal and episodes is not None:
        fatal = episodes.event((xid, gpu, uuid, device), now_ns) is not None
    if fatal:
        where = gpu if gpu is not None else uuid or "(not identified)"
        evidence = {"xid": xid, "gpu_uuid": uuid, "message": message, "resolution": resolution}
        emit(
            context,
            "gpu_xid",
            gpu,
            now_ns,
            f"XID {xid} on GPU {where}" + job_words(job),
            evidence | job.tags() | {"source": source},
        )
    return point


def job_words(job: JobInfo) -> str:
    """`` (job J rank R)`` for a finding's summary, or nothing."""
    if not job.job:
        return ""
    return f" (job {job.job}" + (f" rank {job.rank})" if job.rank else ")")


def sxid_point(context: SourceContext, line: SxidLine, *, source: str, now_ns: int) -> Point:
    """The ``nvswitch_event`` point of an NVSwitch SXid, and the fast-path finding if the
    driver calls it fatal (NVLink through that switch is down: the node's GPUs need a reset,
    so it is a node's finding, not a GPU's)."""
    tags = context.base_tags() | {
        "nvswitch": str(line.switch),
        "event": "sxid",
        "severity": "critical" if line.fatal else "warning",
        "source": source,
    }
    fields: dict[str, Any] = {
        "sxid_code": line.sxid,
        "pci_bus_id": line.pci,
        "message": line.message,
        "fatal_active": line.fatal,
    }
    if line.link is not None:
        fields["link_index"] = line.link
    if line.fatal:
        evidence = {"sxid": line.sxid, "nvswitch": line.switch, "pci": line.pci}
        if line.link is not None:
            evidence["link"] = line.link
        summary = f"fatal NVSwitch error SXid {line.sxid} on nvswitch{line.switch}"
        emit(context, "nvswitch_sxid", None, now_ns, summary,
             evidence | {"message": line.message, "source": source})  # fmt: skip
    return Point("nvswitch_event", tags, fields, now_ns)


def emit(
    context: SourceContext,
    kind: str,
    gpu: int | None,
    now_ns: int,
    summary: str,
    evidence: dict[str, Any],
    *,
    severity: str = "critical",
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
            severity=Severity(severity),
            time_ns=now_ns,
            evidence=evidence,
            confidence=1.0,
            summary=summary,
            source="agent",
        )
    )
