"""Issue 37: the container image recipe, its install steps run in CI in a clean root.

``deploy/container/Containerfile`` builds the one image both manifests name; its one RUN step
is ``deploy/container/install.sh``. No container runtime runs here, so the test checks what the
recipe says (the base, the steps, no ENTRYPOINT under the manifests' args, the image name) and
runs the same install script into an empty folder (``GPUWARDEN_ROOT``): the wheel built from
this checkout with the image's extras, then the agent from that folder (NVML from the
CONSTRUCTED 8x H100 recording), the engine's command and the standby's driver. Apt is checked,
not run, in the clean root (the packages must exist for this Debian, and journalctl be there);
the installer is ``uv pip`` there, to reuse uv's cache, where the image uses pip. Then the
recipe itself, step by step, in a debootstrapped Debian root under chroot (no runtime needed):
apt and pip for real, and the image's commands run inside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
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


def test_the_install_script_refuses_two_wheels(tmp_path: Path) -> None:
    """``COPY dist/gpuwarden-*.whl`` takes every wheel in dist/; before, a second one became
    the extras and pip was asked for ``gpuwarden-0.1.0.whl[gpuwarden-0.2.0.whl]``."""
    wheels = [str(tmp_path / f"gpuwarden-0.{n}.0-py3-none-any.whl") for n in (1, 2)]
    done = run(["env", f"GPUWARDEN_ROOT={tmp_path}", "bash", str(INSTALL), *wheels],
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "one wheel" in done.stderr, done.stderr
    done = run(["env", f"GPUWARDEN_ROOT={tmp_path}", "bash", str(INSTALL), *wheels, "agent"],
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "one wheel" in done.stderr, done.stderr


def test_the_install_script_refuses_an_unknown_installer(tmp_path: Path) -> None:
    done = run(["env", f"GPUWARDEN_ROOT={tmp_path}", "GPUWARDEN_PIP=curl", "bash",
                str(INSTALL), str(tmp_path / "none.whl")], cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "GPUWARDEN_PIP" in done.stderr


def build_by_hand(recipe: Path, root: Path, context: dict[str, Path]) -> list[str]:
    """What ``podman build`` would do with ``recipe``, without a container runtime (CI has
    none): a debootstrapped root of the FROM line's Debian (minbase: what ``-slim`` is, less
    its stripped docs), each COPY into it, each RUN in it under chroot. ``context`` maps a
    COPY source (a glob of the build context) to the files it means. Returns the image's
    PATH (its ENV lines)."""
    lines = [ln.strip() for ln in recipe.read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    (suite,) = re.fullmatch(r"FROM debian:(\w+)-slim", lines[0]).groups()  # type: ignore[union-attr]
    mirror = os.environ.get("GPUWARDEN_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    done = run(["debootstrap", "--variant=minbase", suite, str(root), mirror])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # the build host's way to the registries, as a build would be given it: its resolver and
    # the CAs it trusts (this sandbox's egress proxy signs with one of its own; pip is told
    # to trust them, as a build behind such a proxy is), and pip's index and proxy settings;
    # nothing else of the host's environment enters
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    cas = root / "usr/local/share/ca-certificates"
    cas.mkdir(parents=True, exist_ok=True)
    for ca in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(ca, cas / ca.name)
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"]
    host_cas = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
    if host_cas.is_file():
        shutil.copy(host_cas, root / "tmp/build-host-cas.pem")
        env.append("PIP_CERT=/tmp/build-host-cas.pem")
    keep = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "HTTPS_PROXY", "https_proxy",
            "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")  # fmt: skip
    env += [f"{k}={os.environ[k]}" for k in keep if k in os.environ]
    path = env[0].removeprefix("PATH=")
    for line in lines[1:]:
        verb, _, rest = line.partition(" ")
        if verb == "COPY":
            source, target = rest.split()
            files = [context[source]] if source in context else [ROOT / source]
            for f in files:
                dest = root / target.lstrip("/")
                dest = dest / f.name if target.endswith("/") else dest
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, dest)
        elif verb == "RUN":
            step = run(["env", "-i", *env, "chroot", str(root), "/bin/sh", "-c", rest])
            assert step.returncode == 0, f"{line}\n{step.stdout[-3000:]}\n{step.stderr[-3000:]}"
        elif verb == "ENV":
            name, _, value = rest.partition("=")
            assert name == "PATH", f"an ENV this builder does not apply: {line}"
            path = value.replace("$PATH", path)
        else:
            assert verb == "CMD", f"a step this builder does not know: {line}"
    return [f"PATH={path}"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root (CI runs as root)")
def test_the_image_builds_and_runs_its_commands_in_a_debian_root(
    wheel: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The Containerfile's steps for real, in a clean Debian root: apt installs the packages,
    pip installs the wheel with the image's extras, and then, inside that root, the image's
    CMD and every manifest's command line parse (``--help`` appended: the config they name is
    mounted by Kubernetes), journalctl runs, and the standby's driver is the binary one. The
    test above runs the agent from the same install steps; this one shows the steps need
    nothing the CI host happens to have."""
    assert shutil.which("debootstrap"), "debootstrap: scripts/bootstrap.sh installs it"
    root = tmp_path / "image"
    try:
        env = build_by_hand(RECIPE, root, {"dist/gpuwarden-*.whl": wheel})

        def inside(*argv: str) -> subprocess.CompletedProcess[str]:
            return run(["env", "-i", *env, "chroot", str(root), *argv])

        assert not list((root / "tmp").glob("*.whl")), "the RUN step removes what it copied"
        cmd = re.search(r"^CMD (\[.*\])$", RECIPE.read_text(), re.M)
        assert cmd
        ran = inside(*json.loads(cmd[1]))
        assert ran.returncode == 0 and "remediate" in ran.stdout, ran.stderr
        ours = [c for c in containers() if "gpuwarden" in str(c.get("image", ""))]
        for c in ours:
            args = [str(a) for a in c["args"]]
            ran = inside(*args, "--help")
            assert ran.returncode == 0 and "usage: gpuwarden" in ran.stdout, (args, ran.stderr)
        journal = inside("journalctl", "--version")
        assert journal.returncode == 0 and journal.stdout.startswith("systemd "), journal.stderr
        driver = inside("python", "-c", "import psycopg; print(psycopg.pq.__impl__)")
        assert driver.returncode == 0 and driver.stdout.strip() == "binary", driver.stderr
        for folder in ("var/lib/gpuwarden", "run/gpuwarden", "etc/gpuwarden"):
            assert (root / folder).is_dir()
    finally:
        shutil.rmtree(root, ignore_errors=True)  # about 460 MB
