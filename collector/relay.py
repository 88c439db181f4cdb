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
``job_model``) are accepted, with tag values of at most 320 characters and times within the
last week (and at most 5 minutes ahead): a request cannot make the database create series
across centuries or carry a blob in a series key, and one job may begin at most 1,024 new
series through a node's relay in a day (:class:`SeriesBudget`), at most 200 lines a second
on average (:class:`LineRate`, ``[agent] reporter_lines_per_s``). At most 128 connections are
served at once, each request read within 15 s (:mod:`core.tls`). A line without a timestamp
is stamped when it arrives, truncated to the request's precision as InfluxDB does (not when
the spool reaches the database, which may be hours later after an outage). A body over 1 MiB
(after decompression) answers 413. Listens on loopback by default (``agent.reporter_listen``);
serves HTTPS with ``reporter_tls_cert_file`` and ``reporter_tls_key_file`` set.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import socketserver
import ssl
import threading
import time
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler
from typing import Protocol

from gpuwarden.collector.attribution import POD_UID_PREFIX, parse_cgroup
from gpuwarden.core.catalogue import CATALOGUE, Producer, check_point
from gpuwarden.core.errors import LineProtocolError
from gpuwarden.core.names import SUBJECT_TYPES, BadNameError
from gpuwarden.core.store.lineprotocol import EncodeStats, Point, encode_points
from gpuwarden.core.store.lineprotocol.strict import PRECISIONS, parse_lines
from gpuwarden.core.tls import (
    GuardedHandler,
    http_server,
    loopback_peer_pids,
    peer_pid,
    unix_http_server,
)

log = logging.getLogger(__name__)

ACCEPTED = frozenset(m.name for m in CATALOGUE.values() if m.producer is Producer.REPORTER)
MAX_BODY = 2**20
DRAIN_MAX = 16 * MAX_BODY  # a body up to this size is read and dropped before a 413
#: characters: job and rank names, never a blob (InfluxDB's series key: 64 KiB); room for a
#: Kubernetes pod's job name, ``<namespace>/<pod>`` (63 + 1 + 253)
MAX_TAG_VALUE = 320
MAX_AGE_S = 7 * 86400.0  # a point's time: no older than a week (a spool outage's worth) ...
MAX_AHEAD_S = 300.0  # ... and no further ahead than the engine's clock-skew allowance
MAX_CONNECTIONS = 128  # the training processes of one node, with much room
REQUEST_DEADLINE_S = 15.0
LOG_EVERY_S = 60.0
LOOKUP_SLOW = "\0slow"
"""``caller()``'s answer when the look for a TCP caller's process ran past its budget."""
RECENT_CALLERS = 64  # loopback callers' pids looked at first (a node's training processes)


MAX_SERIES_PER_JOB = 1024
"""New series one job may begin through one node's relay within :data:`SERIES_WINDOW_S`: its
ranks on this node (a series per rank for steps, heartbeats and saves) and its model, with
room for elastic restarts that put new rank numbers on the node (8 ranks: about 40 a day)."""
MAX_SERIES = 4096
"""... and all jobs together whose name the caller's cgroup did not prove (a TCP caller from
another host, or a relay that takes any job's name): made-up names cannot crowd out the jobs
that run here, and are counted apart from them (a job's name said by another caller does not
spend that job's share)."""
MAX_SERIES_PROVEN = 32768
"""... and all jobs a cgroup named, together: bounds the relay's memory and the index's growth
from one node. A tenant that runs thirty-two jobs a day on one node, each beginning its 1,024,
spends it, and new series of every job there are refused (422, logged) until the day moves."""
SERIES_WINDOW_S = 86400.0


