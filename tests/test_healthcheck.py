"""Issue 37, item 4: the node check fails closed and explains itself, on a REAL Slurm.

``deploy/slurm/healthcheck.sh`` is run as slurmd runs it (as root, ``SLURMD_NODENAME`` set)
against a real slurmctld with two nodes. Before this change it exited 0 and drained nothing
when ``gpuwarden`` was missing (rc 127) or its configuration broken (rc 2), drained with an
empty reason when ``check --report`` crashed beside the agent, and never resumed a node it had
drained. The check's inputs are CONSTRUCTED (a sysfs tree with no GPUs, a disk path).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.remediation.adapters.slurm import SPARE_REASON
from testbed.slurm import LocalSlurm, slurm_available

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "deploy/slurm/healthcheck.sh"

pytestmark = pytest.mark.skipif(not slurm_available(), reason="scripts/bootstrap.sh installs Slurm")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    with LocalSlurm(tmp_path_factory.mktemp("slurm"), ["gpu01", "gpu02"]) as s:
        yield s


def shim(bindir: Path) -> Path:
    """This checkout's ``gpuwarden`` as the one on PATH."""
    bindir.mkdir(exist_ok=True)
    gw = bindir / "gpuwarden"
    gw.write_text(f'#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m gpuwarden "$@"\n')
    gw.chmod(0o755)
    return bindir


def agent_config(tmp: Path, disk: str, optional: tuple[str, ...] = ("gpu_count",)) -> Path:
    config = tmp / "agent.toml"
    opt = ", ".join(f'"{o}"' for o in optional)
    config.write_text(
        f'[agent]\ncluster = "c"\nnode = "gpu01"\nsysfs = "{tmp}/sys"\n'
        f'[check]\nprobes = ["gpu_count", "disk"]\ndisk_paths = ["{disk}"]\n'
        f"optional = [{opt}]\n"
        f'[sink]\nurl = "http://127.0.0.1:9"\nspool_dir = "{tmp}/spool"\n'
    )
    return config


def healthcheck(
    slurm: LocalSlurm,
    tmp: Path,
    config: Path,
    *,
    path: str = "",
    node: str = "gpu01",
    extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **(extra or {}),
        "SLURM_CONF": str(slurm.conf),
        "SLURMD_NODENAME": node,
        "GPUWARDEN_CHECK_CONFIG": str(config),
        "PATH": path or f"{shim(tmp / 'bin')}:{os.environ['PATH']}",
    }
    return subprocess.run(["sh", str(SCRIPT)], env=env, capture_output=True, text=True,
                          check=False, timeout=120)  # fmt: skip


def state(slurm: LocalSlurm, node: str = "gpu01") -> tuple[str, str]:
    got = slurm.run("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").strip().split("|", 1)
    return got[0].rstrip("*~#"), got[1]  # a suffix says "not responding" and the like


def resume(slurm: LocalSlurm, node: str = "gpu01") -> None:
    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def test_gpuwarden_missing_drains_with_the_reason(slurm: LocalSlurm, tmp_path: Path) -> None:
    resume(slurm)
    config = agent_config(tmp_path, str(tmp_path))
    done = healthcheck(slurm, tmp_path, config, path="/usr/bin:/bin")  # no gpuwarden here
    assert done.returncode == 1
    st, reason = state(slurm)
    assert st.startswith("drain") and "gpuwarden is not on PATH" in reason, (st, reason)


