"""Issue 37 (Kubernetes): the kernel log from the host's systemd journal (``[agent]
kernel_journal``), where an unprivileged pod cannot read ``/dev/kmsg``.

Everything here is real: the journal files are written by systemd's own
``systemd-journal-remote`` from records in the Journal Export Format
(https://systemd.io/JOURNAL_EXPORT_FORMATS/), laid out as on a host
(``<root>/var/log/journal/<machine-id>/``), and the agent (``python -m gpuwarden agent``, a
real process) reads them with the real ``journalctl``. The records are CONSTRUCTED: an XID
as the NVIDIA driver logs it and journald stores it (``_TRANSPORT=kernel``,
``SYSLOG_FACILITY=0``), next to the same words from user processes (a service's stdout,
``logger -t kernel``, and ``echo ... > /dev/kmsg``, which journald stores with
``_TRANSPORT=kernel`` and the writer's facility), which must raise nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.collector.config import ConfigError, load_config
from gpuwarden.collector.sources.base import SourceContext, SourceError
from gpuwarden.collector.sources.journal import JournalFollower, kernel_escape, kernel_record
from gpuwarden.collector.sources.xid import KmsgXidSource
from testbed.influxd import free_port
from tests.scripted_server import Reply, ScriptedServer

ROOT = Path(__file__).resolve().parent.parent
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"  # Debian's systemd-journal-remote
MACHINE = "0123456789abcdef0123456789abcdef"
BOOT = "fedcba9876543210fedcba9876543210"
XID = "NVRM: Xid (PCI:{pci}): 79, pid=4242, name=python, GPU has fallen off the bus."


def export(fields: dict[str, str | bytes]) -> bytes:
    """One record in the Journal Export Format: ``KEY=value`` lines, or for a value that is
    bytes the binary form (the key, a newline, its length as 64-bit little endian, the data)."""
    out = b""
    for key, value in fields.items():
        if isinstance(value, bytes):
            out += key.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
        else:
            out += f"{key}={value}\n".encode()
    return out + b"\n"


def kernel(message: str | bytes, at_us: int, **extra: str) -> dict[str, str | bytes]:
    """A record as journald stores a kernel message read from ``/dev/kmsg``."""
    return {
        "__REALTIME_TIMESTAMP": str(at_us),
        "__MONOTONIC_TIMESTAMP": str(at_us % 10**9),
        "_BOOT_ID": BOOT,
        "_MACHINE_ID": MACHINE,
        "_HOSTNAME": "node-001",
        "_TRANSPORT": "kernel",
        "SYSLOG_FACILITY": "0",
        "SYSLOG_IDENTIFIER": "kernel",
        "PRIORITY": "4",
        "MESSAGE": message,
    } | extra


def append(root: Path, records: list[dict[str, str | bytes]]) -> None:
    """Appends ``records`` to the host's journal below ``root`` with the real tool."""
    folder = root / "var/log/journal" / MACHINE
    folder.mkdir(parents=True, exist_ok=True)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/machine-id").write_text(MACHINE + "\n")  # the host's, as mounted
    done = subprocess.run(
        [JOURNAL_REMOTE, f"--output={folder}/system.journal", "-"],
        input=b"".join(export(r) for r in records),
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()


@pytest.fixture(autouse=True)
def _real_tools() -> None:
    # installed by scripts/bootstrap.sh (systemd, systemd-journal-remote): a test that cannot
    # run has failed
    assert os.access(JOURNAL_REMOTE, os.X_OK), f"{JOURNAL_REMOTE} missing: run bootstrap.sh"
    assert shutil.which("journalctl"), "journalctl missing: run bootstrap.sh"


class Agent:
    """The real agent process, reading the journal below ``root``."""

    def __init__(self, tmp: Path, root: Path, engine: str, influx: str) -> None:
        self.port = free_port()
        self.config = tmp / "agent.toml"
        self.config.write_text(
            f'[agent]\ncluster = "c"\nnode = "node-001"\nsources = ["xid"]\ninterval_s = 0.5\n'
            f'kernel_journal = "{root}"\nkmsg = "{tmp}/no-kmsg"\nreporter_listen = ""\n'
            f'health_listen = "127.0.0.1:{self.port}"\n'
            f'remediation_url = "{engine}/v1/findings"\n'
            f'[xid]\nlookback_s = 600.0\njournal_cursor_file = "{tmp}/kernel-journal.cursor"\n'
            f"[health]\nhealthy_after_s = 0.0\n"
            f'[sink]\nurl = "{influx}"\ndatabase = "d"\nspool_dir = "{tmp}/spool"\n'
            f"flush_interval_s = 0.1\n"
        )
        self.log = tmp / "agent.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "agent", "--config", str(self.config)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def ready(self) -> tuple[int, dict[str, Any]] | None:
        if self.proc.poll() is not None:
            pytest.fail(f"the agent exited ({self.proc.returncode}): {self.log.read_text()}")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/readyz")
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        except (ConnectionRefusedError, ConnectionResetError, TimeoutError):
            return None
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(timeout=30) == 0, self.log.read_text()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def until(what: str, check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)


def findings(engine: ScriptedServer) -> list[dict[str, Any]]:
    return [json.loads(b) for b in engine.bodies()]


def xid_pcis(engine: ScriptedServer) -> list[str]:
    """The PCI address each posted ``gpu_xid`` names (its evidence's message), in order."""
    out = []
    for f in findings(engine):
        assert f["kind"] == "gpu_xid", f
        out.append(f["evidence"]["message"].split("PCI:")[1].split(")")[0])
    return out


@pytest.fixture
def servers() -> Iterator[tuple[ScriptedServer, ScriptedServer]]:
    """The engine's /v1/findings and InfluxDB's /write, each answering every post."""
    with ScriptedServer([], default=Reply(202)) as engine, ScriptedServer([]) as influx:
        yield engine, influx


def test_the_agent_raises_the_kernels_xid_from_the_journal_and_no_users(
    tmp_path: Path, servers: tuple[ScriptedServer, ScriptedServer]
) -> None:
    """The kernel's XID (its time the record's) raises ``gpu_xid``; the same words from a user
    process do not; ``/readyz`` is 200; a record appended later is read by the running
    follower; after a restart, the old records are not raised again but one logged while the
    agent was down is."""
    engine, influx = servers
    root = tmp_path / "host"
    now_us = time.time_ns() // 1000
    t_kernel = now_us - 60_000_000  # a minute ago: inside lookback_s
    append(root, [
        kernel(XID.format(pci="0000:3b:00"), t_kernel),
        # a service's stdout, `logger -t kernel` (syslog), `echo '<0>...' > /dev/kmsg` (journald
        # stores it with _TRANSPORT=kernel and the writer's facility, user: 1)
        kernel(XID.format(pci="0000:aa:00"), now_us - 50_000_000, _TRANSPORT="stdout",
               SYSLOG_IDENTIFIER="pwn", _PID="77", _UID="1000"),
        kernel(XID.format(pci="0000:bb:00"), now_us - 49_000_000, _TRANSPORT="syslog",
               _PID="78", _UID="1000"),
        kernel(XID.format(pci="0000:cc:00"), now_us - 48_000_000, SYSLOG_FACILITY="1",
               SYSLOG_IDENTIFIER="pwn"),
        # the kernel's, not UTF-8 (a process name of any bytes): journalctl gives MESSAGE as an
        # array of bytes
        kernel(XID.format(pci="0000:5e:00").replace("python", "py\xffthon").encode("latin-1"),
               now_us - 47_000_000),
    ])  # fmt: skip
    agent = Agent(tmp_path, root, engine.url, influx.url)
    try:
        until("two findings", lambda: len(engine.bodies()) >= 2)
        until("/readyz 200", lambda: (agent.ready() or (0, {}))[0] == 200)
        assert xid_pcis(engine) == ["0000:3b:00", "0000:5e:00"]
        first, binary = findings(engine)
        assert first["time_ns"] == t_kernel * 1000
        assert first["evidence"]["source"] == "journal"
        assert "name=py\\xffthon" in binary["evidence"]["message"]
        # the point too, tagged with the path that saw it
        until("the point", lambda: b"source=journal xid_code=79i" in b"".join(influx.bodies()))

        t_later = time.time_ns() // 1000
        append(root, [kernel(XID.format(pci="0000:86:00"), t_later)])
        until("the appended record", lambda: len(engine.bodies()) >= 3)
        assert xid_pcis(engine)[2] == "0000:86:00"
        assert findings(engine)[2]["time_ns"] == t_later * 1000
        # its point with the sink: the restart goes on after it (a record whose point had not
        # reached the sink is read again: tests/test_xid_cursor.py)
        until("its point", lambda: b"0000:86:00" in b"".join(influx.bodies()))
    finally:
        agent.stop()
    assert "kernel-journal.cursor" in os.listdir(tmp_path)

    # logged while the agent was down
    append(root, [kernel(XID.format(pci="0000:af:00"), time.time_ns() // 1000)])
    seen = len(engine.bodies())
    agent = Agent(tmp_path, root, engine.url, influx.url)
    try:
        until("the record logged while down", lambda: len(engine.bodies()) > seen)
        until("/readyz 200 again", lambda: (agent.ready() or (0, {}))[0] == 200)
        time.sleep(1.0)  # a few more cycles: nothing old comes back
        assert xid_pcis(engine)[seen:] == ["0000:af:00"]
    finally:
        agent.stop()


def test_a_source_without_the_journal_fails_with_its_reason(tmp_path: Path) -> None:
    """The folder holds no journal (a mount missing, or the setting names the journal folder
    itself): the source fails every cycle and says what it wants, and the agent goes on."""
    (tmp_path / "journal/etc").mkdir(parents=True)
    (tmp_path / "journal/etc/machine-id").write_text(MACHINE + "\n")
    context = SourceContext("c", "n", kernel_journal=str(tmp_path / "journal"))
    source = KmsgXidSource(context, {"follow_s": 0, "journal_cursor_file": ""})
    try:
        with pytest.raises(SourceError, match="neither var/log/journal nor run/log/journal"):
            source.collect(time.time_ns())
    finally:
        source.close()


def test_only_this_hosts_journal_counts(tmp_path: Path) -> None:
    """The journal folders also hold other machines' journals: ``remote/`` (what
    systemd-journal-remote received from other hosts) and containers' (``--link-journal``),
    whose writers set any field. A kernel XID there, with another machine id, raises nothing
    (before: journalctl --merge read it as this node's, and the fast path drained it). With
    no machine id to tell them apart the source fails and says why."""
    root = tmp_path / "host"
    now_us = time.time_ns() // 1000
    append(root, [kernel("usb 1-1: new high-speed USB device number 2", now_us - 5_000_000)])
    remote = root / "var/log/journal/remote"
    remote.mkdir(parents=True)
    foreign = kernel(XID.format(pci="0000:3b:00"), now_us - 1_000_000,
                     _MACHINE_ID="99999999999999999999999999999999",
                     _HOSTNAME="some-other-host")  # fmt: skip
    done = subprocess.run([JOURNAL_REMOTE, f"--output={remote}/remote-10.0.0.9.journal", "-"],
                          input=export(foreign), capture_output=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    emitted: list[object] = []
    context = SourceContext("c", "n", kernel_journal=str(root), emit_finding=emitted.append)
    source = KmsgXidSource(context, {"follow_s": 0, "journal_cursor_file": "", "lookback_s": 60})
    try:
        points = source.collect(time.time_ns())
        assert [p for p in points if p.measurement == "gpu_event"] == []
        assert emitted == []
    finally:
        source.close()
    (root / "etc/machine-id").unlink()
    source = KmsgXidSource(context, {"follow_s": 0, "journal_cursor_file": ""})
    try:
        with pytest.raises(SourceError, match="no etc/machine-id"):
            source.collect(time.time_ns())
    finally:
        source.close()


def test_the_journal_replaces_kmsg_and_a_file_is_not_named_too(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nkernel_journal = "/host"\n[xid]\npath = "/var/log/dmesg"\n')
    with pytest.raises(ConfigError, match="kernel_journal"):
        load_config(str(config), environ={})
    config.write_text('[agent]\nkernel_journal = "/host"\n')
    assert load_config(str(config), environ={})["agent"]["kernel_journal"] == "/host"


def test_only_the_kernels_records_count() -> None:
    """Pure: ``_TRANSPORT`` kernel and the kernel's facility (0), as journalctl's JSON gives
    them; a message of bytes is escaped as /dev/kmsg would give it."""
    line = XID.format(pci="0000:3b:00")
    base = {"__CURSOR": "s=1;i=1", "__REALTIME_TIMESTAMP": "1764150000000001",
            "_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "MESSAGE": line}  # fmt: skip
    assert kernel_record(base) == (line, 1764150000000001000)
    for other in ({"_TRANSPORT": "stdout"}, {"_TRANSPORT": "syslog"}, {"SYSLOG_FACILITY": "1"},
                  {"SYSLOG_FACILITY": None}, {"_TRANSPORT": None}, {"MESSAGE": None},
                  {"MESSAGE": [line, line]}):  # fmt: skip
        assert kernel_record(base | other) is None, other
    raw = list(b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a\xff\nb\\, x")
    got = kernel_record(base | {"MESSAGE": raw})
    assert (
        got is not None
        and got[0] == "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a\\xff\\x0ab\\x5c, x"
    )
    assert kernel_escape("ü".encode()) == "\\xc3\\xbc"


def test_journalctl_that_exits_is_started_again_after_the_last_record(tmp_path: Path) -> None:
    """Supervision: journalctl killed under the follower is reported (the source's cycle
    fails with the reason) and started again after the back-off, from the record after the
    last one read (none twice, none lost); a journalctl that cannot run is a reason too."""
    root = tmp_path / "host"
    now_us = time.time_ns() // 1000
    append(root, [kernel(XID.format(pci="0000:3b:00"), now_us)])
    follower = JournalFollower(str(root), lookback_s=600.0)
    try:
        follower.start()
        assert [text for text, _ in follower.read()] == [XID.format(pci="0000:3b:00")]
        until("journalctl following", lambda: follower.running_pid() is not None)
        os.kill(follower.running_pid() or 0, signal.SIGKILL)
        reasons: list[str] = []

        def down() -> bool:
            try:
                follower.check()
            except SourceError as exc:
                reasons.append(str(exc))
                return True
            return False

        until("the exit reported", down)  # for the back-off's 1 s
        assert "journalctl exited with status -9" in reasons[0], reasons
        append(root, [kernel(XID.format(pci="0000:86:00"), now_us + 1)])
        got: list[str] = []

        def more() -> bool:
            got.extend(text for text, _ in follower.read())
            return bool(got)

        until("the record after", more)
        time.sleep(0.3)  # and nothing else (the record before is not read again)
        more()
        assert got == [XID.format(pci="0000:86:00")] and follower.restarts >= 1
        follower.check()
    finally:
        follower.close()
    missing = JournalFollower(str(root), journalctl=str(tmp_path / "no-journalctl"))
    try:
        missing.start()
        with pytest.raises(SourceError, match=r"cannot run .*no-journalctl"):
            missing.check()
    finally:
        missing.close()


def test_points_read_while_journalctl_is_down_go_out_with_the_next_cycle(tmp_path: Path) -> None:
    """A cycle that fails because journalctl is not running keeps the points it read (an XID
    that journalctl printed just before it died) for the cycle after."""
    root = tmp_path / "host"
    append(root, [kernel("NVRM: loading NVIDIA UNIX x86_64 Kernel Module", time.time_ns() // 1000)])
    source = KmsgXidSource(
        SourceContext("c", "n", kernel_journal=str(root)),
        {"follow_s": 0, "lookback_s": 600.0, "journal_cursor_file": ""},
    )
    try:
        assert source.collect(time.time_ns()) == []
        follower = source.journal
        assert follower is not None
        until("journalctl following", lambda: follower.running_pid() is not None)
        append(root, [kernel(XID.format(pci="0000:3b:00"), time.time_ns() // 1000)])
        until("the record read", lambda: bool(follower._pending))
        os.kill(follower.running_pid() or 0, signal.SIGKILL)

        def down() -> bool:
            try:
                follower.check()
            except SourceError:
                return True
            return False

        until("journalctl down", down)
        with pytest.raises(SourceError, match="journalctl exited"):
            source.collect(time.time_ns())
        points: list[Any] = []

        def cycle() -> bool:
            try:
                points.extend(source.collect(time.time_ns()))
            except SourceError:
                return False
            return True

        until("a cycle that works", cycle)
        assert [p.fields["xid_code"] for p in points if p.measurement == "gpu_event"] == [79]
    finally:
        source.close()


def test_a_record_whose_point_never_reached_the_sink_is_read_again(tmp_path: Path) -> None:
    """Found in a review of what a crash loses (2026-11-28): the cursor was saved as a record
    was read, before its point had gone anywhere (it waits for the next cycle) and while its
    finding was only in the poster's memory; an agent killed then lost the fatal XID for good,
    point and finding. Now the cursor is saved once the agent's sink took the points
    (``committed()``, which the agent calls after a write). Here a first source reads the XID
    and dies before its write (never closed, as SIGKILL leaves it); a second reads it again,
    is told the sink has it, and a third, after it, reads nothing."""
    root = tmp_path / "host"
    append(root, [kernel(XID.format(pci="0000:3b:00"), time.time_ns() // 1000 - 1_000_000)])
    cursor = tmp_path / "kernel-journal.cursor"
    settings = {"follow_s": 0, "journal_cursor_file": str(cursor), "lookback_s": 60}

    def xids(source: KmsgXidSource) -> list[int]:
        points = source.collect(time.time_ns())
        return [int(p.fields["xid_code"]) for p in points if p.measurement == "gpu_event"]

    emitted: list[object] = []
    context = SourceContext("c", "n", kernel_journal=str(root), emit_finding=emitted.append)
    first = KmsgXidSource(context, settings)
    assert xids(first) == [79] and len(emitted) == 1
    # killed here: its point is in this cycle's answer, not yet with any sink
    second = KmsgXidSource(context, settings)
    try:
        assert xids(second) == [79] and len(emitted) == 2  # read again: same point, same id
        second.committed()  # the agent wrote them
        assert xids(second) == []
    finally:
        second.close()
    assert len({f.id for f in emitted}) == 1
    third = KmsgXidSource(context, settings)
    try:
        assert xids(third) == []
    finally:
        third.close()
    first._stop.set()
    if first.journal is not None:
        first.journal.close("")


def test_the_agent_tells_a_source_only_once_its_sink_took_the_points() -> None:
    """The other half of the cursor's fix, found by the review of it: saving the cursor at the
    next collect proved only that the last collect returned; a sink that refused the cycle's
    points (a full disk under the spool) still moved the cursor past them."""
    import threading

    from gpuwarden.collector.agent import Agent
    from gpuwarden.core.store.lineprotocol import Point

    class Reader:
        name = "xid"

        def __init__(self) -> None:
            self.commits = 0
            self.saves: list[bool] = []

        def collect(self, now_ns: int) -> list[Point]:
            return [Point("gpu_event", {"node": "n"}, {"xid_code": 79}, now_ns)]

        def committed(self, save: bool = True) -> None:
            self.commits += 1
            self.saves.append(save)

        def close(self) -> None:
            pass

    class Sink:
        refuse = True
        disk_full = False

        def __init__(self) -> None:
            self.order: list[str] = []

        def write_points(self, points: list[Point]) -> None:
            if self.refuse:
                raise OSError(28, "No space left on device")

        def persist(self) -> None:  # what it holds in memory, on disk before a commit
            self.order.append("persist")
            if self.disk_full:
                raise OSError(28, "No space left on device")

        def flush(self, timeout_s: float | None = None) -> bool:
            return True

        def close(self) -> None:
            self.order.append("sink closed")

    def run() -> None:
        agent = Agent([reader], sink, cluster="c", node="n", interval_s=0.01,  # type: ignore[arg-type]
                      commit=True)  # fmt: skip
        agent.run(threading.Event(), max_cycles=2)

    reader, sink = Reader(), Sink()
    reader.close = lambda: sink.order.append("source closed")
    run()
    assert reader.commits == 0  # the sink refused the points: not told
    # the sink closes first: what it holds is out or on disk before a source saves its place
    assert sink.order == ["sink closed", "source closed"]
    sink.refuse, sink.disk_full, sink.order = False, True, []
    run()
    # taken but not on disk: the points wait in the sink's memory (not sent again), and the
    # source keeps its place in the log (found by the fourth review: re-sent every cycle)
    assert reader.saves == [False, False] and sink.order.count("persist") == 2
    sink.disk_full = False
    run()
    assert reader.saves[2:] == [True, True]
    # records that made no point (a chatty kernel: veth, usb) move the cursor only: no disk
    # write for them (the write-behind is kept)
    reader.holds_points = lambda: False
    sink.order = []
    run()
    assert reader.saves[4:] == [True, True] and "persist" not in sink.order


def test_agent_once_leaves_the_running_agents_place_in_the_journal(tmp_path: Path) -> None:
    """Found by the review of the cursor's fix: ``gpuwarden agent --once`` (a look by hand, or
    ``--print``, ``--record``) saved the production cursor file, past records whose points the
    running agent had not written. Their agent does not save it (``Agent(commit=False)``)."""
    root = tmp_path / "host"
    append(root, [kernel(XID.format(pci="0000:3b:00"), time.time_ns() // 1000 - 1_000_000)])
    cursor = tmp_path / "kernel-journal.cursor"
    context = SourceContext("c", "n", kernel_journal=str(root))
    look = KmsgXidSource(context, {"follow_s": 0, "journal_cursor_file": str(cursor),
                                   "lookback_s": 60})  # fmt: skip
    try:
        assert len(look.collect(time.time_ns())) == 1
        look.committed(save=False)
    finally:
        look.close()
    assert not cursor.exists()
