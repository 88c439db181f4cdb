"""A local relay for the training-side reporter: ``POST /write`` with line protocol.

The reporter (:mod:`collector.reporter`) can send to the node's agent instead of straight to
InfluxDB; the agent then spools its points with its own, so a training loop never waits on the
database and nothing is lost during an outage. Only the reporter's measurements (``job_step``,
``job_model``) are accepted; anything else is refused with 400 and a message, and a body over
1 MiB with 413. Listens on loopback by default (``agent.reporter_listen``).
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from collector.catalogue import CATALOGUE, Producer

log = logging.getLogger(__name__)

ACCEPTED = frozenset(m.name for m in CATALOGUE.values() if m.producer is Producer.REPORTER)
MAX_BODY = 2**20


class LineSink(Protocol):
    def write_lines(self, lines: list[str]) -> None: ...


def measurement_of(line: str) -> str:
    """The measurement of a line-protocol line (up to the first unescaped comma or space)."""
    out = []
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            out.append(line[i + 1])
            i += 2
            continue
        if c in ", ":
            break
        out.append(c)
        i += 1
    return "".join(out)


def check_lines(body: str) -> tuple[list[str], str]:
    lines = [ln for ln in body.splitlines() if ln.strip() and not ln.startswith("#")]
    for n, line in enumerate(lines, 1):
        m = measurement_of(line)
        if m not in ACCEPTED:
            return [], f"line {n}: measurement {m!r} is not accepted here; only {sorted(ACCEPTED)}"
        if " " not in line.rstrip():
            return [], f"line {n}: has no fields"
    return lines, ""


class ReporterRelay:
    def __init__(self, listen: str, sink: LineSink) -> None:
        host, _, port = listen.rpartition(":")
        self.address = (host or "127.0.0.1", int(port))
        self.sink = sink
        self.accepted = 0
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: object) -> None:
                log.debug(fmt, *args)

            def _answer(self, code: int, text: str = "") -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(200 if self.path in ("/health", "/ping") else 404, "ok\n")

            def do_POST(self) -> None:
                if not self.path.startswith("/write"):
                    self._answer(404, "POST /write\n")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._answer(413, f"body over {MAX_BODY} bytes\n")
                    return
                try:
                    body = self.rfile.read(length).decode("utf-8")
                except UnicodeDecodeError:
                    self._answer(400, "body is not UTF-8\n")
                    return
                lines, problem = check_lines(body)
                if problem:
                    self._answer(400, problem + "\n")
                    return
                relay.sink.write_lines(lines)
                relay.accepted += len(lines)
                self._answer(204)

        self._server = ThreadingHTTPServer(self.address, Handler)
        self.address = self._server.server_address[:2]  # type: ignore[assignment]
        threading.Thread(target=self._server.serve_forever, daemon=True, name="relay").start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