def test_gpuwarden_off_path_is_found_where_it_was_installed(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    """slurmd's PATH does not hold the venv docs/DEPLOY.md installs into: the script takes
    GPUWARDEN_BIN (else the venv's path). Before: every node drained, 'not on PATH'."""
    resume(slurm)
    config = agent_config(tmp_path, str(tmp_path))
    gw = shim(tmp_path / "elsewhere") / "gpuwarden"
    done = healthcheck(slurm, tmp_path, config, path="/usr/bin:/bin",
                       extra={"GPUWARDEN_BIN": str(gw)})  # fmt: skip
    st, reason = state(slurm)
    assert done.returncode == 0 and not st.startswith("drain"), (st, reason, done.stderr)


def test_a_missing_or_broken_configuration_drains(slurm: LocalSlurm, tmp_path: Path) -> None:
    resume(slurm)
    done = healthcheck(slurm, tmp_path, tmp_path / "nowhere.toml")
    assert done.returncode == 1
    assert "no readable configuration" in state(slurm)[1]
    resume(slurm)
    broken = tmp_path / "broken.toml"
    broken.write_text("[check]\nno_such_setting = 1\n")
    assert healthcheck(slurm, tmp_path, broken).returncode == 1
    st, reason = state(slurm)
    assert st.startswith("drain") and reason.startswith("gpuwarden check: could not run (exit 2)")
    assert "no_such_setting" in reason


def test_a_required_probe_that_cannot_run_fails(slurm: LocalSlurm, tmp_path: Path) -> None:
    """No GPU visible here: with gpu_count required (not in [check] optional) the node is not
    healthy (before: 'unavailable' passed, exit 0)."""
    resume(slurm)
    config = agent_config(tmp_path, str(tmp_path), optional=())
    assert healthcheck(slurm, tmp_path, config).returncode == 1
    st, reason = state(slurm)
    assert st.startswith("drain") and reason.startswith("gpuwarden check: gpu_count: could not run")


def test_a_node_the_check_drained_returns_when_it_passes_and_no_other(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    resume(slurm)
    failing = agent_config(tmp_path, "/nonexistent/shared-fs")
    assert healthcheck(slurm, tmp_path, failing).returncode == 1
    assert "disk: /nonexistent/shared-fs" in state(slurm)[1]
    passing = agent_config(tmp_path, str(tmp_path))
    assert healthcheck(slurm, tmp_path, passing).returncode == 0
    assert state(slurm)[0] == "idle"  # resumed: the check had drained it
    # drained by someone else (an operator, the engine): a passing check leaves it drained
    slurm.run("scontrol", "update", "NodeName=gpu01", "State=DRAIN", "Reason=RMA ticket 4411")
    assert healthcheck(slurm, tmp_path, passing).returncode == 0
    st, reason = state(slurm)
    assert st.startswith("drain") and reason == "RMA ticket 4411"
    resume(slurm)


def test_a_failing_check_does_not_take_over_someone_elses_drain(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    """Found by a review as a new operator (2026-11-28): a failing check wrote its own reason
    over an operator's (or the engine's) drain, and the next passing check then resumed the
    node as one it had drained: an RMA node back in service after one transient failure."""
    resume(slurm)
    for sub in ("fail", "other"):
        (tmp_path / sub).mkdir()
    failing = agent_config(tmp_path / "fail", "/nonexistent/shared-fs")
    other = agent_config(tmp_path / "other", "/nonexistent/other")
    passing = agent_config(tmp_path, str(tmp_path))
    for why in ("RMA ticket 123 DO NOT RESUME", "gpuwarden: gpu_xid on gpu01 (XID 79)"):
        slurm.run("scontrol", "update", "NodeName=gpu01", "State=DRAIN", f"Reason={why}")
        assert healthcheck(slurm, tmp_path, failing).returncode == 1
        assert state(slurm)[1] == why  # its reason kept
        assert healthcheck(slurm, tmp_path, passing).returncode == 0
        st, reason = state(slurm)
        assert st.startswith("drain") and reason == why, (st, reason)  # still out
        resume(slurm)
    # a hot spare that fails its check leaves the spare pool (found by a review of the fix:
    # keeping the spare's reason left it to be put back in service, unchecked, on a requeue)
    assert f'"|{SPARE_REASON}"' in SCRIPT.read_text()  # the engine's spare reason, as it writes it
    slurm.run("scontrol", "update", "NodeName=gpu01", "State=DRAIN", f"Reason={SPARE_REASON}")
    assert healthcheck(slurm, tmp_path, failing).returncode == 1
    assert state(slurm)[1].startswith("gpuwarden check: disk: /nonexistent/shared-fs")
    resume(slurm)
    # its own drain is still its own: a second failure renews the reason, a pass resumes
    assert healthcheck(slurm, tmp_path, failing).returncode == 1
    assert healthcheck(slurm, tmp_path, other).returncode == 1
    assert "/nonexistent/other" in state(slurm)[1]
    assert healthcheck(slurm, tmp_path, passing).returncode == 0
    assert state(slurm)[0] == "idle"


def test_check_report_works_beside_a_running_agents_spool(tmp_path: Path) -> None:
    """The agent holds its spool's lock; ``check --report`` used to open the same spool, die
    with SpoolError (exit 1) and make healthcheck.sh drain with an empty reason."""
    from gpuwarden.core.store.spool import Spool

    config = agent_config(tmp_path, str(tmp_path))
    held = Spool(tmp_path / "spool")  # what the running agent holds
    held.open()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "check", "--config", str(config), "--report"],
            cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
    finally:
        held.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 node_check points spooled" in done.stderr


def test_the_check_names_the_node_as_slurm_does(slurm: LocalSlurm, tmp_path: Path) -> None:
    """Found in review (as a new operator): the check named the node by its hostname, so on
    a host called ``gpu02.cluster`` (or a NodeHostname that is not the NodeName) its findings
    named a node the engine could neither drain nor resume. Slurm's name goes to the check
    (``GPUWARDEN_AGENT_NODE``), unless the environment names one already."""
    seen = tmp_path / "node"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    gw = bindir / "gpuwarden"  # records the node the check would name, and passes
    gw.write_text(f'#!/bin/sh\nprintf %s "${{GPUWARDEN_AGENT_NODE:-}}" > {seen}\nexit 0\n')
    gw.chmod(0o755)
    config = agent_config(tmp_path, str(tmp_path))  # it names gpu01: Slurm's name wins
    path = f"{bindir}:{os.environ['PATH']}"
    assert healthcheck(slurm, tmp_path, config, path=path, node="gpu02").returncode == 0
    assert seen.read_text() == "gpu02"
    named = {"GPUWARDEN_AGENT_NODE": "gpu02-ib"}
    assert (
        healthcheck(slurm, tmp_path, config, path=path, node="gpu02", extra=named).returncode == 0
    )
    assert seen.read_text() == "gpu02-ib"
