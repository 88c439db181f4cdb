"""Analytics end to end on SIMULATED scenarios replayed into the real InfluxDB (Debian influxd).

Each test generates a library scenario (simulation/library; marginals from the real
AcmeTrace CDFs, ToRs from the real Lingjun topology), writes it through the sink, and runs the
runner on it: the Dask path (LocalCluster, 2 workers) and the single-process path give the same
results. What is injected is known, so the assertions are exact about *what* is found.
"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from gpuwarden.analytics.config import DEFAULTS, load_config, with_overrides
from gpuwarden.analytics.emit import findings, points
from gpuwarden.analytics.mfu import model_flops_per_token
from gpuwarden.analytics.runner import DaskExecutor, LocalExecutor, analyse
from gpuwarden.analytics.tasks import job_task, read_steps
from gpuwarden.analytics.topology import TopologyError, load_topology, write_topology
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.reader import InfluxReader
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.simulation.generator import TAGS, ScenarioGenerator
from gpuwarden.simulation.spec import load_spec

MEASUREMENTS = ("gpu", "ib_port", "job_step", "job_model")


def _load(influxd, db, tmp_path, name, seed=1, interval_s=10, edit=None, **changes):
    """Write a SIMULATED scenario to ``db``; ``edit(measurement, frame)`` may change a frame
    before it is written (a forged tag)."""
    spec = dataclasses.replace(
        load_spec(name), interval_s=interval_s, measurements=MEASUREMENTS, **changes
    ).validate()
    gen = ScenarioGenerator(spec, seed=seed)
    sink = InfluxSink(
        SinkConfig(
            url=influxd.url, database=db, spool_dir=str(tmp_path / "spool"), batch_size=20_000
        )
    )
    frames: dict[str, list[pl.DataFrame]] = {}
    for chunk in gen.chunks(ticks_per_chunk=60):
        for m, raw in chunk.items():
            df = edit(m, raw) if edit is not None else raw
            sink.write_frame(df, m, tags=[t for t in TAGS[m] if t in df.columns])
            frames.setdefault(m, []).append(df)
    assert sink.close(timeout_s=120)
    topo = tmp_path / "topology.csv"
    write_topology(dict(zip(gen.node_names, gen.switch_of, strict=True)), topo)
    cfg = with_overrides(
        load_config(environ={}),
        influxdb={"url": influxd.url, "database": db},
        analysis={"topology": str(topo), "spool_dir": str(tmp_path / "aspool")},
    )
    window = (spec.start_ns, spec.start_ns + spec.duration_s * 10**9 + 1)
    return gen, {m: pl.concat(v) for m, v in frames.items()}, cfg, window


def test_mfu_matches_the_hand_computed_value(influxd, influx_db, tmp_path):
    """Must-show 2: MFU from job_step in InfluxDB against the injected shape and step times."""
    gen, frames, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "healthy")
    job = gen.spec.jobs[0]
    a = analyse(cfg, start, end, LocalExecutor())
    result = a.job(job.name)
    assert result.mfu is not None and not result.problems
    # by hand: global tokens per step over the mean synchronous step (slowest rank's time)
    steps = frames["job_step"]
    wall = steps.group_by("step_index").agg(pl.col("step_time_s").max())["step_time_s"].mean()
    world = job.nodes * gen.spec.gpus_per_node
    tokens_per_step = job.tokens_per_step // world * world
    # The scenario's job_model says nothing of its embeddings (an old caller): analytics
    # assumes a dense decoder (12·L·H² in the layers) with an untied head, so half of what
    # params holds beyond 12·L·H² (the input embedding table) is not a matmul (docs/MFU.md)
    rest = job.params_count - 12 * job.layers_count * job.hidden_size_count**2
    assert 0 < rest < job.params_count / 10
    per_token = model_flops_per_token(
        job.params_count - rest / 2, job.layers_count, job.hidden_size_count, job.seq_len_tokens
    )
    by_hand = tokens_per_step / wall * per_token / world / 312e12  # A100 bf16 dense peak
    assert result.mfu.mfu == pytest.approx(by_hand, rel=0.01)
    assert 0.2 < result.mfu.mfu < 0.7  # a plausible 13B run on A100s, not an impossible one
    assert result.mfu.goodput > 0.98  # healthy: no restarts
    assert result.energy is not None and result.energy["j_per_token"] > 0
    assert not result.stragglers  # healthy: nothing flagged
    assert not [s for s in a.switches if s.hot]
    assert a.unplaced == []
    # a topology file that misses a node: said, not silently pooled under a made-up switch
    topo = load_topology(cfg["analysis"]["topology"])
    dropped = gen.node_names[-1]
    del topo[dropped]
    write_topology(topo, tmp_path / "partial.csv")
    partial = with_overrides(cfg, analysis={"topology": str(tmp_path / "partial.csv")})
    assert analyse(partial, start, end, LocalExecutor()).unplaced == [dropped]


def test_slow_gpu_is_found_and_attributed_to_the_gpu_on_dask(influxd, influx_db, tmp_path):
    gen, _, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "slow-gpu", duration_s=2400)
    fault = gen.spec.faults[0]
    rank = str(fault.node * gen.spec.gpus_per_node + fault.gpu)
    executor = DaskExecutor(workers=2)
    try:
        a = analyse(cfg, start, end, executor)
    finally:
        executor.close()
    local = analyse(cfg, start, end, LocalExecutor())
    assert a.executor == "dask" and local.executor == "polars"
    stragglers = a.job("llm-13b").stragglers
    assert [(s.kind, s.worker) for s in stragglers] == [("worker", rank)]
    assert [s.to_json() for s in stragglers] == [
        s.to_json() for s in local.job("llm-13b").stragglers
    ]
    s = stragglers[0]
    assert s.slowdown == pytest.approx(1 + fault.severity, rel=0.05)
    onset_time = a.job("llm-13b").step_times[s.onset_step][1]
    assert abs(onset_time - (gen.spec.start_ns + fault.at_s * 10**9)) < 30 * 10**9
    cause, evidence = a.attributions[("llm-13b", rank)]
    assert cause == "gpu" and evidence["clock_ratio"] < 0.95
    (f,) = [f for f in findings(a) if f.kind == "straggler"]
    assert f.subject["rank"] == rank and f.evidence["cause"] == "gpu"
    assert f.subject["node"] == gen.node_names[fault.node]


def test_slow_stage_is_a_pipeline_imbalance_not_a_worker(influxd, influx_db, tmp_path):
    _, _, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "slow-stage", duration_s=1200)
    a = analyse(cfg, start, end, LocalExecutor())
    found = a.job("llm-13b").stragglers
    assert [(s.kind, s.stage) for s in found] == [("stage", 3)]
    assert found[0].slowdown == pytest.approx(1.3, rel=0.05)
    assert [f.kind for f in findings(a)] == ["pipeline_imbalance"]


def test_congested_tor_ranks_first_and_healthy_flags_nothing(influxd, influx_db, tmp_path):
    """Must-show 3, with the job's slowdown correlated to the hot switch."""
    gen, _, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "congested-tor")
    a = analyse(cfg, start, end, LocalExecutor())
    injected = gen.switch_of[gen.spec.faults[0].node]
    assert a.switches[0].switch == injected and a.switches[0].hot
    assert [s.switch for s in a.switches if s.hot] == [injected]
    impact = a.switches[0].jobs
    assert impact and impact[0]["job"] == "llm-13b" and impact[0]["correlation"] > 0.5
    assert impact[0]["slowdown_while_hot"] > 1.1
    (f,) = [f for f in findings(a) if f.kind == "link_congested"]
    assert f.subject["switch"] == injected
    # ranks (here: whole pipeline stages) under the switch are slower, and that is the
    # network's doing, not a bad GPU and not the job's layout
    slow = [f for f in findings(a) if f.kind in ("straggler", "pipeline_imbalance")]
    assert slow and all(f.evidence["cause"] == "nic" for f in slow)
    assert all(f.evidence["attribution"]["switch"] == injected for f in slow)


