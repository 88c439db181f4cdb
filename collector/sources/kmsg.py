"""What a kernel-log line says: an NVIDIA XID, an NVSwitch SXid, the driver naming a GPU, or
one of the OS rules (:data:`OS_RULES`: NFS, Lustre, hung tasks, soft lockups, NVMe, OOM kills).

Pure parsing, shared by the kernel-log source (:mod:`collector.sources.xid`) and the GPU event
points (:mod:`collector.sources.events`). A line comes from ``/dev/kmsg``
(``prio,seq,usec,flags;text``: its time is the boot time plus ``usec``), from ``dmesg -T``
(``[Tue Nov 11 10:00:00 2025] text``) or bare.
"""

from __future__ import annotations

import re
import time
from calendar import timegm
from dataclasses import dataclass

from gpuwarden.collector.sources.base import normalise_pci

XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)"
    r"(?:, pid=(?P<pid>\d+|'?<unknown>'?))?(?:, name=(?P<name>[^,]*))?(?:, (?P<text>.*))?$"
)
# Only a line with its severity is an error; the driver's continuation lines for the same
# SXid ("12028, Data {0x..., ...}") are not new errors.
SXID_RE = re.compile(
    r"nvidia-nvswitch(?P<switch>\d+): SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<sxid>\d+)"
    r", (?P<severity>Fatal|Non-fatal)\b(?:, (?P<text>.*))?$",
    re.IGNORECASE,
)
LINK_RE = re.compile(r"\bLink (?P<link>\d+)\b")
GPU_AT_RE = re.compile(r"NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")
DMESG_T_RE = re.compile(r"^\[(?P<when>\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\] ")
KMSG_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<text>.*)$")


@dataclass(frozen=True)
class XidLine:
    pci: str
    xid: int
    pid: int | None
    process: str
    text: str
    message: str
    time_ns: int | None


@dataclass(frozen=True)
class SxidLine:
    switch: int
    pci: str
    sxid: int
    fatal: bool
    link: int | None
    message: str
    time_ns: int | None


@dataclass(frozen=True)
class OsLine:
    """A kernel-log line one of :data:`OS_RULES` matched."""

    rule: str
    """The finding kind (``nfs_not_responding``...), or a recovery (``nfs_ok``, ``lustre_ok``)."""
    severity: str  # critical | warning | info (a recovery)
    key: str
    """What it is about (an NFS server, a Lustre target, an NVMe device, a process): repeated
    lines about one key are one episode (:mod:`collector.episodes`)."""
    pid: int | None
    process: str
    message: str
    time_ns: int | None


@dataclass(frozen=True)
class OsRule:
    rule: str
    severity: str
    pattern: re.Pattern[str]
    key: str = "key"
    """The named group that gives the key, or a literal key when the pattern has no such
    group."""


# The message formats are the kernel's own (net/sunrpc, kernel/hung_task.c, kernel/watchdog.c,
# drivers/nvme/host, mm/oom_kill.c, block/blk-core.c) and Lustre's; the golden case
# tests/golden/os-kmsg cites real lines of each where a public one exists. Order matters: the
# first rule that matches a line decides.
OS_RULES: tuple[OsRule, ...] = (
    OsRule("nfs_not_responding", "warning",
           re.compile(r"\bnfs: server (?P<key>\S+) not responding, (?:still trying|timed out)")),
    OsRule("nfs_ok", "info", re.compile(r"\bnfs: server (?P<key>\S+) OK\b")),
    OsRule("lustre_ok", "info", re.compile(r"\bLustre: .*\bConnection restored to "),
           key="lustre"),
    OsRule("lustre_error", "warning", re.compile(r"\bLustre: .*\bConnection to .* was lost"),
           key="lustre"),
    OsRule("lustre_error", "warning", re.compile(r"\bLustreError: "), key="lustre"),
    OsRule("hung_task", "warning", re.compile(
        r"\bINFO: task (?P<process>.+?):(?P<pid>\d+) blocked for more than \d+ seconds"),
        key="process"),
    OsRule("soft_lockup", "critical", re.compile(
        r"\bBUG: soft lockup - CPU#\d+ stuck for \d+s! \[(?P<process>.*):(?P<pid>\d+)\]"),
        key="cpu"),
    OsRule("nvme_error", "critical", re.compile(
        r"\bnvme (?P<key>nvme\d+): (?:controller is down; will reset|Removing after probe "
        r"failure|Device not ready; aborting reset)")),
    OsRule("nvme_error", "critical",
           re.compile(r"\bcritical medium error, dev (?P<key>nvme\d+)n\d+")),
    OsRule("nvme_error", "warning", re.compile(
        r"\bnvme (?P<key>nvme\d+): I/O \d+ QID \d+ timeout, (?:aborting|reset controller)")),
    OsRule("nvme_error", "warning", re.compile(r"\bI/O error, dev (?P<key>nvme\d+)n\d+")),
    OsRule("oom_kill", "warning", re.compile(
        r"(?:\b(?:Memory cgroup out of memory|Out of memory): )?\bKilled process (?P<pid>\d+) "
        r"\((?P<process>[^)]*)\)"), key="process"),
)  # fmt: skip


