"""NVML answers from a file, and a recorder that writes such a file from a real GPU.

The file is JSON (``format: gpuwarden-nvml/1``)::

    {"format": "gpuwarden-nvml/1",
     "provenance": "recorded" | "constructed",
     "note": "where it comes from (GPU, driver) or how it was constructed",
     "ticks": [{"answers": {"0|nvmlDeviceGetPowerUsage|[]": {"v": 351234},
                            "3|nvmlDeviceGetTemperature|[0]": {"e": 15}},
                "events": [[3, 8, 79]]},
               ...]}

A key is ``device|call|args`` (device ``-`` for system calls, args as compact JSON); an answer
is a value ``v`` or an NVML return code ``e``. Each tick lists only what changed: answers carry
over from earlier ticks, so a constructed case states its first tick in full and then only the
differences. ``events`` are the critical-XID events that arrive during the tick. A call that
was never recorded answers ``ERROR_FUNCTION_NOT_FOUND`` (the recorded machine was not asked),
except ``nvmlDeviceGetFieldValues`` with a request the recording does not hold: it is answered
field by field from the requests it does hold, so a recording stays usable when the collector
asks for more fields than it did when the recording was made (the new ones: not supported).

"constructed" recordings are written by hand or by a script from NVML's documented behaviour;
they say so in ``provenance`` and every test or report that uses one must too; "simulated" ones
are written live by the twin cluster's hardware (:mod:`simulation.twin`).

**Following a file** (``follow``): the backend reads the recording again at each cycle in
which the file changed (its writer replaces it whole, by rename), and takes the state it ends
with. Each tick then carries an ``id`` (increasing), and its events are delivered once, when
a tick with a higher id than any seen before appears: a writer keeps the last few ticks'
events in the file, so a cycle that falls between two writes loses none and repeats none.
This is how a simulated node's hardware drives a real agent.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from pathlib import Path
from typing import Any

from gpuwarden.collector.errors import CollectorError
from gpuwarden.collector.nvml.backend import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    NvmlBackend,
    NvmlError,
)

FORMAT = "gpuwarden-nvml/1"


class RecordingError(CollectorError):
    """A recording file that cannot be used (the message says which part is wrong)."""


_KEYS: dict[tuple[Any, ...], str] = {}


def call_key(device: int | None, name: str, args: tuple[Any, ...]) -> str:
    """``device|call|args``; memoised when the arguments are hashable (tuples, numbers)."""
    try:
        return _KEYS[(device, name, args)]
    except KeyError:
        pass
    except TypeError:  # a list argument: not cached
        return _make_key(device, name, args)
    key = _make_key(device, name, args)
    if len(_KEYS) < 100_000:
        _KEYS[(device, name, args)] = key
    return key


def _make_key(device: int | None, name: str, args: tuple[Any, ...]) -> str:
    dev = "-" if device is None else str(device)
    return f"{dev}|{name}|{json.dumps(list(args), separators=(',', ':'))}"


class RecordedBackend:
    """Answers from a recording, one tick per collection cycle.

    ``loop``: after the last tick start again at the first (benchmarks); otherwise stay on the
    last tick. ``follow``: the file is rewritten by a live writer; each cycle takes its newest
    state (see the module docstring). Construction reads nothing; ``init`` loads the file."""

    def __init__(self, path: str | Path, *, loop: bool = False, follow: bool = False) -> None:
        self.path = Path(path)
        self.loop = loop
        self.follow = follow
        self._stamp: tuple[int, int, int] | None = None  # the followed file as last read
        self._last_id = -1
        self.provenance = ""
        self.note = ""
        self._ticks: list[dict[str, Any]] = []
        self._tick = -1
        self._answers: dict[str, Any] = {}
        self._pairs: dict[int, dict[tuple[int, int], list[Any]] | NvmlError] = {}
        self._base: dict[str, Any] = {}
        self._events: deque[list[int]] = deque()
        self._cond = threading.Condition()

    def init(self) -> None:
        doc = self._load()
        if self.follow:
            self._stamp = None
            self._last_id = -1
        self._ticks = self._checked(doc)
        self._tick = -1
        self._answers = {}
        self._pairs = {}

    def _load(self) -> Any:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RecordingError(f"cannot read NVML recording {self.path}: {exc}") from exc

    def _checked(self, doc: Any) -> list[dict[str, Any]]:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise RecordingError(f"{self.path}: not a {FORMAT} recording")
        ticks = doc.get("ticks")
        if not isinstance(ticks, list) or not ticks:
            raise RecordingError(f"{self.path}: a recording needs at least one tick")
        for i, tick in enumerate(ticks):
            if not isinstance(tick, dict) or not isinstance(tick.get("answers", {}), dict):
                raise RecordingError(f"{self.path}: tick {i} must be an object with 'answers'")
        self.provenance = str(doc.get("provenance", ""))
        if self.provenance not in ("recorded", "constructed", "simulated"):
            raise RecordingError(
                f"{self.path}: provenance must be 'recorded', 'constructed' or 'simulated'"
            )
        self.note = str(doc.get("note", ""))
        return ticks

    def shutdown(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wake(self) -> None:
        """End an event wait in progress now (a recording can; the driver cannot)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def ticks(self) -> int:
        return len(self._ticks)

    def begin_cycle(self) -> None:
        if self.follow:
            self._follow()
            return
        nxt = self._tick + 1
        if nxt >= len(self._ticks):
            if not self.loop:
                self._events.clear()  # the last tick's events happened once
                return
            nxt = 0
        if nxt == 0:
            self._answers = {}
        tick = self._ticks[nxt]
        self._answers.update(tick.get("answers", {}))
        self._pairs = {}
        self._tick = nxt
        with self._cond:
            self._events.extend(tick.get("events", []))
            self._cond.notify_all()

    def _follow(self) -> None:
        """Take the followed file's newest state, and the events of ticks not seen before. A
        file that cannot be read now (its writer is between writes, or gone) leaves the last
        state standing: the GPUs answer as they last did."""
        try:
            st = self.path.stat()
        except OSError:
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            ticks = self._checked(self._load())
        except RecordingError:
            return
        self._stamp = stamp
        answers: dict[str, Any] = {}
        fresh: list[list[int]] = []
        last = self._last_id
        for tick in ticks:
            answers.update(tick.get("answers", {}))
            tick_id = tick.get("id")
            if isinstance(tick_id, int) and tick_id > self._last_id:
                fresh += tick.get("events", [])
                last = max(last, tick_id)
        self._last_id = last
        self._ticks = ticks
        self._answers = answers
        self._pairs = {}
        with self._cond:
            self._events.extend(fresh)
            self._cond.notify_all()

    def call(self, device: int | None, name: str, *args: Any) -> Any:
        if name == "nvmlEventSetWait":
            return self._wait(int(args[0]))
        answer = self._answers.get(call_key(device, name, args))
        if answer is None:
            if name == "nvmlDeviceGetFieldValues" and args and device is not None:
                return self._fields_by_pair(device, args[0])
            raise NvmlError(ERROR_FUNCTION_NOT_FOUND, f"{name}[{device}] (not in recording)")
        if "e" in answer:
            raise NvmlError(int(answer["e"]), f"{name}[{device}]")
        return answer["v"]

    def answers_of(self, device: int | None, name: str) -> list[tuple[Any, dict[str, Any]]]:
        """Every recorded ``(args, answer)`` of ``name`` on ``device`` as of this tick."""
        prefix = f"{'-' if device is None else device}|{name}|"
        return [
            (json.loads(key[len(prefix) :]), answer)
            for key, answer in self._answers.items()
            if key.startswith(prefix)
        ]

    def _fields_by_pair(self, device: int, ids: Any) -> list[list[Any]]:
        """A field request the recording does not hold as such, answered field by field from
        the requests it does hold (the collector asks for more fields than when the recording
        was made). A field never recorded answers NOT_SUPPORTED, as on a driver without it; a
        request that failed as a whole (a lost GPU) fails this one the same way."""
        pairs = self._pairs.get(device)
        if pairs is None:
            pairs = self._pairs[device] = self._pair_index(device)
        if isinstance(pairs, NvmlError):
            raise pairs
        if not pairs:
            raise NvmlError(ERROR_FUNCTION_NOT_FOUND, f"nvmlDeviceGetFieldValues[{device}] "
                            "(no field values in recording)")  # fmt: skip
        try:
            return [pairs.get((int(f), int(s)), [ERROR_NOT_SUPPORTED, None]) for f, s in ids]
        except (TypeError, ValueError) as exc:
            raise NvmlError(ERROR_INVALID_ARGUMENT, "nvmlDeviceGetFieldValues") from exc

    def _pair_index(self, device: int) -> dict[tuple[int, int], list[Any]] | NvmlError:
        pairs: dict[tuple[int, int], list[Any]] = {}
        for args, answer in self.answers_of(device, "nvmlDeviceGetFieldValues"):
            if "e" in answer:
                return NvmlError(int(answer["e"]), f"nvmlDeviceGetFieldValues[{device}]")
            (request,) = args
            for (fid, scope), value in zip(request, answer["v"], strict=True):
                pairs[(int(fid), int(scope))] = value
        return pairs

    def _wait(self, timeout_ms: int) -> list[int] | None:
        with self._cond:
            if not self._events and timeout_ms > 0:
                self._cond.wait(timeout_ms / 1000)
            return self._events.popleft() if self._events else None