def test_results_are_written_back_in_catalogue_terms(influxd, influx_db, tmp_path):
    _, _, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "slow-gpu", duration_s=1800)
    a = analyse(cfg, start, end, LocalExecutor())
    found = findings(a)
    pts = points(a, found)
    for p in pts:
        check_point(p.measurement, p.tags, p.fields)
    from gpuwarden.analytics.cli import _write

    n_found, n_points = _write(cfg, a)
    assert (n_found, n_points) == (len(found), len(pts))
    body = json.loads(influxd.query('SELECT "mfu_ratio","goodput_ratio" FROM "mfu"', influx_db))
    mfu = body["results"][0]["series"][0]["values"][0]
    assert 0 < mfu[1] < 1 and 0 < mfu[2] <= 1
    body = json.loads(
        influxd.query('SELECT "finding_id","cause" FROM "finding","straggler"', influx_db)
    )
    names = {s["name"] for s in body["results"][0]["series"]}
    assert names == {"finding", "straggler"}


def test_unreachable_influxdb_is_a_clear_error(tmp_path):
    from gpuwarden.core.store.reader import QueryError

    cfg = with_overrides(load_config(environ={}), influxdb={"url": "http://127.0.0.1:9"})
    with pytest.raises(QueryError, match="unreachable"):
        analyse(cfg, 0, 10**9, LocalExecutor())


