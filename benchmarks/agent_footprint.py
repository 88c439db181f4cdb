"""What the node agent costs a GPU node in memory, installed as a GPU node installs it.

1. A fresh virtual environment gets ``gpuwarden[agent]`` and nothing else (uv, from this
   checkout: the agent extra is NVML, urllib3, gRPC and protobuf).
2. ``gpuwarden agent`` runs there for 600 cycles at 0.1 s with every source: NVML from the
   CONSTRUCTED 8x H100 recording (looped), InfiniBand, power and thermal from a CONSTRUCTED
   sysfs tree with 8 HCAs, the kernel log from a file, the relay for training jobs on, no
   kubelet socket; its sink writes into a real local influxd (Debian's).
3. Its peak resident set (``ru_maxrss`` of that process, from ``wait4``) and the modules it
   imported (written at exit by a standard-library wrapper that then runs the command as the
   console script does) are reported.

Side by side, in the same run: the baseline the Rooms issue measured (90 MB after 300 cycles),
that is the agent as it was before the rooms were carved (commit ``a12c552``, taken with
``git archive``) in the full development environment, same configuration and cycles. On a
clone without that commit (a shallow one), the baseline is left out and said so.

A heavy module is one of polars, numpy, dask, sklearn, scipy, matplotlib, kubernetes or grpc;
grpc counts only when a kubelet socket exists (none does here).

    uv run python benchmarks/agent_footprint.py [--cycles 600] [--interval-s 0.1]

Last lines: ``agent_imports_heavy=<0|1>``, then ``agent_rss_mib=<x>`` (target <= 40).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from testbed.influxd import LocalInfluxd, free_port
from testbed.sysfstree import build_node_tree

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "tests/golden/nvml-h100-8gpu/nvml.json"
BASELINE = "a12c552"  # the last commit before the rooms were carved
HEAVY = ("polars", "numpy", "dask", "sklearn", "scipy", "matplotlib", "kubernetes", "grpc")

#: runs `module:function` with the given argv in the same process, then, at exit, writes the
#: top-level names of every module imported to $GW_MODULES_OUT (standard library only)
WRAPPER = """\
import atexit, importlib, json, os, sys
def dump():
    with open(os.environ["GW_MODULES_OUT"], "w") as f:
        json.dump(sorted({m.split(".")[0] for m in sys.modules}), f)
atexit.register(dump)
target, argv = sys.argv[1], sys.argv[2:]
if os.environ.get("GW_TREE"):
    sys.path.insert(0, os.environ["GW_TREE"])
module, _, func = target.partition(":")
raise SystemExit(getattr(importlib.import_module(module), func)(argv))
"""


def uv() -> str:
    found = shutil.which("uv") or str(ROOT / ".cache/tools/bin/uv")
    if not Path(found).exists():
        raise SystemExit("uv not found: run scripts/bootstrap.sh first")
    return found


def agent_only_venv(where: Path) -> Path:
    """A fresh venv with gpuwarden[agent] installed from this checkout; its python."""
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([uv(), "venv", "--quiet", "--python", sys.executable, str(where)],
                   check=True, env=env)  # fmt: skip
    python = where / "bin" / "python"
    subprocess.run([uv(), "pip", "install", "--quiet", "--python", str(python),
                    f"{ROOT}[agent]"], check=True, env=env)  # fmt: skip
    return python


def installed(python: Path) -> list[str]:
    """The distributions in ``python``'s environment (uv venvs carry no pip)."""
    out = subprocess.run(
        [uv(), "pip", "list", "--python", str(python), "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(line.split("==")[0].lower() for line in out.splitlines() if "==" in line)


def baseline_tree(where: Path) -> Path | None:
    """The agent's code as it was at BASELINE, or None on a clone that lacks it."""
    archive = where / "baseline.tar"
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), BASELINE],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        return None
    tree = where / "baseline"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def write_config(root: Path, influx_url: str, interval_s: float) -> Path:
    build_node_tree(root / "sys", hcas=8)
    (root / "proc").mkdir(exist_ok=True)
    (root / "kmsg.log").write_text("")
    config = root / "agent.toml"
    config.write_text(
        f'[agent]\ncluster = "bench"\nnode = "node-0"\ninterval_s = {interval_s}\n'
        f'sysfs = "{root}/sys"\nprocfs = "{root}/proc"\nkmsg = "{root}/kmsg.log"\n'
        f'reporter_listen = "127.0.0.1:{free_port()}"\n'
        f'[nvml]\nbackend = "recorded"\nrecording = "{H100}"\nloop = true\nevents = "poll"\n'
        f'jobmap_dir = "{root}/jobs"\npod_resources_socket = "{root}/no-kubelet.sock"\n'
        f'[sink]\nurl = "{influx_url}"\ndatabase = "bench"\nspool_dir = "{root}/spool"\n'
    )
    return config


