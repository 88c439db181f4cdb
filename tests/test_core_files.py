"""core/files.write_all: the one loop every durable writer (audit log, compaction, signature
memory, spool) uses for ``os.write``'s short writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpuwarden.core.files import write_all


def test_short_writes_are_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    calls = []

    def one_byte(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        return real(fd, bytes(data[:1]))

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        monkeypatch.setattr(os, "write", one_byte)
        write_all(fd, b"hello")
    finally:
        monkeypatch.undo()
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"hello"
    assert calls == [5, 4, 3, 2, 1]


def test_the_error_that_stops_it_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write

    def full_after_two(fd: int, data: bytes | memoryview) -> int:
        if os.fstat(fd).st_size >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, bytes(data[:2]))

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        monkeypatch.setattr(os, "write", full_after_two)
        with pytest.raises(OSError) as caught:
            write_all(fd, memoryview(b"hello"))
    finally:
        monkeypatch.undo()
        os.close(fd)
    assert caught.value.errno == errno.ENOSPC
    assert (tmp_path / "f").read_bytes() == b"he"  # left for the caller to cut back
