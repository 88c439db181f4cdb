"""Start and stop a real ``influxd`` (Debian's ``influxdb`` package, 1.6.7) on loopback.

Used by the test fixtures, the benchmarks and the demo: a free loopback port, a data directory
of our own, no reporting, no internal monitor database. Stopping and starting again on the
same data directory keeps the data, which is how the outage tests bring the server back.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from testbed.errors import InfluxdError

_CONFIG = """\
reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"
[meta]
  dir = "{root}/meta"
  logging-enabled = false
[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  query-log-enabled = false
  trace-logging-enabled = false
[coordinator]
  log-queries-after = "0s"
[http]
  bind-address = "127.0.0.1:{port}"
  log-enabled = false
  max-body-size = 0
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = false
[subscriber]
  enabled = false
"""


_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range and not handed out before
    by this process. A port the kernel picks (bind to 0) comes from the ephemeral range, where
    any outgoing connection may take it before the server that was told it binds it: a
    slurmd was seen failing with "Address already in use" so."""
    low = max(1025, _ephemeral_low())
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(10000, low) if low > 10100 else rng.randrange(1025, 65535)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError("no free loopback port below the ephemeral range")


def influxd_binary() -> str:
    found = shutil.which("influxd") or (
        "/usr/bin/influxd" if os.path.exists("/usr/bin/influxd") else None
    )
    if not found:
        raise InfluxdError(
            "influxd not found: install Debian's influxdb package "
            "(scripts/bootstrap.sh does this: apt-get install influxdb)"
        )
    return found


class LocalInfluxd:
    """A real influxd on 127.0.0.1. Construction only picks ports; ``start`` runs it."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        port: int | None = None,
        *,
        auth: tuple[str, str] | None = None,
        data: Mapping[str, int | str] | None = None,
    ) -> None:
        """``auth``: (user, password) of an admin; influxd then requires it on every call
        (``auth-enabled``), and this class sends it. ``data``: more settings of the ``[data]``
        section (e.g. ``{"cache-snapshot-memory-size": 2**30}``)."""
        self.auth = auth
        self.data = dict(data or {})
        self.root = Path(root)
        self.port = port or free_port()
        self.rpc_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> LocalInfluxd:
        if self.process is not None and self.process.poll() is None:
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "influxdb.conf"
        text = _CONFIG.format(root=self.root, port=self.port, rpc_port=self.rpc_port)
        if self.auth:
            text = text.replace("[http]\n", "[http]\n  auth-enabled = true\n")
        for key, value in self.data.items():
            setting = value if isinstance(value, int) else f'"{value}"'
            text = text.replace("[coordinator]\n", f"  {key} = {setting}\n[coordinator]\n")
        config.write_text(text)
        log = open(self.root / "influxd.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [influxd_binary(), "-config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "INFLUXDB_REPORTING_DISABLED": "true"},
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = (self.root / "influxd.log").read_text(errors="replace")[-2000:]
                raise InfluxdError(f"influxd exited with {self.process.returncode}:\n{tail}")
            if self.ping():
                if self.auth:  # the first admin may be created without credentials
                    user, password = (s.replace("'", "\\'") for s in self.auth)
                    self.query(f"CREATE USER \"{user}\" WITH PASSWORD '{password}' "
                               "WITH ALL PRIVILEGES", credentials=False)  # fmt: skip
                return self
            time.sleep(0.05)
        self.stop()
        raise InfluxdError(f"influxd did not answer /ping on {self.url} within {timeout_s} s")

    def ping(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as resp:
                return bool(resp.status == 204)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it does not go; the data directory stays."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def query(self, q: str, database: str | None = None, *, credentials: bool = True) -> bytes:
        """Run InfluxQL (POST, JSON answer); for set-up statements such as CREATE DATABASE."""
        params = {"q": q, "epoch": "ns"}
        if database:
            params["db"] = database
        data = urllib.parse.urlencode(params).encode()
        url = f"{self.url}/query"
        if self.auth and credentials:  # influxd reads u and p from the URL only
            url += "?" + urllib.parse.urlencode({"u": self.auth[0], "p": self.auth[1]})
        with urllib.request.urlopen(url, data=data, timeout=30) as resp:
            return bytes(resp.read())

    def write(self, database: str, lines: str) -> None:
        """Write line protocol as it is (for tests that hand-write a point); raises unless the
        server stored all of it (204)."""
        params = {"db": database}
        if self.auth:
            params |= {"u": self.auth[0], "p": self.auth[1]}
        url = f"{self.url}/write?" + urllib.parse.urlencode(params)
        request = urllib.request.Request(url, lines.encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            if resp.status != 204:
                raise RuntimeError(f"influxd answered {resp.status} to a write")

    def create_database(self, name: str) -> None:
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        self.query(f'CREATE DATABASE "{escaped}"')

    def cpu_seconds(self) -> float:
        """User + system CPU the server process has used (from /proc)."""
        if self.process is None:
            raise InfluxdError("influxd is not running")
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> LocalInfluxd:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