def test_topology_files(tmp_path):
    def topo(text: str) -> dict[str, str]:
        path = tmp_path / "t.csv"
        path.write_text(text)
        return load_topology(path)

    # an ASW's name is unique within its pod only: h3's S1 is another switch than h1's
    assert topo("ip,DSW,PSW,ASW\nh1,G1,P1,S1\nh2,G1,P1,S2\nh3,G1,P2,S1\n") == {
        "h1": "P1-S1", "h2": "P1-S2", "h3": "P2-S1"}  # fmt: skip
    assert topo("ip,DSW,PSW,ASW\nh1,G1,,S1\n") == {"h1": "S1"}  # no pod: not dropped
    assert topo("# the fleet's ToRs\nNode, Switch\nh1,S1\n") == {"h1": "S1"}
    for text, says in [
        ("Node,node,switch\nh1,h2,S1\n", "only in case"),
        ("host,tor\nh1,S1\n", "need columns"),
        ("node,switch\nh1,S1\nh1,S2\n", "twice"),
    ]:
        with pytest.raises(TopologyError, match=says):
            topo(text)


def test_analytics_sample_config_equals_defaults():
    import tomllib

    path = Path(__file__).parent.parent / "config/analytics.sample.toml"
    assert load_config(path, environ={}).sections == DEFAULTS
    for section, values in tomllib.loads(path.read_text()).items():
        assert set(values) == set(DEFAULTS[section]), section


def test_cli_run_writes_back_and_posts_findings_with_the_token(
    influxd, influx_db, tmp_path, capsys
):
    from gpuwarden.analytics.cli import main
    from gpuwarden.core.finding import Finding
    from tests.scripted_server import ScriptedServer

    _, _, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "slow-gpu", duration_s=1800)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with ScriptedServer([]) as engine:
        conf = tmp_path / "analytics.toml"
        conf.write_text(
            f'[influxdb]\nurl = "{influxd.url}"\ndatabase = "{influx_db}"\n'
            f'[analysis]\ntopology = "{cfg["analysis"]["topology"]}"\n'
            f'spool_dir = "{tmp_path / "spool2"}"\n'
            f'[findings]\nurl = "{engine.url}/v1/findings"\ntoken_file = "{token}"\n'
        )

        def iso(ns: int) -> str:
            return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()

        assert (
            main(
                ["run", "--config", str(conf), "--start", iso(start), "--end", iso(end), "--local"]
            )
            == 0
        )
        out = capsys.readouterr().out
        assert "job llm-13b: MFU" in out and "findings=1" in out
        (req,) = engine.requests
        assert req[1] == "/v1/findings" and req[2]["Authorization"] == "Bearer s3cret"
        posted = Finding.from_json(json.loads(req[3]))  # the id must match the content
        assert posted.kind == "straggler" and posted.evidence["cause"] == "gpu"
    body = json.loads(influxd.query('SELECT count("finding_id") FROM "finding"', influx_db))
    assert body["results"][0]["series"][0]["values"][0][1] == 1


def test_goodput_counts_redone_steps_and_downtime(influxd, influx_db, tmp_path):
    """xid79-mid-run: a fatal XID stops the job; it restarts from its last checkpoint."""
    gen, _, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "xid79-mid-run")
    a = analyse(cfg, start, end, LocalExecutor())
    tp = a.job("llm-13b").throughput
    assert tp is not None
    job = gen.spec.jobs[0]
    assert tp.down_s == pytest.approx(job.restart_s, rel=0.1)
    assert tp.redone_s > 0  # steps since the last checkpoint ran twice
    assert tp.goodput == pytest.approx(tp.productive_s / tp.elapsed_s)
    assert tp.goodput < 0.9


