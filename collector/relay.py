"""A local relay for the training-side reporter: ``POST /write`` with line protocol.

The reporter (:mod:`collector.jobside.reporter`) can send to the node's agent instead of straight to
InfluxDB; the agent then spools its points with its own, so a training loop never waits on the
database and nothing is lost during an outage. Any InfluxDB client can write here too (the
``/write`` of InfluxDB 1.x, with its ``precision`` parameter; gzip bodies are accepted).

Every line is read (:mod:`core.store.lineprotocol.strict`) and checked against the catalogue before
anything is kept, then written out again by the agent's own encoder, so a bad line from a
training job can never make the database refuse a batch that carries the node's telemetry.
A request is taken whole or not at all: one bad line answers 400 naming its line, column and
problem, and nothing of it is kept. Only the reporter's measurements (``job_step``,
``job_model``) are accepted, with tag values of at most 256 characters and times within the
last week (and at most 5 minutes ahead): a request cannot make the database create series
across centuries or carry a blob in a series key. At most 128 connections are served at once,
each request read within 15 s (:mod:`core.tls`). A line without a timestamp is stamped when
it arrives, truncated to the request's precision as InfluxDB does (not when the spool reaches
the database, which may be hours later after an outage). A body over 1 MiB (after
decompression) answers 413. Listens on loopback by default (``agent.reporter_listen``);
serves HTTPS with ``reporter_tls_cert_file`` and ``reporter_tls_key_file`` set.
"""

from __future__ import annotations

import io
import logging
import ssl
import threading
import time
import urllib.parse
import zlib
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from gpuwarden.core.catalogue import CATALOGUE, Producer, check_point
from gpuwarden.core.errors import LineProtocolError
from gpuwarden.core.store.lineprotocol import EncodeStats, Point, encode_points
from gpuwarden.core.store.lineprotocol.strict import PRECISIONS, parse_lines
from gpuwarden.core.tls import GuardedHandler, http_server

log = logging.getLogger(__name__)

ACCEPTED = frozenset(m.name for m in CATALOGUE.values() if m.producer is Producer.REPORTER)
MAX_BODY = 2**20
DRAIN_MAX = 16 * MAX_BODY  # a body up to this size is read and dropped before a 413
MAX_TAG_VALUE = 256  # characters: job and rank names, never a blob (InfluxDB's series key: 64 KiB)
MAX_AGE_S = 7 * 86400.0  # a point's time: no older than a week (a spool outage's worth) ...
MAX_AHEAD_S = 300.0  # ... and no further ahead than the engine's clock-skew allowance
MAX_CONNECTIONS = 128  # the training processes of one node, with much room
REQUEST_DEADLINE_S = 15.0
LOG_EVERY_S = 60.0


class LineSink(Protocol):
    def write_lines(self, lines: list[str]) -> None: ...


def check_lines(body: str, precision: str = "", now_ns: int | None = None) -> tuple[list[str], str]:
    """The body's points, checked and encoded again at nanosecond precision; or a message
    saying what is wrong (and no lines)."""
    ns_per_unit = PRECISIONS.get(precision)
    if ns_per_unit is None:
        return [], f"precision {precision!r} is not one of {sorted(p for p in PRECISIONS if p)}"
    try:
        points = parse_lines(body, time.time_ns() if now_ns is None else now_ns, ns_per_unit)
    except LineProtocolError as e:
        return [], str(e)
    for n, point in enumerate(points, 1):
        if point.measurement not in ACCEPTED:
            return [], (
                f"point {n}: measurement {point.measurement!r} is not accepted here; only "
                f"{sorted(ACCEPTED)}"
            )
        problems = check_point(point.measurement, point.tags, point.fields)
        if problems:
            return [], f"point {n}: " + "; ".join(problems)
        long = sorted(k for k, v in point.tags.items() if len(v) > MAX_TAG_VALUE)
        if long:
            return [], f"point {n}: tag {long[0]} is over {MAX_TAG_VALUE} characters"
        now = time.time_ns() if now_ns is None else now_ns
        if not (now - MAX_AGE_S * 1e9 <= point.time_ns <= now + MAX_AHEAD_S * 1e9):
            return [], (
                f"point {n}: its time is {(point.time_ns - now) / 1e9:+.0f} s from now; a "
                f"reporter's points are from the last {MAX_AGE_S / 86400:g} days (at most "
                f"{MAX_AHEAD_S:g} s ahead)"
            )
    stats = EncodeStats()
    lines = encode_points(points, stats=stats)
    if stats.points_dropped:  # cannot happen for what parse_lines reads; say so if it does
        return [], f"{stats.points_dropped} point(s) could not be written: {stats.reasons}"
    return lines, ""


