"""The InfluxDB sink: batches by size and age, retries with backoff, spools on outage.

Data path: ``write_*`` encodes and appends to the :class:`~core.store.spool.Spool`; a sender
thread takes batches from the spool in order (up to ``batch_size`` points, or fewer
once the oldest pending point is ``flush_interval_s`` old), sends them through a
:class:`~core.store.transport.Transport`, and commits. What the server answers decides what
happens to the batch (see :mod:`core.store.transport`): retries back off exponentially with full
jitter (``backoff_base_s`` doubling up to ``backoff_max_s``), a 429 or 503 waits for its
Retry-After, and a configuration error parks the sender without dropping anything.

Every batch goes through the spool. While the server keeps up, a batch waits in the spool's
memory and never touches the disk; a failed send, ``spool_write_behind_s`` of waiting or
``close`` writes it to disk, and while anything waits on disk new batches queue behind it
there. So an outage of any length or a restart of the writer during it loses nothing the
sink accepted; a writer killed outright can lose what was still in memory (at most
``spool_write_behind_s``; set it to 0 to write every batch to disk first). The spool drains in
order before newer data, and past its bound the oldest data is dropped and counted exactly.

Sending a batch twice is harmless: InfluxDB keeps one value per series (measurement + tag set)
field and timestamp, so a re-sent point overwrites itself. That is why the sink can retry a
batch whose answer was lost, and resume from its last committed batch after a crash.

The sender is supervised: anything that raises in it (the spool's disk, a bug) is counted
(``sender_errors_total``), logged once per streak, and the sender backs off and goes on; a
sender thread that ended anyway is started again by the next write. A full disk under the
spool loses nothing it can keep in memory (see :mod:`core.store.spool`).

Clocks: the flush timer (``flush_interval_s``), backoff and parking run on the monotonic
clock; wall time is only ever a timestamp, so a wall clock stepped back or forward neither
holds a batch back nor sends one early.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpuwarden.core.errors import SinkError
from gpuwarden.core.retry import Backoff
from gpuwarden.core.store.lineprotocol import EncodeStats, Point, Precision, encode_points
from gpuwarden.core.store.spool import Spool
from gpuwarden.core.store.transport import Outcome, SendResult, Transport, V1Transport, V2Transport

if TYPE_CHECKING:
    import polars as pl  # only write_frame needs it, and imports it then: the agent never does

log = logging.getLogger(__name__)

SECRETS = ("password", "token")  # SinkConfig fields that are secrets: never settings


@dataclass(frozen=True)
class SinkConfig:
    """Sink settings; ``config/sink.sample.toml`` documents each one.

    ``password`` and ``token`` are the secrets themselves, for code that builds a sink; they are
    never settings (:meth:`to_mapping` leaves them out, :meth:`from_mapping` refuses them, and
    they are not in the repr). A configuration names their files, ``password_file`` and
    ``token_file``, which :meth:`with_secrets` reads."""

    url: str = "http://127.0.0.1:8086"
    api: Literal["v1", "v2"] = "v1"
    database: str = "gpuwarden"
    retention_policy: str = ""
    username: str = ""
    password_file: str = ""
    token_file: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)
    org: str = ""
    bucket: str = ""
    precision: str = "ns"
    batch_size: int = 5000
    flush_interval_s: float = 1.0
    timeout_s: float = 10.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    park_interval_s: float = 60.0
    retry_after_max_s: float = 300.0
    gzip: bool = False
    spool_dir: str = "/var/lib/gpuwarden/spool"
    spool_max_bytes: int = 256 * 2**20
    spool_segment_bytes: int = 0
    spool_write_behind_s: float = 5.0
    fsync: bool = False
    backpressure_bytes: int = 0

    def __post_init__(self) -> None:
        if self.api not in ("v1", "v2"):
            raise SinkError(f"sink api must be 'v1' or 'v2', got {self.api!r}")
        Precision(self.precision)
        if self.batch_size < 1 or self.flush_interval_s <= 0 or self.timeout_s <= 0:
            raise SinkError("batch_size, flush_interval_s and timeout_s must be positive")
        if self.spool_write_behind_s < 0:
            raise SinkError("spool_write_behind_s must be 0 (every batch to disk first) or more")
        if self.backpressure_bytes < 0 or (
            self.backpressure_bytes and self.backpressure_bytes >= self.spool_max_bytes
        ):
            raise SinkError("backpressure_bytes must be 0 (off) or below spool_max_bytes")
        if self.api == "v2" and not self.bucket:
            raise SinkError("the v2 API needs a bucket (and usually org and token)")

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> SinkConfig:
        """From settings (no secret in them: their files; :meth:`with_secrets` reads them)."""
        known = {f.name for f in fields(cls)} - set(SECRETS)
        for key in SECRETS:
            if key in data:
                raise SinkError(
                    f"sink.{key} is a secret, and a secret is never a setting: put it in a file "
                    f"only the service can read (chmod 600) and set sink.{key}_file to its path"
                )
        unknown = set(data) - known
        if unknown:
            raise SinkError(f"unknown sink settings: {sorted(unknown)}")
        return cls(**data)

    def to_mapping(self) -> dict[str, Any]:
        """The settings: every field but the secrets themselves."""
        return {k: v for k, v in asdict(self).items() if k not in SECRETS}

    def with_secrets(self) -> SinkConfig:
        """A copy holding the password and token read from their files (checked:
        :func:`core.config.read_secret`)."""
        from gpuwarden.core.config import read_secret

        return replace(
            self,
            password=read_secret(self.password_file, "sink.password_file") or self.password,
            token=read_secret(self.token_file, "sink.token_file") or self.token,
        )

    def make_transport(self) -> Transport:
        precision = Precision(self.precision)
        if self.api == "v2":
            return V2Transport(
                self.url,
                org=self.org,
                bucket=self.bucket,
                token=self.token or None,
                precision=precision,
                timeout_s=self.timeout_s,
            )
        return V1Transport(
            self.url,
            self.database,
            retention_policy=self.retention_policy or None,
            precision=precision,
            username=self.username or None,
            password=self.password or None,
            token=self.token or None,
            timeout_s=self.timeout_s,
            gzip=self.gzip,
        )


@dataclass
class SinkStats:
    """Counters since this process started, except ``points_dropped`` which the spool
    persists across restarts (it is the exact count of points lost to the bound)."""

    points_accepted: int = 0
    points_written: int = 0
    points_rejected: int = 0
    points_dropped: int = 0
    batches_sent: int = 0
    retries: int = 0
    last_send_s: float = 0.0
    spool_bytes: int = 0
    spool_memory_bytes: int = 0
    spool_points: int = 0
    sender_errors: int = 0
    spool_write_errors: int = 0
    spool_cursor_resets: int = 0
    spool_cut_bytes: int = 0
    encode: EncodeStats = field(default_factory=EncodeStats)
    last_error: str = ""

    def fields(self) -> dict[str, int | float]:
        """These counters as the catalogue's ``sink`` measurement (the agent writes them)."""
        return {
            "points_written_total": self.points_written,
            "points_rejected_total": self.points_rejected,
            "points_invalid_total": self.encode.points_dropped,
            "fields_invalid_total": self.encode.fields_dropped,
            "points_unencodable_total": self.encode.points_unencodable,
            "points_dropped_total": self.points_dropped,
            "spool_bytes": self.spool_bytes,
            "spool_memory_bytes": self.spool_memory_bytes,
            "spool_points_count": self.spool_points,
            "batches_sent_total": self.batches_sent,
            "retries_total": self.retries,
            "send_duration_s": self.last_send_s,
            "sender_errors_total": self.sender_errors,
            "spool_write_errors_total": self.spool_write_errors,
            "spool_cursor_resets_total": self.spool_cursor_resets,
            "spool_cut_bytes_total": self.spool_cut_bytes,
        }


