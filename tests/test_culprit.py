"""The node that stopped a job (analytics.culprit): CONSTRUCTED ranks and findings, then the
same through the real InfluxDB and the analysis runner, and the policy that acts on it."""

from __future__ import annotations

import time

import polars as pl
import pytest

from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.culprit import StopConfig, find_stop
from gpuwarden.analytics.emit import findings
from gpuwarden.analytics.runner import LocalExecutor, analyse
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.remediation.policy import DEFAULT_POLICIES, first_match, load_policies

S = 1_000_000_000
T0 = 1_790_000_000 * S
END = T0 + 600 * S
CFG = StopConfig()


def ranks(last_s: dict[str, tuple[str, float]], step: int = 100) -> pl.DataFrame:
    """rank -> (node, seconds after T0 of its last sign of life)."""
    return pl.DataFrame(
        {
            "rank": list(last_s),
            "node": [n for n, _ in last_s.values()],
            "time": [T0 + int(t * S) for _, t in last_s.values()],
            "step_index": [step] * len(last_s),
        }
    )


def found(rows: list[tuple[str, float, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "node": [n for n, _, _ in rows],
            "time": [T0 + int(t * S) for _, t, _ in rows],
            "kind": [k for _, _, k in rows],
        },
        schema={"node": pl.String, "time": pl.Int64, "kind": pl.String},
    )


EIGHT = {str(r): (f"n{r // 2}", 300.0) for r in range(8)}  # 4 nodes, 2 ranks each, all at 300 s


def test_a_hardware_finding_near_the_stop_names_its_node() -> None:
    s = find_stop("j", ranks(EIGHT), found([("n2", 295.0, "gpu_lost")]), T0, END, CFG)
    assert s is not None and (s.node, s.method) == ("n2", "finding")
    assert s.evidence["finding_kind"] == "gpu_lost" and s.stopped_s == 300.0
    assert "n2 stopped it (gpu_lost on it)" in s.describe()
    # a finding long before the stop, or on a node the job did not use, is no evidence
    old = found([("n2", 100.0, "gpu_xid"), ("n9", 299.0, "gpu_xid")])
    assert find_stop("j", ranks(EIGHT), old, T0, END, CFG) is None


def test_the_node_that_went_silent_first_is_named() -> None:
    first = {**EIGHT, "4": ("n2", 200.0), "5": ("n2", 210.0)}  # n2's ranks 90 s early
    s = find_stop("j", ranks(first), found([]), T0, END, CFG)
    assert s is not None and (s.node, s.method) == ("n2", "first_silent")
    assert s.evidence["first_rank"] == "4" and s.evidence["lead_s"] == 90.0  # its last went at 210
    # two nodes as early: no single culprit
    two = {**first, "6": ("n3", 205.0), "7": ("n3", 205.0)}
    assert find_stop("j", ranks(two), found([]), T0, END, CFG) is None


def test_a_node_only_the_jobs_own_tags_name_is_never_the_culprit() -> None:
    """Issue 38: a rank's ``node`` tag is its writer's word. A job tagged two ranks
    ``node=victim`` and made them go silent first (or put a critical finding of the victim's
    near its stop); where the agents saw the job's GPUs on n0-n3 only, the victim is listed as
    unconfirmed and never named. Before, it was named and the default policy drained it."""
    forged = {**EIGHT, "8": ("victim", 200.0), "9": ("victim", 210.0)}
    held = {"n0", "n1", "n2", "n3"}
    assert find_stop("j", ranks(forged), found([]), T0, END, CFG, held) is None
    s = find_stop("j", ranks(forged), found([("victim", 295.0, "gpu_lost")]), T0, END, CFG, held)
    assert s is None
    # the same stop seen by the agents on the victim too names it, as before
    named = find_stop("j", ranks(forged), found([]), T0, END, CFG, held | {"victim"})
    assert named is not None and named.node == "victim"
    # what the tags alone would name, before: the victim
    assert (find_stop("j", ranks(forged), found([]), T0, END, CFG) or named).node == "victim"


def test_no_finding_for_a_job_that_ended_runs_or_stopped_before_the_window() -> None:
    assert find_stop("j", ranks(EIGHT), found([]), T0, END, CFG) is None  # all together
    running = {r: (n, 590.0) for r, (n, _) in EIGHT.items()}  # 10 s ago: still going
    assert find_stop("j", ranks(running), found([("n1", 589.0, "gpu_xid")]), T0, END, CFG) is None
    late = T0 + 400 * S  # the window starts after the stop: reported by an earlier window
    assert find_stop("j", ranks(EIGHT), found([("n2", 295.0, "gpu_lost")]), late, END, CFG) is None
    with pytest.raises(ValueError):
        StopConfig(lead_s=-1)


def test_the_policy_drains_the_culprit_and_requeues_the_job() -> None:
    f = Finding(
        kind="job_stopped",
        subject={"cluster": "c", "job": "j", "node": "n2"},
        severity=Severity.CRITICAL,
        time_ns=END,
    )
    policy = first_match(load_policies(DEFAULT_POLICIES), f)
    assert policy is not None and policy.name == "job-stopped-culprit"
    assert [str(a) for a in policy.actions] == ["notify", "drain", "requeue"]


def test_through_influxdb_a_rank_that_died_first_and_a_lost_gpu(influxd, influx_db, tmp_path):
    """Two ranks per node on three nodes, 1 s steps, heartbeats every 5 s; node-b's GPU is
    lost (a critical finding from its agent) and its ranks stop at 100 s, the others die of
    their watchdog at 160 s; the analysis at 300 s names node-b from the finding."""
    sink = InfluxSink(SinkConfig(url=influxd.url, database=influx_db,
                                 spool_dir=str(tmp_path / "spool")))  # fmt: skip
    t0 = time.time_ns() - 300 * S
    points = []
    for rank in range(6):
        node = "node-" + "abc"[rank // 2]
        stop_s = 100 if node == "node-b" else 160
        tags = {"cluster": "t", "job": "j7", "rank": str(rank), "node": node}
        for s in range(min(stop_s, 100) + 1):
            fields = {"step_index": s, "step_time_s": 1.0, "tokens_count": 10, "samples_count": 1}
            points.append(Point("job_step", tags, fields, t0 + s * S))
        for s in range(0, stop_s + 1, 5):
            points.append(Point("job_heartbeat", tags, {"since_step_s": 1.0}, t0 + s * S))
    lost = Finding(kind="gpu_lost", subject={"cluster": "t", "node": "node-b", "gpu": "1"},
                   severity=Severity.CRITICAL, time_ns=t0 + 99 * S, source="agent")  # fmt: skip
    tags, fields = lost.to_point()
    points.append(Point("finding", tags, fields, lost.time_ns))
    sink.write_points(points)
    assert sink.close(timeout_s=60)
    cfg = with_overrides(
        load_config(environ={}),
        influxdb={"url": influxd.url, "database": influx_db},
        analysis={"spool_dir": str(tmp_path / "aspool")},
    )
    a = analyse(cfg, t0, t0 + 300 * S, LocalExecutor())
    stop = a.job("j7").stop
    assert stop is not None and (stop.node, stop.method) == ("node-b", "finding")
    assert stop.last_step == 100 and stop.evidence["nodes"] == ["node-a", "node-b", "node-c"]
    (f,) = [f for f in findings(a) if f.kind == "job_stopped"]
    assert f.subject == {"cluster": "t", "job": "j7", "node": "node-b"}
    assert f.severity is Severity.CRITICAL and f.evidence["finding_kind"] == "gpu_lost"
