"""The append-only audit log: finding → decision → intent → action → outcome, with timings.

One JSON object per line, flushed and fsynced per record (remediation is rare; losing the
record of a drain is not acceptable). Every record has ``event`` (``finding``, ``decision``,
``intent``, ``action``, ``approval``, ``undo``, ``expired``; ``outcome``, ``demoted``,
``promoted``: :mod:`remediation.outcomes`), the wall time ``time`` (RFC 3339,
UTC) and ``t`` (Unix seconds); actions carry ``duration_s`` and ``since_finding_s`` (finding
received → outcome).

The log is also the engine's journal (write ahead, then act):

* a finding counts as seen only once its ``decision`` record is on disk, so a finding whose
  records could not be written (a full disk) is decided again when it is re-sent;
* a decision that acts or waits records its whole plan (``plan``: every action, with its
  parameters), so the plan can be rebuilt after a restart;
* before an action changes anything, its ``intent`` is on disk, with what the adapter observed
  of the world just before (:class:`remediation.model.Reconciling`);
* on start, :func:`replay` tells which plans had not finished (:attr:`Memory.unfinished`) and
  which were still waiting (:attr:`Memory.waiting`), and the engine resumes them against the
  scheduler's real state: an action whose intent is on disk but whose record is not is
  reconciled (done, and recorded now) or done, never done twice.

On start the engine reads the log back (:func:`replay`) to restore what it must not forget
over a restart: the findings it has already decided (de-duplication), the actions it has done
(idempotency), when it last acted on each node (cooldown) and which nodes it took out itself
(undo never resumes a node someone else drained). A torn line (power cut mid-write) is
skipped and counted, not fatal. The records' wall times become times on this process's
monotonic clock once, as they are read (:meth:`remediation.clock.Clock.journal_frame`): the
timers restored from them (cooldown, lemon window, a waiting plan's age) are not moved by a
clock step after the start.

One engine at a time writes a log: :class:`AuditLog` with ``exclusive=True`` (what the engine
opens) holds an exclusive ``flock`` on ``<log>.lock`` for its life, so ``remediate apply``
beside a running ``remediate serve`` on the same log is refused instead of making two engines
with two blast-radius states. (A standby engine on another host needs a lease from a component
the site runs; see docs/DURABILITY.md.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuwarden.core.files import write_all
from gpuwarden.remediation.clock import SYSTEM, Instant
from gpuwarden.remediation.errors import RemediationError
from gpuwarden.remediation.model import foreign_removal

#: The crash-point sweep (tests/test_crash_sweep.py) kills the engine at a journal boundary:
#: ``after:N`` once its Nth record of this process is on disk, ``before:N`` just before the Nth
#: is written. Unset (always, outside that test) it costs one comparison per record.
CRASH_AT_ENV = "GPUWARDEN_TEST_CRASH_AT"


#: verdicts that cut a plan down to its notification, told once per node, policy and verdict
#: within ``cooldown_s`` (:meth:`remediation.engine.guard.Guards.check`). Found by a review of
#: what a restart forgets (2026-11-28): that memory was the process's only, so a restart (or a
#: standby taking over) paged again for every node in cooldown
NOTIFY_ONCE_VERDICTS = ("cooldown", "not_ours", "held", "unchecked")


class JournalError(RemediationError, OSError):
    """A record could not be made durable (a full disk, a read-only file system): nothing that
    depended on it was done, and the caller may retry once the disk is back."""


class AuditLogBusyError(RemediationError, RuntimeError):
    """Another engine holds this audit log: two engines on one log would each keep their own
    blast-radius state, so the second one is refused."""


def _crash_point() -> tuple[str, int] | None:
    spec = os.environ.get(CRASH_AT_ENV, "")
    where, _, number = spec.partition(":")
    if where in ("before", "after") and number.isdigit():
        return where, int(number)
    return None


def _now_iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AuditLog:
    def __init__(self, path: str | Path, *, exclusive: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._written = 0
        self._crash = _crash_point()
        self._holder: int | None = None
        self.fence: Callable[[], None] | None = None
        """Called before every record; raises (a :class:`JournalError`) when this engine may
        no longer write: the standby's lease (:meth:`remediation.lease.PostgresLease.fence`)."""
        if exclusive:
            self._hold()

    def _hold(self) -> None:
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AuditLogBusyError(
                f"another engine (pid {holder}) holds {self.path}: one engine per audit log"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._holder = fd

    def close(self) -> None:
        """Let another engine take the log (the lock also goes with the process)."""
        if self._holder is not None:
            os.close(self._holder)
            self._holder = None

    def append(self, event: str, t: float, **record: Any) -> dict[str, Any]:
        """Write one record and make it durable, or raise :class:`JournalError` with the file
        as it was (a partial line is cut off again, so the next record starts clean)."""
        return self._append(event, t, record, sync=True)

    def append_unsynced(self, event: str, t: float, **record: Any) -> dict[str, Any]:
        """:meth:`append` without the fsync, for a record that nothing acts on before a later
        record of the same file is synced: that fsync makes it durable too (the engine's
        ``finding`` record, whose ``decision`` follows under the same lock; a crash in
        between loses neither an action nor an answer: none was given)."""
        return self._append(event, t, record, sync=False)

    def _append(
        self, event: str, t: float, record: dict[str, Any], *, sync: bool
    ) -> dict[str, Any]:
        entry = {"event": event, "time": _now_iso(t), "t": round(t, 6), **record}
        line = (json.dumps(entry, sort_keys=False, default=str) + "\n").encode()
        with self._lock:
            if self.fence is not None:
                self.fence()
            self._maybe_crash("before", self._written + 1)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            try:
                start = os.fstat(fd).st_size
                try:
                    # a line torn by a crash, or one a full disk did not let us cut back,
                    # must not swallow this record: start it on a line of its own
                    torn = start > 0 and os.pread(fd, 1, start - 1) != b"\n"
                    write_all(fd, b"\n" + line if torn else line)
                    if sync:
                        os.fsync(fd)
                except OSError as exc:
                    with contextlib.suppress(OSError):  # else replay skips the torn line
                        os.ftruncate(fd, start)
                    raise JournalError(f"cannot write the audit log {self.path}: {exc}") from exc
            finally:
                os.close(fd)
            self._written += 1
            self._maybe_crash("after", self._written)
        return entry

    @contextlib.contextmanager
    def rewriting(self) -> Iterator[Path]:
        """Hold the writer's lock, the lease confirmed (``fence``), while the log is replaced
        (:mod:`remediation.compact`): no record is appended meanwhile, and an append after it
        opens the new file. :class:`JournalError` if the lease is not confirmed."""
        with self._lock:
            if self.fence is not None:
                self.fence()
            yield self.path

    def _maybe_crash(self, where: str, number: int) -> None:
        if self._crash is not None and self._crash == (where, number):
            os.kill(os.getpid(), signal.SIGKILL)

    def records(self) -> Iterator[dict[str, Any]]:
        yield from read_records(self.path)


def read_records(path: str | Path, torn: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Every record; a line that is not JSON (a torn write) is skipped and its number recorded."""
    if not Path(path).exists():
        return
    with Path(path).open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # torn, or nested past any reader
                if torn is not None:
                    torn.append(number)
                continue
            if isinstance(record, dict):
                yield record


@dataclass
class PlanRecord:
    """A plan as the journal holds it: its latest decision, the finding that caused it."""

    decision: dict[str, Any]
    finding: dict[str, Any] | None
    received: float


@dataclass
class Memory:
    """What the engine remembers across restarts (rebuilt from the audit log)."""

    seen_findings: set[str] = field(default_factory=set)
    seen_at: dict[str, float] = field(default_factory=dict)
    """When each seen finding was decided, oldest first (:meth:`forget_seen_before`). Wall
    time, on purpose: forgetting an id pairs with the endpoint's freshness check, which
    compares a finding's time with the wall clock; both read the same clock, so an id is
    forgotten only once a re-send of its finding would be refused as stale, whatever steps
    the clock took in between."""
    finding_digests: dict[str, str] = field(default_factory=dict)
    """Each seen finding's content digest (:attr:`Finding.digest`), where the audit has it: a
    duplicate is answered "same content" only when they match."""
    done_actions: set[str] = field(default_factory=set)
    last_action_at: dict[str, float] = field(default_factory=dict)
    """When gpuwarden last changed each node (monotonic: the cooldown measures from it)."""
    return_failed_at: dict[str, float] = field(default_factory=dict)
    """When gpuwarden last failed to return each node to service (monotonic): another return
    is not tried within ``cooldown_s`` (a node's own key sent 60 ``node_healthy`` a minute,
    each a return check that hung in an executor thread for up to 15 minutes)."""
    taken_out: set[str] = field(default_factory=set)
    taken_out_at: dict[str, list[tuple[Instant, str]]] = field(default_factory=dict)
    """Every time gpuwarden took each node out, and why (the lemon rule reads it: its window
    on the monotonic clock, the times it shows and the return check on the wall clock)."""
    torn_lines: list[int] = field(default_factory=list)
    intents: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Intent records by action id whose action record is not (yet) on disk."""
    recorded: set[str] = field(default_factory=set)
    """Action ids with an action record, whatever its outcome."""
    unfinished: list[PlanRecord] = field(default_factory=list)
    """Plans decided ``act``/``dry_run`` whose actions had not all been recorded (replay)."""
    waiting: list[PlanRecord] = field(default_factory=list)
    """Plans still waiting (approval, blast radius, rate limit, lemon) at the last stop."""
    approved: dict[str, str] = field(default_factory=dict)
    """Waiting plans an operator approved (plan id: who) whose decision after the approval is
    not on disk: the engine stopped between the ``approval`` record and acting on it. The
    approval was journalled, so it holds: :meth:`Engine.resume` runs them as approved."""
    compacted_horizon: float = 0.0
    """Records older than this (wall time) may have been dropped by a compaction
    (:mod:`remediation.compact`): a finding that old may have been decided already."""
    told: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(node, policy, verdict): when (this process's monotonic clock) a plan cut down to its
    notification last told people (:data:`NOTIFY_ONCE_VERDICTS`); the guards tell once per key
    within ``cooldown_s``, across a restart too."""
    approved_plans: set[str] = field(default_factory=set)
    """Every plan with an ``approval`` record: one the blast radius or the rate limit held
    after its approval waits as approved after a restart (released, it skips the guards an
    approval skips) instead of needing a second approval."""

    def saw(self, finding_id: str, t: float) -> None:
        """``finding_id`` was decided at ``t``: a re-send of it is a duplicate (and does not
        make it remembered longer: the first decision's time counts)."""
        self.seen_findings.add(finding_id)
        self.seen_at.setdefault(finding_id, t)

    def forget_seen_before(self, t: float) -> int:
        """Forget findings decided before ``t`` (oldest first; returns how many): where every
        sender's finding older than some age is refused as stale anyway, remembering its id
        longer guards nothing, and the memory stays bounded by the senders' quotas."""
        forgotten = 0
        while self.seen_at:
            oldest = next(iter(self.seen_at))
            if self.seen_at[oldest] >= t:
                break
            del self.seen_at[oldest]
            self.seen_findings.discard(oldest)
            self.finding_digests.pop(oldest, None)
            forgotten += 1
        return forgotten

    def note_action(self, record: Mapping[str, Any], mono: float) -> None:
        """An ``action`` record, written at ``mono`` on this process's monotonic clock (for a
        record read back from the journal: its ``t`` placed in this process's frame)."""
        self.recorded.add(str(record.get("action_id", "")))
        self.intents.pop(str(record.get("action_id", "")), None)
        if record.get("action") == "uncordon" and not record.get("dry_run"):
            if record.get("outcome") in ("failed", "timeout"):
                self.return_failed_at[str(record.get("node", ""))] = mono
            else:
                self.return_failed_at.pop(str(record.get("node", "")), None)
        if record.get("dry_run") or record.get("outcome") not in ("ok",):
            return
        self.done_actions.add(str(record["action_id"]))
        node = str(record.get("node", ""))
        if not node:
            return
        action = record.get("action")
        # the cooldown keeps gpuwarden from acting on a node again and again; returning a node
        # does not start it: a node that breaks right after its repair must come out at once
        if action not in ("notify", "uncordon"):
            self.last_action_at[node] = mono
        if action in ("cordon", "drain") and not foreign_removal(record):
            if node not in self.taken_out:
                times = self.taken_out_at.setdefault(node, [])
                times.append((Instant(float(record["t"]), mono), str(record.get("reason", ""))))
            self.taken_out.add(node)
        elif action == "uncordon":
            self.taken_out.discard(node)


#: verdicts whose plans run (and so may be unfinished), and those whose plans wait
RUNNING_VERDICTS = ("act", "dry_run", "cooldown", "not_ours", "unchecked", "held", "demoted")
WAITING_VERDICTS = ("approval", "lemon", "blast_radius", "rate_limited", "busy")
REMOVING_KINDS = ("cordon", "drain")


def replay(path: str | Path, to_mono: Callable[[float], float] | None = None) -> Memory:
    """What the journal at ``path`` says the engine must remember; ``to_mono`` places a
    record's wall time on this process's monotonic clock (by default the host's clocks, read
    once now: :meth:`remediation.clock.Clock.journal_frame`)."""
    memory = Memory()
    to_mono = to_mono or SYSTEM.journal_frame()
    findings: dict[str, dict[str, Any]] = {}
    latest: dict[str, PlanRecord] = {}
    outcomes: dict[str, str] = {}
    approvals: dict[str, str] = {}
    for record in read_records(path, memory.torn_lines):
        event = record.get("event")
        fid = str(record.get("finding_id", ""))
        if event == "approval" and fid:
            approvals[fid] = str(record.get("by", ""))
            memory.approved_plans.add(fid)
        elif event == "finding" and fid:
            findings[fid] = record
            if record.get("digest"):
                memory.finding_digests[fid] = str(record["digest"])
        elif event == "decision" and fid:
            if record.get("verdict") != "duplicate":
                approvals.pop(fid, None)  # decided since: the approval took effect
            if record.get("verdict") == "queue_full":  # dropped: a re-send starts afresh
                memory.approved_plans.discard(fid)
            if record.get("verdict") != "queue_full":  # (not queued: a re-send is decided)
                memory.saw(fid, float(record.get("t", 0.0)))  # decided, durably: a duplicate
            if record.get("verdict") != "duplicate":
                received = float((findings.get(fid) or record).get("t", record.get("t", 0.0)))
                latest[fid] = PlanRecord(record, findings.get(fid), received)
            if record.get("verdict") in NOTIFY_ONCE_VERDICTS and record.get("actions"):
                key = (str(record.get("node", "")), str(record.get("policy", "")),
                       str(record["verdict"]))  # fmt: skip
                memory.told[key] = to_mono(float(record.get("t", 0.0)))
        elif event == "compacted":
            horizon = record.get("horizon_t")
            if isinstance(horizon, int | float):
                memory.compacted_horizon = max(memory.compacted_horizon, float(horizon))
        elif event == "expired" and fid:
            latest.pop(fid, None)
            memory.approved_plans.discard(fid)
        elif event == "intent" and record.get("action_id"):
            memory.intents[str(record["action_id"])] = record
        elif event == "action" and record.get("action_id"):
            memory.note_action(record, to_mono(float(record.get("t", 0.0))))
            outcomes[str(record["action_id"])] = str(record.get("outcome", ""))
    for p in latest.values():
        verdict = p.decision.get("verdict")
        if verdict in WAITING_VERDICTS:
            memory.waiting.append(p)
            fid = str(p.decision.get("finding_id", ""))
            if verdict == "approval" and fid in approvals:
                memory.approved[fid] = approvals[fid]
        elif verdict in RUNNING_VERDICTS and not finished(p.decision, outcomes):
            memory.unfinished.append(p)
    # only plans still waiting are restored with their approval: the rest are done with
    memory.approved_plans &= {str(p.decision.get("finding_id", "")) for p in memory.waiting}
    return memory


def finished(decision: Mapping[str, Any], outcomes: Mapping[str, str]) -> bool:
    """Every action of the plan has its record, or a removing action failed (the ladder
    stops there). Decisions from before the journal recorded plans count as finished."""
    for action in decision.get("plan") or []:
        outcome = outcomes.get(str(action.get("action_id")))
        if outcome is None:
            return False
        if action.get("action") in REMOVING_KINDS and outcome not in ("ok", "dry_run"):
            return True
    return True
