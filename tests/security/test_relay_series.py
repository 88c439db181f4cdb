"""Found in a fifth review (2026-11-28, a helper reviewing as an attacker): a job could make
InfluxDB create a series per line through its node's relay. Ranks are digits (the fourth
review), but any number of them: one 1 MiB request of ``job_step,rank=0..16819`` was taken
whole (204, 16,820 distinct ranks), with no bound across requests, and about 60 such requests
reach influxd's default ``max-series-per-database`` (1,000,000), after which the database
refuses every new series of every writer. The lines are CONSTRUCTED; the relay is the agent's
own, over real HTTP.
"""

from __future__ import annotations

from gpuwarden.collector.relay import MAX_SERIES_PER_JOB, ReporterRelay, SeriesBudget
from tests.test_relay import Lines, post


def _steps(job: str, ranks: range) -> bytes:
    """One step per rank (no timestamp: stamped on arrival; 16,820 of them fit in 1 MiB)."""
    return "".join(f"job_step,job={job},rank={r} step_index=1i\n" for r in ranks).encode()


def test_a_job_cannot_begin_a_series_per_line() -> None:
    sink = Lines()
    relay = ReporterRelay("127.0.0.1:0", sink)
    relay.start()
    try:
        status, why = post(relay, _steps("j1", range(16820)))
        assert status == 422 and "may begin 256" in why, (status, why)
        assert sink.lines == []  # nothing of it kept
        # a job's ranks on a node, with their model: taken, and again (series already begun)
        assert post(relay, _steps("j1", range(8)))[0] == 204
        assert post(relay, _steps("j1", range(8)))[0] == 204
        # the rest of its share, one request at a time, then no more
        assert post(relay, _steps("j1", range(8, MAX_SERIES_PER_JOB)))[0] == 204
        assert (
            post(relay, _steps("j1", range(MAX_SERIES_PER_JOB, MAX_SERIES_PER_JOB + 1)))[0] == 422
        )
        assert post(relay, _steps("j1", range(4)))[0] == 204  # its begun series still go in
        # another job has a share of its own
        assert post(relay, _steps("j2", range(8)))[0] == 204
        assert len(sink.lines) == 8 * 2 + (MAX_SERIES_PER_JOB - 8) + 4 + 8
    finally:
        relay.close()


def test_the_budget_is_per_window_and_bounds_all_jobs_together() -> None:
    now = [0.0]
    budget = SeriesBudget(per_job=3, total=5, window_s=100.0, clock=lambda: now[0])
    assert budget.admit({"a": "j1", "b": "j1", "c": "j1"}) == ""
    assert "may begin 3" in budget.admit({"d": "j1"})
    assert budget.admit({"e": "j2", "f": "j2"}) == ""
    assert "this relay began 5" in budget.admit({"g": "j3"})  # all jobs' share
    assert budget.admit({"a": "j1", "e": "j2"}) == ""  # begun already: taken
    now[0] = 101.0  # a day later (here 100 s): what began then no longer counts
    assert budget.admit({"d": "j1", "g": "j3"}) == ""
