"""The rooms and what each may import (../shared/DESIGN.md "Layout").

The import rule is import-linter's contracts in pyproject.toml (``lint-imports`` runs them in
scripts/test.sh). Here each contract is also shown failing: a copy of the tree gets one
deliberate violation and ``lint-imports`` must call exactly that contract broken. The two
import cycles the Rooms issue found (sources/events <-> sources/xid, and gpuinfo <-> the NVML
source) are put back as violations of the acyclic contract.

What a room loads at run time is checked in fresh interpreters: the job-side libraries only
the standard library, the agent none of the heavy libraries, the launcher only the package of
the command it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "collector", "analytics", "remediation", "dashboards", "simulation")
HEAVY = (
    "polars", "numpy", "dask", "sklearn", "scipy", "matplotlib", "kubernetes", "grpc",
    "influxdb_client", "yaml", "grafana_foundation_sdk", "torch",
)  # fmt: skip


def lint_imports(cwd: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    argv = [str(Path(sys.executable).with_name("lint-imports")), "--no-logo", "--no-cache"]
    for c in contracts:
        argv += ["--contract", c]
    # PYTHONPATH first: the copy is found before the editable install of the real tree
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def test_the_import_rule_holds() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python files of every root package, testbed/ and demo/, with gpuwarden/ (its
    links to the product folders) and pyproject.toml: what the linter reads, in a place a
    test can break."""
    out = tmp_path_factory.mktemp("tree")
    for pkg in (*PACKAGES, "testbed", "demo", "gpuwarden"):
        for src in (ROOT / pkg).rglob("*.py"):
            dst = out / src.relative_to(ROOT)
            if dst.parent.name in PACKAGES and dst.parent.parent.name == "gpuwarden":
                continue  # reached through a link, copied with its folder
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    for pkg in PACKAGES:
        (out / "gpuwarden" / pkg).symlink_to(Path("..") / pkg)
    shutil.copyfile(ROOT / "pyproject.toml", out / "pyproject.toml")
    return out


VIOLATIONS = [
    # (contract id, module that gets the import, the import)
    ("core", "core/finding.py", "import gpuwarden.collector.agent"),
    ("products", "collector/health.py", "import gpuwarden.analytics.mfu"),
    (
        "products",
        "remediation/adapters/slurm.py",
        "from gpuwarden.collector.jobside import checkpoint_hook",
    ),
    ("products", "dashboards/panels.py", "import gpuwarden.remediation.policy"),
    ("product-not-tools", "remediation/cli.py", "import testbed.influxd"),
    ("product-not-tools", "analytics/runner.py", "import gpuwarden.simulation.generator"),
    ("simulation", "simulation/generator.py", "import gpuwarden.analytics.runner"),
    ("testbed", "testbed/k8s.py", "import gpuwarden.remediation.engine"),
    ("acyclic", "collector/sources/events.py", "import gpuwarden.collector.sources.xid"),
    ("acyclic", "collector/sources/nvml/poll.py", "import gpuwarden.collector.sources.nvml.info"),
]


@pytest.mark.parametrize(("contract", "module", "line"), VIOLATIONS)
def test_each_contract_fails_on_a_deliberate_violation(
    tree: Path, contract: str, module: str, line: str
) -> None:
    path = tree / module
    original = path.read_text(encoding="utf-8")
    assert lint_imports(tree, contract).returncode == 0  # the copy keeps it before
    try:
        path.write_text(original + f"\n{line}  # a deliberate violation\n", encoding="utf-8")
        done = lint_imports(tree, contract)
    finally:
        path.write_text(original, encoding="utf-8")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "BROKEN" in done.stdout and "1 broken" in done.stdout, done.stdout


