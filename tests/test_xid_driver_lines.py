"""XID lines as current NVIDIA drivers write them, found by a review against real driver output
(2026-11-28). The lines are REAL formats (open-gpu-kernel-modules
``src/nvidia/src/kernel/gpu/rc/kernel_rc.c`` for MIG attribution; XID 154's wording as quoted in
public bug reports and NVIDIA/NVSentinel's parser tests); the values in them are CONSTRUCTED.
"""

from __future__ import annotations

import time

import pytest

from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.kmsg import SxidLine, XidLine, parse_line, parse_message
from gpuwarden.collector.sources.xid import KmsgXidSource
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.xidcat import XidPolicy

MIG = [
    # a MIG GPU instance and compute instance: fatal XID 95 (uncontained memory error)
    (
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 95, pid=1234, name=python, "
        "Uncontained: FBHUB. RST: Yes, D-RST: No",
        95,
    ),
    # the GPU instance alone
    (
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:01): 94, pid='<unknown>', name=<unknown>, "
        "Contained: CE User Channel (0x9). RST: No, D-RST: No",
        94,
    ),
]


@pytest.mark.parametrize(("line", "xid"), MIG)
def test_an_xid_on_a_mig_instance_is_an_xid_of_its_gpu(line: str, xid: int) -> None:
    """Before: not an XID at all (the address allowed nothing after it), fatal XID 95 lost
    wherever the kernel log is the only path (the journal in a pod, a file)."""
    parsed = parse_message(line, 1)
    assert isinstance(parsed, XidLine)
    assert (parsed.pci, parsed.xid) == ("0000:3b:00", xid)


RECOVERY = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to {}"


@pytest.mark.parametrize(
    ("action", "severity", "fatal"),
    [
        ("0x2 (Node Reboot Required)", "critical", True),
        ("0x1 (GPU Reset Required)", "critical", True),
        ("0x4 (Drain and Reset)", "critical", True),
        ("0x2 (OS Reboot)", "critical", True),
        ("0x1 (PF FLR)", "critical", True),
        ("0x3 (Drain P2P)", "warning", False),
        ("0x0 (None)", "info", False),
    ],
)
def test_xid_154_is_as_severe_as_the_recovery_it_asks_for(
    action: str, severity: str, fatal: bool
) -> None:
    """Before: every XID 154 was info (the catalogue: "informational only"), so a GPU the
    driver declared in need of a reboot raised nothing."""
    line = RECOVERY.format(action)
    parsed = parse_message(line, 1)
    assert isinstance(parsed, XidLine) and parsed.xid == 154
    got = XidPolicy().describe(154, parsed.message)
    assert (got[0], got[2]) == (severity, fatal)
    # the operator's not_fatal list still wins
    assert XidPolicy(not_fatal=[154]).describe(154, parsed.message)[2] is False


def test_a_reboot_required_154_from_the_kernel_log_raises_the_fast_path(tmp_path) -> None:
    log = tmp_path / "kern.log"
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    log.write_text(
        f"{now} node-001 kernel: " + RECOVERY.format("0x2 (Node Reboot Required)") + "\n"
    )
    emitted: list = []
    source = KmsgXidSource(
        SourceContext("c", "node-001", emit_finding=emitted.append),
        {"path": str(log), "follow_s": 0, "lookback_s": 600},
    )
    try:
        (point,) = source.collect(time.time_ns())
    finally:
        source.close()
    assert point.tags["severity"] == "critical" and point.fields["fatal_active"] is True
    assert [f.kind for f in emitted] == ["gpu_xid"]


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize(
    "line",
    [
        f"Nov 28 09:00:00 node-001 kernel: [ 3223.512345] {XID79}",  # rsyslog's kern.log
        f"Nov 28 09:00:00.123456 node-001 kernel: {XID79}",  # journalctl -o short-precise
        f"Sat 2026-11-28 09:00:00 UTC node-001 kernel: {XID79}",  # journalctl -o short-full
        f"2026-11-28T09:00:00+0100 node-001 kernel: {XID79}",  # journalctl -o short-iso
        f"2026-11-28T09:00:00,123456+00:00 {XID79}",  # dmesg --time-format iso
        f"kern  :warn  : [   12.300000] {XID79}",  # dmesg -x
    ],
)
def test_the_kernel_log_as_common_tools_write_it_to_a_file(line: str) -> None:
    """``[xid] path`` names a file: the formats operators have. Before: rsyslog's kern.log
    (the kernel's uptime after ``kernel:``), short-precise, short-full, dmesg's ISO time and
    ``dmesg -x`` were not XIDs at all (found by a review against real tools, 2026-11-28)."""
    parsed = parse_line(line)
    assert isinstance(parsed, XidLine) and parsed.xid == 79


