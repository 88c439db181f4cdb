"""A loopback HTTP server that answers /write from a script: for driving the sink through
every status an InfluxDB can answer (429 with Retry-After, 5xx, partial writes, auth errors).
The real server is used wherever it can produce the case itself (see test_outage.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 204
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class ScriptedServer:
    def __init__(self, replies: list[Reply], default: Reply | None = None, port: int = 0) -> None:
        self.replies = list(replies)
        self.default = default or Reply()
        self.requests: list[tuple[float, str, dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                outer.requests.append((time.monotonic(), self.path, dict(self.headers), body))
                reply = outer.replies.pop(0) if outer.replies else outer.default
                data = reply.body.encode()
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def bodies(self) -> list[bytes]:
        return [r[3] for r in self.requests]