#: each rule's finding summary (``str.format`` with the line's key, pid and process)
SUMMARIES = {
    "nfs_not_responding": "NFS server {key} not responding",
    "lustre_error": "Lustre errors on {key}",
    "hung_task": "task {process}:{pid} hung in the kernel (blocked past hung_task_timeout)",
    "soft_lockup": "CPU soft lockup (stuck in the kernel; {process}:{pid} on it)",
    "nvme_error": "NVMe {key} errors",
    "oom_kill": "the OOM killer killed {process} (pid {pid})",
}
#: a recovery line's rule -> the rule whose episode it ends
RECOVERS = {"nfs_ok": "nfs_not_responding", "lustre_ok": "lustre_error"}
LUSTRE_TARGET = re.compile(r"[\w.]+-(?:OST|MDT)[0-9a-fA-F]{4}\b")


def _os_line(text: str, time_ns: int | None) -> OsLine | None:
    for rule in OS_RULES:
        m = rule.pattern.search(text)
        if m is None:
            continue
        groups = m.groupdict()
        key = groups.get(rule.key) or rule.key
        if key == "lustre" and (target := LUSTRE_TARGET.search(text)):
            key = target[0]  # the OST or MDT the line names
        pid = groups.get("pid")
        return OsLine(rule.rule, rule.severity, key, int(pid) if pid else None,
                      groups.get("process") or "", text[m.start():].strip(), time_ns)  # fmt: skip
    return None


def parse_line(
    line: str, boot_ns: int | None = None, *, os_rules: bool = False
) -> XidLine | SxidLine | OsLine | tuple[str, str] | None:
    """An XID line, an SXid line, a ``(pci, uuid)`` pair from a "GPU at" line, an OS rule's
    line (``os_rules``), or None (pure)."""
    time_ns = None
    m = KMSG_RE.match(line)
    if m:
        text = m["text"]
        if boot_ns is not None:
            time_ns = boot_ns + int(m["usec"]) * 1000
    else:
        text = line
        t = DMESG_T_RE.match(line)
        if t:
            when = time.strptime(" ".join(t["when"].split()), "%a %b %d %H:%M:%S %Y")
            time_ns = timegm(when) * 10**9
    g = GPU_AT_RE.search(text)
    if g:
        return normalise_pci(g["pci"]), g["uuid"]
    x = XID_RE.search(text)
    if not x:
        sxid = _sxid(text, time_ns)
        if sxid is None and os_rules:
            return _os_line(text, time_ns)
        return sxid
    pid = int(x["pid"]) if x["pid"] and x["pid"].isdigit() else None
    message = text[text.index("NVRM: ") + 6 :].strip()
    return XidLine(
        normalise_pci(x["pci"]),
        int(x["xid"]),
        pid,
        (x["name"] or "").strip(),
        (x["text"] or "").strip(),
        message,
        time_ns,
    )


def _sxid(text: str, time_ns: int | None) -> SxidLine | None:
    m = SXID_RE.search(text)
    if not m:
        return None
    link = LINK_RE.search(m["text"] or "")
    return SxidLine(
        int(m["switch"]),
        normalise_pci(m["pci"]),
        int(m["sxid"]),
        m["severity"].lower() == "fatal",
        int(link["link"]) if link else None,
        text[m.start() :].strip(),
        time_ns,
    )