class SeriesBudget:
    """How many new series the relay lets each job, and all unproven jobs, begin in a window.

    Every new tag value is a series InfluxDB keeps in its index until the retention policy
    drops it: a job that wrote ``rank=0..16819`` in one 1 MiB request made 16,820 series, and
    about 60 such requests reach influxd's default ``max-series-per-database`` (1,000,000),
    after which the database refuses every new series of every writer, the fleet's telemetry
    included (found by a review as an attacker). This bounds how fast a job can grow the
    index, not the total over a long retention: set influxd's ``max-series-per-database`` to
    what your fleet needs (docs/SECURITY.md). A request that would begin more than the job's
    share is refused whole (422: the reporter drops it, as any refused line; resending would
    be refused again); series already begun are always taken."""

    def __init__(
        self,
        per_job: int = MAX_SERIES_PER_JOB,
        total: int = MAX_SERIES,
        window_s: float = SERIES_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        total_proven: int = MAX_SERIES_PROVEN,
    ) -> None:
        self.per_job, self.total, self.window_s, self.clock = per_job, total, window_s, clock
        self.totals = {False: total, True: total_proven}
        # series -> (when, job, proven); the oldest first
        self._begun: dict[str, tuple[float, str, bool]] = {}
        self._per_job: dict[tuple[str, bool], int] = {}  # (job, proven) -> series begun
        self._count = {False: 0, True: 0}
        self._lock = threading.Lock()

    def admit(self, series: Mapping[str, str], proven: bool = False) -> str:
        """Takes ``series`` (key -> its job) if the budget allows, else says why (nothing is
        taken). ``proven``: the caller's cgroup named the job (its name is not made up)."""
        now = self.clock()
        hours = f"{self.window_s / 3600:g} h"
        with self._lock:
            self._forget(now - self.window_s)
            new: dict[str, int] = {}
            for key, job in series.items():
                if key not in self._begun:
                    new[job] = new.get(job, 0) + 1
            for job, n in new.items():
                began = self._per_job.get((job, proven), 0)
                if began + n > self.per_job:
                    return (f"job {job!r} would begin {n} new series here; it began {began} "
                            f"within {hours} and may begin {self.per_job} (a series per rank "
                            "and measurement)")  # fmt: skip
            if self._count[proven] + sum(new.values()) > self.totals[proven]:
                who = "jobs named by" if proven else "jobs not named by"
                return (f"{who} their callers' cgroups began {self._count[proven]} series here "
                        f"within {hours}; all of them may begin {self.totals[proven]}")  # fmt: skip
            for key, job in series.items():
                if key not in self._begun:
                    self._begun[key] = (now, job, proven)
                    self._per_job[job, proven] = self._per_job.get((job, proven), 0) + 1
                    self._count[proven] += 1
            return ""

    def _forget(self, before: float) -> None:
        while self._begun:
            key = next(iter(self._begun))
            when, job, proven = self._begun[key]
            if when >= before:
                return
            del self._begun[key]
            self._count[proven] -= 1
            left = self._per_job[job, proven] - 1
            if left:
                self._per_job[job, proven] = left
            else:
                del self._per_job[job, proven]


LINES_PER_S = 200.0
"""Lines a second one job may send through a node's relay, on average (``[agent]
reporter_lines_per_s``): its ranks' steps, heartbeats and saves at ten steps a second on
eight GPUs are about 100. A job may send a minute's worth at once (a reporter's batch is at
most 5,000 lines)."""
BURST_S = 60.0
UNPROVEN = "(callers whose cgroup names no job)"
"""The one line bucket all such callers share."""