def run_agent(
    python: Path, target: list[str], config: Path, work: Path, tree: Path | None, cycles: int
) -> dict:
    """One agent run to completion: peak RSS (MiB), the modules it imported, wall time."""
    (work / "wrapper.py").write_text(WRAPPER)
    modules_out = work / "modules.json"
    env = {**os.environ, "GW_MODULES_OUT": str(modules_out), "GW_TREE": str(tree or "")}
    env.pop("PYTHONPATH", None)
    argv = [str(python), str(work / "wrapper.py"), *target]
    argv += ["--config", str(config), "--cycles", str(cycles), "--log-level", "WARNING"]
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=work)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(target)} exited with {proc.returncode}")
    modules = json.loads(modules_out.read_text())
    return {
        "rss_mib": usage.ru_maxrss / 1024,  # Linux: KiB
        "heavy": [m for m in HEAVY if m in modules],
        "modules": len(modules),
        "wall_s": time.monotonic() - started,
    }


def gpu_points(influxd: LocalInfluxd) -> int:
    data = json.loads(influxd.query('SELECT count("power_w") FROM "gpu"', "bench"))
    series = data["results"][0].get("series") or [{"values": [[0, 0]]}]
    return int(series[0]["values"][0][1])


def main(cycles: int, interval_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="gw-footprint-") as tmp:
        root = Path(tmp)
        t0 = time.monotonic()
        python = agent_only_venv(root / "venv")
        packages = installed(python)
        print(f"# agent-only venv in {time.monotonic() - t0:.0f} s: {', '.join(packages)}")
        results = {}
        with LocalInfluxd(root / "influxd") as influxd:
            influxd.create_database("bench")
            for name in ("agent", "baseline"):
                work = root / name
                work.mkdir()
                config = write_config(work, influxd.url, interval_s)
                before = gpu_points(influxd)
                if name == "agent":
                    results[name] = run_agent(
                        python, ["gpuwarden.cli:main", "agent"], config, work, None, cycles
                    )
                else:
                    tree = baseline_tree(root)
                    if tree is None:
                        print(f"# baseline: commit {BASELINE} is not in this clone; left out")
                        continue
                    results[name] = run_agent(
                        Path(sys.executable), ["collector.agent_cli:main"], config, work, tree,
                        cycles,
                    )  # fmt: skip
                time.sleep(2)  # the last batch lands
                results[name]["gpu_points"] = gpu_points(influxd) - before
        run = f"{cycles} cycles at {interval_s:g} s"
        print(f"agent footprint: {run}; NVML CONSTRUCTED 8x H100 (recorded), 8-HCA sysfs tree "
              "CONSTRUCTED, power, thermal, kernel log, relay on; real influxd")  # fmt: skip
        print(f"{'run':<44}{'max RSS MiB':>12}{'modules':>9}{'gpu points':>12}  heavy imported")
        labels = {
            "agent": "gpuwarden[agent] alone (this checkout)",
            "baseline": f"before the rooms ({BASELINE}), full env",
        }
        for name, r in results.items():
            heavy = ", ".join(r["heavy"]) or "none"
            print(f"{labels[name]:<44}{r['rss_mib']:>12.1f}{r['modules']:>9}"
                  f"{r['gpu_points']:>12}  {heavy}")  # fmt: skip
        a = results["agent"]
        if "baseline" in results:
            print(f"agent_rss_saved_mib={results['baseline']['rss_mib'] - a['rss_mib']:.1f}")
        print(f"agent_imports_heavy={int(bool(a['heavy']))}")
        print(f"agent_rss_mib={a['rss_mib']:.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=600)
    ap.add_argument("--interval-s", type=float, default=0.1)
    args = ap.parse_args()
    main(args.cycles, args.interval_s)
