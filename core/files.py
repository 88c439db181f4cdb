"""Small helpers for files that must survive a crash."""

from __future__ import annotations

import os
from pathlib import Path


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``fd``. ``os.write`` may write less than it was given
    (a signal, a nearly full disk); this writes the rest, or raises the OSError that stopped
    it, leaving what was already written for the caller to cut back."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(folder: str | Path) -> None:
    """Make a rename or a new name in ``folder`` durable: POSIX promises a renamed file's
    new name only after its folder is fsynced (ext4 and XFS commit it with the file's own
    fsync in practice; other filesystems need not)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
