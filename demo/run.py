"""The main job: the live loop, end to end on local defaults. ``gpuwarden demo`` (and
``bash scripts/demo.sh``, which installs what it needs first).

Two full live runs of the same scenario and seed (:mod:`demo.live`): ``reactive`` (the engine
only notifies) and ``proactive`` (the shipped policies). Each starts every part with its
production command, plays the scenario in real time onto the twin cluster's SIMULATED
hardware, and stops everything. Then the terminal summary, the HTML report
(:mod:`demo.live_report`), and the last lines ``xid_to_drain_p95_s=``,
``work_lost_reactive_gpu_h=``, ``work_lost_proactive_gpu_h=`` and ``work_saved_pct=``.

Options: ``--scenario`` (a library name or a TOML file), ``--seed`` (the telemetry's noise,
and where each fault falls: its node of the job, its GPU, its onset within 25 s; 0 keeps the
file's placement), ``--arms``, ``--out``
(the report; default ``demo-report/``), ``--workdir`` (keep every part's files and logs),
``--model`` (the failure-risk model; default the shipped live-scale one, ``none`` for none).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from demo.live import ArmResult, LiveLoop, Settings, placed
from demo.live_report import summary, write_report
from demo.train_live_model import LIVE_PREDICTOR, MODEL
from gpuwarden.simulation.spec import load_spec
from testbed.influxd import LocalInfluxd

REAL = (
    "REAL: an agent process per node, influxd, a Dask scheduler and two workers reached by "
    "address under the analyze service, the remediation engine (signatures required) acting on "
    "Slurm (slurmctld and a slurmd per node), and a PyTorch training job (gloo, CPU) under "
    "sbatch with the job-side reporter and checkpoint hook."
)
SIMULATED = (
    "SIMULATED: the nodes' hardware (NVML answers, sysfs, the kernel log) played from the "
    "scenario in real time, and GPU losses that kill the job's processes on the node. The "
    "scenario's faults are known to the twin alone; findings come from the agents and the "
    "analyze service, and work lost is read from the job's own step log."
)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpuwarden demo", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="live-loop")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arms", default="reactive,proactive")
    ap.add_argument("--out", default="demo-report")
    ap.add_argument("--workdir", help="keep every part's files and logs here")
    ap.add_argument("--model", default=str(MODEL), help="failure-risk model, or 'none'")
    ap.add_argument("--checkpoint-write-s", type=float, default=0.0,
                    help="SIMULATED slow storage: seconds added to each checkpoint write, "
                    "both arms (4.6: a 13B job's 276 s save at the loop's 60x scale)")  # fmt: skip
    ap.add_argument(
        "--sync-saves",
        action="store_true",
        help="the proactive arm saves synchronously too (no async_save lever)",
    )
    args = ap.parse_args(argv)
    if args.checkpoint_write_s < 0:
        ap.error("--checkpoint-write-s: not negative")
    arms = [a for a in args.arms.split(",") if a]
    if set(arms) - {"reactive", "proactive"}:
        ap.error("--arms: reactive and/or proactive")
    spec = placed(load_spec(args.scenario), args.seed)
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so every part started is stopped:
    # Python's default for it ends the process at once and leaves Slurm, influxd and the
    # agents running
    signal.signal(signal.SIGTERM, _terminate)
    model = "" if args.model == "none" else args.model
    settings = Settings(model=model, predictor=tuple(LIVE_PREDICTOR.items()),
                        checkpoint_write_s=args.checkpoint_write_s,
                        background_saves=not args.sync_saves)  # fmt: skip
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    print(f"gpuwarden demo: the live loop, scenario {spec.name} (seed {args.seed}), "
          f"arms {', '.join(arms)}, {spec.duration_s} s each\n{REAL}\n{SIMULATED}",
          flush=True)  # fmt: skip
    if settings.checkpoint_write_s:
        print(f"SIMULATED: {settings.checkpoint_write_s:g} s of slow storage added to every "
              "checkpoint write", flush=True)  # fmt: skip
    print(
        "the proactive arm saves on its cadence "
        + ("in the background (async_save)" if settings.background_saves else "synchronously"),
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="gw-live-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        loop = LiveLoop(spec, args.seed, work, settings, say)
        results: list[ArmResult] = []
        with LocalInfluxd(work / "influxd") as influxd:
            for arm in arms:
                say(f"{arm}: starting every part")
                results.append(loop.run_arm(arm, influxd))
        say(f"writing the report to {args.out}")
        write_report(Path(args.out), spec, args.seed, results, REAL, SIMULATED)
    for line in summary(spec, results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
