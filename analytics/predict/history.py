"""A node's own fault history as features, and "fails within H" labels, on a time grid.

Meta's "lemon node" signals (the same few nodes fail again and again; cutting them out took
large-job failures from 14 % to 4 %) need nothing but the fault log: how often a node failed,
how recently, and how long since its last repair. These are the features the StepFun benchmark
uses alone (``benchmarks/predict_stepfun.py``) and the telemetry predictor adds to its own.

Leakage rules, enforced here and tested: a feature at decision time ``t`` uses only faults that
*started* at or before ``t`` (a repair end after ``t`` is unknown at ``t``); a label at ``t`` is
whether a failure starts in ``(t, t + horizon]``; a subject that is inside a fault at ``t`` is
``down`` and is neither scored nor evaluated (it is already out of service).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

DAY_S = 86_400.0
#: history windows, seconds
WINDOWS_S = (7 * DAY_S, 30 * DAY_S, 90 * DAY_S)
#: "never" for time-since features: longer than any history we keep
NEVER_S = 10 * 365 * DAY_S


@dataclass(frozen=True)
class FaultEvent:
    """One fault of one subject (a node, or ``node/gpu``); times in seconds on any epoch.

    ``failure`` marks the events that count as a failure to predict (the label rules); the
    others (software faults, stress-test failures, non-fatal XIDs) are history only."""

    subject: str
    start_s: float
    end_s: float | None
    failure: bool
    kind: str = ""


HISTORY_FEATURES = (
    "failures_total",
    *(f"failures_{int(w // DAY_S)}d" for w in WINDOWS_S),
    "faults_total",
    *(f"faults_{int(w // DAY_S)}d" for w in WINDOWS_S),
    "days_since_failure",
    "days_since_fault",
    "days_since_repair",
)


def _by_subject(events: Sequence[FaultEvent]) -> dict[str, list[FaultEvent]]:
    out: dict[str, list[FaultEvent]] = defaultdict(list)
    for e in events:
        out[e.subject].append(e)
    for v in out.values():
        v.sort(key=lambda e: e.start_s)
    return out


def _since(starts: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Seconds since the latest start at or before each time (NEVER_S when none)."""
    idx = np.searchsorted(starts, times, side="right") - 1
    out = np.full(times.shape, NEVER_S)
    ok = idx >= 0
    out[ok] = times[ok] - starts[idx[ok]]
    return out


def _count(starts: np.ndarray, times: np.ndarray, window: float | None) -> np.ndarray:
    upto = np.searchsorted(starts, times, side="right")
    if window is None:
        return upto.astype(np.float64)
    after = np.searchsorted(starts, times - window, side="right")
    return (upto - after).astype(np.float64)


def history_frame(
    events: Sequence[FaultEvent],
    subjects: Sequence[str],
    times_s: np.ndarray,
    horizons_s: Sequence[float] = (),
) -> pl.DataFrame:
    """One row per (subject, decision time): history features, ``down``, and ``y_<h>s`` labels.

    Repairs count only when they ended at or before ``t`` (an open fault has no repair yet)."""
    grouped = _by_subject(events)
    times = np.asarray(times_s, dtype=np.float64)
    frames = []
    for subject in subjects:
        evs = grouped.get(subject, [])
        starts = np.array([e.start_s for e in evs], dtype=np.float64)
        fail = np.array([e.start_s for e in evs if e.failure], dtype=np.float64)
        cols: dict[str, np.ndarray | list[str]] = {"subject": [subject] * len(times), "t": times}
        cols["failures_total"] = _count(fail, times, None)
        for w in WINDOWS_S:
            cols[f"failures_{int(w // DAY_S)}d"] = _count(fail, times, w)
        cols["faults_total"] = _count(starts, times, None)
        for w in WINDOWS_S:
            cols[f"faults_{int(w // DAY_S)}d"] = _count(starts, times, w)
        cols["days_since_failure"] = _since(fail, times) / DAY_S
        cols["days_since_fault"] = _since(starts, times) / DAY_S
        ends = np.sort(np.array([e.end_s for e in evs if e.end_s is not None], dtype=np.float64))
        cols["days_since_repair"] = _since(ends, times) / DAY_S
        down = np.zeros(times.shape, dtype=bool)
        for e in evs:
            end = e.end_s if e.end_s is not None else np.inf
            down |= (times >= e.start_s) & (times < end)
        cols["down"] = down
        nxt = np.searchsorted(fail, times, side="right")  # the first failure after t
        padded = np.append(fail, np.inf)
        for h in horizons_s:
            cols[f"y_{int(h)}s"] = padded[nxt] <= times + h
        frames.append(pl.DataFrame(cols))
    return pl.concat(frames) if frames else pl.DataFrame()
