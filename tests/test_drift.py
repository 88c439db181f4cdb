"""Configuration drift (``config_drift`` findings): GPUs set up unlike their fleet, or waiting for
a reset. The fleets below are CONSTRUCTED: hand-written ``gpu_info`` rows, and the CONSTRUCTED
H100 golden recording answered for five nodes, one of them altered (an older driver, ECC off
on one GPU with ECC on pending)."""

from __future__ import annotations

import json
from typing import Any

import polars as pl
import pytest

from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.drift import DriftConfig, find_drift, find_job_mix
from gpuwarden.analytics.emit import findings
from gpuwarden.analytics.runner import Analysis, LocalExecutor, analyse
from gpuwarden.collector import sources
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.config import ConfigError
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.remediation.policy import DEFAULT_POLICIES, first_match, load_policies
from tests.test_golden import GOLDEN

S = 10**9
GOOD = {
    "driver_version": "550.90.07",
    "vbios_version": "96.00.99.00.01",
    "persistence_mode_active": True,
    "ecc_mode_active": True,
    "ecc_mode_pending_active": True,
    "mig_mode_active": False,
    "mig_mode_pending_active": False,
}


def _fleet(
    nodes: int,
    changes: dict[str, dict[str, Any]] | None = None,
    model: str = "NVIDIA H100 80GB HBM3",
    t: int = 0,
) -> list[dict[str, Any]]:
    """``gpu_info`` rows; ``changes`` maps ``"node-2/3"`` (or ``"node-2"``: all its GPUs) to
    the fields that GPU reports differently."""
    rows, changes = [], changes or {}
    for n in range(nodes):
        for g in range(8):
            row = {"time": t, "cluster": "c1", "node": f"node-{n}", "gpu": str(g)}
            row |= {"gpu_model": model, **GOOD}
            row |= changes.get(f"node-{n}", {}) | changes.get(f"node-{n}/{g}", {})
            rows.append(row)
    return rows


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows).with_columns(pl.col("time").cast(pl.Datetime("ns", "UTC")))


def test_a_node_on_an_old_driver_and_a_gpu_without_ecc_are_named():
    rows = _fleet(
        6,
        {
            "node-4": {"driver_version": "535.129.03"},
            "node-1/3": {"ecc_mode_active": False, "ecc_mode_pending_active": False},
            "node-1/5": {"persistence_mode_active": False},
        },
    )
    found = find_drift(_frame(rows), DriftConfig())
    assert [(d.node, d.gpus) for d in found] == [("node-1", 8), ("node-4", 8)]
    node1, node4 = found
    assert [x.to_json() for x in node1.differences] == [
        {"gpu": "5", "field": "persistence_mode_active", "value": False, "fleet": True,
         "fleet_share": round(47 / 48, 4)},
        {"gpu": "3", "field": "ecc_mode_active", "value": False, "fleet": True,
         "fleet_share": round(47 / 48, 4)},
    ]  # fmt: skip
    assert {x.field for x in node4.differences} == {"driver_version"}
    assert node4.describe() == "driver 535.129.03 (fleet 550.90.07, 83%) on all 8 GPUs"
    assert node1.describe() == (
        "persistence mode off (fleet on, 98%) on GPU 5; ECC off (fleet on, 98%) on GPU 3"
    )


def test_a_mode_waiting_for_a_reset_is_named_whatever_the_fleet_does():
    rows = _fleet(
        2,  # too few nodes for a fleet reference: only the pending change is said
        {"node-0/6": {"ecc_mode_pending_active": False, "mig_mode_pending_active": True}},
    )
    (d,) = find_drift(_frame(rows), DriftConfig())
    assert d.node == "node-0"
    assert [x.to_json() for x in d.differences] == [
        {"gpu": "6", "field": "ecc_mode_active", "value": True, "pending": False},
        {"gpu": "6", "field": "mig_mode_active", "value": False, "pending": True},
    ]
    assert d.describe() == (
        "ECC turns off at the next GPU reset on GPU 6; "
        "MIG mode turns on at the next GPU reset on GPU 6"
    )


def test_no_clear_fleet_setting_means_nothing_is_said():
    # a driver rollout halfway through (3 of 6 nodes) has no reference: nobody is "drifted"
    half = _fleet(6, {f"node-{n}": {"driver_version": "560.35.03"} for n in range(3)})
    assert find_drift(_frame(half), DriftConfig()) == []
    # below min_share (4 of 6 = 67 % < 75 %) neither
    third = _fleet(6, {f"node-{n}": {"driver_version": "560.35.03"} for n in range(2)})
    assert find_drift(_frame(third), DriftConfig()) == []
    assert len(find_drift(_frame(third), DriftConfig(min_share=0.6))) == 2


def test_models_are_compared_only_with_their_own_kind():
    a100 = {"driver_version": "550.90.07", "vbios_version": "92.00.45.00.06"}
    rows = _fleet(4) + [
        r | {"node": r["node"].replace("node", "a100")}
        for r in _fleet(4, {f"node-{n}": a100 for n in range(4)}, model="NVIDIA A100-SXM4-80GB")
    ]
    assert find_drift(_frame(rows), DriftConfig()) == []  # each model agrees with itself


