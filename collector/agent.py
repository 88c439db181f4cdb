"""The node agent loop: every source on a fixed interval, its own health, one sink.

Each cycle starts on a fixed schedule (``start + k * interval``, on the monotonic clock, so
collection time does not accumulate as drift; a cycle that overruns skips the ticks it missed
and says so in ``cycle_lag_s``). A source that fails is reported
(``collect_success_active=false``) and the others are written as usual. Sources run one after
another on the loop thread (their work is Python, so running them at once would only add GIL
contention); :meth:`Agent.run` supervises that thread, and if it makes no progress in one
source for ``source_timeout_s`` (a D-state sysfs read, a stuck driver call) it is left there,
the source is reported failed, and a new loop thread carries on, skipping that source until
its call returns. Every cycle writes, per source, ``agent`` self-metrics (duration, success,
points, errors so far) and the sink's own counters. Stopping flushes the sink.

Nothing a job or the hardware hands the agent stops the loop: a point the line protocol cannot
carry is dropped and counted by the sink (``points_unencodable_total``), and a sink that fails
outright is logged once per streak and counted (``sink_errors_total`` on the ``agent`` point);
the next cycle writes again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuwarden.collector.errors import CollectorError
from gpuwarden.collector.plausible import Screen
from gpuwarden.collector.sources import Source
from gpuwarden.core.finding import Finding
from gpuwarden.core.store.lineprotocol import Point

log = logging.getLogger(__name__)


class PointSink(Protocol):
    def write_points(self, points: Iterable[Point]) -> None: ...

    def close(self, timeout_s: float = 10.0) -> bool: ...


@dataclass
class SourceHealth:
    errors: int = 0
    failing: str = ""  # the message of the failure streak it is in ("" when it works)
    failed_cycles: int = 0  # cycles in that streak
    implausible: int = 0  # readings left out as physically impossible (collector.plausible)
    points: int = 0  # points of its last successful cycle


class _AbandonedError(Exception):
    """Unwinds a loop thread that the supervisor gave up on while it was stuck in a source."""


class Agent:
    """Runs ``sources`` into ``sink``. ``stats`` (optional) answers the sink's self-metrics."""

    def __init__(
        self,
        sources: Sequence[Source],
        sink: PointSink,
        *,
        cluster: str,
        node: str,
        interval_s: float = 10.0,
        source_timeout_s: float = 5.0,
        sink_stats: Callable[[], dict[str, Any]] | None = None,
        on_cycle: Callable[[int, list[Point]], None] | None = None,
        clock: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        commit: bool = False,
    ) -> None:
        """``commit``: sources that read a log save how far the sink has their points on disk
        (the agent that writes to InfluxDB; off for ``--once``, ``--print`` and ``--record``,
        which must not move the running agent's place in the kernel journal)."""
        self.commit = commit
        self.sources = list(sources)
        self.sink = sink
        self.cluster = cluster
        self.node = node
        self.interval_s = interval_s
        self.source_timeout_s = source_timeout_s
        self.sink_stats = sink_stats
        self.on_cycle = on_cycle
        self.clock = clock
        self.monotonic = monotonic
        self.health = {s.name: SourceHealth() for s in self.sources}
        self.screen = Screen()
        # more self-metrics, each a point per cycle (the reporter relay's)
        self.self_reports: list[Callable[[int], Point]] = []
        self.cycles = 0
        self.skipped_ticks = 0
        self.last_points: list[Point] = []  # the sources' points of the last cycle (/metrics)
        self.last_xid: dict[str, int] = {}  # GPU index -> the last XID seen (/metrics)
        # monotonic: when the loop started, and when its last cycle was handed to the sink
        # (the liveness probe, collector.probes)
        self.started_at = monotonic()
        self.last_cycle_at: float | None = None
        self._hung: dict[str, threading.Thread] = {}
        # per loop thread: the source it is in and since when (the watchdog reads the current
        # loop thread's; an abandoned thread that returns clears only its own)
        self._current: dict[threading.Thread, tuple[str, float]] = {}
        self._next_cycle_at = 0.0  # on the monotonic clock (the supervisor sleeps until it)
        self._owner: threading.Thread | None = None  # the loop thread that may carry on
        self.sink_errors = 0
        self._sink_failing = ""
        self._pending_failures: list[str] = []
        self._findings: list[Finding] = []
        self._collected: list[Source] = []
        self._persist_failing = ""
        self._findings_lock = threading.Lock()
        self._tags = {s.name: {"cluster": cluster, "node": node, "source": s.name} for s in sources}

    def add_finding(self, finding: Finding) -> None:
        """Findings from the sources' event rules are written with the next cycle."""
        with self._findings_lock:
            self._findings.append(finding)

    def collect(self, now_ns: int, lag_s: float = 0.0) -> list[Point]:
        """One cycle: every source's points, the findings raised since the last cycle, and the
        agent's and the sink's self-metrics."""
        points: list[Point] = []
        own: list[Point] = []
        self._collected = []  # the sources whose points this cycle holds (see _write)
        for source in self.sources:
            name = source.name
            hung = self._hung.get(name)
            if hung is not None:
                if hung.is_alive():  # its late run has not returned yet: skip it
                    self.health[name].errors += 1
                    self.health[name].failed_cycles += 1
                    own.append(self._self_point(name, now_ns, 0.0, False, 0))
                    continue
                del self._hung[name]
            t0 = time.perf_counter()
            me = threading.current_thread()
            self._current[me] = (name, self.monotonic())
            try:
                result = source.collect(now_ns)
            except Exception as exc:  # a source's failure must never stop the agent
                self._check_owner()
                self._failed(name, exc)
                own.append(self._self_point(name, now_ns, time.perf_counter() - t0, False, 0))
                continue
            finally:
                self._current.pop(me, None)
            self._check_owner()
            if self.health[name].failing:
                self._recovered(name)
            self.health[name].implausible += self.screen(result)
            # (a kernel-log source sends points again until they are on the sink's disk:
            # counted once)
            self.health[name].points = len(result) - getattr(source, "resent", 0)
            points += result
            self._collected.append(source)
            own.append(
                self._self_point(
                    name, now_ns, time.perf_counter() - t0, True, self.health[name].points
                )
            )
        if self.on_cycle is not None:  # sees the cycle's points; may raise a finding for it
            try:
                self.on_cycle(now_ns, points)
            except Exception:
                log.exception("the per-cycle hook failed")
        with self._findings_lock:
            findings, self._findings = self._findings, []
        for finding in findings:
            tags, fields = finding.to_point()
            points.append(Point("finding", tags, fields, finding.time_ns))  # type: ignore[arg-type]
        agent_tags = {"cluster": self.cluster, "node": self.node, "source": "agent"}
        loop_fields = {"cycle_lag_s": lag_s, "sink_errors_total": self.sink_errors}
        own.append(Point("agent", agent_tags, loop_fields, now_ns))
        for report in self.self_reports:
            own.append(report(now_ns))
        if self.sink_stats is not None:
            sink_tags = {"cluster": self.cluster, "node": self.node, "sink": "influxdb"}
            own.append(Point("sink", sink_tags, self.sink_stats(), now_ns))
        self.cycles += 1
        self.last_points = points
        for p in points:
            code = p.fields.get("xid_code") if p.measurement == "gpu_event" else None
            if isinstance(code, int) and not isinstance(code, bool):
                self.last_xid[p.tags.get("gpu", "")] = code
        return points + own

    def _failed(self, name: str, exc: Exception) -> None:
        """Counts the failure; logs it when a streak starts or its message changes (a node
        without a GPU, or a driver that is down for an hour, says so once, not every cycle;
        the self-metrics record every failed cycle)."""
        health = self.health[name]
        health.errors += 1
        health.failed_cycles += 1
        message = str(exc) or type(exc).__name__
        if message != health.failing:
            health.failing = message
            log.warning("source %s failed: %s (logged again when the error changes or it "
                        "recovers)", name, message, exc_info=log.isEnabledFor(10))  # fmt: skip
        else:
            log.debug("source %s failed again: %s", name, message)

    def _recovered(self, name: str) -> None:
        health = self.health[name]
        log.warning("source %s works again after %d failed cycle(s)", name, health.failed_cycles)
        health.failing, health.failed_cycles = "", 0

    def _self_point(self, name: str, now_ns: int, duration: float, ok: bool, n: int) -> Point:
        fields: dict[str, Any] = {
            "collect_duration_s": duration,
            "collect_success_active": ok,
            "points_count": n,
            "errors_total": self.health[name].errors,
            "implausible_total": self.health[name].implausible,
        }
        return Point("agent", self._tags[name], fields, now_ns)

    def run(self, stop: threading.Event, max_cycles: int | None = None) -> None:
        """Cycle until ``stop`` is set (or ``max_cycles``); then flush and close the sink.

        The cycles run on a loop thread; this thread supervises it. If one source makes no
        progress for ``source_timeout_s``, the loop thread is left inside it and a new one
        carries on with the schedule, skipping that source until its call returns."""
        done = threading.Event()
        start = self.started_at = self.monotonic()
        for source in self.sources:  # this loop tells them when the sink has their points
            if hasattr(source, "retain_until_committed"):
                source.retain_until_committed = True
        try:
            while True:
                loop = threading.Thread(
                    target=self._loop, args=(stop, done, start, max_cycles), daemon=True,
                    name="agent-loop",
                )  # fmt: skip
                self._owner = loop  # before it starts: an abandoned thread never carries on
                loop.start()
                while loop.is_alive():
                    loop.join(self._until_overdue(loop))
                    current = self._current.get(loop)
                    if current and self.monotonic() - current[1] > self.source_timeout_s:
                        break
                else:
                    break  # the loop ended (stop, max_cycles)
                name = current[0]
                self._hung[name] = loop
                self._current.pop(loop, None)
                health = self.health[name]
                health.errors += 1
                health.failed_cycles += 1
                health.failing = "made no progress"  # so its return is logged
                log.warning("source %s made no progress for %.1fs; skipped until it returns",
                            name, self.source_timeout_s)  # fmt: skip
                self._pending_failures.append(name)
        finally:
            self.close()

    def _until_overdue(self, loop: threading.Thread) -> float:
        """How long the supervisor may sleep: until the source call under way would pass
        ``source_timeout_s``, or, between calls, until one starting at the next cycle would
        (no wakeup every second while the agent waits for its next cycle)."""
        now = self.monotonic()
        current = self._current.get(loop)
        if current is not None:
            wait = current[1] + self.source_timeout_s - now + 0.01
        else:
            wait = max(0.0, self._next_cycle_at - now) + self.source_timeout_s
        return min(max(0.01, wait), self.interval_s + self.source_timeout_s)

    def _loop(
        self, stop: threading.Event, done: threading.Event, start: float, max_cycles: int | None
    ) -> None:
        try:
            while not stop.is_set() and (max_cycles is None or self.cycles < max_cycles):
                tick = max(0, int((self.monotonic() - start) / self.interval_s))
                scheduled = start + tick * self.interval_s
                lag = max(0.0, self.monotonic() - scheduled)
                now = self.clock()
                points = self.collect(now, lag)
                for name in self._drain_failures():
                    points.append(self._self_point(name, now, self.source_timeout_s, False, 0))
                self._write(points)
                self.last_cycle_at = self.monotonic()
                behind = int((self.monotonic() - start) / self.interval_s) - tick
                if behind > 0:  # overran: the ticks already missed are skipped, not burst
                    self.skipped_ticks += behind
                self._next_cycle_at = start + (tick + behind + 1) * self.interval_s
                stop.wait(max(0.0, self._next_cycle_at - self.monotonic()))
        except _AbandonedError:
            return
        done.set()

    def _write(self, points: list[Point]) -> None:
        """Hands a cycle's points to the sink; a sink that raises is counted and logged (once
        per streak and message, as a failing source is), and the loop goes on."""
        try:
            self.sink.write_points(points)
        except Exception as exc:
            self.sink_errors += 1
            message = f"{type(exc).__name__}: {exc}"
            if message != self._sink_failing:
                self._sink_failing = message
                log.warning("the sink refused a cycle's points: %s (counted in "
                            "sink_errors_total; logged again when the error changes)", message,
                            exc_info=log.isEnabledFor(10))  # fmt: skip
            return
        if self._sink_failing:
            log.warning("the sink takes points again")
            self._sink_failing = ""
        self._commit()

    def _commit(self) -> None:
        """The sink has this cycle's points: a source that reads a log (the kernel's) is told,
        once they are on the sink's disk (``persist``: what waits in its memory is written
        now, in a cycle that has such a source's news only), so it stops sending them again
        and (``commit``) remembers how far it has read, and a restart goes on after them."""
        due = [
            s for s in self._collected
            if getattr(s, "committed", None) is not None
            and getattr(s, "commit_due", lambda: True)()
        ]  # fmt: skip
        self._collected = []
        if not due:
            return
        persist = getattr(self.sink, "persist", None)
        if persist is not None and any(getattr(s, "holds_points", lambda: True)() for s in due):
            try:
                persist()
            except Exception as exc:
                # not on disk: the points wait in the sink's memory (sent once from there), so
                # the source need not send them again, but keeps its place in the log
                message = f"{type(exc).__name__}: {exc}"
                if message != self._persist_failing:
                    self._persist_failing = message
                    log.warning("the sink could not put a cycle's kernel-log points on disk "
                                "(%s): the kernel journal's cursor stays where it is (logged "
                                "again when the error changes)", message)  # fmt: skip
                save = False
            else:
                self._persist_failing, save = "", self.commit
        else:
            save = self.commit
        for source in due:
            try:
                source.committed(save=save)  # type: ignore[attr-defined]
            except Exception:
                log.exception("source %s could not note what the sink has", source.name)

    def _check_owner(self) -> None:
        if self._owner is not None and threading.current_thread() is not self._owner:
            raise _AbandonedError

    def _drain_failures(self) -> list[str]:
        failures, self._pending_failures = self._pending_failures, []
        return failures

    def close(self) -> None:
        # the sink first: what it holds goes out or to disk before a source saves how far it
        # read (the kernel journal's cursor; found by a review, 2026-11-28)
        try:
            self.sink.close()
        finally:
            for source in self.sources:
                try:
                    source.close()
                except Exception as exc:
                    log.warning("closing source %s: %s", source.name, exc)


