"""Time as operators type it and as the wire carries it, parsed in one place.

* :func:`parse_when`: ``now`` or an ISO 8601 time (``Z`` or an offset; UTC when none is given),
  as nanoseconds since the epoch. Every ``--start``/``--end``/``--from``/``--to`` uses it.
* :func:`parse_iso`: an ISO 8601 time as an aware ``datetime`` (Alertmanager's and Grafana's
  ``startsAt``, a scenario's ``start``).
* :func:`parse_duration_s`: ``60``, ``60s``, ``5m``, ``1h``, ``1d`` as seconds.
  Grafana's own duration strings (``10s`` as milliseconds) stay with the dashboards.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

NS = 1_000_000_000
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_iso(text: str) -> datetime:
    """An ISO 8601 time, ``Z`` accepted; a time without a zone is UTC. ``ValueError`` if not."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def parse_when(text: str) -> int:
    """``now`` or an ISO time (UTC when no zone is given) as nanoseconds since the epoch."""
    if text == "now":
        return time.time_ns()
    return int(parse_iso(text).timestamp() * NS)


def parse_duration_s(text: str) -> float:
    """``60``, ``60s``, ``5m``, ``1h``, ``1d`` -> seconds; ``ValueError`` for anything else."""
    text = text.strip()
    try:
        if text and text[-1] in _UNITS:
            return float(text[:-1]) * _UNITS[text[-1]]
        return float(text)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (e.g. 60s, 5m)") from None


def duration_arg(text: str) -> float:
    """:func:`parse_duration_s` as an ``argparse`` type (its message, not argparse's own)."""
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
