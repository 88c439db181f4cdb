"""Training, calibration, saving and loading of a failure-risk model.

Gradient boosting (scikit-learn's ``HistGradientBoostingClassifier``: fast, handles missing
values, no scaling) with ``class_weight="balanced"`` for the rare positives, then sigmoid
calibration on the *latest* slice of the training period, so the probabilities mean what they
say on data that comes after what the trees saw. Splits are by time with a gap of at least the
label horizon (:func:`time_split`): a training label never looks into the test period.

A saved model is one pickle file (the fitted estimator and its metadata: features, horizon,
training window, metrics, threshold) plus the same metadata as JSON beside it for people.
Loading unpickles: load only models you trained yourself.
"""

from __future__ import annotations

import json
import pickle
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from sklearn.calibration import CalibratedClassifierCV
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.frozen import FrozenEstimator

from gpuwarden.analytics.errors import AnalyticsError

FORMAT = 1


class ModelError(AnalyticsError):
    """A model that cannot be trained (no positives), loaded or applied (missing features)."""


@dataclass
class Metadata:
    features: list[str]
    label: str
    horizon_s: float
    threshold: float
    train_start_s: float
    train_end_s: float
    rows: int
    positives: int
    version: str
    metrics: dict[str, float] = field(default_factory=dict)
    notes: str = ""


