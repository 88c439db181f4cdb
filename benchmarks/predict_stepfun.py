"""Which nodes have a hardware fault in the next 7 days, from fault history alone, on the REAL
StepFun trace (InfiniteHBD, 400 servers, 349 days): our model against "has faulted before" and
random, on a time split (train on days 14-228, test on days 236-342; the 7-day gap means no
training label sees a test-period fault).

    uv run python -m benchmarks.predict_stepfun

Last line: ``prauc_model=<x> prauc_history=<y> prauc_random=<z>``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gpuwarden.analytics.predict.history import HISTORY_FEATURES
from gpuwarden.analytics.predict.metrics import AtThreshold, at_threshold, pr_auc, random_pr_auc
from gpuwarden.analytics.predict.model import fit_selected, time_split
from gpuwarden.analytics.predict.stepfun import problem
from gpuwarden.core.faulttrace import SOURCE


def _f1(a: AtThreshold) -> float:
    if not a.alerts or a.precision + a.recall == 0:
        return 0.0
    return 2 * a.precision * a.recall / (a.precision + a.recall)


def main() -> None:
    p = problem()
    train, test = time_split(p.frame, p.split_s, p.gap_s)
    model = fit_selected(train, HISTORY_FEATURES, p.label, horizon_s=p.gap_s, version="stepfun")
    y = test[p.label].to_numpy().astype(int)
    score = model.predict(test)
    history = (test["failures_total"] > 0).cast(pl.Float64).to_numpy()
    pm, ph, pr = pr_auc(y, score), pr_auc(y, history), random_pr_auc(y)
    print(f"data: {SOURCE}")
    print(
        f"train: {train.height} node-days, {int(train[p.label].sum())} positive; "
        f"test: {test.height} node-days, {int(y.sum())} positive ({y.mean():.2%})"
    )
    # operating points: the model at the threshold with the best F1 on its *training* data
    # (chosen before the test period is seen); the baseline flags every node that failed before
    y_train = train[p.label].to_numpy().astype(int)
    s_train = model.predict(train)
    candidates = np.unique(np.quantile(s_train, np.linspace(0.5, 0.999, 200)))
    thr = max(candidates, key=lambda t: _f1(at_threshold(y_train, s_train, t)))
    print(f"model: {model.meta.notes}")
    for name, s, t in (("model", score, thr), ("has faulted before", history, 1.0)):
        a = at_threshold(y, s, t)
        print(
            f"{name}: PR-AUC {pr_auc(y, s):.4f}; at threshold {t:.4f}: {a.alerts} alerts, "
            f"precision {a.precision:.3f}, recall {a.recall:.3f}"
        )
    print(f"prauc_model={pm:.4f} prauc_history={ph:.4f} prauc_random={pr:.4f}")


if __name__ == "__main__":
    main()
