"""Issue 38, names are data: a path built from a name stays inside its folder, and an atomic
write never follows a link.

The pid-file and interval-file attacks drive the real ``gpuwarden remediate serve`` (bearer +
HMAC), with the elastic adapter's ``pid_dir`` and the Slurm adapter's ``checkpoint_dir``; the
symlink attacks call :func:`core.checkpoint.write_json_atomic`, the function the engine and the
job-side hook both write through (a process adds nothing there). Every name is CONSTRUCTED."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.core.checkpoint import interval_path, write_json_atomic
from tests.security.names_engine import DRAIN_ON_XID, ServedEngine, xid_finding


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_node_name_cannot_signal_a_process_outside_pid_dir(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """CONSTRUCTED: node ``../elsewhere/daemon`` and an unrelated daemon whose pid file sits in
    ``<tmp>/elsewhere``. The engine refuses the finding (400); the daemon lives; the real
    node's agent (``pids/nodeA.pid``) is still stopped."""
    pids, elsewhere = tmp_path / "pids", tmp_path / "elsewhere"
    pids.mkdir()
    elsewhere.mkdir()
    daemon = subprocess.Popen(["sleep", "600"])
    agent = subprocess.Popen(["sleep", "600"])
    sleepers.extend([daemon, agent])
    reaper = threading.Thread(target=agent.wait)  # the engine waits for the agent to be gone
    reaper.start()
    (elsewhere / "daemon.pid").write_text(str(daemon.pid))
    (pids / "nodeA.pid").write_text(str(agent.pid))
    engine = ServedEngine(
        tmp_path,
        'node_adapter = "elastic"\ncheckpoint_adapter = "elastic"',
        f'[elastic]\npid_dir = "{pids}"\nstop_timeout_s = 30.0\n{DRAIN_ON_XID}',
    )
    try:
        assert engine.ready(), engine.output()
        status, reply = engine.post("/v1/findings", xid_finding("../elsewhere/daemon"))
        assert engine.post("/v1/findings", xid_finding("nodeA"))[0] == 202
        acted = engine.action_done(node="nodeA")  # one worker: a hostile plan would run first
    finally:
        engine.stop()
    assert daemon.poll() is None, "the unrelated daemon was signalled through pid_dir/../"
    assert status == 400 and "not a node name" in reply["error"], reply
    reaper.join(timeout=30)
    assert acted["outcome"] == "ok" and agent.returncode == -15, acted  # SIGTERM: acted on


def test_a_job_name_cannot_write_outside_checkpoint_dir(tmp_path: Path) -> None:
    """CONSTRUCTED: checkpoint advice for job ``../../outside/planted``. Nothing appears in
    ``<tmp>/outside``; the real job's interval request is written in ``checkpoint_dir``."""
    ckpt, outside = tmp_path / "a" / "ckpt", tmp_path / "outside"
    outside.mkdir(parents=True)
    engine = ServedEngine(
        tmp_path,
        'checkpoint_adapter = "slurm"\nnode_adapter = "slurm"',
        f'[slurm]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_timeout_s = 1.0\npoll_s = 0.1\n',
    )

    def advice(job: str) -> dict[str, object]:
        return {
            "kind": "checkpoint_advice", "subject": {"cluster": "c", "job": job},
            "severity": "info", "time_ns": time.time_ns(),
            "evidence": {"advised_interval_s": 600.0}, "summary": "CONSTRUCTED advice",
        }  # fmt: skip

    try:
        assert engine.ready(), engine.output()
        status, reply = engine.post("/v1/findings", advice("../../outside/planted"))
        assert engine.post("/v1/findings", advice("1234"))[0] == 202
        engine.action_done(job="1234", action="checkpoint_interval")
    finally:
        engine.stop()
    assert sorted(p.name for p in outside.iterdir()) == [], "a file was written outside"
    assert status == 400 and "not a job name" in reply["error"], reply
    assert json.loads((ckpt / "1234.interval").read_text())["interval_s"] == 600.0


def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """CONSTRUCTED: a link at the temporary name the old code used (``.<name>.<pid>.tmp``)
    pointing at a victim file: the victim keeps its content, the request is written."""
    ckpt, victim = tmp_path / "ckpt", tmp_path / "victim"
    ckpt.mkdir()
    victim.write_text("precious")
    (ckpt / f".1234.interval.{os.getpid()}.tmp").symlink_to(victim)
    write_json_atomic(interval_path(ckpt, "1234"), {"interval_s": 600.0})
    assert victim.read_text() == "precious"
    assert json.loads((ckpt / "1234.interval").read_text()) == {"interval_s": 600.0}


def test_the_temporary_file_is_created_exclusively_never_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a link at the exact (here predictable) temporary name is refused, not followed;
    and a target that is itself a link out of the folder is refused by its path."""
    monkeypatch.setattr(secrets, "token_hex", lambda n=8: "guessed")
    ckpt, victim = tmp_path / "ckpt", tmp_path / "victim"
    ckpt.mkdir()
    victim.write_text("precious")
    (ckpt / ".1234.interval.guessed.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_json_atomic(ckpt / "1234.interval", {"interval_s": 600.0})
    (ckpt / "99.interval").symlink_to(victim)
    with pytest.raises(ValueError, match="leads out of"):
        interval_path(ckpt, "99")
    assert victim.read_text() == "precious"
