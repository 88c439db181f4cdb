"""The true cause of each slowed rank of a SIMULATED scenario, and a score of blamed causes.

Each slowdown fault type names the cause a straggler it slows should be blamed on
(:attr:`simulation.faulttypes.FaultType.cause`); :func:`true_causes` applies the type's own
``slowdown`` mask to the job's ranks where it ran while the fault was on. A rank slowed by two
faults at once is blamed on the more local one (:data:`CAUSES` is ordered from the GPU out): a
slow GPU under a congested switch is slower than its node peers, which share the switch, so the
GPU is what sets it apart.

:func:`score` compares those with what analytics blamed, straggler by straggler (the
attribution's own output; this module imports nothing of analytics): a confusion table, and
precision, recall and F1 per cause. A straggler no fault slowed has the true cause ``none``;
a blamed ``unknown`` is an abstention, a miss for the true cause and a class of its own for
nobody.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpuwarden.simulation.faulttypes import of
from gpuwarden.simulation.generator import ScenarioGenerator

CAUSES = ("gpu", "pcie", "power", "nic", "stage")
"""Most local first: a rank slowed by several faults is blamed on the first."""
NONE, UNKNOWN = "none", "unknown"


def true_causes(
    gen: ScenarioGenerator, job: str, start_s: float, end_s: float, min_overlap_s: float = 120.0
) -> dict[str, str]:
    """Rank -> cause, for every rank of ``job`` that a slowdown fault held back for at least
    ``min_overlap_s`` of ``[start_s, end_s)`` (seconds into the scenario)."""
    plan = next(p for p in gen.jobs if p.spec.name == job)
    out: dict[str, str] = {}
    for f in gen.faults:
        cause = of(f).cause
        lo, hi = max(f.onset_s, start_s), min(f.end_s, end_s)
        if cause is None or hi - lo < min_overlap_s:
            continue
        nodes = plan.nodes_at((lo + hi) / 2)
        if nodes is None:
            continue
        mask = of(f).slowdown(f, job, gen.schedule.ranks(plan.spec, nodes), gen.switch_of)
        if mask is None:
            continue
        for r in np.flatnonzero(mask):
            rank = str(int(r))
            if rank not in out or CAUSES.index(cause) < CAUSES.index(out[rank]):
                out[rank] = cause
    return out


@dataclass(frozen=True)
class PerCause:
    cause: str
    precision: float
    recall: float
    f1: float
    support: int
    """Stragglers whose true cause this is."""


@dataclass
class Score:
    confusion: Counter[tuple[str, str]]
    """(true cause, blamed cause) -> stragglers."""

    def classes(self) -> list[str]:
        """The causes scored: every true cause, and every cause blamed (not ``unknown``)."""
        seen = {t for t, _ in self.confusion} | {b for _, b in self.confusion}
        extra = sorted(seen - set(CAUSES) - {NONE, UNKNOWN})
        return [c for c in (*CAUSES, *extra) if c in seen]

    def per_cause(self) -> list[PerCause]:
        out = []
        for c in self.classes():
            tp = self.confusion[(c, c)]
            blamed = sum(n for (_, b), n in self.confusion.items() if b == c)
            support = sum(n for (t, _), n in self.confusion.items() if t == c)
            p = tp / blamed if blamed else 0.0
            r = tp / support if support else 0.0
            f1 = 2 * p * r / (p + r) if p + r else 0.0
            out.append(PerCause(c, p, r, f1, support))
        return out

    def macro_f1(self) -> float:
        rows = self.per_cause()
        return sum(r.f1 for r in rows) / len(rows) if rows else 0.0

    def __iadd__(self, other: Score) -> Score:
        self.confusion += other.confusion
        return self

    def table(self) -> str:
        """The confusion table (rows: true cause; columns: blamed) and the per-cause scores."""
        truths = [c for c in (*self.classes(), NONE) if any(t == c for t, _ in self.confusion)]
        blames = [c for c in (*self.classes(), UNKNOWN) if any(b == c for _, b in self.confusion)]
        lines = ["true \\ blamed | " + " | ".join(f"{b:>7}" for b in blames)]
        for t in truths:
            cells = " | ".join(f"{self.confusion[(t, b)]:>7}" for b in blames)
            lines.append(f"{t:>13} | {cells}")
        lines.append("")
        lines.append("cause | precision | recall | F1 | stragglers")
        for r in self.per_cause():
            lines.append(
                f"{r.cause:>5} | {r.precision:9.3f} | {r.recall:6.3f} | {r.f1:.3f} | {r.support}"
            )
        return "\n".join(lines)


def score(truth: Mapping[str, str], blamed: Mapping[str, str]) -> Score:
    """Each straggler (a rank in ``blamed``) with its true cause (``none`` if no fault slowed
    it) against the cause blamed."""
    return Score(Counter((truth.get(rank, NONE), cause) for rank, cause in blamed.items()))
