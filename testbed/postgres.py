"""Start and stop a real PostgreSQL (Debian's ``postgresql``, 15 on bookworm) on loopback.

The standby engine's lease is a PostgreSQL session advisory lock (:mod:`remediation.lease`);
the failover test and benchmark take it from this server. The cluster is made by ``initdb``
in a directory of its own, runs as the ``postgres`` user the Debian package creates when
started by root (PostgreSQL refuses to run as root), trusts loopback connections (a test
server: a site's gives the engine a password or a certificate in ``[lease] dsn_file``) and
skips fsync (the lease is a lock in memory; nothing here is stored).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from testbed.errors import TestbedError
from testbed.influxd import free_port


class PostgresError(TestbedError):
    pass


def postgres_bindir() -> Path | None:
    """Where the installed PostgreSQL's ``initdb`` and ``postgres`` are (the newest major)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_major)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path else None


def _major(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


def postgres_available() -> bool:
    return postgres_bindir() is not None


class LocalPostgres:
    """A real PostgreSQL on ``127.0.0.1:<free port>``; :attr:`dsn` connects to it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.user = "postgres"
        self.root: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres"

    def start(self, timeout_s: float = 60.0) -> Self:
        bindir = postgres_bindir()
        if bindir is None:
            raise PostgresError("no PostgreSQL: apt-get install postgresql")
        if os.geteuid() != 0:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        # a directory of its own under /tmp, owned by the server's user (pytest's tmp_path
        # is root's, 0700: the postgres user could not reach into it)
        # /tmp itself (1777), not $TMPDIR: a test's TMPDIR is root's, 0700
        self.root = Path(
            tempfile.mkdtemp(prefix="gpuwarden-pg-", dir="/tmp" if os.geteuid() == 0 else None)
        )
        if os.geteuid() == 0:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        data = self.root / "data"
        ids: dict[str, int] = {}
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            ids = {"user": entry.pw_uid, "group": entry.pw_gid}
        made = subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", self.user, "--auth=trust",
             "--no-sync", "--encoding=UTF8", "--locale=C"],
            check=False, capture_output=True, cwd=self.root,
            user=ids.get("user"), group=ids.get("group"),
        )  # fmt: skip
        if made.returncode != 0:
            raise PostgresError(f"initdb failed ({made.returncode}): "
                                f"{made.stderr.decode(errors='replace')[-1000:]}")  # fmt: skip
        log = (self.root / "postgres.log").open("ab")
        self.process = subprocess.Popen(
            [str(bindir / "postgres"), "-D", str(data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
             "-c", "fsync=off", "-c", "max_connections=40"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root,
            user=ids.get("user"), group=ids.get("group"),
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PostgresError(f"postgres exited with {self.process.returncode}:\n"
                                    f"{self.log()[-2000:]}")  # fmt: skip
            if self.ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise PostgresError(f"postgres did not accept connections on port {self.port}")

    def ready(self) -> bool:
        bindir = postgres_bindir()
        assert bindir is not None
        isready = bindir / "pg_isready"
        res = subprocess.run(
            [str(isready), "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"],
            capture_output=True, check=False,
        )  # fmt: skip
        return res.returncode == 0

    def log(self) -> str:
        if self.root is None:
            return ""
        path = self.root / "postgres.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            # SIGINT is the "fast" shutdown (SIGTERM's "smart" one waits for every session)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