def test_mfu_estimate_from_gpm_for_a_job_that_reports_nothing(influxd, influx_db, tmp_path):
    """H100 scenario without job_step: only the agent's telemetry (GPM tensor activity)."""
    spec = dataclasses.replace(
        load_spec("healthy"),
        interval_s=10,
        duration_s=600,
        gpu_model="H100",
        measurements=("gpu", "ib_port"),
    ).validate()
    gen = ScenarioGenerator(spec, seed=2)
    sink = InfluxSink(
        SinkConfig(url=influxd.url, database=influx_db, spool_dir=str(tmp_path / "s"))
    )
    for chunk in gen.chunks(ticks_per_chunk=60):
        for m, df in chunk.items():
            sink.write_frame(df, m, tags=[t for t in TAGS[m] if t in df.columns])
    assert sink.close(timeout_s=60)
    cfg = with_overrides(
        load_config(environ={}), influxdb={"url": influxd.url, "database": influx_db}
    )
    a = analyse(cfg, spec.start_ns, spec.start_ns + 600 * 10**9 + 1, LocalExecutor())
    job = a.job("llm-13b")
    assert job.mfu is None and job.estimate is not None and 0 < job.estimate < 1
    (mfu,) = [p for p in points(a, []) if p.measurement == "mfu"]
    assert mfu.fields["estimate_active"] is True


def test_goodput_counts_every_step_when_only_every_nth_is_reported():
    """A reporter that sends every 10th step: time and tokens stand for the whole run, and a
    restart from a checkpoint still shows as re-done work."""
    from gpuwarden.analytics.mfu import throughput

    def rows(indices, t0):
        return [
            {"rank": "0", "step_index": i, "time": t0 + (k + 1) * 10 * 10**9,
             "step_time_s": 1.0, "tokens_count": 100}
            for k, i in enumerate(indices)
        ]  # fmt: skip

    # every 10th step of 200, 10 s apart (one step a second)
    sampled = throughput(pl.DataFrame(rows(range(10, 201, 10), 0)))
    assert sampled is not None
    assert sampled.running_s == pytest.approx(200.0)
    assert sampled.tokens == 200 * 100
    assert sampled.goodput == pytest.approx(1.0, abs=0.06)
    # stopped after step 100, restarted from step 50: steps 60..100 were done twice
    restarted = rows(range(10, 101, 10), 0) + rows(range(60, 201, 10), 2000 * 10**9)
    r = throughput(pl.DataFrame(restarted))
    assert r is not None and r.redone_s == pytest.approx(50.0)


def test_badput_splits_a_restart_and_a_straggler_by_cause(influxd, influx_db, tmp_path):
    """xid79-mid-run: the lost time is the steps run twice and the restart, nothing else.
    slow-gpu: a GPU 25 % slow for the whole run costs about 25 % of a step per step (less the
    jitter of the slowest other rank), and says so as what fixing it would give back."""
    gen, _, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "xid79-mid-run")
    a = analyse(cfg, start, end, LocalExecutor())
    b, tp = a.badput["llm-13b"], a.job("llm-13b").throughput
    assert tp is not None
    assert b.recompute_s == tp.redone_s > 0
    assert b.restart_s == pytest.approx(gen.spec.jobs[0].restart_s, rel=0.1)
    assert b.checkpoint_s == b.hang_s == b.straggler_s == b.mixed_config_s == 0.0
    assert b.productive_s + b.recompute_s + b.restart_s == pytest.approx(b.elapsed_s)
    assert [p.fields for p in points(a, []) if p.measurement == "badput"] == [
        {"elapsed_s": round(b.elapsed_s, 3), "productive_s": round(b.productive_s, 3),
         **{f"{c}_s": round(v, 3) for c, v in b.seconds().items()}}
    ]  # fmt: skip

    slow_db = f"{influx_db}_slow"
    influxd.create_database(slow_db)
    gen, _, cfg, (start, end) = _load(
        influxd, slow_db, tmp_path / "slow", "slow-gpu", duration_s=2400
    )
    a = analyse(cfg, start, end, LocalExecutor())
    job = a.job("llm-13b")
    (s,) = job.stragglers
    b = a.badput["llm-13b"]
    fault, js = gen.spec.faults[0], gen.spec.jobs[0]
    steps = job.walls.height  # executed samples in the window
    flagged = sum(1 for k in job.step_times if s.onset_step <= k <= s.last_step)
    per_step = fault.severity * js.step_time_s
    assert flagged > steps / 2
    # each flagged sample stands for report_every_steps steps
    expected = per_step * flagged * js.report_every_steps
    assert 0.5 * expected < b.straggler_s < expected, (b.straggler_s, expected)
    assert b.mixed_config_s == 0.0
    (f,) = [f for f in findings(a) if f.kind == "straggler"]
    assert f.evidence["fix_gain_s"] == pytest.approx(b.straggler_s, abs=0.01)