class Recorder:
    """Wraps a backend (the real one) and records every answer it gives, tick by tick."""

    def __init__(self, inner: NvmlBackend, note: str = "") -> None:
        self.inner = inner
        self.note = note
        self._ticks: list[dict[str, Any]] = []
        self._state: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def concurrent_calls(self) -> bool:
        """As the backend it records (its answers are noted under a lock)."""
        return bool(getattr(self.inner, "concurrent_calls", False))

    def init(self) -> None:
        self.inner.init()

    def shutdown(self) -> None:
        self.inner.shutdown()

    def wake(self) -> None:
        wake = getattr(self.inner, "wake", None)
        if wake is not None:
            wake()

    def begin_cycle(self) -> None:
        self.inner.begin_cycle()
        with self._lock:
            self._ticks.append({"answers": {}, "events": []})

    def call(self, device: int | None, name: str, *args: Any) -> Any:
        try:
            value = self.inner.call(device, name, *args)
        except NvmlError as exc:
            self._note_answer(device, name, args, {"e": exc.code})
            raise
        if name == "nvmlEventSetWait":
            if value is not None:
                with self._lock:
                    self._current()["events"].append(value)
        else:
            self._note_answer(device, name, args, {"v": value})
        return value

    def _current(self) -> dict[str, Any]:
        if not self._ticks:
            self._ticks.append({"answers": {}, "events": []})
        return self._ticks[-1]

    def _note_answer(
        self, device: int | None, name: str, args: tuple[Any, ...], answer: dict[str, Any]
    ) -> None:
        key = call_key(device, name, args)
        with self._lock:
            if self._state.get(key) != answer:
                self._state[key] = answer
                self._current()["answers"][key] = answer

    def save(self, path: str | Path) -> None:
        with self._lock:
            # re-recording a constructed file must not launder it into "recorded"
            provenance = getattr(self.inner, "provenance", "") or "recorded"
            doc = {
                "format": FORMAT,
                "provenance": provenance,
                "note": self.note,
                "ticks": [{k: v for k, v in t.items() if v or k == "answers"} for t in self._ticks],
            }
        Path(path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