def test_the_last_report_counts_and_unanswered_fields_do_not_vote():
    # node-2 ran the old driver an hour ago and was upgraded since; node-3 does not say its
    # VBIOS (an older driver without the call): neither is drift
    rows = _fleet(4, {"node-2": {"driver_version": "535.129.03"}}, t=0)
    rows += _fleet(4, {"node-3": {"vbios_version": None}}, t=3600 * S)
    assert find_drift(_frame(rows), DriftConfig()) == []
    # a field that the whole fleet leaves out is not compared at all
    frame = _frame(_fleet(4)).drop("vbios_version", "mig_mode_pending_active")
    assert find_drift(frame, DriftConfig()) == []
    assert find_drift(frame.clear(), DriftConfig()) == []


def _placement(jobs: dict[str, list[str]]) -> pl.DataFrame:
    """``cluster, node, gpu, job`` rows: ``{"job": ["node-2", "node-3/4", ...]}`` (a node alone:
    all 8 GPUs)."""
    rows = []
    for job, where in jobs.items():
        for w in where:
            node, _, gpu = w.partition("/")
            for g in [gpu] if gpu else [str(i) for i in range(8)]:
                rows.append({"cluster": "c1", "node": node, "gpu": g, "job": job})
    return pl.DataFrame(rows)


def test_a_job_on_gpus_set_up_unlike_each_other_is_named():
    cfg = DriftConfig()
    # the fleet has a clear driver and ECC setting: node-4 and node-1/3 are drifted nodes, and
    # the jobs on them are mixed "explained" (info); a job on good nodes only is not mixed
    rows = _fleet(
        6, {"node-4": {"driver_version": "535.129.03"}, "node-1/3": {"ecc_mode_active": False}}
    )
    place = _placement({"77": ["node-1", "node-2", "node-3", "node-4"], "78": ["node-5", "node-3"]})
    (mix,) = find_job_mix(_frame(rows), place, cfg)
    assert (mix.job, mix.gpus, mix.explained) == ("77", 32, True)
    assert mix.describe() == (
        "driver 550.90.07 for 24 GPUs (node-1, node-2, node-3), 535.129.03 for 8 GPUs (node-4); "
        "ECC on for 31 GPUs (4 nodes), off for 1 GPU (node-1)"
    )
    # a rollout halfway through: no node is drifted, but the job straddling it is, louder
    half = _fleet(6, {f"node-{n}": {"driver_version": "560.35.03"} for n in range(3)})
    assert find_drift(_frame(half), cfg) == []
    (mix,) = find_job_mix(_frame(half), place, cfg)
    assert (mix.job, mix.explained) == ("77", False)
    assert mix.describe() == (  # a tie, and no fleet setting: by value
        "driver 550.90.07 for 16 GPUs (node-3, node-4), 560.35.03 for 16 GPUs (node-1, node-2)"
    )
    # only the GPUs a job runs on count: node-4's GPU 7 differs, the job uses GPUs 0-3
    odd_gpu = _fleet(4, {"node-3/7": {"persistence_mode_active": False}})
    assert (
        find_job_mix(
            _frame(odd_gpu),
            _placement({"9": [f"node-{n}/{g}" for n in (2, 3) for g in range(4)]}),
            cfg,
        )
        == []
    )
    assert len(find_job_mix(_frame(odd_gpu), _placement({"9": ["node-2", "node-3"]}), cfg)) == 1
    # GPUs of two models are compared within their model only (their VBIOS lines differ)
    a100 = {"vbios_version": "92.00.45.00.06"}
    two = _fleet(2) + [
        r | {"node": "a100-0"} for r in _fleet(1, {"node-0": a100}, model="NVIDIA A100-SXM4-80GB")
    ]
    assert find_job_mix(_frame(two), _placement({"5": ["node-0", "node-1", "a100-0"]}), cfg) == []
    # unknown GPUs, no jobs, no gpu_info: nothing to say
    assert find_job_mix(_frame(half), _placement({"1": ["node-9"]}), cfg) == []
    assert find_job_mix(_frame(half), pl.DataFrame(), cfg) == []
    assert find_job_mix(_frame(half).clear(), place, cfg) == []


def test_a_mix_nothing_else_reports_is_sent_and_an_explained_one_only_written():
    half = _fleet(6, {f"node-{n}": {"driver_version": "560.35.03"} for n in range(3)})
    drifted = _fleet(6, {"node-4": {"driver_version": "535.129.03"}})
    policies = load_policies(DEFAULT_POLICIES)
    place = _placement({"77": ["node-2", "node-3", "node-4"]})
    sent = []
    for rows in (half, drifted):
        a = Analysis(0, 600 * S, "local", drift=find_drift(_frame(rows), DriftConfig()))
        a.job_mix = find_job_mix(_frame(rows), place, DriftConfig())
        (f,) = [f for f in findings(a) if f.kind == "job_config_mixed"]
        assert f.subject == {"cluster": "c1", "job": "77"}
        assert f.evidence["fields"]["driver_version"][0] == {  # the most common first
            "value": "550.90.07",
            "gpus": 16,
            "nodes": ["node-2", "node-3"] if rows is drifted else ["node-3", "node-4"],
        }
        policy = first_match(policies, f)
        sent.append((f.severity.value, policy.name if policy else None, f.summary.split("; ")[-1]))
    assert sent == [
        ("warning", "job-config-mixed", "no fleet setting to compare with (a rollout under way?)"),
        ("info", None, "the odd nodes have config_drift findings"),
    ]


