"""Issue 37: the container image recipe, its install steps run in CI in a clean root.

``deploy/container/Containerfile`` builds the one image both manifests name; its one RUN step
is ``deploy/container/install.sh``. No container runtime runs here, so the test checks what the
recipe says (the base, the steps, no ENTRYPOINT under the manifests' args, the image name) and
runs the same install script into an empty folder (``GPUWARDEN_ROOT``): the wheel built from
this checkout with the image's extras, then the agent from that folder (NVML from the
CONSTRUCTED 8x H100 recording), the engine's command and the standby's driver. Apt is checked,
not run, in the clean root (the packages must exist for this Debian, and journalctl be there);
the installer is ``uv pip`` there, to reuse uv's cache, where the image uses pip.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from tests.test_packaging import ROOT, agent_config, run, uv, wheel  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

RECIPE = ROOT / "deploy/container/Containerfile"
INSTALL = ROOT / "deploy/container/install.sh"
MANIFESTS = sorted((ROOT / "deploy/kubernetes").glob("*.yaml"))


def containers() -> list[dict[str, object]]:
    found = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for key in ("containers", "initContainers"):
                found.extend(spec.get(key, []))
    return found


def test_the_recipe_builds_the_one_image_the_manifests_run() -> None:
    text = RECIPE.read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "FROM debian:bookworm-slim"  # the Debian CI runs on
    runs = [ln for ln in lines if ln.startswith("RUN ")]
    assert len(runs) == 1 and "/tmp/install.sh" in runs[0]
    assert "COPY deploy/container/install.sh /tmp/install.sh" in lines
    # the manifests give the whole command as args, which replace CMD: an ENTRYPOINT would
    # run `gpuwarden gpuwarden agent ...`
    assert not [ln for ln in lines if ln.startswith("ENTRYPOINT")]
    assert "ENV PATH=/opt/gpuwarden/.venv/bin:$PATH" in lines
    (image,) = set(re.findall(r"ghcr\.io/gpuwarden/gpuwarden:[\w.]+", text))
    ours = [c for c in containers() if "gpuwarden" in str(c.get("image", ""))]
    assert ours and {c["image"] for c in ours} == {image}
    for c in ours:
        args = c.get("args") or c.get("command")
        assert isinstance(args, list) and args[0] == "gpuwarden", c


def test_the_install_steps_run_in_a_clean_root(wheel: Path, tmp_path: Path) -> None:  # noqa: F811
    root = tmp_path / "root"
    root.mkdir()
    env_extra = {"GPUWARDEN_ROOT": str(root), "GPUWARDEN_PIP": "uv"}
    tools = str(Path(uv()).parent)
    done = run(
        ["env", *(f"{k}={v}" for k, v in env_extra.items()),
         f"PATH={tools}:{os.environ.get('PATH', '')}",
         "bash", str(INSTALL), str(wheel), "agent,remediation,standby"],
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    bin_dir = root / "opt/gpuwarden/.venv/bin"
    for folder in ("var/lib/gpuwarden", "run/gpuwarden", "etc/gpuwarden"):
        assert (root / folder).is_dir()
    config = agent_config(tmp_path)
    once = run([str(bin_dir / "gpuwarden"), "agent", "--config", str(config), "--once"],
               cwd=tmp_path)  # fmt: skip
    assert once.returncode == 0, once.stderr
    assert len([ln for ln in once.stdout.splitlines() if ln.startswith("gpu,")]) == 8
    engine = run([str(bin_dir / "gpuwarden"), "remediate", "--help"], cwd=tmp_path)
    assert engine.returncode == 0 and "serve" in engine.stdout, engine.stderr
    driver = run([str(bin_dir / "python"), "-c", "import psycopg; print(psycopg.pq.__impl__)"])
    assert driver.returncode == 0 and driver.stdout.strip() == "binary", driver.stderr


def test_the_install_script_refuses_an_unknown_installer(tmp_path: Path) -> None:
    done = run(["env", f"GPUWARDEN_ROOT={tmp_path}", "GPUWARDEN_PIP=curl", "bash",
                str(INSTALL), str(tmp_path / "none.whl")], cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "GPUWARDEN_PIP" in done.stderr
