"""What every source is, what it is given, and the small helpers they share.

A source is constructed from its settings without touching the host (no NVML init, no file
opened); :meth:`Source.collect` does the I/O, and returns the cycle's points. Reading and
parsing are separate: each source has a thin ``read`` and a pure ``parse`` that most tests use.
Absent hardware is no data (an empty list), not an error; a source raises only when it could
not do its job, and the agent reports that as the source's ``collect_success_active=false``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuwarden.collector.attribution import JobHistory
from gpuwarden.collector.errors import CollectorError
from gpuwarden.core.finding import Finding
from gpuwarden.core.store.lineprotocol import Point

log = logging.getLogger(__name__)


class SourceError(CollectorError):
    """A source could not collect (the message says which source and why)."""


@dataclass
class Inventory:
    """What sources learn about the node and share: PCI bus id -> (GPU index, UUID), and the
    jobs the GPUs had (so an event read late names the job it hit)."""

    gpus_by_pci: dict[str, tuple[int, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs: JobHistory = field(default_factory=JobHistory)

    def gpu_for_pci(self, pci: str) -> tuple[int, str] | None:
        with self.lock:
            return self.gpus_by_pci.get(normalise_pci(pci))


@dataclass
class SourceContext:
    """Host paths and identity every source gets. Every host path is a parameter."""

    cluster: str
    node: str
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    kmsg: Path = Path("/dev/kmsg")
    kernel_journal: str = ""
    """The host's root as mounted here, below which its systemd journal lies; when set, the
    kernel log is read from the journal instead of ``kmsg``."""
    inventory: Inventory = field(default_factory=Inventory)
    emit_finding: Callable[[Finding], None] | None = None
    """The fast path: critical events go to the remediation engine at once when set."""

    def base_tags(self) -> dict[str, str]:
        return {"cluster": self.cluster, "node": self.node}


class Source(Protocol):
    name: str

    def collect(self, now_ns: int) -> list[Point]: ...

    def close(self) -> None: ...


def normalise_pci(pci: str) -> str:
    """``PCI:0000:9b:00``, ``00000000:9B:00.0`` and ``0000:9b:00.0`` all become ``0000:9b:00``."""
    text = pci.strip().lower().removeprefix("pci:")
    text = text.split(".")[0]
    parts = text.split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


class FileReader:
    """Reads small sysfs files cheaply: each file is opened once and re-read with ``pread``
    at offset 0 (sysfs regenerates an attribute on every read from offset 0). A file that
    fails is closed and opened again next time; one that is missing answers None.

    :meth:`read_many` reads a fixed group of files (one InfiniBand port's counters) with one
    ``pread`` each and no per-file Python call while every file of the group stays open."""

    def __init__(self, max_open: int = 4096) -> None:
        self._fds: dict[str, int] = {}
        self.max_open = max_open
        # bumped whenever a descriptor is closed: a group's cached descriptors are only
        # trusted while it is unchanged (a closed number may be reused by another file)
        self._generation = 0
        self._groups: dict[tuple[str, ...], tuple[int, list[int]]] = {}

    def read(self, path: str) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8", "replace")

    def read_bytes(self, path: str) -> bytes | None:
        fd = self._fds.get(path)
        try:
            if fd is None:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                if len(self._fds) < self.max_open:
                    self._fds[path] = fd
                else:
                    try:
                        return os.read(fd, 4096)
                    finally:
                        os.close(fd)
            return os.pread(fd, 4096, 0)
        except OSError:
            if path in self._fds:
                os.close(self._fds.pop(path))
                self._generation += 1
            return None

    def read_many(self, paths: tuple[str, ...]) -> list[bytes | None]:
        """The contents of every file in ``paths`` (None for one that cannot be read), as
        :meth:`read_bytes` would answer them one by one."""
        group = self._groups.get(paths)
        if group is not None and group[0] == self._generation:
            pread = os.pread
            try:
                return [pread(fd, 4096, 0) for fd in group[1]]
            except OSError:
                pass  # one file failed: read them one by one, which reopens or drops it
        out = [self.read_bytes(path) for path in paths]
        fds = self._fds
        if all(path in fds for path in paths):
            self._groups[paths] = (self._generation, [fds[path] for path in paths])
        else:
            self._groups.pop(paths, None)
        return out

    def forget_groups(self) -> None:
        """Drops the cached groups (after rediscovery; their files stay open)."""
        self._groups.clear()

    def keep_only(self, paths: set[str]) -> None:
        """Closes every open file not in ``paths`` (after rediscovery: the files of a device
        that went away, e.g. an SR-IOV function removed with its pod, are not kept open)."""
        gone = [path for path in self._fds if path not in paths]
        for path in gone:
            os.close(self._fds.pop(path))
        if gone:
            self._generation += 1
            self._groups.clear()

    @property
    def open_files(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._groups.clear()
        self._generation += 1


def parse_int(text: str | bytes | None) -> int | None:
    """An integer sysfs value, or None for anything else ("N/A (no PMA)", garbage, empty)."""
    if text is None:
        return None
    try:
        return int(text)  # int() itself ignores surrounding whitespace, str or bytes
    except ValueError:
        return None


class WarnOnce:
    """Logs each distinct message once (a missing driver function, an unreadable file)."""

    def __init__(self, logger: logging.Logger) -> None:
        self._seen: set[str] = set()
        self._log = logger

    def __call__(self, key: str, message: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self._log.warning("%s", message)


def hwmon_chips(root: str, files: FileReader) -> list[tuple[str, str, list[str]]]:
    """(chip name, path, sorted entries) of every hwmon chip under ``root``; a name that
    repeats (``coretemp`` per socket) becomes ``coretemp-1``, ``coretemp-2``, ..."""
    out: list[tuple[str, str, list[str]]] = []
    try:
        chips = sorted(os.listdir(root), key=lambda c: (len(c), c))
    except OSError:
        return out
    seen: dict[str, int] = {}
    for chip in chips:
        path = os.path.join(root, chip)
        name = (files.read(os.path.join(path, "name")) or chip).strip()
        seen[name] = seen.get(name, 0) + 1
        unique = name if seen[name] == 1 else f"{name}-{seen[name] - 1}"
        try:
            entries = sorted(os.listdir(path), key=lambda e: (len(e), e))
        except OSError:
            continue
        out.append((unique, path, entries))
    return out
