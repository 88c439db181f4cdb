"""Only the kernel writes a kernel-log finding (issue 38, item 3).

Each test drives the real agent process (``python -m gpuwarden agent --once``) with its fast path
pointed at a loopback server that records every finding posted, and asserts that no line a user
can write raised anything. The kernel log is a file of ``/dev/kmsg`` records
(``pri,seq,usec,flags;message``) CONSTRUCTED in the kernel's formats, and, where this machine
allows it (root, a C compiler, a readable ``/dev/kmsg``), the real kernel log after a real
segfault by uid 65534 and a real write to ``/dev/kmsg``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.scripted_server import Reply, ScriptedServer

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python, GPU has fallen off the bus."
# what a user can make the kernel say: the segfault report quotes the name of the file the
# faulting code was mapped from (arch/x86/mm/fault.c: show_signal_msg, print_vma_addr)
SEGV = (
    "pwn[4242]: segfault at 0 ip 00007f0000001129 sp 00007ffd00000000 error 4 in "
    "{}[1129,7f0000000000+1000]"
)
# a line for each kernel-log rule, as its own subsystem writes it
RULES = [
    "NVRM: Xid (0): 79, pwn.so",
    "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 30 pwn.so",
    "BUG: soft lockup - CPU#3 stuck for 99s! [pwn:1]",
    "nvme nvme0: controller is down; will reset",
    "critical medium error, dev nvme0n1, sector 1",
    "nfs: server pwn not responding, still trying",
    "INFO: task pwn:1 blocked for more than 120 seconds.",
    "LustreError: 11-0: pwn",
    "Memory cgroup out of memory: Killed process 1 (init)",
]


def run_agent(
    tmp: Path, kmsg: str, engine: ScriptedServer, extra: str = ""
) -> tuple[str, list[dict]]:
    config = tmp / "agent.toml"
    config.write_text(
        f'[agent]\ncluster = "c"\nnode = "node-001"\nsources = ["xid"]\nkmsg = "{kmsg}"\n{extra}'
        f'remediation_url = "{engine.url}/v1/findings"\n'
        f'[xid]\nlookback_s = 600.0\njournal_cursor_file = ""\n'
        f"[health]\nhealthy_after_s = 0.0\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "agent", "--config", str(config), "--once"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout, [json.loads(b) for b in engine.bodies()]


def kernel_events(out: str) -> list[str]:
    return [
        line
        for line in out.splitlines()
        if line.startswith(("gpu_event", "nvswitch_event", "os_event", "finding"))
    ]


def test_no_user_written_kernel_log_line_raises_a_finding(tmp_path: Path) -> None:
    """CONSTRUCTED records: every rule's words quoted in a kernel segfault report (facility 0,
    the kernel's), and every rule's line written by user space (facility 1, as
    ``echo '<3>...' > /dev/kmsg`` gives: priority 11). Then one true kernel XID: the only
    finding, so the agent still reads the log."""
    records = [f"6,{n},{1000 + n},-;{SEGV.format(words)}" for n, words in enumerate(RULES)]
    records += [f"{8 + 3},{20 + n},{2000 + n},-;{words}" for n, words in enumerate(RULES)]
    records += ["11,40,3000,-;" + XID79, "14,41,3001,-;" + XID79]  # <3> and no prefix
    records.append("3,50,4000,-;" + XID79)  # the kernel's own: facility 0, level err
    log = tmp_path / "kmsg.log"
    log.write_text("\n".join(records) + "\n")
    with ScriptedServer([], default=Reply(202)) as engine:
        out, posted = run_agent(tmp_path, str(log), engine)
    assert [(f["kind"], f["evidence"]["xid"]) for f in posted] == [("gpu_xid", 79)]
    events = kernel_events(out)
    assert len(events) == 2, events  # the true XID's gpu_event and its finding point
    assert all("fallen off the bus" in e for e in events)


# a process may name itself with a rule's first words (comm: up to 15 bytes, chosen by its
# owner); the kernel then starts its report with them (SEGV's first words are the name)
NAMED = [
    "LustreError: [4242]: segfault at 0 ip 00007f0000001129 sp 00007ffd00000000 error 4 in "
    "pwn.so[1129,7f0000000000+1000]",
    "INFO: task [4242]: segfault at 0 ip 00007f0000001129 sp 00007ffd00000000 error 4 in "
    "a:1 blocked for more than 120 seconds[1129,7f0000000000+1000]",
    "LustreError: /4242: potentially unexpected fatal signal 11.",
    "INFO: task  (4242): drop_caches: 3",
    # lines that begin with the name and no pid (an attacker's review): the OOM killer's
    "LustreError: invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
]


def test_a_process_named_like_a_rule_raises_nothing(tmp_path: Path) -> None:
    """CONSTRUCTED kernel records (facility 0) that begin with a process's name, as the
    segfault, fatal-signal and drop_caches reports do: a process named ``LustreError: `` or
    ``INFO: task `` made the warning-level Lustre and hung-task rules fire (docs/SECURITY.md,
    known hole 6). Then a real Lustre line and a real hung task: both still read."""
    records = [f"6,{n},{1000 + n},-;{line}" for n, line in enumerate(NAMED)]
    records.append("3,60,5000,-;LustreError: 11-0: lustre-OST0000-osc: operation failed")
    records.append(
        "3,62,5002,-;LustreError: 2231:0:(ldlm_request.c:148:ldlm_expired()) lustre-OST0001"
    )
    records.append("3,61,5001,-;INFO: task python3:1234 blocked for more than 120 seconds.")
    log = tmp_path / "kmsg.log"
    log.write_text("\n".join(records) + "\n")
    with ScriptedServer([], default=Reply(202)) as engine:
        out, _ = run_agent(tmp_path, str(log), engine)
    events = [e for e in kernel_events(out) if e.startswith("os_event")]
    assert len(events) == 3, events
    joined = "\n".join(events)
    assert all(word in joined for word in ("lustre-OST0000", "OST0001", "python3")), events


def test_a_journal_export_counts_only_the_kernels_lines(tmp_path: Path) -> None:
    """CONSTRUCTED ``journalctl -o short`` lines: ``logger -t pwn`` writes any words under its
    own identifier; only ``kernel:`` lines are the kernel's."""
    log = tmp_path / "kmsg.log"
    log.write_text(
        f"May 07 21:43:54 node-001 pwn[77]: {XID79}\n"
        f"May 07 21:43:55 node-001 pwn: {RULES[1]}\n"
        f"May 07 21:43:56 node-001 kernel: {SEGV.format(RULES[0])}\n"
    )
    with ScriptedServer([], default=Reply(202)) as engine:
        out, posted = run_agent(tmp_path, str(log), engine)
    assert posted == [] and kernel_events(out) == []