def test_bad_drift_settings_are_a_clear_error(tmp_path):
    path = tmp_path / "analytics.toml"
    path.write_text('[drift]\nfields = ["driver_version", "serial"]\n')
    with pytest.raises(ConfigError, match=r"unknown \['serial'\]"):
        load_config(path, environ={})
    path.write_text("[drift]\nmin_share = 0.5\n")
    with pytest.raises(ConfigError, match="min_share"):
        load_config(path, environ={})
    path.write_text("[drift]\njob_window_s = 0\n")
    with pytest.raises(ConfigError, match="job_window_s"):
        load_config(path, environ={})


def _recording(tmp_path, driver: str | None = None, ecc: dict[int, list[int]] | None = None):
    doc = json.loads((GOLDEN / "nvml-h100-8gpu" / "nvml.json").read_text())
    for tick in doc["ticks"]:
        answers = tick["answers"]
        if driver:
            answers["-|nvmlSystemGetDriverVersion|[]"] = {"v": driver}
        for gpu, pair in (ecc or {}).items():
            answers[f"{gpu}|nvmlDeviceGetEccMode|[]"] = {"v": pair}
    path = tmp_path / f"nvml-{driver or 'stock'}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_agents_to_finding_to_policy_through_the_real_influxdb(influxd, influx_db, tmp_path):
    """Five agents (the recorded H100 backend) write gpu_info into the real InfluxDB; the
    analytics read it back and name the one node set up differently, and the engine's default
    policies only notify about it."""
    stock = _recording(tmp_path)
    odd = _recording(tmp_path, driver="535.129.03", ecc={3: [0, 1]})
    sink = InfluxSink(
        SinkConfig(url=influxd.url, database=influx_db, spool_dir=str(tmp_path / "spool"))
    )
    t0 = 1_780_000_000 * S
    for n in range(5):
        context = SourceContext("c1", f"node-{n}", sysfs=tmp_path, procfs=tmp_path)
        settings = {"backend": "recorded", "recording": odd if n == 3 else stock, "events": "poll"}
        source = sources.create("nvml", context, settings)
        try:
            points = [p for p in source.collect(t0) if p.measurement == "gpu_info"]
        finally:
            source.close()
        assert len(points) == 8
        for p in points:
            check_point(p.measurement, p.tags, p.fields)
        sink.write_points(points)
    # a job runs on node-2's and node-3's GPUs (as the agent tags them for a Slurm job)
    sink.write_points(
        [
            Point(
                "gpu",
                {"cluster": "c1", "node": n, "gpu": str(g), "job": "4242"},
                {"power_w": 3e2},
                t0,
            )
            for n in ("node-2", "node-3")
            for g in range(8)
        ]
    )
    assert sink.close(timeout_s=60)
    cfg = with_overrides(
        load_config(environ={}),
        influxdb={"url": influxd.url, "database": influx_db},
        analysis={"spool_dir": str(tmp_path / "aspool")},
    )
    a = analyse(cfg, t0 - 3600 * S, t0 + S, LocalExecutor())
    assert a.info_gpus == 40
    (finding,) = [f for f in findings(a) if f.kind == "config_drift"]
    assert finding.subject == {"cluster": "c1", "node": "node-3"}
    assert finding.summary == (
        "node node-3 (NVIDIA H100 80GB HBM3): driver 535.129.03 (fleet 550.90.07, 80%) on all "
        "8 GPUs; ECC off (fleet on, 98%) on GPU 3; ECC turns on at the next GPU reset on GPU 3; "
        "running job 4242"
    )
    assert finding.evidence["jobs"] == ["4242"]
    assert finding.confidence == pytest.approx(0.8)
    policy = first_match(load_policies(DEFAULT_POLICIES), finding)
    assert policy is not None and policy.name == "gpu-config-drift"
    assert policy.actions == ("notify",)
    # the job's view: its ranks straddle two drivers, which node-3's finding already says
    (mixed,) = [f for f in findings(a) if f.kind == "job_config_mixed"]
    assert mixed.subject == {"cluster": "c1", "job": "4242"}
    assert mixed.summary.startswith(
        "job 4242 (NVIDIA H100 80GB HBM3) on GPUs set up unlike each other: driver 550.90.07 "
        "for 8 GPUs (node-2), 535.129.03 for 8 GPUs (node-3); ECC on for 15 GPUs (node-2, "
        "node-3), off for 1 GPU (node-3)"
    )
    assert mixed.severity.value == "info" and mixed.evidence["explained"] is True
