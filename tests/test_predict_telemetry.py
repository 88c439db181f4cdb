"""The telemetry failure predictor on a small SIMULATED scenario in a real influxd: failures
found where the scenario injected them, features that never look ahead, labels and outages,
and the train -> evaluate -> online scoring path through the CLI. (Quality on unseen seeds is
the benchmark's job: benchmarks/predict_simulated.py.)"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from gpuwarden.analytics.cli import main as analyze
from gpuwarden.analytics.config import AnalyticsConfig, load_config, with_overrides
from gpuwarden.analytics.predict.cli import dataset, label_events
from gpuwarden.analytics.predict.dataset import Dataset
from gpuwarden.analytics.predict.evaluate import alert_starts, first_failures
from gpuwarden.analytics.predict.model import RiskModel, fit
from gpuwarden.analytics.predict.scoring import score
from gpuwarden.analytics.predict.telemetry import FEATURES
from gpuwarden.analytics.runner import LocalExecutor
from gpuwarden.simulation.cli import stream_scenario
from gpuwarden.simulation.spec import FaultSpec, ScenarioSpec, load_spec
from testbed.influxd import LocalInfluxd

HOUR = 3600


def _spec() -> ScenarioSpec:
    return dataclasses.replace(
        load_spec("predictor-day"),
        name="predictor-test",
        nodes=8,
        duration_s=5 * HOUR,
        stepfun=None,
        faults=(
            FaultSpec(type="ecc_row_remap", at_s=3 * HOUR, node=1, gpu=4, xid=48),
            FaultSpec(type="ib_flap", at_s=3.5 * HOUR, node=3, hca=2),
            FaultSpec(type="xid79", at_s=4 * HOUR, node=5, gpu=2),
            FaultSpec(type="thermal_slowdown", at_s=2 * HOUR, node=6, gpu=1),
        ),
    ).validate()


@pytest.fixture(scope="module")
def loaded(
    influxd: LocalInfluxd, tmp_path_factory: pytest.TempPathFactory
) -> tuple[AnalyticsConfig, ScenarioSpec, Dataset]:
    spec = _spec()
    influxd.create_database("predict")
    stream_scenario(spec, 7, influxd.url, "predict", tmp_path_factory.mktemp("spool"))
    # a fatal NVSwitch error on node-000 at 4.5 h (CONSTRUCTED: the scenario has no NVSwitches),
    # and a non-fatal one on node-002 that must not count
    sxid_ns = spec.start_ns + int(4.5 * HOUR) * 10**9
    lines = (
        f"nvswitch_event,cluster={spec.cluster},node=node-000,nvswitch=2,event=sxid,"
        f"severity=critical,source=kmsg sxid_code=24007i,fatal_active=true {sxid_ns}\n"
        f"nvswitch_event,cluster={spec.cluster},node=node-002,nvswitch=1,event=sxid,"
        f"severity=warning,source=kmsg sxid_code=20009i,fatal_active=false {sxid_ns}\n"
    )
    influxd.write("predict", lines)
    cfg = with_overrides(
        load_config(environ={}), influxdb={"url": influxd.url, "database": "predict"}
    )
    end = spec.start_ns + spec.duration_s * 10**9
    return cfg, spec, dataset(cfg, spec.start_ns, end, LocalExecutor())


def test_failures_are_found_where_the_scenario_put_them(
    loaded: tuple[AnalyticsConfig, ScenarioSpec, Dataset],
) -> None:
    _, spec, ds = loaded
    t0 = spec.start_ns / 1e9
    found: dict[tuple[str, str], float] = {}
    for e in ds.events:
        if e.failure:
            found.setdefault((e.kind, e.subject), e.start_s - t0)
    assert found.keys() >= {
        ("xid 48", "node-001/4"),
        ("link_down", "node-003"),
        ("xid 79", "node-005/2"),
        ("nvswitch_sxid", "node-000"),
    }
    # the DBE counter moves within a bucket of the XID 48; a thermal slowdown is no failure
    assert abs(found[("dbe", "node-001/4")] - 3 * HOUR) <= 120
    assert len(first_failures(ds.events)) == 4  # the DBE and its XID are one failure
    assert abs(found[("nvswitch_sxid", "node-000")] - 4.5 * HOUR) <= 60
    assert not [k for k in found if k[1].startswith("node-002")]  # a non-fatal SXid is none
    assert abs(found[("xid 48", "node-001/4")] - 3 * HOUR) <= 60
    assert abs(found[("link_down", "node-003")] - 3.5 * HOUR) <= 60
    assert not [k for k in found if k[1].startswith("node-006")]
    # the xid79 GPU stops reporting: one GPU silent is not a node down
    assert not [k for k in found if k[0] == "node_down"]


def test_gpu_events_from_nvml_alone_are_failures(
    influxd: LocalInfluxd, influx_db: str, tmp_path: Path
) -> None:
    """A node whose agent cannot read the kernel log still has its failures labelled: the
    agent's own gpu_lost and row_remap_failure events (CONSTRUCTED here, in the agent's tags)
    on an hour of a SIMULATED 2-node cluster; and the label rules turn them off."""
    spec = dataclasses.replace(_spec(), nodes=2, duration_s=HOUR, faults=()).validate()
    stream_scenario(spec, 3, influxd.url, influx_db, tmp_path / "spool")
    event = f"gpu_event,cluster={spec.cluster},node=node-001,severity=critical,source=nvml"
    at = spec.start_ns + 1200 * 10**9
    lines = (
        f'{event},gpu=6,event=gpu_lost message="GPU 6 is lost",fatal_active=true {at}\n'
        f'{event},gpu=2,event=row_remap_failure message="remap failed",fatal_active=true '
        f"{at + 600 * 10**9}\n"
        f'{event},gpu=3,event=ecc_dbe message="DBE",fatal_active=true {at}\n'
    )
    influxd.write(influx_db, lines)
    cfg = with_overrides(
        load_config(environ={}), influxdb={"url": influxd.url, "database": influx_db}
    )
    ds = dataset(cfg, spec.start_ns, spec.start_ns + HOUR * 10**9, LocalExecutor())
    t0 = spec.start_ns / 1e9
    failures = {(e.kind, e.subject, e.start_s - t0) for e in ds.events if e.failure}
    # the ecc_dbe event is not read: the DBE counter is the label there (label_dbe)
    assert failures == {("gpu_lost", "node-001/6", 1200), ("row_remap_failure", "node-001/2", 1800)}
    gpu6 = ds.frame.filter((pl.col("node") == "node-001") & (pl.col("gpu") == "6"))
    assert gpu6.filter(pl.col("t") < t0 + 1200)["y_3600s"].all()
    off = with_overrides(cfg, predictor={"label_gpu_lost": False, "label_row_remap_failure": False})
    assert not [e for e in label_events(off, ds.events) if e.failure]


def test_features_never_look_ahead(loaded: tuple[AnalyticsConfig, ScenarioSpec, Dataset]) -> None:
    """Features from a window that ends at t equal those from the whole run, up to t."""
    cfg, spec, ds = loaded
    cut = spec.start_ns + int(3.2 * HOUR) * 10**9
    early = dataset(cfg, spec.start_ns, cut, LocalExecutor()).frame
    upto = cut / 1e9 - 60
    a = (
        early.filter(pl.col("t") <= upto)
        .sort("node", "gpu", "t")
        .select("node", "gpu", "t", *FEATURES)
    )
    b = (
        ds.frame.filter(pl.col("t") <= upto)
        .sort("node", "gpu", "t")
        .select("node", "gpu", "t", *FEATURES)
    )
    assert a.height == b.height > 0
    assert a.equals(b)


def test_precursor_rows_are_positive_and_failed_parts_are_out(
    loaded: tuple[AnalyticsConfig, ScenarioSpec, Dataset],
) -> None:
    _, spec, ds = loaded
    t0 = spec.start_ns / 1e9
    gpu = ds.frame.filter((pl.col("node") == "node-001") & (pl.col("gpu") == "4"))
    before = gpu.filter((pl.col("t") > t0 + 1.5 * HOUR) & (pl.col("t") < t0 + 3 * HOUR - 60))
    assert before["y_7200s"].all() and not before["down"].any()
    assert before["sbe_30m"].max() > 0  # type: ignore[operator]
    assert gpu.filter(pl.col("t") > t0 + 3 * HOUR)["down"].all()
    node3 = ds.frame.filter((pl.col("node") == "node-003") & (pl.col("t") < t0 + 3.4 * HOUR))
    assert node3.filter(pl.col("t") > t0 + 2.5 * HOUR)["y_3600s"].all()  # every GPU of it
    sxid_node = ds.frame.filter(pl.col("node") == "node-000")  # a node failure: all its GPUs
    assert sxid_node.filter(pl.col("t") > t0 + 4.5 * HOUR + 60)["down"].all()
    assert sxid_node.filter(pl.col("t") > t0 + 3.6 * HOUR)["y_3600s"].any()
    healthy = ds.frame.filter(pl.col("node") == "node-007")
    assert not healthy["y_7200s"].any() and not healthy["down"].any()


def test_train_evaluate_and_score_online(
    loaded: tuple[AnalyticsConfig, ScenarioSpec, Dataset],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI path on the same small window (plumbing, not quality): train saves a model with
    its metadata; evaluate reports model and baselines with plots; the scorer writes
    failure_risk for every GPU and a finding, with its drivers, for the GPU in its precursor;
    `run` scores when a model is configured."""
    cfg, spec, _ = loaded
    conf = tmp_path / "a.toml"
    influx = cfg["influxdb"]
    conf.write_text(
        f'[influxdb]\nurl = "{influx["url"]}"\ndatabase = "predict"\n'
        f'[predictor]\nmodel = "{tmp_path / "risk.pkl"}"\n'
        f'[analysis]\nspool_dir = "{tmp_path / "spool"}"\n'
    )
    start = "2026-01-05T00:00:00Z"
    end = "2026-01-05T05:00:00Z"
    common = ["--config", str(conf), "--start", start, "--end", end, "--local"]
    assert analyze(["train", *common, "--out", str(tmp_path / "risk.pkl")]) == 0
    model = RiskModel.load(tmp_path / "risk.pkl")
    meta = json.loads((tmp_path / "risk.pkl.json").read_text())
    assert meta["features"] == list(FEATURES) and meta["horizon_s"] == 7200
    assert meta["positives"] > 0 and "oof_pr_auc" in meta["metrics"]
    report = tmp_path / "report"
    code = analyze(
        [
            "evaluate",
            *common,
            "--model",
            str(tmp_path / "risk.pkl"),
            "--report",
            str(report),
            "--label",
            "SIMULATED: test",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "PR-AUC: model" in out and "fixed thresholds" in out and "has failed before" in out
    for name in ("report.html", "pr_curve.png", "lead_time.png", "report.json"):
        assert (report / name).stat().st_size > 0
    assert json.loads((report / "report.json").read_text())["events"]["model"]["failures"] >= 2

    t_ns = spec.start_ns + int(2.75 * HOUR) * 10**9  # 15 min before the XID 48, in precursor
    nodes = [f"node-{i:03d}" for i in range(8)]
    scored = score(cfg, model, t_ns, LocalExecutor(), cluster="sim", nodes=nodes, threshold=0.2)
    assert scored.frame.height == 64
    per_gpu = [p for p in scored.points if "gpu" in p.tags]
    per_node = [p for p in scored.points if "gpu" not in p.tags]
    assert len(per_gpu) == 64 and len(per_node) == 8
    risk = {(p.tags["node"], p.tags["gpu"]): p.fields["probability_ratio"] for p in per_gpu}
    assert risk[("node-001", "4")] == max(risk.values())
    hit = [f for f in scored.findings if f.subject.get("gpu") == "4"]
    assert hit and hit[0].kind == "failure_risk" and hit[0].subject["node"] == "node-001"
    drivers = [d["feature"] for d in hit[0].evidence["drivers"]]
    assert drivers and any(d.startswith(("sbe", "remap", "error")) for d in drivers), drivers
    assert not [f for f in scored.findings if f.subject["node"] == "node-007"]

    assert (
        analyze(
            [
                "run",
                "--config",
                str(conf),
                "--start",
                start,
                "--end",
                "2026-01-05T02:45:00Z",
                "--local",
                "--no-write",
            ]
        )
        == 0
    )
    assert "failure risk: 64 GPUs scored" in capsys.readouterr().out


def test_alerts_rearm_only_after_the_cooldown() -> None:
    frame = pl.DataFrame(
        {
            "node": ["n"] * 6,
            "gpu": ["0"] * 6,
            "t": [0.0, 60, 120, 180, 240, 4000],
            "risk": [0.9, 0.1, 0.9, 0.1, 0.9, 0.9],
        }
    )
    assert alert_starts(frame, "risk", 0.5, 60)["t"].to_list() == [0.0, 120.0, 240.0, 4000.0]
    assert alert_starts(frame, "risk", 0.5, 60, rearm_s=3600)["t"].to_list() == [0.0, 4000.0]
    assert np.isfinite(frame["t"].max())  # type: ignore[arg-type]


def test_a_model_that_does_not_fit_the_data_does_not_stop_the_analysis(
    loaded: tuple[AnalyticsConfig, ScenarioSpec, Dataset],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg, _, _ = loaded
    caplog.set_level(logging.WARNING, logger="gpuwarden.analyze")
    rng = np.random.default_rng(0)
    frame = pl.DataFrame(
        {"t": np.arange(400.0), "bogus": rng.random(400), "y": rng.random(400) > 0.8}
    )
    fit(frame, ["bogus"], "y", horizon_s=60.0).save(tmp_path / "other.pkl")
    conf = tmp_path / "a.toml"
    conf.write_text(
        f'[influxdb]\nurl = "{cfg["influxdb"]["url"]}"\ndatabase = "predict"\n'
        f'[predictor]\nmodel = "{tmp_path / "other.pkl"}"\n'
    )
    code = analyze(
        [
            "run",
            "--config",
            str(conf),
            "--start",
            "2026-01-05T00:00:00Z",
            "--end",
            "2026-01-05T01:00:00Z",
            "--local",
            "--no-write",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "findings=" in out
    assert "failure risk not scored" in caplog.text and "bogus" in caplog.text, (out, caplog.text)
