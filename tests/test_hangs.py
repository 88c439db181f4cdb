"""Hung jobs (``job_hang`` findings): steps stop, the job is still there.

The unit tests use CONSTRUCTED frames (hand-written steps, GPU samples and heartbeats). One
end-to-end test replays the SIMULATED library scenario ``hang`` (a 16-node job that hangs for
30 minutes with one rank's GPU idle while the other 127 spin) into the real InfluxDB and
analyses windows ending before, during and after the hang. Another runs a REAL torchrun job
(gloo, CPU, ``testbed/jobs/hang_job.py``) whose rank 1 stops between steps while rank 0 blocks in
its all-reduce; only the placement (each rank on its own "node") and the data are SIMULATED.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.emit import findings
from gpuwarden.analytics.hangs import HangConfig, find_hang, pace, silence
from gpuwarden.analytics.runner import LocalExecutor, analyse
from gpuwarden.core.config import ConfigError
from gpuwarden.remediation.policy import DEFAULT_POLICIES, first_match, load_policies
from testbed.influxd import free_port
from tests.remediation_util import poll
from tests.test_analytics import _load
from tests.torchrun_util import torchrun_argv

S = 10**9
NO_BEATS = pl.DataFrame()


def _steps(times_s: list[float], ranks: int = 4, step_s: float = 4.0) -> pl.DataFrame:
    """Every rank reports step i at ``times_s[i]``."""
    rows = [
        {"time": int(t * S), "rank": str(r), "node": f"node-{r // 2}", "step_index": i,
         "step_time_s": step_s}
        for i, t in enumerate(times_s)
        for r in range(ranks)
    ]  # fmt: skip
    return pl.DataFrame(rows).with_columns(pl.col("time").cast(pl.Datetime("ns", "UTC")))


def _last(steps: pl.DataFrame) -> pl.DataFrame:
    return steps.sort("time").group_by("rank", "node").agg(pl.col("time", "step_index").last())


def _gpus(util: dict[str, float], t_s: float) -> pl.DataFrame:
    """``{"rank": util}``: rank r on node-(r // 2), GPU r % 2, three samples."""
    rows = [
        {"time": int((t_s - k * 10) * S), "node": f"node-{int(r) // 2}", "gpu": str(int(r) % 2),
         "rank": r, "gpu_util_pct": u}
        for r, u in util.items()
        for k in range(3)
    ]  # fmt: skip
    return pl.DataFrame(rows)


def test_a_spinning_job_with_one_idle_rank_is_hung_and_its_node_named():
    cfg = HangConfig()
    steps = _steps([4.0 * i for i in range(100)])  # steps every 4 s until 396 s
    quiet = silence(_last(steps), steps, int(1200 * S), cfg)
    assert quiet is not None
    assert quiet.silent_s == pytest.approx(804) and quiet.patience_s == 600
    assert (quiet.last_step, quiet.median_step_s, quiet.longest_gap_s) == (99, 4.0, 4.0)
    hang = find_hang(
        "7", quiet, _last(steps), _gpus({"0": 100, "1": 100, "2": 3, "3": 100}, 1190), NO_BEATS, cfg
    )
    assert hang is not None
    assert (hang.spinning, hang.gpus, hang.nodes, hang.busy_gpus) == (True, 4, 2, 3)
    assert (hang.behind, hang.idle, hang.suspect_nodes) == ([], ["2"], ["node-1"])
    assert hang.culprit_node == "node-1"
    assert hang.describe() == (
        "no step for 13 min (last step 99; it steps every 4.0 s, its longest pause in the window "
        "was 4 s); 3 of its 4 GPUs busy (waiting in a collective); rank 2 on node-1 idle while "
        "the others spin"
    )
    # not yet: 500 s of silence is within the 600 s floor
    assert silence(_last(steps), steps, int(896 * S), cfg) is None


def test_patience_learns_the_jobs_own_pauses():
    """A job that pauses 500 s to checkpoint is not hung 700 s into a silence (1.5 x 500 s is
    its patience), and is at 800 s; nor is a job whose steps take 60 s at 15 minutes."""
    times = [4.0 * i for i in range(50)] + [196 + 500 + 4.0 * i for i in range(50)]
    steps = _steps(times)
    assert pace(steps) == (4.0, 500.0)
    end = times[-1]
    assert silence(_last(steps), steps, int((end + 700) * S), HangConfig()) is None
    quiet = silence(_last(steps), steps, int((end + 800) * S), HangConfig())
    assert quiet is not None and quiet.patience_s == 750
    slow = _steps([60.0 * i for i in range(20)], step_s=60.0)
    assert silence(_last(slow), slow, int((1140 + 900) * S), HangConfig()) is None  # 20 x 60 s
    # a restart rolls the step index back: the time it took is not a pause of the job's
    restarted = _steps([0, 4, 8, 12]).vstack(
        _steps([1000, 1004]).with_columns(pl.col("step_index") + 1)
    )
    assert pace(restarted) == (4.0, 4.0)


def test_who_is_behind_or_idle_and_when_nothing_is_said():
    cfg = HangConfig()
    steps = _steps([4.0 * i for i in range(100)])
    # rank 3 stopped two steps before the others: it never reached the step they wait in
    behind = steps.filter(~((pl.col("rank") == "3") & (pl.col("step_index") >= 98)))
    last = _last(behind)
    quiet = silence(last, behind, int(1200 * S), cfg)
    assert quiet is not None
    hang = find_hang("7", quiet, last, _gpus({r: 100 for r in "0123"}, 1190), NO_BEATS, cfg)
    assert hang is not None and (hang.behind, hang.idle, hang.culprit_node) == (["3"], [], "node-1")
    # a rank whose last step is hours old (an elastic job dropped it) is not behind
    long = _steps([4.0 * i for i in range(400)])  # until 1596 s
    gone = _steps([0.0], ranks=8).filter(pl.col("rank") == "7").vstack(long)
    later = silence(_last(gone), long, int(2400 * S), cfg)
    assert later is not None
    hang = find_hang("7", later, _last(gone), _gpus({r: 100 for r in "0123"}, 2390), NO_BEATS, cfg)
    assert hang is not None and hang.behind == []
    # every GPU idle: stuck outside the GPU (or a very long checkpoint); a warning, nobody named
    idle = find_hang("7", quiet, last, _gpus({r: 0 for r in "0123"}, 1190), NO_BEATS, cfg)
    assert idle is not None and not idle.spinning and idle.culprit_node == ""
    assert "0 of its 4 GPUs busy (stuck outside the GPU?)" in idle.describe()
    # idle ranks on two nodes while the rest spin: no single node to take out
    both = find_hang(
        "7",
        quiet,
        _last(steps),
        _gpus({"0": 0, "1": 100, "2": 0, "3": 100, "4": 100, "5": 100}, 1190),
        NO_BEATS,
        cfg,
    )
    assert both is not None and both.suspect_nodes == ["node-0", "node-1"]
    assert both.culprit_node == ""
    # the job let its GPUs go (finished, crashed, requeued): not a hang
    assert find_hang("7", quiet, last, _gpus({}, 1190).clear(), NO_BEATS, cfg) is None
    # a job that never reported a step cannot be judged
    assert silence(last.clear(), steps.clear(), int(1200 * S), cfg) is None


def _beats(in_step: dict[str, bool], t_s: float) -> pl.DataFrame:
    rows = [
        {"time": int((t_s - k) * S), "node": f"node-{int(r) // 2}", "rank": r, "in_step_active": v}
        for r, v in in_step.items()
        for k in range(3)
    ]
    return pl.DataFrame(rows).with_columns(pl.col("time").cast(pl.Datetime("ns", "UTC")))


def test_heartbeats_show_a_job_alive_without_gpu_data_and_who_is_between_steps():
    """A job whose GPUs carry no job tag (or a CPU job): its reporters' heartbeats say it is
    still there, and the rank between steps while the others wait inside one is the suspect."""
    cfg = HangConfig()
    steps = _steps([4.0 * i for i in range(100)])
    last = _last(steps)
    quiet = silence(last, steps, int(1200 * S), cfg)
    assert quiet is not None
    beats = _beats({"0": True, "1": True, "2": False, "3": True}, 1195)
    hang = find_hang("7", quiet, last, pl.DataFrame(), beats, cfg)
    assert hang is not None and hang.gpus == 0
    assert (hang.ranks_beating, hang.ranks_in_step, hang.waiting) == (4, 3, True)
    assert (hang.outside, hang.culprit_node) == (["2"], "node-1")
    assert hang.describe().endswith(
        "3 of its 4 live ranks inside a step (waiting in a collective); rank 2 on node-1 "
        "between steps while the others wait inside one"
    )
    # all between steps (a checkpoint to slow storage, an evaluation): nobody is named
    out = find_hang(
        "7", quiet, last, pl.DataFrame(), _beats(dict.fromkeys("0123", False), 1195), cfg
    )
    assert out is not None and not out.waiting and out.suspects == []
    # the GPUs' evidence comes first: an idle GPU names its rank
    both = find_hang(
        "7", quiet, last, _gpus({"0": 100, "1": 0, "2": 100, "3": 100}, 1190), beats, cfg
    )
    assert both is not None and (both.idle, both.outside) == (["1"], [])


def test_bad_hang_settings_are_a_clear_error(tmp_path):
    path = tmp_path / "analytics.toml"
    for text, match in (
        ("[hangs]\nbusy_pct = 0\n", "busy_pct"),
        ("[hangs]\nmin_silence_s = -1\n", "min_silence_s"),
        ("[hangs]\nlookback_s = 60\n", "lookback_s"),
        ("[hangs]\npatience = 3\n", "patience"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_config(path, environ={})


def test_hang_scenario_through_the_real_influxdb_to_the_policy(influxd, influx_db, tmp_path):
    gen, _, cfg, (start, _) = _load(influxd, influx_db, tmp_path, "hang")
    policies = load_policies(DEFAULT_POLICIES)

    def hangs_at(t_s: float) -> list:
        a = analyse(cfg, start + int((t_s - 3600) * S), start + int(t_s * S), LocalExecutor())
        return [f for f in findings(a) if f.kind == "job_hang"]

    assert hangs_at(1800 + 300) == []  # 5 minutes in: within the 10-minute floor
    (f,) = hangs_at(1800 + 900)
    assert f.subject == {"cluster": gen.spec.cluster, "job": "llm-13b", "node": "node-009"}
    assert f.severity.value == "critical"
    e = f.evidence
    assert (e["gpus"], e["busy_gpus"], e["spinning"]) == (128, 127, True)
    assert e["idle_ranks"] == ["77"] and e["behind_ranks"] == []  # node 9, GPU 5: rank 9x8+5
    assert 890 <= e["silent_s"] <= 910 and e["patience_s"] == 600
    policy = first_match(policies, f)
    assert policy is not None and policy.name == "job-hang-culprit"
    assert [str(a) for a in policy.actions] == ["notify", "drain", "requeue"]
    assert hangs_at(5400) == []  # restarted at 3600 s and stepping again


torch = pytest.importorskip("torch", reason="scripts/bootstrap.sh installs the CPU build of torch")


def test_a_real_torchrun_job_that_hangs_is_found_and_its_stuck_rank_named(
    influxd, influx_db, tmp_path: Path
):
    port = free_port()
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "GW_JOB": "hang-real",
        "GW_INFLUX_URL": influxd.url,
        "GW_INFLUX_DB": influx_db,
        "GW_HANG_RANK": "1",
        "GW_HANG_AT": "20",
    }
    argv = torchrun_argv("testbed.jobs.hang_job", port)
    log = (tmp_path / "torchrun.log").open("w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    cfg = with_overrides(
        load_config(environ={}),
        influxdb={"url": influxd.url, "database": influx_db},
        analysis={"spool_dir": str(tmp_path / "aspool")},
        hangs={"min_silence_s": 3.0, "alive_s": 5.0, "lookback_s": 600.0},
    )

    def hung() -> list:
        assert proc.poll() is None, (tmp_path / "torchrun.log").read_text()[-3000:]
        end = time.time_ns()
        a = analyse(cfg, end - 600 * S, end, LocalExecutor())
        return [f for f in findings(a) if f.kind == "job_hang"]

    try:
        (f,) = poll(hung, 180, "analytics to call the torchrun job hung", every_s=1.0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    e = f.evidence
    assert e["last_step_index"] == 20 and e["behind_ranks"] == []  # both reported step 20
    # rank 0 waits inside step 21 (in its all-reduce) and its reporter thread still beats
    assert (e["gpus"], e["ranks_beating"], e["ranks_in_step"], e["waiting"]) == (0, 2, 1, True)
    assert e["outside_ranks"] == ["1"] and e["suspect_nodes"] == ["host-1"]
    assert f.subject == {"cluster": "test", "job": "hang-real", "node": "host-1"}
    policy = first_match(load_policies(DEFAULT_POLICIES), f)
    assert policy is not None and policy.name == "job-hang-culprit"


def test_a_rank_tagged_with_a_node_the_agents_never_saw_the_job_on_is_not_named():
    """Issue 38: a rank's ``node`` tag is its writer's word. A job writing straight to the
    store tagged its lagging rank ``node=node-z``, a node where no agent saw any of the job's
    GPUs; before, the hang analysis named node-z the culprit and the default policy drained
    it. Now the suspects are only nodes where the agents saw the job's GPUs; node-z is kept in
    the evidence as unconfirmed, and nobody is named. Every point is CONSTRUCTED."""
    cfg = HangConfig()
    steps = _steps([4.0 * i for i in range(100)])
    forged = steps.with_columns(
        pl.when(pl.col("rank") == "3").then(pl.lit("node-z")).otherwise(pl.col("node"))
        .alias("node")
    )  # fmt: skip
    behind = forged.filter(~((pl.col("rank") == "3") & (pl.col("step_index") >= 98)))
    last = _last(behind)
    quiet = silence(last, behind, int(1200 * S), cfg)
    assert quiet is not None
    hang = find_hang("7", quiet, last, _gpus({r: 100 for r in "0123"}, 1190), NO_BEATS, cfg)
    assert hang is not None and hang.behind == ["3"]
    assert hang.culprit_node == "" and hang.unconfirmed_nodes == ["node-z"]
    # the same rank on a node the agents saw the job on is named, as before
    honest = steps.filter(~((pl.col("rank") == "3") & (pl.col("step_index") >= 98)))
    named = find_hang("7", quiet, _last(honest), _gpus({r: 100 for r in "0123"}, 1190),
                      NO_BEATS, cfg)  # fmt: skip
    assert named is not None and named.culprit_node == "node-1"


def test_a_node_whose_agent_died_with_it_is_still_named():
    """Review of issue 38's check: the node that hangs a job is often dead, its agent with it,
    so it has no GPU points in the last ``alive_s``; it is still a node the agents saw the
    job on over the lookback (``held``), and is named. Every point is CONSTRUCTED."""
    cfg = HangConfig()
    steps = _steps([4.0 * i for i in range(100)], ranks=6)  # node-0, node-1, node-2
    behind = steps.filter(~(pl.col("rank").is_in(["4", "5"]) & (pl.col("step_index") >= 98)))
    last = _last(behind)
    quiet = silence(last, behind, int(1200 * S), cfg)
    assert quiet is not None
    alive = _gpus({r: 100 for r in "0123"}, 1190)  # node-2's agent is silent now
    hang = find_hang("7", quiet, last, alive, NO_BEATS, cfg, held={"node-0", "node-1", "node-2"})
    assert hang is not None and hang.culprit_node == "node-2" and hang.unconfirmed_nodes == []
    # only what the last few minutes show (the first version of the check): not named
    narrow = find_hang("7", quiet, last, alive, NO_BEATS, cfg)
    assert narrow is not None and narrow.culprit_node == ""