class InfluxSink:
    """Construct, then write; the spool and the sender thread start on first use."""

    def __init__(self, config: SinkConfig, transport: Transport | None = None) -> None:
        self.config = config
        self.precision = Precision(config.precision)
        self._transport = transport if transport is not None else config.make_transport()
        self._spool = Spool(
            Path(config.spool_dir),
            max_bytes=config.spool_max_bytes,
            segment_bytes=config.spool_segment_bytes or None,
            fsync=config.fsync,
            write_behind_s=config.spool_write_behind_s,
        )
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._sender_failing = ""  # the message of the sender's failure streak
        # "HTTP <status>" while the server's answer parks the sender (a configuration error:
        # wrong token, no database); "" once a batch went through (the agent's readiness)
        self._parked = ""
        self._closing = False
        self._flush_requested = False
        self._sender_idle = False  # the sender sleeps on an empty spool until a write
        self._stats = SinkStats()
        self._rng = random.Random()
        self._retry = Backoff(
            base_s=self.config.backoff_base_s,
            max_s=self.config.backoff_max_s,
            retry_after_max_s=self.config.retry_after_max_s,
        )  # for as long as the sink runs: the spool holds what waits

    # -- writing --------------------------------------------------------------------------

    def start(self) -> None:
        """Opens the spool and starts the sender; starts it again if it ended (it never should:
        :meth:`_run` survives every exception)."""
        with self._cond:
            if self._thread is not None and (self._thread.is_alive() or self._closing):
                return
            if self._closing:
                raise SinkError("sink is closed")
            if self._thread is not None:
                self._stats.sender_errors += 1
                log.error("the sink's sender had ended; starting it again")
            self._spool.open()
            self._thread = threading.Thread(target=self._run, name="gpuwarden-sink", daemon=True)
            self._thread.start()

    def write_points(self, points: Iterable[Point]) -> None:
        stats = EncodeStats()
        # what a job or the hardware put in a point must never stop the agent: a point that
        # cannot be written is dropped and counted (points_unencodable_total)
        lines = encode_points(points, self.precision, stats, drop_unencodable=True)
        self._stats.encode.add(stats)
        self.write_lines(lines)

    def write_frame(
        self,
        df: pl.DataFrame,
        measurement: str,
        *,
        tags: Sequence[str],
        time: str = "time",
        fields: Sequence[str] | None = None,
    ) -> None:
        stats = EncodeStats()
        import polars as pl

        from gpuwarden.core.store.lineprotocol.frame import encode_frame

        lines = encode_frame(
            df,
            measurement,
            tags=tags,
            fields=fields,
            time=time,
            precision=self.precision,
            stats=stats,
        )
        self._stats.encode.add(stats)
        size = self.config.batch_size
        for start in range(0, len(lines), size):
            chunk = lines.slice(start, size)
            # Binary straight from polars: one copy fewer than .item().encode().
            self._append(chunk.str.join("\n").cast(pl.Binary).item(), len(chunk))

    def write_lines(self, lines: Sequence[str]) -> None:
        """Encoded lines (no trailing newlines); split into records of at most batch_size."""
        size = self.config.batch_size
        for start in range(0, len(lines), size):
            chunk = lines[start : start + size]
            self._append("\n".join(chunk).encode(), len(chunk))

    def _append(self, payload: bytes, points: int) -> None:
        if not points:
            return
        self.start()
        if self.config.backpressure_bytes:
            self._wait_for_room()
        dropped = self._spool.append(payload, points)
        with self._cond:
            self._stats.points_accepted += points
            if dropped:
                log.warning("spool bound reached: dropped %d oldest unsent points", dropped)
            # a full batch is due now; a sender asleep on an empty spool (no wakeup a second)
            # starts its flush timer on the first points
            if self._sender_idle or self._spool.pending_points >= self.config.batch_size:
                self._cond.notify_all()

    def _wait_for_room(self) -> None:
        """Backpressure: block the writer while the unsent backlog is above the bound.

        Only for producers that can outrun the server (a replay, a benchmark); the agent
        leaves it off, because a node agent must never stall its collection loop. While the
        server is down the writer waits (until the server is back, or the sink is closed).
        """
        with self._cond:
            while not self._closing and self._spool.pending_bytes > self.config.backpressure_bytes:
                self._cond.wait(1.0)

    # -- lifecycle ------------------------------------------------------------------------

    def persist(self) -> None:
        """Put what waits in memory on disk now (the spool's write-behind skipped once): the
        agent asks before a source may forget points it read from a log."""
        self._spool.spill()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Send everything pending now; True if the spool emptied within the timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            if self._thread is None:
                return True
            self._flush_requested = True
            self._cond.notify_all()
            while self._spool.pending_points > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)
            self._flush_requested = False
            return True

    def close(self, timeout_s: float = 10.0) -> bool:
        """Flush for up to ``timeout_s``; whatever is left stays in the spool for next time."""
        flushed = self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(self.config.timeout_s + 5.0)
        self._transport.close()
        self._spool.close()
        return flushed

    def __enter__(self) -> InfluxSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def parked(self) -> str:
        """Why the sender is parked (``"HTTP 401"``), or "" when it is not."""
        return self._parked

    def stats(self) -> SinkStats:
        s = self._stats
        s.points_dropped = self._spool.dropped_points_total
        s.spool_bytes = self._spool.size_bytes
        s.spool_memory_bytes = self._spool.memory_bytes
        s.spool_points = self._spool.pending_points
        s.spool_write_errors = self._spool.write_errors_total
        s.spool_cursor_resets = self._spool.cursor_resets_total
        s.spool_cut_bytes = self._spool.cut_bytes_total
        return s

    # -- sending --------------------------------------------------------------------------

    def _wait_for_batch(self) -> bool:
        """Block until a batch is due; False when closing."""
        with self._cond:
            while not self._closing:
                pending = self._spool.pending_points
                if pending and (self._flush_requested or pending >= self.config.batch_size):
                    return True
                oldest = self._spool.oldest_queued() if pending else None
                if oldest is not None:
                    age = time.monotonic() - oldest
                    if age >= self.config.flush_interval_s:
                        return True
                    self._cond.wait(self.config.flush_interval_s - age)
                elif pending:  # queued before a restart (no age): due at the next flush
                    self._cond.wait(self.config.flush_interval_s)
                else:  # nothing to send: until a write (or close) notifies
                    self._sender_idle = True
                    try:
                        self._cond.wait()
                    finally:
                        self._sender_idle = False
            return False

    def _sleep(self, seconds: float) -> None:
        """Back off for ``seconds``; only closing cuts it short (not flush, not new data)."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._closing and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)

    def _run(self) -> None:
        """The sender, supervised: an exception anywhere in a round (peek, send, commit,
        release) is counted and logged once per streak; the sender backs off and goes on."""
        failures = 0
        attempt = 0
        while True:
            try:
                if not self._wait_for_batch():
                    return
                attempt = self._round(attempt)
            except Exception as exc:
                failures += 1
                message = f"{type(exc).__name__}: {exc}"
                with self._cond:
                    self._stats.sender_errors += 1
                    self._stats.last_error = message
                if message != self._sender_failing:
                    self._sender_failing = message
                    log.exception("the sink's sender failed (counted in sender_errors_total; "
                                  "it backs off and goes on, logged again when the error "
                                  "changes)")  # fmt: skip
                self._sleep(self._backoff(failures, None))
                continue
            if failures:
                log.warning("the sink's sender works again after %d failure(s)", failures)
                failures, self._sender_failing = 0, ""

    def _round(self, attempt: int) -> int:
        """Sends one batch and settles it; returns the retry attempt the next round is at."""
        records = self._spool.peek(self.config.batch_size)
        if not records:
            return attempt
        points = sum(r.points for r in records)
        body = records[0].payload if len(records) == 1 else b"\n".join(r.payload for r in records)
        started = time.monotonic()
        try:
            result = self._transport.send(body, points)
        except Exception as exc:  # a transport bug must not kill the sender
            log.exception("sink transport raised")
            result = SendResult(Outcome.RETRY, None, f"{type(exc).__name__}: {exc}")
        if result.outcome in (Outcome.OK, Outcome.PARTIAL, Outcome.REJECTED):
            self._spool.commit(records)
            attempt = 0
            self._parked = ""
            with self._cond:
                s = self._stats
                s.batches_sent += 1
                s.points_rejected += result.rejected_points
                s.points_written += points - result.rejected_points
                s.last_send_s = time.monotonic() - started
                if result.rejected_points:
                    s.last_error = result.message
                    log.error(
                        "InfluxDB refused %d of %d points (%s): %s",
                        result.rejected_points,
                        points,
                        result.status,
                        result.message[:500],
                    )
                self._cond.notify_all()
            return attempt
        self._spool.release(records)
        self._stats.last_error = result.message
        if result.outcome is Outcome.PARK:
            self._parked = f"HTTP {result.status}"
            log.error(
                "InfluxDB answered %s (%s); keeping %d points spooled, next try in %.0f s",
                result.status,
                result.message[:300],
                self._spool.pending_points,
                self.config.park_interval_s,
            )
            self._sleep(self.config.park_interval_s)
            return attempt
        self._stats.retries += 1
        attempt += 1
        delay = self._backoff(attempt, result.retry_after_s)
        log.warning(
            "send failed (%s %s); retry %d in %.2f s",
            result.status,
            result.message[:200],
            attempt,
            delay,
        )
        self._sleep(delay)
        return attempt

    def _backoff(self, attempt: int, retry_after_s: float | None) -> float:
        return self._retry.delay(attempt, retry_after_s, self._rng)
