"""Failure predictor (issue 6): leakage rules of history features and labels, and the REAL
StepFun trace: the model against shuffled labels (must-show 3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from gpuwarden.analytics.predict.history import DAY_S, HISTORY_FEATURES, FaultEvent, history_frame
from gpuwarden.analytics.predict.metrics import at_threshold, lead_times, pr_auc, random_pr_auc
from gpuwarden.analytics.predict.model import ModelError, RiskModel, fit, fit_selected, time_split
from gpuwarden.analytics.predict.stepfun import problem


def test_history_features_see_only_the_past() -> None:
    """Adding a fault after t changes no feature at t; the label at t sees it; a node inside
    a fault is down; repairs count only once they ended."""
    times = np.array([10.0, 20.0, 30.0]) * DAY_S
    past = [FaultEvent("n", 5 * DAY_S, 6 * DAY_S, failure=True)]
    future = [*past, FaultEvent("n", 25 * DAY_S, 27 * DAY_S, failure=True)]
    a = history_frame(past, ["n"], times, horizons_s=(7 * DAY_S,))
    b = history_frame(future, ["n"], times, horizons_s=(7 * DAY_S,))
    assert (
        a.filter(pl.col("t") <= 20 * DAY_S)
        .select(HISTORY_FEATURES)
        .equals(b.filter(pl.col("t") <= 20 * DAY_S).select(HISTORY_FEATURES))
    )
    assert b["y_604800s"].to_list() == [False, True, False]
    assert b["down"].to_list() == [False, False, False]
    row = b.row(2, named=True)
    assert row["failures_total"] == 2 and row["failures_7d"] == 1
    assert row["days_since_failure"] == pytest.approx(5.0)
    assert row["days_since_repair"] == pytest.approx(3.0)
    open_fault = [FaultEvent("n", 19 * DAY_S, None, failure=True)]
    c = history_frame(open_fault, ["n"], times)
    assert c["down"].to_list() == [False, True, True]
    assert c["days_since_repair"][2] > 1000  # no repair yet: "never"
    software = [FaultEvent("n", 5 * DAY_S, 6 * DAY_S, failure=False)]
    d = history_frame(software, ["n"], times, horizons_s=(30 * DAY_S,))
    assert d["failures_total"].sum() == 0 and d["faults_total"][0] == 1
    assert not d["y_2592000s"].any()


def test_time_split_leaves_a_horizon_long_gap() -> None:
    p = problem()
    train, test = time_split(p.frame, p.split_s, p.gap_s)
    assert train["t"].max() + p.gap_s < p.split_s <= test["t"].min()  # type: ignore[operator]
    assert not p.frame["down"].any()
    # the never-failed servers are subjects too (400 in the paper's cluster)
    assert p.frame["subject"].n_unique() == 400


def test_metrics() -> None:
    y = np.array([0, 0, 1, 1])
    assert pr_auc(y, np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    a = at_threshold(y, np.array([0.1, 0.6, 0.8, 0.9]), 0.5)
    assert a.precision == pytest.approx(2 / 3) and (a.recall, a.alerts) == (1.0, 3)
    assert random_pr_auc(np.array([0] * 90 + [1] * 10), repeats=200) == pytest.approx(0.1, abs=0.04)
    # one alert before the first failure, none before the second
    assert lead_times([100.0, 150.0], [400.0, 900.0], horizon_s=600.0) == [300.0, None]


@pytest.fixture(scope="module")
def stepfun() -> tuple[pl.DataFrame, pl.DataFrame, str, float]:
    p = problem()
    train, test = time_split(p.frame, p.split_s, p.gap_s)
    return train, test, p.label, p.gap_s


def test_shuffled_labels_score_under_twice_chance_and_far_below_the_real_ones(
    stepfun: tuple[pl.DataFrame, pl.DataFrame, str, float],
) -> None:
    """Must-show 3, on the REAL StepFun trace, stated as what holds. Trained on labels shuffled
    across time, the model does *not* score at chance: measured over seeds 0-4, its PR-AUC is
    1.0 to 1.9 times the positive rate (0.0163 to 0.0315 against 0.0166), above the 99th
    percentile of random scores (0.0187) in three of the five, because a model fitted to noise
    still orders nodes by the size of their features, and a node's fault history carries some
    of the signal by itself. The bound tested: shuffled labels stay under twice the positive
    rate on average, and the real labels (0.0595, 3.6 times) beat three times chance and twice
    the shuffled average. (Before, this test was called "at chance" and asserted the same
    loose bound.)"""
    train, test, label, horizon = stepfun
    y = test[label].to_numpy().astype(int)
    chance = float(y.mean())
    real = pr_auc(y, fit_selected(train, HISTORY_FEATURES, label, horizon_s=horizon).predict(test))
    shuffled = []
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(train[label].to_numpy())
        noise = train.with_columns(pl.Series(label, perm))
        model = fit_selected(noise, HISTORY_FEATURES, label, horizon_s=horizon, seed=seed)
        shuffled.append(pr_auc(y, model.predict(test)))
    assert np.mean(shuffled) < 2 * chance, (shuffled, chance)
    assert real > 3 * chance and real > 2 * np.mean(shuffled), (real, shuffled, chance)


def test_model_saves_and_loads_with_its_metadata(
    tmp_path: Path, stepfun: tuple[pl.DataFrame, pl.DataFrame, str, float]
) -> None:
    train, test, label, horizon = stepfun
    model = fit(train, HISTORY_FEATURES, label, horizon_s=horizon, version="t1")
    model.save(tmp_path / "m.pkl")
    back = RiskModel.load(tmp_path / "m.pkl")
    assert back.meta == model.meta and back.meta.features == list(HISTORY_FEATURES)
    assert np.allclose(back.predict(test.head(100)), model.predict(test.head(100)))
    assert (tmp_path / "m.pkl.json").exists()
    with pytest.raises(ModelError, match="needs features"):
        back.predict(test.drop("failures_total"))
    (tmp_path / "bad").write_text("not a model")
    with pytest.raises(ModelError, match=r"cannot load|not a gpuwarden"):
        RiskModel.load(tmp_path / "bad")
    with pytest.raises(ModelError, match="nothing to learn"):
        fit(
            train.with_columns(pl.lit(False).alias(label)),
            HISTORY_FEATURES,
            label,
            horizon_s=horizon,
        )