@dataclass
class RiskModel:
    estimator: Any
    meta: Metadata

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        """Calibrated probability of a failure within the horizon, one per row."""
        missing = [f for f in self.meta.features if f not in frame.columns]
        if missing:
            raise ModelError(f"model {self.meta.version} needs features {missing}")
        x = frame.select(self.meta.features).to_numpy().astype(np.float64)
        return np.asarray(self.estimator.predict_proba(x)[:, 1], dtype=np.float64)

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "meta": asdict(self.meta), "estimator": self.estimator}
        p.write_bytes(pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL))
        p.with_suffix(p.suffix + ".json").write_text(
            json.dumps(asdict(self.meta), indent=2) + "\n", encoding="utf-8"
        )

    @classmethod
    def load(cls, path: str | Path) -> RiskModel:
        try:
            data = pickle.loads(Path(path).read_bytes())
        except MemoryError:
            raise
        except Exception as exc:  # unpickling garbage raises almost anything
            raise ModelError(f"cannot load model {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ModelError(f"{path} is not a gpuwarden risk model (format {FORMAT})")
        return cls(data["estimator"], Metadata(**data["meta"]))


def time_split(
    frame: pl.DataFrame, split_s: float, gap_s: float
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Rows decided before ``split_s - gap_s`` train; rows from ``split_s`` on test. With
    ``gap_s`` >= the label horizon, no training label covers a test-period failure."""
    return frame.filter(pl.col("t") < split_s - gap_s), frame.filter(pl.col("t") >= split_s)


def fit(
    frame: pl.DataFrame,
    features: Sequence[str],
    label: str,
    *,
    horizon_s: float,
    threshold: float = 0.5,
    calibration_share: float = 0.25,
    seed: int = 0,
    version: str = "",
    params: Mapping[str, Any] | None = None,
    monotone: Mapping[str, int] | None = None,
    max_negatives: int = 150_000,
) -> RiskModel:
    """``monotone`` maps a feature to +1 (risk never falls as it grows) or -1. Beyond
    ``max_negatives`` negative rows, negatives are sampled (every positive kept) and weighted
    up by the inverse of the sampling rate, so the calibrated probabilities stay true.

    Fit on the earlier ``1 - calibration_share`` of the rows (by time), calibrate on the
    rest. ``frame`` must not contain ``down`` rows (the caller drops them)."""
    frame = frame.sort("t")
    y_all = frame[label].to_numpy().astype(int)
    if y_all.sum() < 2:
        raise ModelError(f"{int(y_all.sum())} positive rows of {label}: nothing to learn from")
    n_neg = int((y_all == 0).sum())
    rate = min(1.0, max_negatives / n_neg) if n_neg else 1.0
    keep = pl.col(label) | (pl.int_range(pl.len()).shuffle(seed).truediv(pl.len()) < rate)
    weight = pl.when(pl.col(label)).then(1.0).otherwise(1.0 / rate).alias("_weight")
    rows = frame.height
    frame = frame.filter(keep).with_columns(weight)
    cut_t = float(np.quantile(frame["t"].to_numpy(), 1.0 - calibration_share))
    early = frame.filter(pl.col("t") < cut_t)
    late = frame.filter(pl.col("t") >= cut_t)
    if early[label].sum() < 1 or late[label].sum() < 1:  # too few to split: calibrate in-sample
        early = late = frame
    x_early = early.select(features).to_numpy().astype(np.float64)
    trees = HistGradientBoostingClassifier(
        **{
            "max_iter": 200,
            "learning_rate": 0.05,
            "max_leaf_nodes": 15,
            "min_samples_leaf": 20,
            "l2_regularization": 1.0,
            "class_weight": "balanced",
            "random_state": seed,
            "monotonic_cst": [int((monotone or {}).get(f, 0)) for f in features],
            **(params or {}),
        }
    )
    trees.fit(
        x_early, early[label].to_numpy().astype(int), sample_weight=early["_weight"].to_numpy()
    )
    calibrated = CalibratedClassifierCV(FrozenEstimator(trees), method="sigmoid")
    with warnings.catch_warnings():
        # the weights are meant for the calibration only: the trees are already fitted
        warnings.filterwarnings("ignore", message="Since FrozenEstimator")
        calibrated.fit(
            late.select(features).to_numpy().astype(np.float64),
            late[label].to_numpy(),
            sample_weight=late["_weight"].to_numpy(),
        )
    meta = Metadata(
        features=list(features),
        label=label,
        horizon_s=horizon_s,
        threshold=threshold,
        train_start_s=float(frame["t"].min()),  # type: ignore[arg-type]
        train_end_s=float(frame["t"].max()),  # type: ignore[arg-type]
        rows=rows,
        positives=int(y_all.sum()),
        version=version,
    )
    return RiskModel(calibrated, meta)


#: the candidates :func:`fit_selected` chooses from (class weighting is one of the choices:
#: on a weak signal, "balanced" weights can rank worse than none)
GRID: tuple[dict[str, Any], ...] = (
    {"max_depth": 2, "max_iter": 50, "class_weight": None},
    {"max_depth": 2, "max_iter": 50, "class_weight": "balanced"},
    {"max_leaf_nodes": 15, "max_iter": 200, "class_weight": None},
    {"max_leaf_nodes": 15, "max_iter": 200, "class_weight": "balanced"},
)


def select_params(
    frame: pl.DataFrame,
    features: Sequence[str],
    label: str,
    *,
    horizon_s: float,
    validation_share: float = 0.3,
    grid: Sequence[Mapping[str, Any]] = GRID,
    monotone: Mapping[str, int] | None = None,
    seed: int = 0,
) -> tuple[dict[str, Any], float]:
    """The grid entry with the best PR-AUC on the latest ``validation_share`` of ``frame``
    (split by time with a horizon-long gap), and that PR-AUC (NaN when it cannot be told)."""
    from gpuwarden.analytics.predict.metrics import pr_auc

    cut = float(np.quantile(frame["t"].to_numpy(), 1.0 - validation_share))
    inner, valid = time_split(frame, cut, horizon_s)
    y = valid[label].to_numpy().astype(int)
    scored: list[tuple[float, int]] = []
    if inner[label].sum() >= 2 and y.sum() >= 1:
        for i, params in enumerate(grid):
            m = fit(
                inner,
                features,
                label,
                horizon_s=horizon_s,
                params=params,
                seed=seed,
                monotone=monotone,
            )
            scored.append((pr_auc(y, m.predict(valid)), i))
    if not scored:
        return dict(grid[0]), float("nan")
    best_auc, best = max(scored)
    return dict(grid[best]), best_auc


def fit_selected(
    frame: pl.DataFrame,
    features: Sequence[str],
    label: str,
    *,
    horizon_s: float,
    validation_share: float = 0.3,
    grid: Sequence[Mapping[str, Any]] = GRID,
    version: str = "",
    seed: int = 0,
    monotone: Mapping[str, int] | None = None,
) -> RiskModel:
    """Choose the parameters on a validation slice at the end of the training period
    (:func:`select_params`), then refit on all of it. The test period is never looked at."""
    params, auc = select_params(
        frame,
        features,
        label,
        horizon_s=horizon_s,
        validation_share=validation_share,
        grid=grid,
        monotone=monotone,
        seed=seed,
    )
    model = fit(
        frame, features, label, horizon_s=horizon_s, params=params, seed=seed, monotone=monotone
    )
    model.meta.version = version
    model.meta.notes = f"parameters {params} chosen on the validation slice"
    if not np.isnan(auc):
        model.meta.metrics["validation_pr_auc"] = auc
    return model


def out_of_fold(
    frame: pl.DataFrame,
    features: Sequence[str],
    label: str,
    *,
    horizon_s: float,
    params: Mapping[str, Any],
    folds: int = 4,
    monotone: Mapping[str, int] | None = None,
) -> pl.DataFrame:
    """``frame`` with ``risk`` scored by models that never saw its time block: the frame is
    cut into ``folds`` blocks by time; each is scored by a model fitted on the other blocks,
    less a horizon-long gap on each side (blocked cross-validation). For choosing an operating
    threshold on the training period without scoring the rows a model learned from."""
    t = frame["t"].to_numpy()
    edges = np.quantile(t, np.linspace(0, 1, folds + 1))
    parts = []
    for k in range(folds):
        lo, hi = edges[k], edges[k + 1]
        block = frame.filter((pl.col("t") >= lo) & ((pl.col("t") < hi) | (k == folds - 1)))
        rest = frame.filter((pl.col("t") < lo - horizon_s) | (pl.col("t") >= hi + horizon_s))
        if block.is_empty():
            continue
        if rest[label].sum() < 2:
            parts.append(block.with_columns(pl.lit(0.0).alias("risk")))
            continue
        m = fit(rest, features, label, horizon_s=horizon_s, params=params, monotone=monotone)
        parts.append(block.with_columns(pl.Series("risk", m.predict(block))))
    return pl.concat(parts)
