"""Shared fixtures: a real influxd (Debian package) for the session, a fresh database per test.

Nothing here is mocked: ``influxd`` is the real 1.6.7 server started on a free loopback port
with a temporary data directory, and stopped at the end of the session.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.influxd import LocalInfluxd, free_port

_db_counter = itertools.count()


@pytest.fixture(scope="session")
def influxd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalInfluxd]:
    server = LocalInfluxd(tmp_path_factory.mktemp("influxd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def influx_db(influxd: LocalInfluxd) -> str:
    """A new, empty database on the session's server."""
    name = f"test_{next(_db_counter)}"
    influxd.create_database(name)
    return name


@pytest.fixture
def victoria(tmp_path: Path) -> Iterator[str]:
    """Debian's victoria-metrics: a real server that accepts InfluxDB's v2 write API."""
    binary = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={tmp_path / 'vm'}",
            "-search.latencyOffset=0s",
            "-search.disableCache",
            "-loggerLevel=ERROR",
            "-retentionPeriod=100y",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("victoria-metrics did not start")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB file system (tmpfs), unmounted after the test."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