def test_the_journal_counts_only_the_kernels_records(tmp_path: Path) -> None:
    """Issue 37: the same records in the host's systemd journal (``[agent] kernel_journal``;
    real journal files, written by systemd-journal-remote from CONSTRUCTED records): every
    rule's words quoted in a kernel segfault report and in the reports that start with a
    process's name (the kernel's: ``_TRANSPORT=kernel``, facility 0), every rule's line as
    journald stores what user space writes to ``/dev/kmsg`` (``_TRANSPORT=kernel``, the
    writer's facility), a service's stdout and ``logger -t kernel``. Then one true kernel XID:
    the only finding."""
    from tests.test_agent_kernel_journal import append, kernel

    now_us = time.time_ns() // 1000
    records = [kernel(SEGV.format(words), now_us - 100 + n) for n, words in enumerate(RULES)]
    records += [kernel(line, now_us - 80 + n) for n, line in enumerate(NAMED)]
    for n, words in enumerate(RULES):
        records += [
            kernel(words, now_us - 60 + n, SYSLOG_FACILITY="1", SYSLOG_IDENTIFIER="pwn"),
            kernel(words, now_us - 40 + n, _TRANSPORT="stdout", SYSLOG_IDENTIFIER="pwn"),
            kernel(words, now_us - 20 + n, _TRANSPORT="syslog", _UID="65534"),
        ]
    records.append(kernel(XID79, now_us))
    append(tmp_path / "host", records)
    with ScriptedServer([], default=Reply(202)) as engine:
        extra = f'kernel_journal = "{tmp_path / "host"}"\n'
        out, posted = run_agent(tmp_path, "/nonexistent", engine, extra)
    assert [(f["kind"], f["evidence"]["xid"]) for f in posted] == [("gpu_xid", 79)]
    events = kernel_events(out)
    assert len(events) == 2, events
    assert all("fallen off the bus" in e for e in events)
    assert [e for e in events if e.startswith("gpu_event") and ",source=journal " in e], events


def _real_kernel_log_usable() -> str:
    if os.geteuid() != 0:
        return "needs root (to run code as uid 65534 and to write /dev/kmsg)"
    if shutil.which("cc") is None:
        return "needs a C compiler for the faulting program"
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError as exc:
        return f"/dev/kmsg is not readable here: {exc}"
    return ""


def _kmsg_records() -> list[str]:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        while True:
            try:
                out.append(os.read(fd, 8192).decode("utf-8", "replace"))
            except BlockingIOError:
                return out
            except BrokenPipeError:  # overwritten before it was read
                continue
    finally:
        os.close(fd)


@pytest.mark.skipif(bool(_real_kernel_log_usable()), reason=_real_kernel_log_usable() or "-")
def test_the_real_kernel_log_after_a_users_segfault_and_kmsg_write(tmp_path: Path) -> None:
    """The attack of issue 38 on this machine's own kernel: uid 65534 runs a program whose file
    is named ``NVRM: Xid (0): 79, pwn.so`` and that reads address 0; the kernel logs the fault,
    quoting the name. And ``<3>`` plus an XID 79 line written to ``/dev/kmsg`` (as any
    program allowed to write it can). The agent reads the real ``/dev/kmsg``: nothing raised."""
    folder = Path(tempfile.mkdtemp(prefix="gw-kmsg-"))  # world-readable: uid 65534 runs from it
    try:
        folder.chmod(0o755)
        source = folder / "pwn.c"
        source.write_text("int main(void) { return *(volatile int *)0; }\n")
        program = folder / "NVRM: Xid (0): 79, pwn.so"
        subprocess.run(["cc", "-O0", "-o", str(program), str(source)], check=True)
        program.chmod(0o755)
        faulted = subprocess.run([str(program)], user=NOBODY, group=NOBODY, check=False)
        assert faulted.returncode == -11  # SIGSEGV
        marker = f"gpuwarden test {time.time_ns()}"
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<3>{XID79} ({marker})\n")
        records = _kmsg_records()
        # the attack is staged: the kernel quoted the file's name, the forged line is there
        assert any("segfault at 0" in r and "in NVRM: Xid (0): 79, pwn.so[" in r for r in records)
        assert any(marker in r and r.split(",", 1)[0] == "11" for r in records)
        with ScriptedServer([], default=Reply(202)) as engine:
            out, posted = run_agent(tmp_path, "/dev/kmsg", engine)
        # the machine's own log may hold real OS events (an OOM kill); none is ours
        ours = [e for e in kernel_events(out) if e.startswith("gpu_event") or "pwn" in e]
        assert [f["kind"] for f in posted if f["kind"] == "gpu_xid"] == [] and ours == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)
