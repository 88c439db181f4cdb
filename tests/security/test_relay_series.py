"""Found in a fifth review (2026-11-28, a helper reviewing as an attacker): a job could make
InfluxDB create a series per line through its node's relay. Ranks are digits (the fourth
review), but any number of them: one 1 MiB request of ``job_step,rank=0..16819`` was taken
whole (204, 16,820 distinct ranks), with no bound across requests, and about 60 such requests
reach influxd's default ``max-series-per-database`` (1,000,000), after which the database
refuses every new series of every writer. The lines are CONSTRUCTED; the relay is the agent's
own, over real HTTP.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.collector.config import load_config
from gpuwarden.collector.relay import (
    MAX_SERIES_PER_JOB,
    LineRate,
    ReporterRelay,
    SeriesBudget,
    checked_lines,
)
from gpuwarden.core.config import ConfigError
from tests.test_relay import Lines, post


def _steps(job: str, ranks: range) -> bytes:
    """One step per rank (no timestamp: stamped on arrival; 16,820 of them fit in 1 MiB)."""
    return "".join(f"job_step,job={job},rank={r} step_index=1i\n" for r in ranks).encode()


def test_a_job_cannot_begin_a_series_per_line() -> None:
    sink = Lines()
    relay = ReporterRelay("127.0.0.1:0", sink, lines_per_s=0)  # the series bound alone
    relay.start()
    try:
        status, why = post(relay, _steps("j1", range(16820)))
        assert status == 422 and "may begin 1024" in why, (status, why)
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


def test_the_budget_is_per_window_and_bounds_unproven_jobs_together() -> None:
    now = [0.0]
    budget = SeriesBudget(per_job=3, total=5, window_s=100.0, clock=lambda: now[0])
    assert budget.admit({"a": "j1", "b": "j1", "c": "j1"}) == ""
    assert "may begin 3" in budget.admit({"d": "j1"})
    assert budget.admit({"e": "j2", "f": "j2"}) == ""
    assert "all of them may begin 5" in budget.admit({"g": "j3"})  # made-up names' share
    # a job its caller's cgroup named is not crowded out by them (found by a review of the
    # first version, which shared one cap among all jobs: one tenant's sixteen jobs used it up)
    assert budget.admit({"p": "slurm-7", "q": "slurm-7"}, proven=True) == ""
    assert budget.admit({"a": "j1", "e": "j2"}) == ""  # begun already: taken
    now[0] = 101.0  # a day later (here 100 s): what began then no longer counts
    assert budget.admit({"d": "j1", "g": "j3"}) == ""


def _same_rank(job: str, n: int) -> bytes:
    return "".join(f"job_step,job={job},rank=0 step_index={i}i\n" for i in range(n)).encode()


def test_a_job_cannot_fill_the_agents_spool_through_the_relay() -> None:
    """Found in the same review: no bound on how many lines a job sends, and the relay's
    points go into the agent's own spool. During an InfluxDB outage 1 MiB bodies as fast as
    the job could filled the 256 MiB spool in a few hundred requests, and its bound then
    dropped the oldest points: the node's own telemetry and XIDs. Now 200 lines a second per
    job on average, a minute's worth at once; more is 429 (the reporter sends it again)."""
    sink = Lines()
    relay = ReporterRelay("127.0.0.1:0", sink)
    relay.start()
    try:
        assert post(relay, _same_rank("j1", 5000))[0] == 204  # a reporter's largest batch
        assert post(relay, _same_rank("j1", 5000))[0] == 204
        status, why = post(relay, _same_rank("j1", 5000))  # past a minute's worth at once
        assert status == 429 and "200 lines a second" in why, (status, why)
        # a caller no cgroup names a job for (here: this test's process) says its job's name
        # itself: all such callers share one bucket, made-up names are not buckets of their own
        assert post(relay, _same_rank("j2", 5000))[0] == 429
        assert len(sink.lines) == 10_000
        assert post(relay, _same_rank("j3", 12_001))[0] == 413  # more than a bucket holds
    finally:
        relay.close()


def test_a_job_its_cgroup_names_has_its_own_bucket_and_series() -> None:
    """Found by a review of the first version: buckets and series shares keyed by the job's
    name alone let a caller no cgroup names (a remote peer, a process outside any job) spend
    a real job's share by saying its name, and the real job's reporter got 429s and 422s."""
    rate, budget = LineRate(), SeriesBudget(per_job=16)
    mine = {"cluster": "c", "node": "n1", "job": "slurm-7"}  # stamped: its cgroup named it
    body = _same_rank("slurm-7", 12_000).decode()
    assert checked_lines(body, stamp={"cluster": "c"}, rate=rate, budget=budget)[1] == 204
    assert checked_lines(body, stamp={"cluster": "c"}, rate=rate)[1] == 429  # unproven: spent
    assert checked_lines(body, stamp=mine, rate=rate)[1] == 204  # the real job: its own
    # where the relay knows the jobs on this node's GPUs (only their names are taken), each
    # name said by such callers is a bucket of its own: one cannot starve the others
    other = _same_rank("slurm-8", 12_000).decode()
    assert checked_lines(other, stamp={"cluster": "c"}, rate=rate, named_here=True)[1] == 204
    assert checked_lines(_steps("slurm-7", range(16)).decode(), stamp={"cluster": "c"},
                         budget=budget)[1] == 204  # fmt: skip
    got = checked_lines(_steps("slurm-7", range(16)).decode(), stamp=mine, budget=budget)
    assert got[1] == 204, got  # its series share is its own too
    assert checked_lines(_steps("slurm-7", range(16, 17)).decode(), stamp=mine,
                         budget=budget)[1] == 422  # fmt: skip


def test_the_line_rate_refills_and_can_be_turned_off(tmp_path: Path) -> None:
    now = [0.0]
    rate = LineRate(per_s=100.0, burst_s=60.0, clock=lambda: now[0])
    assert rate.take({"j1": 6000}) == ""
    assert "100 lines a second" in rate.take({"j1": 1})
    assert rate.take({"j2": 10, "j1": 1}) != ""  # all or nothing: j2 took nothing
    now[0] = 10.0  # 1,000 lines later
    assert rate.take({"j1": 1000, "j2": 6000}) == ""
    assert LineRate(per_s=0).take({"j1": 10**9}) == ""
    bad = tmp_path / "agent.toml"
    bad.write_text("[agent]\nreporter_lines_per_s = 10.0\n")
    with pytest.raises(ConfigError, match="reporter_lines_per_s"):
        load_config(bad, environ={})