class LineRate:
    """A token bucket of lines per job (:data:`LINES_PER_S`, a burst of :data:`BURST_S`' worth).

    The relay's points go into the agent's own spool: a job sending 1 MiB bodies as fast as
    it could filled the 256 MiB spool in a few hundred requests during an InfluxDB outage, and
    the spool's bound then dropped the oldest points, the node's own telemetry and XIDs among
    them (found by a review as an attacker). Over the rate: 429 and ``Retry-After`` (the
    reporter keeps the lines and sends them again)."""

    def __init__(
        self,
        per_s: float = LINES_PER_S,
        burst_s: float = BURST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_s, self.capacity, self.clock = per_s, per_s * burst_s, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # job -> (tokens, when)
        self._lock = threading.Lock()

    def take(self, lines: Mapping[str, int]) -> str:
        """Takes ``lines`` (job -> count) if every job's bucket holds them, else says why
        (nothing is taken). ``per_s`` 0: no limit."""
        if self.per_s <= 0:
            return ""
        now = self.clock()
        with self._lock:
            if len(self._buckets) > 1024:  # forget the full ones (idle jobs)
                self._buckets = {
                    j: b for j, b in self._buckets.items()
                    if b[0] + (now - b[1]) * self.per_s < self.capacity
                }  # fmt: skip
            level = {}
            for job, n in lines.items():
                tokens, when = self._buckets.get(job, (self.capacity, now))
                tokens = min(self.capacity, tokens + (now - when) * self.per_s)
                if n > tokens:
                    burst = f"{self.capacity:.0f}"
                    return (f"job {job!r} sent more than {self.per_s:g} lines a second "
                            f"through this relay (a burst of {burst}); retry")  # fmt: skip
                level[job] = tokens - n
            for job, tokens in level.items():
                self._buckets[job] = (tokens, now)
            return ""


class LineSink(Protocol):
    def write_lines(self, lines: list[str]) -> None: ...


#: what the relay asks of a line's job tag: ``(status, why)`` to refuse the request, or None
JobRule = Callable[[str], "tuple[int, str] | None"]


def check_lines(
    body: str,
    precision: str = "",
    now_ns: int | None = None,
    *,
    stamp: Mapping[str, str] | None = None,
    job_rule: JobRule | None = None,
) -> tuple[list[str], str]:
    """The body's points, checked and encoded again at nanosecond precision; or a message
    saying what is wrong (and no lines). ``stamp``: tags set on every point whatever it said
    (the relay's own ``cluster`` and ``node``, and a caller's job where the system names it);
    ``job_rule``: asked about every point's job as the point says it (:class:`ReporterRelay`)."""
    lines, _, problem = checked_lines(body, precision, now_ns, stamp=stamp, job_rule=job_rule)
    return lines, problem


def checked_lines(
    body: str,
    precision: str = "",
    now_ns: int | None = None,
    *,
    stamp: Mapping[str, str] | None = None,
    job_rule: JobRule | None = None,
    budget: SeriesBudget | None = None,
    rate: LineRate | None = None,
    named_here: bool = False,
) -> tuple[list[str], int, str]:
    """:func:`check_lines` with the status a refusal gets (400, or what ``job_rule`` says);
    ``rate``: each job's lines must fit its bucket (429 if not: sent again later, 413 if more
    than a bucket holds); ``budget``: the new series the points begin must fit it (422)."""
    ns_per_unit = PRECISIONS.get(precision)
    if ns_per_unit is None:
        return (
            [],
            400,
            f"precision {precision!r} is not one of {sorted(p for p in PRECISIONS if p)}",
        )
    try:
        points = parse_lines(body, time.time_ns() if now_ns is None else now_ns, ns_per_unit)
    except LineProtocolError as e:
        return [], 400, str(e)
    stamped: list[Point] = []
    for n, point in enumerate(points, 1):
        if point.measurement not in ACCEPTED:
            return (
                [],
                400,
                (
                    f"point {n}: measurement {point.measurement!r} is not accepted here; only "
                    f"{sorted(ACCEPTED)}"
                ),
            )
        problems = check_point(point.measurement, point.tags, point.fields)
        if problems:
            return [], 400, f"point {n}: " + "; ".join(problems)
        long = sorted(k for k, v in point.tags.items() if len(v) > MAX_TAG_VALUE)
        if long:
            return [], 400, f"point {n}: tag {long[0]} is over {MAX_TAG_VALUE} characters"
        bad = _bad_name(point.tags)
        if bad:  # a rank of its own per line made a new series per line (found in review)
            return [], 400, f"point {n}: {bad}"
        now = time.time_ns() if now_ns is None else now_ns
        if not (now - MAX_AGE_S * 1e9 <= point.time_ns <= now + MAX_AHEAD_S * 1e9):
            return (
                [],
                400,
                (
                    f"point {n}: its time is {(point.time_ns - now) / 1e9:+.0f} s from now; a "
                    f"reporter's points are from the last {MAX_AGE_S / 86400:g} days (at most "
                    f"{MAX_AHEAD_S:g} s ahead)"
                ),
            )
        if job_rule is not None:
            refused = job_rule(point.tags.get("job", ""))
            if refused is not None:
                return [], refused[0], f"point {n}: {refused[1]}"
        tags = {**point.tags, **stamp} if stamp else point.tags
        stamped.append(Point(point.measurement, tags, point.fields, point.time_ns))
    # the caller's cgroup named its job: else the job is only what the caller says, counted
    # apart from the job a cgroup names (such a caller cannot spend a real job's line bucket
    # or series share); where any name is taken (``named_here`` False: no list of the jobs on
    # this node's GPUs), all such callers share one line bucket, else made-up names would be
    # buckets of their own
    proven = bool(stamp and stamp.get("job"))
    if rate is not None and rate.per_s > 0:
        per_job = Counter(
            job if proven else f"?{job}" if named_here else UNPROVEN
            for job in (p.tags.get("job", "") for p in stamped)
        )
        if any(n > rate.capacity for n in per_job.values()):
            return [], 413, f"more than {rate.capacity:.0f} lines of one job in one request"
        if over := rate.take(per_job):
            return [], 429, over
    if budget is not None:
        series = {_series_key(p): p.tags.get("job", "") for p in stamped}
        over = budget.admit(series, proven=proven)
        if over:
            return [], 422, over
    stats = EncodeStats()
    lines = encode_points(stamped, stats=stats)
    if stats.points_dropped:  # cannot happen for what parse_lines reads; say so if it does
        return [], 500, f"{stats.points_dropped} point(s) could not be written: {stats.reasons}"
    return lines, 204, ""


def _series_key(point: Point) -> str:
    """The point's series: its measurement and tags (what InfluxDB indexes)."""
    return "\0".join([point.measurement, *(f"{k}={v}" for k, v in sorted(point.tags.items()))])


def _bad_name(tags: Mapping[str, str]) -> str:
    """Why a tag that names something (``rank``, ``job``, ``node``, ...) is not a name of its
    kind (:mod:`core.names`: a rank is digits), or ``""``."""
    for key, value in tags.items():
        parse = SUBJECT_TYPES.get(key)
        if parse is not None:
            try:
                parse(value)
            except BadNameError as exc:
                return f"tag {key}: {exc}"
    return ""


def read_body(headers: Message, rfile: io.BufferedIOBase) -> tuple[bytes | None, int, str]:
    """The request body, or ``(None, status, message)``: a length that is missing, not a
    number or over :data:`MAX_BODY`; an encoding other than gzip; gzip that is broken or
    inflates past :data:`MAX_BODY`."""
    if headers.get("Transfer-Encoding"):
        return None, 411, "send a Content-Length (chunked bodies are not read)"
    raw = headers.get("Content-Length") or "0"
    if not (raw.isascii() and raw.isdigit()):  # "\xb2" (superscript two) is a digit to isdigit
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
    """The relay: TCP on ``listen`` (``host:port``; "" for none) and/or a Unix socket at
    ``socket_path``.

    **Who may write what** (issue 38): every point is stamped with the relay's own ``cluster``
    and ``node`` (when given), whatever it said: a job on node A cannot speak for node B. Its
    ``job`` must be the caller's:

    * over the Unix socket, or over TCP from loopback, the kernel names the caller (read
      when the connection is accepted: ``SO_PEERCRED`` on the socket; on TCP the process
      holding the peer's end in the socket table, as identd finds it), and its cgroup names
      its job where Slurm set one (``job_<id>``; :func:`collector.attribution.parse_cgroup`):
      a point of another job is refused (403), and a point without one gets it. A caller
      whose cgroup cannot be read, or a loopback peer whose process cannot be found, is
      refused (403). A pod's cgroup names only its UID, while its reporter names
      ``<namespace>/<pod>``: with ``pods_named`` (each pod UID the agent saw on this node's
      GPUs, and the name the kubelet gave the pod holding them), a pod seen so is held to
      that name as a Slurm job is to its id (403 for another), and a pod not seen yet may not
      claim a name another pod was seen as (503: a pod restarted under its name has a new UID
      until the agent sees it); then the rule below;
    * otherwise (a TCP peer on another host, which a listener on a non-loopback address lets
      in and which cannot be told apart from any other job; or a caller in no job's cgroup),
      with ``jobs_here`` set (the jobs the agent saw on this node's GPUs lately), a point of a
      job holding none of them is refused with 503 and ``Retry-After`` (a job's first report
      can come before the agent's next look at its GPUs; a made-up job never becomes one).
      Without ``jobs_here`` any job is taken.
    """

    def __init__(
        self,
        listen: str,
        sink: LineSink,
        tls: ssl.SSLContext | None = None,
        *,
        cluster: str = "",
        node: str = "",
        socket_path: str = "",
        procfs: str = "/proc",
        jobs_here: Callable[[], set[str]] | None = None,
        pods_named: Callable[[], dict[str, str]] | None = None,
        lines_per_s: float = LINES_PER_S,
    ) -> None:
        self.tls = tls
        self.address: tuple[str, int] = ("", 0)
        if listen:
            host, _, port = listen.rpartition(":")
            self.address = (host or "127.0.0.1", int(port))
        self.listen = bool(listen)
        self.socket_path = socket_path
        self.procfs = procfs
        self.lookup_budget_s = 0.5
        """How long the look for a TCP caller's process may take (past it: 503, retry)."""
        self.jobs_here = jobs_here
        self.pods_named = pods_named
        self.stamp = {k: v for k, v in (("cluster", cluster), ("node", node)) if v}
        self.sink = sink
        self.accepted = 0  # lines
        self.refused = 0  # requests
        self._reported = 0  # lines accepted up to the last stats_point
        self._unsaid = 0  # refusals not logged yet
        self._said_at = -float("inf")
        self._lock = threading.Lock()
        self._servers: list[socketserver.BaseServer] = []
        self._socket_inode: int | None = None
        self._recent: dict[int, None] = {}  # loopback callers' pids, the latest last
        self.series = SeriesBudget()
        self.rate = LineRate(lines_per_s)

    def start(self) -> None:
        relay = self

        class Handler(GuardedHandler):
            # a client silent this long on a read is dropped (before: no timeout over plain
            # HTTP, so idle connections held a thread and a descriptor each, for ever)
            timeout = 10
            caller: str | None = ""

            def setup(self) -> None:
                super().setup()
                self.caller = relay.caller(self.connection)

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug(fmt, *args)

            def _answer(self, code: int, text: str = "") -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                if code in (429, 503):
                    self.send_header("Retry-After", "5")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(200 if self.path in ("/health", "/ping") else 404, "ok\n")

            def do_POST(self) -> None:  # noqa: N802
                status, problem = relay._post(self)
                if status >= 400:
                    who = self.client_address[0] if self.client_address else "the Unix socket"
                    relay._refused(status, problem, str(who))
                    self._answer(status, problem + "\n")
                else:
                    self._answer(status)

        # every caller of a node's relay is that node (loopback, or one socket): no cap per peer
        cap, deadline = MAX_CONNECTIONS, REQUEST_DEADLINE_S
        if self.listen:
            server = http_server(self.address, Handler, self.tls, max_connections=cap,
                                 max_per_peer=cap, request_deadline_s=deadline)  # fmt: skip
            self.address = server.server_address[:2]  # type: ignore[assignment]
            self._servers.append(server)
        if self.socket_path:
            unix = unix_http_server(self.socket_path, Handler, max_connections=cap,
                                    max_per_peer=cap, request_deadline_s=deadline)  # fmt: skip
            self._servers.append(unix)
            self._socket_inode = os.lstat(self.socket_path).st_ino
        for s in self._servers:
            threading.Thread(target=s.serve_forever, daemon=True, name="relay").start()

    def caller(self, connection: socket.socket) -> str | None:
        """Who is at the other end, read once when the connection is accepted (before any of
        its bytes, so a process cannot write its request and exit, leaving a pid whose cgroup
        is gone or reused): its job where the system's cgroup names one, ``""`` for a peer
        on another host or a local process in no job's cgroup, None for a local process
        whose cgroup cannot be read or that cannot be found (refused: it cannot be told apart
        from any other job).

        A local process is the one the kernel names: over the Unix socket by ``SO_PEERCRED``
        (a pid the relay cannot see: refused), over TCP from any of this host's addresses
        (loopback or not: a process may bind its source to the node's own address) by the
        socket's owner and the first process of that owner holding it
        (:func:`core.tls.loopback_peer_pids`, per connection, within ``lookup_budget_s``: past
        it :data:`LOOKUP_SLOW`, answered 503; the relay's recent callers are looked at first).
        A socket gone before the lookup (a reset) is refused."""
        if connection.family == socket.AF_UNIX:
            pid = peer_pid(connection)
            # pid 0: a caller the relay's pid namespace cannot see (an agent container
            # without hostPID): unknown, not "no job"
            return None if pid is None else self._job_of(pid)
        with self._lock:
            recent = list(reversed(self._recent))
        try:
            found = loopback_peer_pids(connection, self.procfs, recent, self.lookup_budget_s)
        except TimeoutError:
            return LOOKUP_SLOW  # 503: the reporter tries again
        if found is None:
            return ""  # a peer on another host: who it is is not the kernel's to say
        if not found:
            return None  # its socket gone before the lookup, or no process of its owner
        with self._lock:
            self._recent.pop(found[0], None)
            self._recent[found[0]] = None
            while len(self._recent) > RECENT_CALLERS:
                del self._recent[next(iter(self._recent))]
        return self._job_of(found[0])

    def _job_of(self, pid: int) -> str | None:
        """The job a process's cgroup names (``""``: none), None where it cannot be read."""
        try:
            with open(f"{self.procfs}/{pid}/cgroup", "rb") as f:
                return parse_cgroup(f.read().decode("utf-8", "replace"))
        except OSError:
            return None

    def _job_rule(self, request: BaseHTTPRequestHandler) -> tuple[JobRule | None, dict[str, str]]:
        """What the caller may say its job is, and the tags to stamp (see the class)."""
        stamp = dict(self.stamp)
        system_job = getattr(request, "caller", "")
        if system_job == LOOKUP_SLOW:
            return (lambda job: (503, "the caller could not be looked up in time; retry")), stamp
        if system_job is None:
            unknown = "the caller's process cannot be found or its cgroup cannot be read"
            return (lambda job: (403, f"{unknown}: its job is unknown")), stamp
        # a Slurm job's cgroup names the job the reporter names; a pod's names its UID, while
        # the reporter names <namespace>/<pod>: the name the agent saw that pod's GPUs under
        pods = self.pods_named() if self.pods_named is not None else {}
        is_pod = bool(system_job) and system_job.startswith(POD_UID_PREFIX)
        if is_pod and system_job in pods:
            system_job = pods[system_job]
        elif is_pod and self.pods_named is None:  # no pod memory here: the TCP rule below
            return self._on_this_node(), stamp
        elif is_pod:
            others = set(pods.values())

            def not_seen_yet(job: str) -> tuple[int, str] | None:
                # 503 for every name: a pod is named by what the agent saw on its GPUs, and a
                # name the kubelet gave a pod whose GPUs are still idle is not yet anyone's to
                # take (an attacker's review: an unseen pod took such a pod's name, 204); a
                # pod's own processes show on its GPUs within a cycle or two, and the reporter
                # retries
                who = "another pod's (its GPUs' processes say so)" if job in others else "not seen"
                return 503, (f"job {job!r}: this pod's GPUs are not seen yet, and the name is "
                             f"{who}; retry")  # fmt: skip

            return not_seen_yet, stamp
        if system_job and not system_job.startswith(POD_UID_PREFIX):
            stamp["job"] = system_job

            def own_job(job: str) -> tuple[int, str] | None:
                if job and job != system_job:
                    return 403, f"job {job!r} is not the caller's: its cgroup names {system_job}"
                return None

            return own_job, stamp
        return self._on_this_node(), stamp

    def _on_this_node(self) -> JobRule | None:
        """A job holding some of this node's GPUs lately, or 503 (None: any job)."""
        if self.jobs_here is None:
            return None
        here = self.jobs_here()

        def on_this_node(job: str) -> tuple[int, str] | None:
            if job not in here:
                return 503, (
                    f"job {job!r} holds none of this node's GPUs (not yet, or not at all); "
                    f"jobs seen here lately: {sorted(here)[:8]}"
                )
            return None

        return on_this_node

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
        rule, stamp = self._job_rule(request)
        lines, status, problem = checked_lines(
            text,
            precision,
            stamp=stamp,
            job_rule=rule,
            budget=self.series,
            rate=self.rate,
            named_here=self.jobs_here is not None,
        )
        if problem:
            return status, problem
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
        for s in self._servers:
            s.shutdown()
            s.server_close()
        if self.socket_path and self._socket_inode is not None:
            with contextlib.suppress(OSError):  # ours only: a newer agent may have made its own
                if os.lstat(self.socket_path).st_ino == self._socket_inode:
                    os.unlink(self.socket_path)
