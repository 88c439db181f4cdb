"""The REAL StepFun fault trace: 584 faults on 400 servers over 349 days.

stepfun-ai/InfiniteHBD-Trace @ 7aacdc8c (InfiniteHBD, SIGCOMM'25), Apache-2.0, copied from
``shared/data/stepfun-fault-trace`` with starts paired with ends (``core/data/stepfun/``, with
its licence and source). The trace lists only the 231 servers that had a fault; the other 169
of the paper's 400 never did.

It is shared by two rooms, which is why it lives here: analytics uses it as a real prior for
failure rates and as a real prediction problem (:mod:`analytics.predict.stepfun`), and the
scenario generator replays its arrival process, type mix and repair times
(:mod:`simulation.faults`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

SOURCE = "REAL: stepfun-ai/InfiniteHBD-Trace @ 7aacdc8c (Apache-2.0), via ../shared/data/"
STEPFUN_SERVERS = 400  # the InfiniteHBD paper's cluster size for this trace
STEPFUN_DAYS = 349.0


@dataclass(frozen=True)
class FaultRecord:
    """One StepFun fault interval (days since the trace's first event)."""

    node: str
    level: str
    klass: str
    desc: str
    start_d: float
    end_d: float


@cache
def stepfun_faults() -> tuple[FaultRecord, ...]:
    path = resources.files("gpuwarden.core").joinpath("data/stepfun/stepfun_fault_intervals.csv")
    rows = csv.DictReader(path.read_text(encoding="utf-8-sig").splitlines())
    return tuple(
        FaultRecord(
            r["node"],
            r["Level"],
            r["Class"],
            r["Desc"],
            float(r["start"]),
            float(r["end"]),
        )
        for r in rows
    )
