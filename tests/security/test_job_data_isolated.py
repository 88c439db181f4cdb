"""Found in a fifth review (2026-11-28, a helper reviewing as an attacker and a broken job):
what one job's own reports could do to the analysis of every other job. The job data here is
CONSTRUCTED (a stub reader stands for InfluxDB, as analytics reads it).

* a job that reported ``world_size = 0`` (a careless ``int(os.environ.get("WORLD_SIZE", 0))``
  does) made ``compute_mfu`` divide by zero: the exception left ``job_task`` and stopped the
  whole pass, for every job, every window, while the job had steps in it;
* any other error a job's data raised did the same.
"""

from __future__ import annotations

import math
import time
from typing import Any

import polars as pl
import pytest

from gpuwarden.analytics import tasks
from gpuwarden.analytics.config import load_config
from gpuwarden.analytics.mfu import ModelShape
from gpuwarden.analytics.runner import LocalExecutor
from gpuwarden.core.store.reader import QueryError

NS = 1_000_000_000
END = time.time_ns()
START = END - 600 * NS
MODEL = {"params_count": 1e9, "layers_count": 16, "hidden_size_count": 2048,
         "seq_len_tokens": 2048, "world_size_count": 8, "dtype": "bf16",
         "gpu_model": "NVIDIA H100 80GB HBM3"}  # fmt: skip


def _frame(rows: dict[str, list[Any]]) -> pl.DataFrame:
    df = pl.DataFrame(rows)
    return df.with_columns(
        pl.from_epoch(pl.col("time"), time_unit="ns").dt.replace_time_zone("UTC")
    )


class JobsReader:
    """InfluxDB as analytics reads it, holding a step log and a job_model per job."""

    def __init__(self, models: dict[str, dict[str, Any]]) -> None:
        self.models = models

    def read(self, measurement: str, start: Any, end: Any, fields: Any = None, tags: Any = None,
             where: Any = None, **_: Any) -> pl.DataFrame:  # fmt: skip
        job = next((j for j in self.models if where and f"'{j}'" in str(where)), None)
        if measurement == "job_step" and job:
            n = 300
            return _frame({"time": [START + i * NS for i in range(1, n + 1)],
                           "cluster": ["c"] * n, "node": ["node-a"] * n, "rank": ["0"] * n,
                           "job": [job] * n, "step_index": list(range(n)),
                           "step_time_s": [1.0] * n, "tokens_count": [16384] * n})  # fmt: skip
        if measurement == "job_model" and job:
            return _frame({"time": [START], **{k: [v] for k, v in self.models[job].items()}})
        return self._empty([*(fields or []), *(tags or [])], fields or [])

    def aggregate(self, measurement: str, fns: Any, start: Any, end: Any, every_s: Any = None,
                  group_tags: Any = (), where: Any = None, **_: Any) -> pl.DataFrame:  # fmt: skip
        return self._empty([*fns, *group_tags], list(fns))

    @staticmethod
    def _empty(columns: list[str], numeric: list[str]) -> pl.DataFrame:
        cols = {"time": pl.Series([], dtype=pl.Datetime("ns", "UTC"))}
        for c in columns:
            cols[c] = pl.Series([], dtype=pl.Float64 if c in numeric else pl.Utf8)
        return pl.DataFrame(cols)

    def indexed_tag_values(self, *_: Any, **__: Any) -> list[str]:
        return ["node-a"]

    def close(self) -> None:
        pass


def test_a_shape_no_model_has_is_refused() -> None:
    assert ModelShape.from_row(MODEL).world_size == 8
    for bad in ({"world_size_count": 0}, {"layers_count": -1}, {"params_count": math.nan},
                {"params_count": 0}, {"seq_len_tokens": 0},
                {"embedding_params_count": 2e9}):  # fmt: skip
        with pytest.raises(ValueError, match="model shape"):
            ModelShape.from_row(MODEL | bad)


def test_the_reporter_says_so_at_the_call() -> None:
    from gpuwarden.collector.jobside.reporter import Reporter

    reporter = Reporter.__new__(Reporter)  # the check comes before anything is sent
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        reporter.model(params=10**9, layers=16, hidden_size=2048, heads=16, seq_len=2048,
                       world_size=0)  # fmt: skip


def test_one_jobs_bad_shape_is_its_own_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = JobsReader({"1001": MODEL | {"world_size_count": 0}, "1002": MODEL})
    monkeypatch.setattr(tasks, "_reader", lambda cfg: reader)
    cfg = load_config(None, environ={})
    calls = [(tasks.job_task, (cfg, job, START, END)) for job in ("1001", "1002")]
    bad, good = LocalExecutor().run(calls, "jobs")  # before: ZeroDivisionError for the pass
    assert bad.mfu is None and any("world_size must be >= 1" in p for p in bad.problems)
    assert good.mfu is not None and 0 < good.mfu.mfu < 1


def test_an_error_a_jobs_data_raises_stops_only_that_job(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = JobsReader({"1001": MODEL, "1002": MODEL})
    monkeypatch.setattr(tasks, "_reader", lambda cfg: reader)
    real = tasks.throughput

    def fragile(steps: pl.DataFrame) -> Any:  # an error no one foresaw, on one job's data
        if steps.height and steps["job"][0] == "1001":
            raise ZeroDivisionError("float division by zero (CONSTRUCTED)")
        return real(steps)

    monkeypatch.setattr(tasks, "throughput", fragile)
    cfg = load_config(None, environ={})
    calls = [(tasks.job_task, (cfg, job, START, END)) for job in ("1001", "1002")]
    bad, good = LocalExecutor().run(calls, "jobs")
    assert bad.job == "1001" and bad.mfu is None
    assert bad.problems == [
        "analysis failed on this job's own data: ZeroDivisionError: float division by zero "
        "(CONSTRUCTED)"
    ]
    assert good.mfu is not None
    # the store's own failure is everyone's: it still stops the pass
    monkeypatch.setattr(tasks, "_reader", lambda cfg: (_ for _ in ()).throw(QueryError("down")))
    with pytest.raises(QueryError):
        LocalExecutor().run(calls, "jobs")