def test_a_straggler_tagged_with_a_node_that_never_ran_the_job_names_no_node(
    influxd, influx_db, tmp_path
):
    """Issue 38: a rank's ``node`` tag is its writer's word. slow-gpu's job tags its ranks of
    the slow GPU's node ``victim`` (no agent saw the job there): the straggler is still found,
    but its finding names no node (``evidence.unconfirmed_node``), and no attribution reads
    the victim's telemetry. Before, the finding's subject was ``node=victim``."""
    spec = load_spec("slow-gpu")
    slow = ScenarioGenerator(spec, seed=1).node_names[spec.faults[0].node]

    def forge(m, df):
        if m.startswith("job_") and "node" in df.columns:
            return df.with_columns(
                pl.when(pl.col("node") == slow).then(pl.lit("victim")).otherwise(pl.col("node"))
                .alias("node")
            )  # fmt: skip
        return df

    gen, _, cfg, (start, end) = _load(
        influxd, influx_db, tmp_path, "slow-gpu", duration_s=1200, edit=forge
    )
    a = analyse(cfg, start, end, LocalExecutor())
    (s,) = a.job("llm-13b").stragglers
    assert s.node is None and s.evidence["unconfirmed_node"] == "victim"
    (f,) = [f for f in findings(a) if f.kind == "straggler"]
    assert "node" not in f.subject and f.evidence["evidence"]["unconfirmed_node"] == "victim"
    assert "victim" not in a.job("llm-13b").rank_node.values()
    assert slow in set(gen.node_names)  # the agents' data names the real node, which ran it


def test_a_rank_whose_points_name_two_nodes_names_neither() -> None:
    """A job writing to the store tags its slow rank's first point with another node of the
    same job (one that did run it): the node is the tags' word only when they agree. Before,
    the first tag was taken, and an innocent node of the job was blamed."""
    from gpuwarden.analytics.stragglers import Straggler, confirmed

    slow = Straggler("worker", 1.3, 1.0, 10, 50, 40, 1.1, worker="13", node="n1")
    other = Straggler("worker", 1.2, 1.0, 10, 50, 40, 1.1, worker="7", node="n2")
    held = {"n1", "n2", "n3"}
    tagged = {"13": ["n1", "n3"], "7": ["n2"]}
    s, o = confirmed([slow, other], held, tagged)
    assert s.node is None and s.evidence["unconfirmed_node"] == "n1, n3"
    assert o == other  # agreeing tags on a node that ran the job: named
    assert confirmed([slow], set(), {"13": ["n1"]}) == [slow]  # no GPU data: the tags stand


def test_a_job_read_in_node_groups_gives_what_one_read_gives(influxd, influx_db, tmp_path):
    """``analysis.nodes_per_read``: the step log read three nodes at a time (influxd merges
    fewer series per query) is the same frame, row for row, as one read, and so is the job's
    whole result; a rank reported without a ``node`` tag is in it too."""
    gen, _, cfg, (start, end) = _load(influxd, influx_db, tmp_path, "slow-gpu", duration_s=600)
    orphan = Point("job_step", {"cluster": gen.spec.cluster, "job": "llm-13b", "rank": "9999"},
                   {"step_index": 1, "step_time_s": 1.0}, start + 10**9)  # fmt: skip
    sink = InfluxSink(SinkConfig(url=influxd.url, database=influx_db,
                                 spool_dir=str(tmp_path / "spool2")))  # fmt: skip
    sink.write_points([orphan])
    assert sink.close(timeout_s=60)
    grouped = with_overrides(cfg, analysis={"nodes_per_read": 3})
    reader = InfluxReader(**cfg.reader_kwargs())
    try:
        nodes = reader.indexed_tag_values("job_step", "node", {"job": "llm-13b"})
        assert len(nodes) == len(gen.node_names) > 3  # so several groups
        one = read_steps(reader, cfg, "llm-13b", start, end)
        with ThreadPoolExecutor(max_workers=2) as pool:
            several = read_steps(reader, grouped, "llm-13b", start, end, pool)
    finally:
        reader.close()
    assert one.height > 0 and "9999" in set(one["rank"])
    assert several.equals(one)
    a, b = job_task(cfg, "llm-13b", start, end), job_task(grouped, "llm-13b", start, end)
    assert b.mfu is not None  # every rank, and the one without a node tag:
    assert len(b.rank_node) == len(nodes) * gen.spec.gpus_per_node + 1
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.equals(y) if isinstance(x, pl.DataFrame) else x == y, f.name
