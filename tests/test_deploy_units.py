"""Issue 37, item 2: the systemd units start as shipped, on a freshly booted node.

``systemd-analyze verify`` (Debian's systemd) checks each unit in a root made here: the
distribution's own units, ours with their drop-ins, an executable where ``ExecStart`` points,
and the users ``systemd-sysusers`` makes from our sysusers.d file. Two things verify does not
see are checked from the files: every ``ReadWritePaths`` exists on a node that just booted
(else systemd refuses the unit: 226/NAMESPACE), and every ``User`` is root or made by our
sysusers file.
"""

from __future__ import annotations

import shutil
import subprocess
from configparser import RawConfigParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy/systemd"
SERVICES = sorted(UNITS.glob("*.service"))
# what exists on a node that just booted, before any job or Slurm prolog ran
BOOTED = ("/var", "/var/lib", "/run", "/tmp", "/etc", "/usr", "/opt")

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="Debian's systemd provides systemd-analyze"
)


def unit(path: Path) -> RawConfigParser:
    parser = RawConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read(path)
    return parser


def test_every_unit_verifies_clean(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    shutil.copytree(UNITS, root / "etc/systemd/system")
    for service in SERVICES:
        binary = unit(service)["Service"]["ExecStart"].split()[0]
        exe = root / binary.lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", *(s.name for s in SERVICES)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    ours = [ln for ln in (done.stdout + done.stderr).splitlines() if "gpuwarden" in ln]
    assert done.returncode == 0 and ours == [], done.stdout + done.stderr


def test_every_read_write_path_exists_on_a_freshly_booted_node() -> None:
    """Before: the agent listed /run/gpuwarden, which only a Slurm prolog makes (and a boot
    empties), so the unit failed to start with 226/NAMESPACE."""
    for service in SERVICES:
        s = unit(service)["Service"]
        made = {f"/var/lib/{d}" for d in s.get("StateDirectory", "").split()} | {
            f"/run/{d}" for d in s.get("RuntimeDirectory", "").split()
        }
        for path in s.get("ReadWritePaths", "").split():
            if path.startswith("-"):
                continue  # optional: systemd skips it when absent
            assert path in made or path in BOOTED, f"{service.name}: {path} may not exist at boot"
    for dropin in UNITS.glob("*.service.d/*.conf"):
        for path in unit(dropin)["Service"].get("ReadWritePaths", "").split():
            assert path.startswith("-"), f"{dropin}: {path} must be optional ('-')"


def test_every_user_is_root_or_made_by_our_sysusers_file(tmp_path: Path) -> None:
    """Before: the analyze unit ran as User=gpuwarden, which nothing created."""
    sysusers = UNITS / "gpuwarden.sysusers"
    (tmp_path / "etc").mkdir()
    done = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(sysusers)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    made = {line.split(":")[0] for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    for service in SERVICES:
        user = unit(service)["Service"].get("User", "root")
        assert user == "root" or user in made, f"{service.name}: nothing creates user {user}"
