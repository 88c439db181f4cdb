"""One local server process of the testbed: started on a loopback port under a directory of its
own, waited for until it answers, stopped with SIGTERM (SIGKILL if it does not go)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from testbed.errors import TestbedError
from testbed.influxd import free_port


class LocalProcess:
    """Subclasses give :meth:`command` (after writing any config under ``root``), the
    ``ready_path`` that answers 200 once the server is up, ``name`` and ``error``."""

    name = "server"
    ready_path = "/-/ready"
    error: type[TestbedError] = TestbedError

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 60.0) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = self.command()
        with open(self.root / f"{self.name}.log", "ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self.error(f"{self.name} exited with {self.process.returncode}:\n"
                                 f"{self.log()[-2000:]}")  # fmt: skip
            if self.ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise self.error(f"{self.name} did not become ready on {self.url}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log(self) -> str:
        return (self.root / f"{self.name}.log").read_text(errors="replace")

    def stop(self, timeout_s: float = 15.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
