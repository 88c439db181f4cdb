"""Train the demo's failure predictor: the recipe behind ``demo/model/risk-model.pkl``.

    uv run python -m demo.train_model [--seeds 1-8] [--out demo/model/risk-model.pkl]

Replays SIMULATED ``predictor-day`` scenarios (one seed per day: faults from the REAL StepFun
process, 150x compressed, with the generator's precursors) into a local influxd and trains the
predictor on them exactly as ``gpuwarden analyze train`` does (``benchmarks/predict_simulated``
evaluates the same recipe on held-out seeds). It takes about ten minutes on 2 cores, which is
why the demo ships the result instead of training at every run (``scripts/demo.sh --retrain``
trains afresh on fewer days).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from gpuwarden.analytics.config import AnalyticsConfig, load_config, with_overrides
from gpuwarden.analytics.predict.cli import dataset, train
from gpuwarden.analytics.predict.model import RiskModel
from gpuwarden.analytics.runner import LocalExecutor
from gpuwarden.simulation.cli import stream_scenario
from gpuwarden.simulation.spec import load_spec
from testbed.influxd import LocalInfluxd

DAY_NS = 86_400 * 10**9
SCENARIO = "predictor-day"
MODEL = Path(__file__).parent / "model" / "risk-model.pkl"


def train_model(
    cfg: AnalyticsConfig, influx: LocalInfluxd, work: Path, seeds: list[int]
) -> RiskModel:
    influx.create_database("train")
    tcfg = with_overrides(cfg, influxdb={"url": influx.url, "database": "train"})
    for day, seed in enumerate(seeds):
        stream_scenario(
            SCENARIO, seed, influx.url, "train", work / f"tspool{day}", shift_ns=day * DAY_NS
        )
    start = load_spec(SCENARIO).start_ns
    ds = dataset(tcfg, start, start + len(seeds) * DAY_NS, LocalExecutor())
    model, _ = train(tcfg, [ds], version=f"demo: SIMULATED {SCENARIO} seeds {seeds}")
    return model


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1-8")
    ap.add_argument("--out", default=str(MODEL))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, LocalInfluxd(Path(tmp) / "influxd") as influx:
        cfg = load_config(environ={})
        model = train_model(cfg, influx, Path(tmp), parse_seeds(args.seeds))
    model.save(args.out)
    print(f"saved {args.out}: threshold {model.meta.threshold:.3f}, {model.meta.metrics}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
