"""Asynchronous checkpointing (:mod:`collector.jobside.background_save`): the helper alone
(CONSTRUCTED writes), then on a REAL PyTorch job (torchrun, gloo, CPU:
``testbed/jobs/train_job.py`` with ``GW_CKPT_ASYNC=1``; the slow storage is SIMULATED by
``GW_CKPT_WRITE_DELAY_S``)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from gpuwarden.collector.jobside.background_save import BackgroundSave
from gpuwarden.core.checkpoint import ack_path, request_path, write_json_atomic
from testbed.influxd import free_port
from tests.remediation_util import poll
from tests.torchrun_util import step_events as _events
from tests.torchrun_util import torchrun_argv


def test_training_waits_for_the_snapshot_not_the_write() -> None:
    release = threading.Event()
    written: list[int] = []
    saver = BackgroundSave()

    def write(copy: dict) -> None:
        release.wait(30)
        written.append(copy["step"])

    def state() -> tuple[bool, int | None, list[int]]:
        return saver.in_flight, saver.durable_step, list(written)

    saver.save(1, lambda: {"step": 1}, write)  # returns while the write is blocked
    assert state() == (True, None, [])
    release.set()
    saver.wait()
    assert state() == (False, 1, [1])


def test_one_write_at_a_time_in_step_order() -> None:
    order: list[str] = []
    gate = threading.Event()

    def write(copy: int) -> None:
        if copy == 1:
            gate.wait(30)
        order.append(f"write {copy}")

    def snap(n: int) -> int:
        order.append(f"snapshot {n}")
        return n

    saver = BackgroundSave()
    saver.save(1, lambda: snap(1), write)
    threading.Timer(0.2, gate.set).start()
    saver.save(2, lambda: snap(2), write)  # waits for write 1 before its snapshot
    saver.wait()
    assert order == ["snapshot 1", "write 1", "snapshot 2", "write 2"]
    assert saver.durable_step == 2


def test_a_failed_write_is_raised_to_the_training_loop_not_lost() -> None:
    saver = BackgroundSave()

    def full_disk(copy: object) -> None:
        raise OSError(28, "No space left on device")

    saver.save(5, lambda: 5, full_disk)
    with pytest.raises(RuntimeError, match="background checkpoint write failed") as info:
        saver.wait()
    assert isinstance(info.value.__cause__, OSError)
    assert saver.durable_step is None  # step 5 never became a checkpoint
    saver.wait()  # raised once: the saver is usable again
    saver.save(6, lambda: 6, lambda copy: None)
    saver.wait()
    assert saver.durable_step == 6


torch = pytest.importorskip("torch", reason="scripts/bootstrap.sh installs the CPU build of torch")


def test_a_real_job_trains_while_its_checkpoint_is_written(tmp_path: Path) -> None:
    """Each background save is logged once it is on disk, after steps the job trained while
    the (SIMULATED 1.5 s slow) write ran; a save the engine asks for is on disk before it is
    acknowledged; a restart resumes from the newest checkpoint on disk."""
    steplog, requests, ckpt = tmp_path / "steps.jsonl", tmp_path / "requests", tmp_path / "ckpt"
    requests.mkdir()
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "SLURM_JOB_ID": "async-1",
        "GPUWARDEN_REPORTER_URL": f"http://127.0.0.1:{free_port()}",  # nobody: dropped
        "GW_STEP_S": "0.1",
        "GW_CKPT_EVERY_S": "2",
        "GW_CKPT_ASYNC": "1",
        "GW_CKPT_WRITE_DELAY_S": "1.5",
        "GW_CKPT_DIR": str(ckpt),
        "GW_REQUEST_DIR": str(requests),
        "GW_STEPLOG": str(steplog),
    }

    def start(steps: int) -> subprocess.Popen:
        argv = torchrun_argv("testbed.jobs.train_job", free_port())
        out = (tmp_path / "torchrun.log").open("a")
        return subprocess.Popen(
            argv, env=env | {"GW_STEPS": str(steps)}, stdout=out, stderr=subprocess.STDOUT
        )

    def saves(at_least: int, proc: subprocess.Popen) -> list[dict] | None:
        assert proc.poll() is None, (tmp_path / "torchrun.log").read_text()[-3000:]
        found = [e for e in _events(steplog) if e["event"] == "save"]
        return found if len(found) >= at_least else None

    proc = start(100_000)
    try:
        background = poll(lambda: saves(2, proc), 180, "two background saves", every_s=0.2)
        write_json_atomic(
            request_path(requests, "async-1"), {"request_id": "q1", "reason": "test", "time": 0}
        )
        ack = poll(
            lambda: json.loads(p.read_text()) if (p := ack_path(requests, "async-1")).exists()
            else None,
            60, "the acknowledgement", every_s=0.1,
        )  # fmt: skip
        on_disk = sorted(x.name for x in ckpt.glob("ckpt-*.pt"))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    events = _events(steplog)
    for save in background:
        assert save["why"] == "cadence" and save["background"] is True
        before = events[: events.index(save)]
        trained_on = [
            e["step"] for e in before if e["event"] == "step" and e["step"] > save["step"]
        ]
        assert trained_on, f"no step ran while checkpoint {save['step']} was written"
    assert f"ckpt-{ack['step']:08d}.pt" in on_disk  # acknowledged once on disk
    (asked,) = [e for e in events if e["event"] == "save" and e["why"] == "request"]
    assert asked["step"] == ack["step"] and "background" not in asked
    logged = max(e["step"] for e in events if e["event"] == "save")
    # the newest file: the last logged save, or one the stop caught between rename and log line
    newest = int(max(x.name for x in ckpt.glob("ckpt-*.pt"))[5:13])
    assert newest >= logged
    assert not [x for x in ckpt.glob("ckpt-*.pt") if int(x.name[5:13]) > newest]

    proc = start(newest + 3)  # resumes from the newest checkpoint on disk and finishes
    assert proc.wait(timeout=180) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    (resumed,) = [e for e in _events(steplog) if e["event"] == "start"][1:]
    assert resumed["resume_step"] == newest
    last = _events(steplog)[-1]
    assert (last["event"], last["step"]) == ("done", newest + 3)
