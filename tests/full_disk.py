"""A real small file system for the full-disk tests (tests/test_journal.py,
tests/test_sink_durable.py): a size-limited tmpfs the test mounts (root, as CI runs), and
:func:`fill` to bring it to ENOSPC. The ``small_disk`` fixture that mounts it lives in
tests/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def fill(disk: Path) -> Path:
    """Fill ``disk`` to ENOSPC; the filler, to remove when space returns."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        try:
            while True:  # the last few bytes a page would not take
                os.write(fd, b"\0")
        except OSError:
            pass
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        (disk / "probe").write_bytes(b"x" * 8192)
    return filler