def loaded_by(code: str, *, cwd: Path = ROOT) -> Any:
    """Run ``code`` in a fresh interpreter; it prints JSON as its last line."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_job_side_libraries_load_only_the_standard_library() -> None:
    """A training job installs plain ``gpuwarden`` (no extras) and imports these."""
    got = loaded_by(
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "from gpuwarden.collector.jobside.reporter import Reporter\n"
        "from gpuwarden.collector.jobside.checkpoint_hook import CheckpointRequests\n"
        "import gpuwarden.core.checkpoint\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "ours = {'gpuwarden'}\n"
        "print(json.dumps(sorted(new - set(sys.stdlib_module_names) - ours)))"
    )
    assert got == [], f"the job-side libraries import {got}"


def test_the_agent_loads_none_of_the_heavy_libraries(tmp_path: Path) -> None:
    """One full agent cycle (every source, recorded 8x H100, a sysfs tree, no kubelet
    socket), as ``gpuwarden agent --once`` runs it: none of analytics' or the engine's
    libraries, and no gRPC without a kubelet socket."""
    from testbed.sysfstree import build_node_tree

    build_node_tree(tmp_path / "sys", hcas=8)
    (tmp_path / "kmsg.log").write_text("")
    config = tmp_path / "agent.toml"
    recording = ROOT / "tests/golden/nvml-h100-8gpu/nvml.json"
    config.write_text(
        f'[agent]\nnode = "n1"\nsysfs = "{tmp_path}/sys"\nprocfs = "{tmp_path}/proc"\n'
        f'kmsg = "{tmp_path}/kmsg.log"\n'
        f'[nvml]\nbackend = "recorded"\nrecording = "{recording}"\nevents = "poll"\n'
        f'jobmap_dir = "{tmp_path}/jobs"\npod_resources_socket = "{tmp_path}/no-kubelet.sock"\n'
    )
    got = loaded_by(
        "import contextlib, io, json, sys\n"
        "from gpuwarden.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    rc = main(['agent', '--config', {str(config)!r}, '--once'])\n"
        "lines = out.getvalue().splitlines()\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps({'rc': rc, 'gpu_points': sum(l.startswith('gpu,') for l in lines),"
        " 'heavy': heavy}))"
    )
    assert got["rc"] == 0
    assert got["gpu_points"] == 8  # the cycle really ran, on all eight GPUs
    assert got["heavy"] == []


def test_the_launcher_names_the_missing_extra() -> None:
    """A node with only the ``agent`` extra that runs ``gpuwarden analyze`` is told what to
    install (polars stands in for everything analytics needs)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['polars'] = None\n"
            "from gpuwarden.cli import main; raise SystemExit(main(['analyze', 'run']))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "pip install 'gpuwarden[analytics]'" in done.stderr and "polars" in done.stderr


def test_the_launcher_lists_its_commands_and_refuses_others(capsys) -> None:
    from gpuwarden.cli import main

    assert main(["--help"]) == 0
    listing = capsys.readouterr().out
    for name in ("agent", "analyze", "remediate", "dashboards", "replay", "demo"):
        assert f"  {name} " in listing
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    assert main([]) == 2


def test_each_command_loads_only_its_own_package() -> None:
    """``gpuwarden <command> --help`` imports the command's package and core, no other."""
    got = loaded_by(
        "import contextlib, io, json, sys\n"
        "from gpuwarden.cli import main\n"
        "ours = ('collector', 'analytics', 'remediation', 'dashboards', 'simulation')\n"
        "def top(m):\n"
        "    parts = m.split('.')\n"
        "    return parts[1] if parts[0] == 'gpuwarden' and len(parts) > 1 else parts[0]\n"
        "every = set(ours) | {'testbed', 'demo'}\n"
        "result = {}\n"
        "for name in ('agent', 'analyze', 'remediate', 'dashboards', 'replay'):\n"
        "    for m in [m for m in sys.modules if top(m) in every]:\n"
        "        del sys.modules[m]\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main([name, '--help'])\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    result[name] = sorted({top(m) for m in sys.modules} & every)\n"
        "print(json.dumps(result))"
    )
    assert got == {
        "agent": ["collector"],
        "analyze": ["analytics"],
        "remediate": ["remediation"],
        "dashboards": ["dashboards"],
        "replay": ["simulation"],
    }
