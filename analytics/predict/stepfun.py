"""The REAL StepFun fault trace (InfiniteHBD, 584 faults on 400 servers over 349 days) as a
prediction problem: which nodes have a hardware fault in the next 7 days, from the fault
history alone. Used by ``benchmarks/predict_stepfun.py`` and the leakage tests.

The trace lists only the 231 servers that had any fault; the other 169 of the paper's 400
never did and are kept as subjects with empty histories (leaving them out would inflate every
score). Decision times are daily; labels are hardware faults (``Level == "Hardware Failure"``);
software and "other" faults (stress-test failures among them) are history, not labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from gpuwarden.analytics.predict.history import DAY_S, FaultEvent, history_frame
from gpuwarden.core.faulttrace import STEPFUN_DAYS, STEPFUN_SERVERS, stepfun_faults

HORIZON_S = 7 * DAY_S


@dataclass(frozen=True)
class StepfunProblem:
    frame: pl.DataFrame  # subject, t, history features, down, y_<h>s
    label: str
    split_s: float
    gap_s: float


def events() -> list[FaultEvent]:
    return [
        FaultEvent(
            r.node,
            r.start_d * DAY_S,
            r.end_d * DAY_S,
            failure=r.level == "Hardware Failure",
            kind=f"{r.klass}: {r.desc}",
        )
        for r in stepfun_faults()
    ]


def problem(split_day: float = 236.0, first_day: float = 14.0) -> StepfunProblem:
    """Daily decisions from ``first_day``; test from ``split_day`` (about 60 % of the
    hardware faults fall before it); training decisions stop 7 days before it."""
    evs = events()
    servers = sorted({e.subject for e in evs})
    subjects = servers + [f"never-failed-{i}" for i in range(STEPFUN_SERVERS - len(servers))]
    last = STEPFUN_DAYS - HORIZON_S / DAY_S
    times = np.arange(first_day, last, 1.0) * DAY_S
    frame = history_frame(evs, subjects, times, horizons_s=(HORIZON_S,))
    frame = frame.filter(~pl.col("down"))
    return StepfunProblem(frame, f"y_{int(HORIZON_S)}s", split_day * DAY_S, HORIZON_S)
