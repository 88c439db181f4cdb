"""The engine's memory of accepted signatures (remediation/replay.py): group commit keeps
every answer durable before it is given, and a replay stays a replay. CONSTRUCTED inputs."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gpuwarden.remediation import replay
from gpuwarden.remediation.replay import ReplayError, SignatureMemory


def test_concurrent_signatures_share_fsyncs_and_are_all_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 requests at once: each is answered only after an fsync that began after its line
    was written; together they need far fewer fsyncs than requests (before: one each, in
    turn); every one is read back after a restart, and a second use of one MAC is refused."""
    path = tmp_path / "audit.jsonl.signatures"
    now = time.time()
    memory = SignatureMemory(path, 300.0)
    synced: list[int] = []  # the file's size when each fsync began
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        time.sleep(0.02)
        real_fsync(fd)

    monkeypatch.setattr(replay.os, "fsync", slow_fsync)
    answers: dict[str, tuple[bool, int]] = {}
    start = threading.Barrier(64)

    def one(i: int) -> None:
        start.wait()
        ok = memory.remember(f"mac{i:03d}", int(now))
        # what a crash now keeps: the size at the start of the last fsync that returned
        answers[f"mac{i:03d}"] = (ok, synced[-1] if synced else 0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(replay.os, "fsync", real_fsync)
    assert all(ok for ok, _ in answers.values())
    assert len(synced) < 32, synced  # shared (one each would be 64)
    text = path.read_text()
    for mac, (_, durable_upto) in answers.items():
        line_end = text.index(mac) + len(mac)
        assert line_end < durable_upto  # its line was in the file when a finished fsync began
    assert memory.remember("mac007", int(now)) is False
    memory.close()
    again = SignatureMemory(path, 300.0)
    assert len(again) == 64 and again.seen("mac063")
    again.close()


def test_a_failed_fsync_is_no_acceptance_and_its_mac_stays_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sig"
    memory = SignatureMemory(path, 300.0)

    def failing(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(replay.os, "fsync", failing)
    with pytest.raises(ReplayError, match="No space left"):
        memory.remember("abc", int(time.time()))
    monkeypatch.undo()
    # answered 503 and not acted on; its sender signs its retry afresh (a new MAC), and a
    # captured copy of the refused request stays refused (before: accepted, an attacker's
    # second review; the line may even be on disk)
    assert memory.remember("abc", int(time.time())) is False
    assert memory.remember("abc-retry", int(time.time())) is True
    memory.close()


def test_the_rewrite_keeps_appending_to_the_live_file(tmp_path: Path) -> None:
    """Past twice the live entries the file is rewritten; later lines go to the new file
    (the descriptor that wrote the copy), and a restart reads them back."""
    path = tmp_path / "sig"
    clock = [1_000_000.0]
    memory = SignatureMemory(path, 10.0, wall=lambda: clock[0])
    for i in range(100):
        assert memory.remember(f"old{i}", int(clock[0]))
    clock[0] += 60  # all of them stale
    memory._next_expiry = 0.0
    assert memory.remember("new0", int(clock[0]))
    assert len(memory) == 1 and "old" not in path.read_text()
    for i in range(1, 5):
        assert memory.remember(f"new{i}", int(clock[0]))
    memory.close()
    floor, *lines = path.read_text().splitlines()
    assert floor == '{"floor": 1000000}'  # the newest forgotten (test below)
    assert [line.split('"mac": ')[1] for line in lines] == [f'"new{i}"}}' for i in range(5)]
    assert len(SignatureMemory(path, 10.0, wall=lambda: clock[0])) == 5


def test_an_fsync_that_failed_answers_no_line_it_may_have_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests: the first one's fsync fails (EIO) while the second's line is written;
    the second's own fsync then returns 0, as Linux does once a writeback error has been
    reported (the failed pages are clean, their data possibly gone). Neither is answered as
    remembered (before: the second was, an attacker's review), and the next one is."""
    memory = SignatureMemory(tmp_path / "sig", 300.0)
    second_written = threading.Event()
    calls: list[int] = []

    def flaky(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            assert second_written.wait(10)
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(replay.os, "fsync", flaky)
    errors: dict[str, str] = {}

    def one(mac: str) -> None:
        try:
            memory.remember(mac, int(time.time()))
        except ReplayError as exc:
            errors[mac] = str(exc)

    first = threading.Thread(target=one, args=("a",))
    first.start()
    while not calls:
        time.sleep(0.01)
    second = threading.Thread(target=one, args=("b",))
    second.start()
    while not memory.seen("b"):  # its line is written; it waits for the fsync lock
        time.sleep(0.01)
    second_written.set()
    first.join(10)
    second.join(10)
    assert set(errors) == {"a", "b"}, errors
    assert memory.seen("a") and memory.seen("b")  # refused, and not replayable either
    assert memory.remember("c", int(time.time())) is True
    memory.close()


def test_the_rewrite_makes_its_rename_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewrite renames a fresh copy over the file and appends to it after: its folder is
    fsynced before lines count as durable (before: never, an attacker's review)."""
    folders: list[str] = []
    real = replay.fsync_dir

    def recording(folder: str | Path) -> None:
        folders.append(str(folder))
        real(folder)

    monkeypatch.setattr(replay, "fsync_dir", recording)
    memory = SignatureMemory(tmp_path / "sig", 300.0)
    assert folders == [str(tmp_path)]
    memory.close()


def test_after_a_failed_folder_fsync_no_line_counts_until_one_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewrite renamed its copy but the folder's fsync failed: lines appended since are
    in the new file only, whose name may not survive a crash. None is answered until a
    folder fsync succeeds (before: answered at once, its dir fsync left to the next
    compaction, an attacker's second review)."""
    path = tmp_path / "sig"
    clock = [1_000_000.0]
    memory = SignatureMemory(path, 10.0, wall=lambda: clock[0])
    for i in range(100):
        assert memory.remember(f"old{i}", int(clock[0]))
    outcome: list[str] = []

    def dir_eio(folder: str | Path) -> None:
        outcome.append("failed")
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(replay, "fsync_dir", dir_eio)
    clock[0] += 60
    memory._next_expiry = 0.0
    # its line was fsynced in the old file, before the rewrite that failed after it: it is
    # in both files, durable whichever name survives
    assert memory.remember("new0", int(clock[0])) is True
    assert outcome == ["failed"]
    with pytest.raises(ReplayError):  # in the renamed file only, and its folder fails
        memory.remember("new1", int(clock[0]))
    assert outcome == ["failed", "failed"]
    assert "new1" in path.read_text()  # renamed: the new file is the one appended to
    monkeypatch.undo()
    assert memory.remember("new2", int(clock[0])) is True  # the folder's fsync now holds
    memory.close()


def test_a_line_after_junk_a_failed_writeback_left_is_read_back(tmp_path: Path) -> None:
    """A region a failed writeback lost can read back as NULs with no newline; the line
    fsynced after it must still be remembered after a restart (before: skipped, an
    attacker's second review)."""
    path = tmp_path / "sig"
    now = int(time.time())
    path.write_bytes(b"\0" * 4096 + f'{{"t": {now}, "mac": "answered"}}\n'.encode())
    memory = SignatureMemory(path, 300.0)
    assert memory.seen("answered")
    memory.close()


def test_a_close_that_fails_in_the_rewrite_leaves_no_stale_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the old descriptor failed (EIO, e.g. on NFS): before, the memory kept the
    closed number, and once another file reused it, signatures were written there (an
    attacker's second review)."""
    path = tmp_path / "sig"
    clock = [1_000_000.0]
    memory = SignatureMemory(path, 10.0, wall=lambda: clock[0])
    for i in range(100):
        memory.remember(f"old{i}", int(clock[0]))
    real_close = os.close
    closed: list[int] = []

    def close_eio(fd: int) -> None:
        real_close(fd)
        closed.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(replay.os, "close", close_eio)
    clock[0] += 60
    memory._next_expiry = 0.0
    memory.remember("new0", int(clock[0]))
    monkeypatch.undo()
    assert closed and memory._fd not in closed
    other = tmp_path / "someone-elses.log"
    reuse = os.open(other, os.O_WRONLY | os.O_CREAT)  # takes the lowest free number
    try:
        assert memory.remember("new1", int(clock[0]))
    finally:
        os.close(reuse)
    assert "new1" in path.read_text() and "new1" not in other.read_text()
    memory.close()


def test_a_clock_stepped_back_cannot_make_a_forgotten_signature_new(tmp_path: Path) -> None:
    """Found in review: a signature is forgotten once its window is over; if the engine's
    clock then stepped back past it, a captured request verified as fresh again and was not
    in memory: accepted twice. Now anything signed at or before the newest forgotten
    signature is a replay, in the running process and after a restart (the file keeps it)."""
    path = tmp_path / "sig"
    clock = [1_000_000.0]
    memory = SignatureMemory(path, 300.0, wall=lambda: clock[0])
    assert memory.remember("captured", 1_000_000)
    clock[0] += 400  # its window is over: forgotten
    memory._next_expiry = 0.0
    assert memory.remember("later", int(clock[0])) and len(memory) == 1
    clock[0] -= 400  # the clock steps back: the captured request is "fresh" again
    assert memory.remember("captured", 1_000_000) is False
    assert memory.remember("fresh", 1_000_001) is True  # signed after it: new
    memory.close()
    # and across a restart, where the file no longer holds the captured one
    clock[0] += 1000
    SignatureMemory(path, 300.0, wall=lambda: clock[0]).close()  # forgets all, keeps the floor
    assert "captured" not in path.read_text()
    clock[0] -= 1000
    again = SignatureMemory(path, 300.0, wall=lambda: clock[0])
    assert again.remember("captured", 1_000_000) is False
    again.close()