def test_dmesg_iso_time_is_the_records_and_user_lines_are_not_the_kernels() -> None:
    parsed = parse_line(f"2026-11-28T09:00:00,500000+01:00 {XID79}")
    assert isinstance(parsed, XidLine) and parsed.time_ns == 1795852800_500000000
    assert parse_line(f"user  :warn  : [   12.3] {XID79}") is None  # echo > /dev/kmsg
    assert parse_line(f"Nov 28 09:00:00 node-001 pwn: [ 3223.5] {XID79}") is None


def test_dmesg_t_time_is_the_hosts_local_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dmesg -T`` prints local time. Before: read as UTC, so in New York a fresh XID was
    five hours old (outside lookback_s: no point, no finding), in Shanghai eight hours ahead."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        parsed = parse_line(f"[Sat Nov 28 04:00:00 2026] {XID79}")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert isinstance(parsed, XidLine) and parsed.time_ns == 1795856400 * 10**9  # 09:00 UTC


def test_a_fabric_manager_logs_nvswitch_errors_are_sxids() -> None:
    """Fabric Manager's own log, in the format gpud matches in /var/log/fabricmanager.log
    (REAL format; the values CONSTRUCTED). Before: no line of it was an SXid, though the
    docs said such a log is read."""
    fatal = parse_line("[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error "
                       "20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 "
                       "port 33")  # fmt: skip
    assert isinstance(fatal, SxidLine)
    assert (fatal.switch, fatal.pci, fatal.sxid, fatal.fatal, fatal.link) == (
        3, "0000:86:00", 20034, True, 33)  # fmt: skip
    assert fatal.time_ns is not None
    other = parse_line("[Jul 09 2024 18:14:07] [ERROR] [tid 12727] detected NVSwitch non-fatal "
                       "error 12028 on fid 0 on NVSwitch pci bus id 00000000:A9:00.0 physical "
                       "id 3 port 61")  # fmt: skip
    assert isinstance(other, SxidLine) and not other.fatal and other.sxid == 12028
    assert parse_line("[Jul 23 2024 07:53:55] [INFO] [tid 841] Fabric Manager started") is None


def test_a_rotated_kernel_log_file_is_followed(tmp_path) -> None:
    """``[xid] path`` names a file that logrotate rotates. Before: after a rename-rotate the
    source read the old file for ever, after copytruncate past its end: every later XID lost,
    silently (found by a review against real operations, 2026-11-28)."""
    log = tmp_path / "kern.log"
    emitted: list = []
    source = KmsgXidSource(
        SourceContext("c", "node-001", emit_finding=emitted.append),
        {"path": str(log), "follow_s": 0, "lookback_s": 600},
    )

    def line(pci: str) -> str:
        return XID79.replace("0000:3b:00", pci) + "\n"

    def pcis() -> list[str]:
        points = source.collect(time.time_ns())
        source.committed(save=False)  # the agent's sink has them (not sent again)
        return [str(p.fields["message"]).split(")")[0][-10:] for p in points]

    try:
        log.write_text(line("0000:3b:00"))
        assert pcis() == ["0000:3b:00"]
        with log.open("a") as fh:  # the last lines of the old file, then rename-rotate
            fh.write(line("0000:5e:00"))
        log.rename(tmp_path / "kern.log.1")
        log.write_text(line("0000:86:00"))
        assert pcis() == ["0000:5e:00", "0000:86:00"]
        with log.open("r+") as fh:  # copytruncate: copied away, cut to nothing ...
            fh.truncate(0)
        assert pcis() == []  # (the follower looks every follow_s: before the next line)
        with log.open("a") as fh:  # ... and written on from its start
            fh.write(line("0000:af:00"))
        assert pcis() == ["0000:af:00"]
    finally:
        source.close()


