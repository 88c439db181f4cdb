"""The installed product: one import name, the ``agent`` extra alone, beside a squatter.

The wheel is built from this checkout's sdist (``uv build``, as pip builds one) and installed
with only the ``agent`` extra into a fresh venv, as a GPU node installs it. What must hold:

* the wheel and the installed distribution put exactly one name at the top of
  site-packages, ``gpuwarden``, and carry neither the test fakes (``testbed``) nor the demo
  and its pickled models;
* ``gpuwarden agent --once`` and ``gpuwarden check --json`` run from that venv (NVML from the
  CONSTRUCTED 8x H100 recording, a CONSTRUCTED sysfs tree);
* a distribution that ships top-level ``analytics``, ``collector`` and ``core`` packages
  (``analytics-python`` ships a top-level ``analytics``) installs beside it without touching
  gpuwarden, and gpuwarden still works.

The squatter is a wheel written here by hand (a zip with its metadata), so nothing but the
agent extra's dependencies comes from the package index (uv's cache holds them).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from testbed.sysfstree import build_node_tree

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "tests/golden/nvml-h100-8gpu/nvml.json"

pytestmark = pytest.mark.slow


def uv() -> str:
    found = shutil.which("uv") or str(ROOT / ".cache/tools/bin/uv")
    if not Path(found).exists():
        pytest.fail("uv not found: scripts/bootstrap.sh installs it")
    return found


def run(
    argv: list[str], cwd: Path | None = None, timeout: float = 1200.0
) -> subprocess.CompletedProcess[str]:
    """Run outside the checkout (its folders would shadow the venv's), without our paths.
    ``timeout``: a guard against a stalled mirror or index holding CI (not a speed limit)."""
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    where = cwd or Path(os.environ.get("TMPDIR", "/tmp"))
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=env, cwd=where,
                          timeout=timeout)  # fmt: skip


def squatter_wheel(where: Path) -> Path:
    """A wheel of ``analytics-squatter`` with top-level ``analytics``, ``collector``, ``core``
    and ``demo`` packages: what a crowded training image may already hold (PyPI has a
    ``demo``; this one's ``demo.run.main`` says so if anything runs it)."""
    name, version = "analytics_squatter", "1.0"
    files = {
        f"{top}/__init__.py": f"SQUATTER = {top!r}\n".encode()
        for top in ("analytics", "collector", "core", "demo")
    }
    files["demo/run.py"] = b"def main(argv):\n    print('THE SQUATTER RAN')\n    return 0\n"
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: analytics-squatter\nVersion: {version}\n".encode()
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel as ``uv build``, ``python -m build`` and ``pip install <sdist>`` make it:
    built from the sdist, not from the checkout (``--wheel``), so a file the sdist loses is
    missing here."""
    out = tmp_path_factory.mktemp("dist")
    done = run([uv(), "build", "--quiet", "-o", str(out), str(ROOT)])
    assert done.returncode == 0, done.stderr
    (found,) = out.glob("gpuwarden-*.whl")
    return found


def test_the_wheel_from_the_sdist_is_the_wheel_from_the_checkout(
    wheel: Path, tmp_path: Path
) -> None:
    """Before: the sdist held each linked folder once (gpuwarden/remediation, but core/ only
    at its root), so the wheel built from it lacked gpuwarden.core, .collector, .analytics
    and .dashboards (74 files of 205), and ``gpuwarden agent`` died on its first import."""
    done = run([uv(), "build", "--wheel", "--quiet", "-o", str(tmp_path), str(ROOT)])
    assert done.returncode == 0, done.stderr
    (direct,) = tmp_path.glob("gpuwarden-*.whl")
    ours, theirs = zipfile.ZipFile(wheel), zipfile.ZipFile(direct)
    assert sorted(ours.namelist()) == sorted(theirs.namelist())
    record = "gpuwarden-0.1.0.dist-info/RECORD"
    differ = [n for n in ours.namelist() if n != record and ours.read(n) != theirs.read(n)]
    assert differ == []
    (sdist,) = wheel.parent.glob("gpuwarden-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
    assert not [m.name for m in members if m.issym() or m.islnk()], "links in the sdist"
    tops = {m.name.split("/")[1] for m in members if m.name.count("/") >= 1}
    assert not tops & {"testbed", "demo", "tests", ".grimp_cache", ".import_linter_cache"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh venv with the wheel and only its ``agent`` extra; its bin folder."""
    where = tmp_path_factory.mktemp("venv") / "v"
    done = run([uv(), "venv", "--quiet", "--python", sys.executable, str(where)])
    assert done.returncode == 0, done.stderr
    python = where / "bin" / "python"
    done = run([uv(), "pip", "install", "--quiet", "--python", str(python), f"{wheel}[agent]"])
    assert done.returncode == 0, done.stderr
    return where / "bin"


def test_the_wheel_has_one_top_level_name_and_no_fakes_or_demo(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == {"gpuwarden"}
    assert not [n for n in names if n.endswith(".pkl") or "/testbed/" in n or "/demo/" in n]
    # every product folder is in, under the one name (followed through its link)
    for pkg in ("core", "collector", "analytics", "remediation", "dashboards", "simulation"):
        assert f"gpuwarden/{pkg}/__init__.py" in names
    assert "gpuwarden/collector/jobside/reporter.py" in names
    assert "gpuwarden/core/data/xid/xid_catalog.csv" in names


def installed_top_level(bin_dir: Path, dist: str) -> list[str]:
    code = (
        "import json, sys\nfrom importlib.metadata import files\n"
        f"tops = {{str(f).split('/')[0] for f in files({dist!r}) if not str(f).startswith('..')}}\n"
        "print(json.dumps(sorted(t for t in tops if not t.endswith('.dist-info'))))"
    )
    done = run([str(bin_dir / "python"), "-c", code])
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def agent_config(tmp: Path) -> Path:
    build_node_tree(tmp / "sys", hcas=2)
    (tmp / "kmsg.log").write_text("")
    config = tmp / "agent.toml"
    config.write_text(
        f'[agent]\nnode = "node-7"\nsysfs = "{tmp}/sys"\nprocfs = "{tmp}/proc"\n'
        f'kmsg = "{tmp}/kmsg.log"\n'
        f'[nvml]\nbackend = "recorded"\nrecording = "{H100}"\nevents = "poll"\n'
        f'jobmap_dir = "{tmp}/jobs"\npod_resources_socket = "{tmp}/no-kubelet.sock"\n'
    )
    return config


def test_agent_extra_alone_runs_the_agent_and_the_check_beside_a_squatter(
    venv: Path, tmp_path: Path
) -> None:
    assert installed_top_level(venv, "gpuwarden") == ["gpuwarden"]
    squatter = squatter_wheel(tmp_path)
    python = venv / "python"
    done = run([uv(), "pip", "install", "--quiet", "--python", str(python), str(squatter)])
    assert done.returncode == 0, done.stderr
    # the squatter's names are its own, and ours are untouched
    said = run(
        [str(python), "-c", "import analytics, core; print(analytics.SQUATTER, core.SQUATTER)"]
    )
    assert said.stdout.split() == ["analytics", "core"], said.stderr
    assert installed_top_level(venv, "gpuwarden") == ["gpuwarden"]

    config = agent_config(tmp_path)
    once = run([str(venv / "gpuwarden"), "agent", "--config", str(config), "--once"], cwd=tmp_path)
    assert once.returncode == 0, once.stderr
    gpu_lines = [line for line in once.stdout.splitlines() if line.startswith("gpu,")]
    assert len(gpu_lines) == 8, once.stdout[-2000:]
    assert all("node=node-7" in line for line in gpu_lines)

    check = run(
        [str(venv / "gpuwarden"), "check", "--config", str(config), "--json", "--probes",
         "infiniband,gpu_count"], cwd=tmp_path,
    )  # fmt: skip
    assert check.returncode in (0, 1), check.stderr
    report = json.loads(check.stdout)
    assert report["node"] == "node-7"
    assert [p["name"] for p in report["probes"]] == ["infiniband", "gpu_count"]

    # the agent extra brings none of analytics' libraries, and the launcher says so
    analyze = run([str(venv / "gpuwarden"), "analyze", "run"], cwd=tmp_path)
    assert analyze.returncode == 2
    assert "pip install 'gpuwarden[analytics]'" in analyze.stderr
    # the checkout-only commands: not offered, and another's top-level demo never run
    # (before: gpuwarden demo imported the squatter's demo.run and ran it)
    demo = run([str(venv / "gpuwarden"), "demo"], cwd=tmp_path)
    assert demo.returncode == 2 and "source checkout" in demo.stderr, demo.stdout
    assert "SQUATTER" not in demo.stdout + demo.stderr
    listed = run([str(venv / "gpuwarden"), "--help"], cwd=tmp_path)
    assert listed.returncode == 0 and "agent" in listed.stdout
    assert "demo" not in listed.stdout and "backtest" not in listed.stdout, listed.stdout


def test_a_checkout_runs_its_own_demo_before_anothers(tmp_path: Path) -> None:
    """In a checkout (the editable install), another distribution's top-level ``demo`` that
    comes first on sys.path (site-packages precedes the .pth's root; here PYTHONPATH) was
    what ``gpuwarden demo`` imported and ran (the review: THE SQUATTER RAN)."""
    squatter = tmp_path / "elsewhere" / "demo"
    squatter.mkdir(parents=True)
    (squatter / "__init__.py").write_text("")
    (squatter / "run.py").write_text(
        "def main(argv):\n    print('THE SQUATTER RAN')\n    return 0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "elsewhere")}
    argv = [str(ROOT / ".venv/bin/gpuwarden"), "demo", "--help"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=False, timeout=300)  # fmt: skip
    assert "SQUATTER" not in done.stdout, done.stdout
    assert done.returncode == 0 and "usage: gpuwarden demo" in done.stdout, done.stderr