class TraceRecorder:
    """A :class:`PointSink` that records what the agent would send (``--record DIR``) as a
    gpuwarden trace, one chunk per cycle; ``gpuwarden replay replay DIR`` sends it later."""

    def __init__(self, directory: str, origin: str, *, simulated: bool) -> None:
        try:  # a trace is Parquet, written with polars: only --record needs it
            from gpuwarden.core.store.trace import TraceWriter
        except ImportError as exc:
            raise CollectorError(
                f"--record writes a gpuwarden trace and needs polars ({exc}): install "
                "'gpuwarden[agent,simulation]', or record NVML answers with --record-nvml"
            ) from None
        self.writer = TraceWriter(directory, origin, simulated=simulated)

    def write_points(self, points: Iterable[Point]) -> None:
        import polars

        groups: dict[str, list[Point]] = {}
        for p in points:
            groups.setdefault(p.measurement, []).append(p)
        for measurement, group in groups.items():
            tag_keys = sorted({k for p in group for k in p.tags})
            rows = [
                {**{k: p.tags.get(k) for k in tag_keys}, **p.fields, "time": p.time_ns}
                for p in group
            ]
            df = polars.DataFrame(rows, infer_schema_length=None)
            self.writer.write_frame(df, measurement, tags=tag_keys)
        self.writer.next_chunk()

    def close(self, timeout_s: float = 10.0) -> bool:
        self.writer.close()
        return True


class LinePrinter:
    """A :class:`PointSink` that prints line protocol (``--once``)."""

    def __init__(self, write: Callable[[str], Any]) -> None:
        self.write = write
        self.unencodable = 0  # points the line protocol cannot carry: dropped, counted

    def write_points(self, points: Iterable[Point]) -> None:
        from gpuwarden.core.store.lineprotocol import EncodeStats, encode_points

        stats = EncodeStats()
        for line in encode_points(points, stats=stats, drop_unencodable=True):
            self.write(line + "\n")
        self.unencodable += stats.points_unencodable

    def close(self, timeout_s: float = 10.0) -> bool:
        return True
