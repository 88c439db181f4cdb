"""What a kernel-log line says: an NVIDIA XID, an NVSwitch SXid, or the driver naming a GPU.

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

from collector.sources.base import normalise_pci

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


def parse_line(
    line: str, boot_ns: int | None = None
) -> XidLine | SxidLine | tuple[str, str] | None:
    """An XID line, an SXid line, a ``(pci, uuid)`` pair from a "GPU at" line, or None
    (pure)."""
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
        return _sxid(text, time_ns)
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
