"""The append-only audit log: finding → decision → action → outcome, with timings.

One JSON object per line, flushed and fsynced per record (remediation is rare; losing the
record of a drain is not acceptable). Every record has ``event`` (``finding``, ``decision``,
``action``, ``approval``, ``undo``), the wall time ``time`` (RFC 3339, UTC) and ``t`` (Unix
seconds); actions carry ``duration_s`` and ``since_finding_s`` (finding received → outcome).

On start the engine reads the log back (:func:`replay`) to restore what it must not forget
over a restart: the findings it has already seen (de-duplication), the actions it has done
(idempotency), when it last acted on each node (cooldown) and which nodes it took out itself
(undo never resumes a node someone else drained). A torn last line (power cut mid-write) is
skipped and counted, not fatal.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _now_iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AuditLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def append(self, event: str, t: float, **record: Any) -> dict[str, Any]:
        entry = {"event": event, "time": _now_iso(t), "t": round(t, 6), **record}
        line = json.dumps(entry, sort_keys=False, default=str) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        return entry

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
            except json.JSONDecodeError:
                if torn is not None:
                    torn.append(number)
                continue
            if isinstance(record, dict):
                yield record


@dataclass
class Memory:
    """What the engine remembers across restarts (rebuilt from the audit log)."""

    seen_findings: set[str] = field(default_factory=set)
    finding_digests: dict[str, str] = field(default_factory=dict)
    """Each seen finding's content digest (:attr:`Finding.digest`), where the audit has it: a
    duplicate is answered "same content" only when they match."""
    done_actions: set[str] = field(default_factory=set)
    last_action_at: dict[str, float] = field(default_factory=dict)
    taken_out: set[str] = field(default_factory=set)
    taken_out_at: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    """Every time gpuwarden took each node out, and why (the lemon rule reads it)."""
    torn_lines: list[int] = field(default_factory=list)

    def note_action(self, record: Mapping[str, Any]) -> None:
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
            self.last_action_at[node] = float(record["t"])
        if action in ("cordon", "drain"):
            if node not in self.taken_out:
                times = self.taken_out_at.setdefault(node, [])
                times.append((float(record["t"]), str(record.get("reason", ""))))
            self.taken_out.add(node)
        elif action == "uncordon":
            self.taken_out.discard(node)


def replay(path: str | Path) -> Memory:
    memory = Memory()
    for record in read_records(path, memory.torn_lines):
        event = record.get("event")
        if event == "finding" and record.get("finding_id"):
            memory.seen_findings.add(str(record["finding_id"]))
            if record.get("digest"):
                memory.finding_digests[str(record["finding_id"])] = str(record["digest"])
        elif event == "action" and record.get("action_id"):
            memory.note_action(record)
    return memory