def test_dmesg_iso_lines_of_the_os_rules_are_not_taken_for_a_journal_line() -> None:
    """Found by the review of the formats: the journal's short-iso pattern also matched
    dmesg's ISO time, and "nvme nvme0: ..." then read as host "nvme", identifier "nvme0": not
    the kernel's, refused (an NVMe controller down, a soft lockup lost)."""
    nvme = parse_line("2026-11-28T09:00:00,123456+00:00 nvme nvme0: controller is down; will "
                      "reset: CSTS=0xffffffff, PCI_STATUS=0xffff", os_rules=True)  # fmt: skip
    assert nvme is not None and getattr(nvme, "rule", "") == "nvme_error"


def test_points_go_again_until_the_agent_says_its_sink_has_them(tmp_path) -> None:
    """Found by the review of the cursor's fix: a cycle the agent abandoned in a later, hung
    source lost the kernel records' points, and the next cycle moved the cursor past them.
    Now they go out with every collect until committed()."""
    log = tmp_path / "kern.log"
    log.write_text(XID79 + "\n")
    source = KmsgXidSource(SourceContext("c", "node-001"),
                           {"path": str(log), "follow_s": 0, "lookback_s": 600})  # fmt: skip
    source.retain_until_committed = True  # (as Agent.run sets it)
    try:
        assert len(source.collect(time.time_ns())) == 1  # (that cycle abandoned)
        assert len(source.collect(time.time_ns())) == 1  # again
        assert source.commit_due()
        source.committed(save=False)
        assert source.collect(time.time_ns()) == [] and not source.commit_due()
    finally:
        source.close()


def test_a_rotated_file_that_cannot_be_opened_is_tried_again(tmp_path, monkeypatch) -> None:
    """Found by the same review: the old file was closed, the new one could not be opened
    (logrotate's ``create 0640 root adm`` for an agent not in adm), and the closed descriptor
    stayed in use (another file's bytes read as kernel lines once the number was reused), and
    the lines just read were lost with the exception."""
    log = tmp_path / "kern.log"
    log.write_text(XID79 + "\n")
    source = KmsgXidSource(SourceContext("c", "node-001"),
                           {"path": str(log), "follow_s": 0, "lookback_s": 600})  # fmt: skip
    try:
        assert len(source.collect(time.time_ns())) == 1
        source.committed(save=False)
        with log.open("a") as fh:
            fh.write(XID79.replace("3b:00", "5e:00") + "\n")
        log.rename(tmp_path / "kern.log.1")
        log.write_text(XID79.replace("3b:00", "86:00") + "\n")
        opened = source._open

        def refused() -> int:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(source, "_open", refused)
        points = source.collect(time.time_ns())  # the old file's last line, not lost
        assert ["5e:00" in str(p.fields["message"]) for p in points] == [True]
        source.committed(save=False)
        assert source._fd is None  # nothing closed left in use
        monkeypatch.setattr(source, "_open", opened)
        points = source.collect(time.time_ns())  # the new file, from its start
        assert ["86:00" in str(p.fields["message"]) for p in points] == [True]
    finally:
        source.close()


def test_points_cut_from_the_backlog_keep_the_cursor_where_it_is(monkeypatch) -> None:
    """Found by the fourth review: the re-send backlog is bounded; a cycle that carried the
    points cut from it and then failed lost them, and the next good cycle saved the cursor
    past their records. Now the cursor is saved no more until a restart reads them again."""
    from gpuwarden.collector.sources import xid as xid_module

    class Journal:
        handled, saved = "c1", []

        def save(self, cursor: str) -> None:
            self.saved.append(cursor)

    monkeypatch.setattr(xid_module, "MAX_UNACKED", 2)
    source = KmsgXidSource(SourceContext("c", "node-001"), {"follow_s": 0, "path": "/dev/null"})
    journal = Journal()
    source.retain_until_committed = True
    source.journal = journal
    monkeypatch.setattr(source, "_read", lambda now: [Point("gpu_event", {}, {"n": now}, now)])
    monkeypatch.setattr(journal, "check", lambda: None, raising=False)
    try:
        for t in (1, 2, 3):  # three cycles whose writes failed: the backlog is cut at the third
            source.collect(t)
        source.collect(4)  # the third's write failed too: its cut point is gone
        source.committed()
        assert journal.saved == []  # (before: "c1", past the lost point's record)
        source.collect(5)
        source.committed()
        assert journal.saved == []  # until a restart
    finally:
        source.journal = None
        source.close()