def read_body(headers: Message, rfile: io.BufferedIOBase) -> tuple[bytes | None, int, str]:
    """The request body, or ``(None, status, message)``: a length that is missing, not a
    number or over :data:`MAX_BODY`; an encoding other than gzip; gzip that is broken or
    inflates past :data:`MAX_BODY`."""
    if headers.get("Transfer-Encoding"):
        return None, 411, "send a Content-Length (chunked bodies are not read)"
    raw = headers.get("Content-Length") or "0"
    if not raw.isdigit():
        return None, 400, f"Content-Length {raw!r} is not a number of bytes"
    length = int(raw)
    if length > MAX_BODY:
        if length <= DRAIN_MAX:  # read it away, so the client gets the answer, not a reset
            while length > 0 and (chunk := rfile.read(min(length, 1 << 16))):
                length -= len(chunk)
        return None, 413, f"body over {MAX_BODY} bytes"
    body = rfile.read(length)
    encoding = (headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding == "identity":
        return body, 0, ""
    if encoding != "gzip":
        return None, 415, f"Content-Encoding {encoding!r}: only gzip or none"
    inflate = zlib.decompressobj(wbits=31)
    try:
        data = inflate.decompress(body, MAX_BODY + 1)
    except zlib.error as e:
        return None, 400, f"gzip body is broken: {e}"
    if len(data) > MAX_BODY:
        return None, 413, f"body over {MAX_BODY} bytes once inflated"
    if not inflate.eof:
        return None, 400, "gzip body is cut short"
    return data, 0, ""


class ReporterRelay:
    def __init__(self, listen: str, sink: LineSink, tls: ssl.SSLContext | None = None) -> None:
        host, _, port = listen.rpartition(":")
        self.tls = tls
        self.address = (host or "127.0.0.1", int(port))
        self.sink = sink
        self.accepted = 0  # lines
        self.refused = 0  # requests
        self._reported = 0  # lines accepted up to the last stats_point
        self._unsaid = 0  # refusals not logged yet
        self._said_at = -float("inf")
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        relay = self

        class Handler(GuardedHandler):
            # a client silent this long on a read is dropped (before: no timeout over plain
            # HTTP, so idle connections held a thread and a descriptor each, for ever)
            timeout = 10

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug(fmt, *args)

            def _answer(self, code: int, text: str = "") -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(200 if self.path in ("/health", "/ping") else 404, "ok\n")

            def do_POST(self) -> None:  # noqa: N802
                status, problem = relay._post(self)
                if status >= 400:
                    relay._refused(status, problem, self.client_address[0])
                    self._answer(status, problem + "\n")
                else:
                    self._answer(status)

        self._server = http_server(
            self.address,
            Handler,
            self.tls,
            max_connections=MAX_CONNECTIONS,
            request_deadline_s=REQUEST_DEADLINE_S,
        )
        self.address = self._server.server_address[:2]  # type: ignore[assignment]
        threading.Thread(target=self._server.serve_forever, daemon=True, name="relay").start()

    def _post(self, request: BaseHTTPRequestHandler) -> tuple[int, str]:
        """Reads, checks and keeps one request's lines: ``(204, "")`` or an error status and
        what is wrong."""
        url = urllib.parse.urlsplit(request.path)
        if url.path != "/write":
            return 404, "POST /write"
        body, status, problem = read_body(request.headers, request.rfile)
        if isinstance(request, GuardedHandler):
            request.done_reading()
        if body is None:
            request.close_connection = True  # the rest of the body may still be unread
            return status, problem
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return 400, "body is not UTF-8"
        precision = (urllib.parse.parse_qs(url.query).get("precision") or [""])[0]
        lines, problem = check_lines(text, precision)
        if problem:
            return 400, problem
        self.sink.write_lines(lines)
        with self._lock:
            self.accepted += len(lines)
        return 204, ""

    def _refused(self, status: int, problem: str, client: str) -> None:
        """Counts a refused request; logs the first, then at most one line a minute with how
        many were refused since (a training job sending bad lines every step must not flood
        the agent's log, nor go unnoticed)."""
        with self._lock:
            self.refused += 1
            self._unsaid += 1
            now = time.monotonic()
            if now - self._said_at < LOG_EVERY_S:
                return
            count, self._unsaid, self._said_at = self._unsaid, 0, now
        log.warning("relay refused %d request(s) since its last word; the latest, from %s: "
                    "%d %s", count, client, status, problem)  # fmt: skip

    def stats_point(self, cluster: str, node: str, now_ns: int) -> Point:
        """The relay's self-metrics: lines kept since the last call, requests refused since
        start (``agent`` measurement, ``source=relay``)."""
        with self._lock:
            kept, self._reported = self.accepted - self._reported, self.accepted
            refused = self.refused
        tags = {"cluster": cluster, "node": node, "source": "relay"}
        return Point("agent", tags, {"points_count": kept, "errors_total": refused}, now_ns)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
