"""Train the live loop's failure predictor: the recipe behind ``demo/model/live-risk-model.pkl``.

    uv run python -m demo.train_live_model [--seeds 1-6] [--out demo/model/live-risk-model.pkl]

The live loop runs in real time with its scenario compressed to minutes (a precursor of
two minutes, not two hours), so its predictor is trained at that time scale: features on
5 s buckets (``[predictor] step_s = 5``: the feature windows are 30 and 10 buckets, 150 s and
50 s) and a 120 s horizon. The training data are SIMULATED: per seed, 40 minutes of 8 H100
nodes shaped like the live loop's (4 HCAs, 4 NVLinks a GPU), with a dozen faults drawn from
that seed: ECC row-remap failures, NVLink CRC storms and InfiniBand flaps with precursors of
one to three minutes, and sudden GPU losses (XID 79) that no model can see coming. They are
replayed into a local influxd and trained exactly as ``gpuwarden analyze train`` trains.

Last, the model scores the live loop's own scenario (``live-loop``, seed 1: not in the
training data) and says whether it alerts before its ECC failure and how many false alarms it
raises there. That is a DEVELOPMENT check, not a held-out result: the training mix was designed
after the live scenario, and the file's placement is not what the demo runs (issue 40;
``benchmarks/live_model.py`` scores it on fresh placed seeds and on a StepFun-typed mix). A few
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from gpuwarden.analytics.config import AnalyticsConfig, load_config, with_overrides
from gpuwarden.analytics.predict.cli import dataset, train
from gpuwarden.analytics.predict.evaluate import event_report
from gpuwarden.analytics.predict.model import RiskModel
from gpuwarden.analytics.runner import LocalExecutor
from gpuwarden.simulation.cli import stream_scenario
from gpuwarden.simulation.spec import ScenarioSpec, load_spec, parse_spec
from testbed.influxd import LocalInfluxd

MODEL = Path(__file__).parent / "model" / "live-risk-model.pkl"
#: the predictor's settings at the live loop's time scale (the analyze service uses them too)
LIVE_PREDICTOR: dict[str, Any] = {
    "step_s": 5,
    "horizons_s": [60, 120, 300],
    "horizon_s": 120,
    "down_s": 60.0,
    "nodes_per_task": 4,
}
DURATION_S = 2400
NODES = 8
#: fault types, their share of the draws, and their precursor range (s)
MIX: tuple[tuple[str, float, tuple[int, int]], ...] = (
    ("ecc_row_remap", 0.40, (60, 180)),
    ("nvlink_crc_storm", 0.15, (60, 150)),
    ("ib_flap", 0.15, (60, 150)),
    ("xid79", 0.30, (0, 0)),
)


def training_spec(seed: int) -> ScenarioSpec:
    """One seed's SIMULATED 40 minutes: the live loop's hardware, a dozen faults."""
    rng = random.Random(seed)
    faults: list[dict[str, Any]] = []
    busy: dict[int, float] = {}  # node -> when its last fault is repaired
    at = 240.0
    while at < DURATION_S - 150:
        kind, _, (lo, hi) = rng.choices(MIX, weights=[w for _, w, _ in MIX])[0]
        node = rng.choice([n for n in range(NODES) if busy.get(n, 0.0) < at - lo])
        fault: dict[str, Any] = {
            "type": kind,
            "at_s": round(at),
            "node": node,
            "gpu": rng.randrange(8),
            "duration_s": 60,
        }
        if lo:
            fault["precursor_s"] = rng.randint(lo, hi)
        if kind == "ecc_row_remap":
            fault["xid"] = rng.choice([48, 64, 64])
        if kind == "nvlink_crc_storm":
            fault["link"] = rng.randrange(4)
        if kind == "ib_flap":
            fault["hca"] = rng.randrange(4)
        faults.append(fault)
        busy[node] = at + 60
        at += rng.uniform(120, 240)
    return parse_spec(
        {
            "name": f"live-train-{seed}",
            "nodes": NODES,
            "hcas_per_node": 4,
            "nvlink_links": 4,
            "gpu_model": "H100",
            "duration_s": DURATION_S,
            "measurements": ["gpu", "gpu_info", "gpu_nvlink", "gpu_event", "ib_port"],
            "jobs": [{"name": "load", "nodes": NODES, "step_time_s": 1.0, "restart_s": 5}],
            "faults": faults,
        }
    )


def live_config(cfg: AnalyticsConfig, url: str, database: str) -> AnalyticsConfig:
    return with_overrides(
        cfg, influxdb={"url": url, "database": database}, predictor=dict(LIVE_PREDICTOR)
    )


def train_model(influx: LocalInfluxd, work: Path, seeds: list[int]) -> RiskModel:
    influx.create_database("train")
    cfg = live_config(load_config(environ={}), influx.url, "train")
    datasets = []
    for seed in seeds:
        spec = training_spec(seed)
        shift = (seed - seeds[0]) * (DURATION_S + 600) * 10**9
        stream_scenario(spec, seed, influx.url, "train", work / f"spool{seed}", shift_ns=shift)
        start = spec.start_ns + shift
        datasets.append(dataset(cfg, start, start + DURATION_S * 10**9, LocalExecutor()))
        print(f"seed {seed}: {len(spec.faults)} faults, {datasets[-1].frame.height} rows")
    model, _ = train(cfg, datasets, version=f"live loop: SIMULATED live-train seeds {seeds}")
    return model


def check_on_live_loop(influx: LocalInfluxd, work: Path, model: RiskModel) -> str:
    """The model on the live loop's own scenario, which it did not train on."""
    influx.create_database("check")
    cfg = live_config(load_config(environ={}), influx.url, "check")
    spec = load_spec("live-loop")
    stream_scenario(spec, 1, influx.url, "check", work / "check-spool")
    ds = dataset(cfg, spec.start_ns, spec.start_ns + spec.duration_s * 10**9, LocalExecutor())
    frame = ds.frame.filter(~pl.col("down"))
    frame = frame.with_columns(pl.Series("risk", model.predict(frame)))
    r = event_report(frame, ds.events, "risk", model.meta.threshold, model.meta.horizon_s,
                     float(LIVE_PREDICTOR["step_s"]))  # fmt: skip
    return (
        f"live-loop seed 1 (development: the file's placement): {r.caught}/{r.failures} "
        f"predictable failures alerted "
        f"before onset (median lead {r.median_lead_s:.0f} s), {r.sudden_caught}/"
        f"{r.sudden_failures} sudden ones; {r.alerts - r.true_alerts} false alarms of "
        f"{r.alerts} alerts"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1-6")
    ap.add_argument("--out", default=str(MODEL))
    args = ap.parse_args(argv)
    a, _, b = args.seeds.partition("-")
    seeds = list(range(int(a), int(b or a) + 1))
    with tempfile.TemporaryDirectory() as tmp, LocalInfluxd(Path(tmp) / "influxd") as influx:
        model = train_model(influx, Path(tmp), seeds)
        print(check_on_live_loop(influx, Path(tmp), model))
    model.save(args.out)
    print(f"saved {args.out}: threshold {model.meta.threshold:.3f}, {model.meta.metrics}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
