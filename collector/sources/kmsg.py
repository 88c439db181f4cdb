"""What a kernel-log line says: an NVIDIA XID, an NVSwitch SXid, the driver naming a GPU, or
one of the OS rules (:data:`OS_RULES`: NFS, Lustre, hung tasks, soft lockups, NVMe, OOM kills).

Pure parsing, shared by the kernel-log source (:mod:`collector.sources.xid`) and the GPU event
points (:mod:`collector.sources.events`); a record from the host's systemd journal comes in
through :func:`parse_message` (:mod:`collector.sources.journal` has established that the kernel
wrote it). A line comes from ``/dev/kmsg``
(``prio,seq,usec,flags;text``: its time is the boot time plus ``usec``), from ``dmesg -T``
(``[Tue Nov 11 10:00:00 2025] text``), ``dmesg`` (``[ 3223.539141] text``), a Fabric Manager
log (``[Jul 23 2024 07:53:55] [ERROR] [tid 841] text``, or ``[2026-11-14 02:11:07.513286]
text``), a journal export (``May 07 21:43:54 host kernel:
text``) or bare.

Only the kernel speaks here. Every rule's pattern is anchored at the start of the message, so
a kernel line that merely *quotes* user data cannot match: a segfault report ends
``... error 4 in NVRM: Xid (0): 79, pwn.so[...]`` when the faulting code was mapped from a file
of that name, and is nobody's XID. And a ``/dev/kmsg`` record counts only if its facility
(``prio >> 3``) is the kernel's, 0: whatever user space writes to ``/dev/kmsg`` is logged with
facility ``user`` (1) or higher, never 0, whatever ``<N>`` prefix it sends. Where a line carries
no priority (a plain file in one of the formats above), it is the file's word: the operator who
points the source at such a file vouches for what writes it, and a journal export's line counts
only if its identifier is ``kernel``. The ``/dev/kmsg`` device itself always gives a priority,
and a record of it that has none is refused (``priority_required``).
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass
from datetime import datetime

from gpuwarden.collector.sources.base import normalise_pci

# Every pattern starts with ``^``: it matches the message's start, never a quote of user data in
# the middle of a kernel line (see the module's docstring).
# A MIG GPU's XID names its GPU and compute instance after the address
# ("PCI:0000:3b:00 GPU-I:01 GPU-CI:02", or GPU-I alone: open-gpu-kernel-modules,
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c); before, such a line was not an XID at all, fatal
# XID 95 included (found by a review against real driver output, 2026-11-28).
XID_RE = re.compile(
    r"^NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)(?: GPU-I:\d+(?: GPU-CI:\d+)?)?\): "
    r"(?P<xid>\d+)"
    r"(?:, pid=(?P<pid>\d+|'?<unknown>'?))?(?:, name=(?P<name>[^,]*))?(?:, (?P<text>.*))?$"
)
# Only a line with its severity is an error; the driver's continuation lines for the same
# SXid ("12028, Data {0x..., ...}") are not new errors.
SXID_RE = re.compile(
    r"^nvidia-nvswitch(?P<switch>\d+): SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<sxid>\d+)"
    r", (?P<severity>Fatal|Non-fatal)\b(?:, (?P<text>.*))?$",
    re.IGNORECASE,
)
LINK_RE = re.compile(r"\bLink (?P<link>\d+)\b")
GPU_AT_RE = re.compile(r"^NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")
DMESG_T_RE = re.compile(r"^\[(?P<when>\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\] ")
# a /dev/kmsg record: its first line is the header and the message (the kernel escapes control
# characters in a message as \xNN); continuation lines (`` SUBSYSTEM=...``) follow it
KMSG_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;\n]*;(?P<text>[^\n]*)")
# prefixes of a line that carries no priority: ``dmesg``'s uptime, a Fabric Manager log's time
DMESG_RE = re.compile(r"^\[ *\d+\.\d+\] ")
FABRIC_RE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\] ")
# Fabric Manager's own log (/var/log/fabricmanager.log): its local time, level and thread
# (``[Jul 23 2024 07:53:55] [ERROR] [tid 841] ``), then its words for an NVSwitch error
# (``detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0
# physical id 3 port 33``: the format gpud matches in that file). Found by a review against
# real logs (2026-11-28): no line of a real Fabric Manager log was an SXid here
FM_RE = re.compile(r"^\[(?P<when>\w{3} \d\d \d{4} \d\d:\d\d:\d\d)\] \[\w+\] \[tid \d+\] ")
FM_SXID_RE = re.compile(
    r"^detected NVSwitch (?P<severity>fatal|non-fatal) error (?P<sxid>\d+) on fid \d+ on NVSwitch "
    r"pci bus id (?P<pci>[0-9a-fA-F:.]+) physical id (?P<switch>\d+)(?: port (?P<port>\d+))?"
)
# ``journalctl -o short`` / ``short-precise`` / ``short-iso`` (no comma in its time: dmesg's
# ISO time has one, ``,123456``) / ``short-full``, and a syslog
# file (rsyslog's ``kern.log``): time, host, identifier[pid]: (a syslog file's kernel lines
# then carry the kernel's own uptime, ``[ 3223.512345] ``, stripped too)
JOURNAL_RE = re.compile(
    r"^(?:\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT[^\s,]+"
    r"|\w{3} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \S+) \S+ (?P<ident>[^\s:\[]+)(?:\[\d+\])?: "
)
# ``dmesg --time-format iso``: the record's own time, with its zone
DMESG_ISO_RE = re.compile(r"^(?P<when>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?[+-]\d\d:?\d\d) ")
# ``dmesg -x``: facility and level first; only the kernel's facility is the kernel's
DMESG_X_RE = re.compile(
    r"^(?P<facility>[a-z]+) *:(?:emerg|alert|crit|err|warn|notice|info|debug) *: "
)
KERNEL_FACILITY = 0  # LOG_KERN; user space cannot log with it (kernel/printk: devkmsg_write)


@dataclass(frozen=True)
class XidLine:
    pci: str
    xid: int
    pid: int | None
    process: str
    text: str
    message: str
    time_ns: int | None
    episode: str = ""
    """The episode the line counts in, where not its ``key`` (:attr:`OsRule.episode`)."""


@dataclass(frozen=True)
class SxidLine:
    switch: int
    pci: str
    sxid: int
    fatal: bool
    link: int | None
    message: str
    time_ns: int | None
    episode: str = ""
    """The episode the line counts in, where not its ``key`` (:attr:`OsRule.episode`)."""


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
    episode: str = ""
    """The episode the line counts in, where not its ``key`` (:attr:`OsRule.episode`)."""


@dataclass(frozen=True)
class OsRule:
    rule: str
    severity: str
    pattern: re.Pattern[str]
    key: str = "key"
    """The named group that gives the key, or a literal key when the pattern has no such
    group."""
    episode: str = ""
    """A literal episode key for every line of the rule (one episode per node), where the
    line's key is a name its writer chose: else the line's key."""


# The message formats are the kernel's own (net/sunrpc, kernel/hung_task.c, kernel/watchdog.c,
# drivers/nvme/host, mm/oom_kill.c, block/blk-core.c) and Lustre's; the golden case
# tests/golden/os-kmsg cites real lines of each where a public one exists. Each pattern is
# anchored at the message's start; the only prefixes allowed before it are the kernel's own
# (the soft-lockup watchdog's, the block layer's function name on kernels before 5.x, the OOM
# killer's first words); an empty group ``msg`` marks where the message quoted in the point
# starts, after such a prefix (the point quotes from the match's start otherwise). Order
# matters: the first rule that matches a line decides.
_BLOCK = r"^(?:(?:blk_update_request|print_req_error): )?(?P<msg>)"
OS_RULES: tuple[OsRule, ...] = (
    OsRule("nfs_not_responding", "warning",
           re.compile(r"^nfs: server (?P<key>\S+) not responding, (?:still trying|timed out)")),
    OsRule("nfs_ok", "info", re.compile(r"^nfs: server (?P<key>\S+) OK\b")),
    OsRule("lustre_ok", "info", re.compile(r"^Lustre: .*\bConnection restored to "),
           key="lustre"),
    OsRule("lustre_error", "warning", re.compile(r"^Lustre: .*\bConnection to .* was lost"),
           key="lustre"),
    # Lustre's console lines carry a message id (``11-0:``) or the debug header
    # (``<pid>:<extern pid>:(file.c:line:function())``): a process named ``LustreError:``
    # that the OOM killer reports (``<comm> invoked oom-killer``) carries neither
    OsRule("lustre_error", "warning",
           re.compile(r"^LustreError: (?:\d+-\d+: |\d+:\d+:\(|Skipped \d+ previous)"),
           key="lustre"),
    OsRule("hung_task", "warning", re.compile(
        r"^INFO: task (?P<process>.+?):(?P<pid>\d+) blocked for more than \d+ seconds"),
        key="process"),
    OsRule("soft_lockup", "critical", re.compile(
        r"^(?:(?:NMI )?watchdog: )?(?P<msg>)BUG: soft lockup - CPU#\d+ stuck for \d+s! "
        r"\[(?P<process>.*):(?P<pid>\d+)\]"),
        key="cpu"),
    OsRule("nvme_error", "critical", re.compile(
        r"^nvme (?P<key>nvme\d+): (?:controller is down; will reset|Removing after probe "
        r"failure|Device not ready; aborting reset)")),
    OsRule("nvme_error", "critical",
           re.compile(_BLOCK + r"critical medium error, dev (?P<key>nvme\d+)n\d+")),
    OsRule("nvme_error", "warning", re.compile(
        r"^nvme (?P<key>nvme\d+): I/O \d+ QID \d+ timeout, (?:aborting|reset controller)")),
    OsRule("nvme_error", "warning", re.compile(_BLOCK + r"I/O error, dev (?P<key>nvme\d+)n\d+")),
    OsRule("oom_kill", "warning", re.compile(
        r"^(?:(?:Memory cgroup out of memory|Out of memory(?: \(oom_kill_allocating_task\))?): )?"
        r"Killed process (?P<pid>\d+) \((?P<process>[^)]*)\)"), key="process",
        # one episode per node: a job that named each child it let the OOM killer take
        # (prctl PR_SET_NAME) opened an episode, and a fast-path finding, per name
        episode="oom"),
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


# Kernel lines that begin with a process's name (``task->comm``, at most 15 bytes, any bytes
# its owner chose): a segfault report (``comm[pid]: segfault at ...``, arch/x86/mm/fault.c), a
# fatal signal (``comm/pid: potentially unexpected fatal signal``, kernel/signal.c), a
# drop_caches note (``comm (pid): drop_caches``, fs/drop_caches.c). A process named
# ``LustreError: `` or ``INFO: task `` would otherwise start such a line with an OS rule's own
# words (the XID and SXid patterns are longer than a name can be). A line that has this shape
# is nobody's OS event; a real one of the rules' subsystems never does.
USER_NAMED_RE = re.compile(r"^.{1,15}?(?:\[\d+\]:? |/\d+: | \(\d+\): )", re.DOTALL)


def _os_line(text: str, time_ns: int | None) -> OsLine | None:
    if USER_NAMED_RE.match(text):
        return None
    for rule in OS_RULES:
        m = rule.pattern.search(text)
        if m is None:
            continue
        groups = m.groupdict()
        key = groups.get(rule.key) or rule.key
        if key == "lustre" and (target := LUSTRE_TARGET.search(text)):
            key = target[0]  # the OST or MDT the line names
        pid = groups.get("pid")
        start = m.start("msg") if "msg" in groups else m.start()
        return OsLine(rule.rule, rule.severity, key, int(pid) if pid else None,
                      groups.get("process") or "", text[start:].strip(), time_ns,
                      rule.episode)  # fmt: skip
    return None


Parsed = XidLine | SxidLine | OsLine | tuple[str, str] | None
"""What a kernel-log line says (see :func:`parse_line`)."""


def parse_line(
    line: str,
    boot_ns: int | None = None,
    *,
    os_rules: bool = False,
    priority_required: bool = False,
) -> Parsed:
    """An XID line, an SXid line, a ``(pci, uuid)`` pair from a "GPU at" line, an OS rule's
    line (``os_rules``), or None (pure). None too for a record the kernel did not write: a
    ``/dev/kmsg`` record of another facility, a journal line of another identifier, and (with
    ``priority_required``: reading the ``/dev/kmsg`` device) a line with no priority."""
    text = kernel_message(line, priority_required=priority_required)
    if text is None:
        return None
    time_ns = None
    m = KMSG_RE.match(line)
    if m:
        if boot_ns is not None:
            time_ns = boot_ns + int(m["usec"]) * 1000
    elif t := DMESG_T_RE.match(line):
        # ``dmesg -T`` prints the local time of the host it ran on: read as local here (the
        # agent's zone; before, as UTC: west of Greenwich a fresh XID fell outside
        # lookback_s, east of it was stamped hours ahead; found by a review, 2026-11-28)
        when = time.strptime(" ".join(t["when"].split()), "%a %b %d %H:%M:%S %Y")
        time_ns = int(time.mktime(when)) * 10**9
    elif fm := FM_RE.match(line):  # Fabric Manager's local time, as dmesg -T's
        time_ns = int(time.mktime(time.strptime(fm["when"], "%b %d %Y %H:%M:%S"))) * 10**9
    elif not JOURNAL_RE.match(line) and (iso := DMESG_ISO_RE.match(line)):
        with contextlib.suppress(ValueError):
            stamp = datetime.fromisoformat(iso["when"].replace(",", "."))
            time_ns = int(stamp.timestamp() * 1e9)
    return parse_message(text, time_ns, os_rules=os_rules)


def parse_message(text: str, time_ns: int | None, *, os_rules: bool = False) -> Parsed:
    """What the kernel's message ``text`` says (pure): the caller has already established
    that the kernel wrote it (:func:`kernel_message` for a line, the journal's trusted fields
    for a journal record: :mod:`collector.sources.journal`) and when (``time_ns``, or None)."""
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
    message = text[len("NVRM: ") :].strip()
    return XidLine(
        normalise_pci(x["pci"]),
        int(x["xid"]),
        pid,
        (x["name"] or "").strip(),
        (x["text"] or "").strip(),
        message,
        time_ns,
    )


def kernel_message(line: str, *, priority_required: bool = False) -> str | None:
    """The message of a kernel-log line, without its header or time prefix; None if the line
    is not the kernel's (see the module's docstring): a ``/dev/kmsg`` record whose facility is
    not the kernel's, a journal line whose identifier is not ``kernel``, or any line without a
    priority when ``priority_required``."""
    m = KMSG_RE.match(line)
    if m:
        return m["text"] if int(m["prio"]) >> 3 == KERNEL_FACILITY else None
    if priority_required:
        return None
    if x := DMESG_X_RE.match(line):
        if x["facility"] != "kern":
            return None
        line = line[x.end() :]
    for prefix in (DMESG_T_RE, DMESG_RE, FABRIC_RE, FM_RE):
        if p := prefix.match(line):
            return line[p.end() :]
    if j := JOURNAL_RE.match(line):
        if j["ident"] != "kernel":
            return None
        rest = line[j.end() :]
        u = DMESG_RE.match(rest)
        return rest[u.end() :] if u else rest
    if iso := DMESG_ISO_RE.match(line):  # (after the journal's: short-iso starts alike)
        return line[iso.end() :]
    return line


def _sxid(text: str, time_ns: int | None) -> SxidLine | None:
    m = SXID_RE.search(text)
    if not m:
        fm = FM_SXID_RE.match(text)
        if fm is None:
            return None
        return SxidLine(  # its switch by Fabric Manager's physical id, its link the port
            int(fm["switch"]),
            normalise_pci(fm["pci"]),
            int(fm["sxid"]),
            fm["severity"] == "fatal",
            int(fm["port"]) if fm["port"] else None,
            text.strip(),
            time_ns,
        )
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
