"""Scores of a failure predictor: PR-AUC, precision and recall at the operating threshold,
the random baseline, and lead time (how long before each failure the first alert fired)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import average_precision_score


def pr_auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the precision-recall curve (average precision); ties count as one step."""
    if y.sum() == 0:
        return float("nan")
    return float(average_precision_score(y.astype(int), score))


def random_pr_auc(y: np.ndarray, repeats: int = 50, seed: int = 0) -> float:
    """PR-AUC of a random score, averaged (it converges on the positive rate)."""
    rng = np.random.default_rng(seed)
    return float(np.mean([pr_auc(y, rng.random(len(y))) for _ in range(repeats)]))


@dataclass(frozen=True)
class AtThreshold:
    threshold: float
    precision: float
    recall: float
    alerts: int


def at_threshold(y: np.ndarray, score: np.ndarray, threshold: float) -> AtThreshold:
    hit = score >= threshold
    tp = int((hit & (y == 1)).sum())
    precision = tp / hit.sum() if hit.sum() else float("nan")
    recall = tp / (y == 1).sum() if (y == 1).sum() else float("nan")
    return AtThreshold(threshold, float(precision), float(recall), int(hit.sum()))


def lead_times(
    alert_times: Sequence[float], failure_times: Sequence[float], horizon_s: float
) -> list[float | None]:
    """For each failure of one subject: seconds from the first alert in the ``horizon_s``
    before it (and after the previous failure) to the failure; None when none fired."""
    alerts = np.sort(np.asarray(alert_times, dtype=np.float64))
    out: list[float | None] = []
    previous = -np.inf
    for f in sorted(failure_times):
        lo = max(previous, f - horizon_s)
        inside = alerts[(alerts > lo) & (alerts <= f)]
        out.append(float(f - inside[0]) if inside.size else None)
        previous = f
    return out
