"""Issue 39, must-show 1: the crash-point sweep. SIGKILL the engine at every journal and audit
boundary of a checkpoint-drain-requeue plan against a REAL Slurm, restart it, re-send the
finding: every action happens exactly once, and Slurm's own state and the audit agree.

The engine is the real ``gpuwarden remediate serve`` process; it kills itself with SIGKILL at
the boundary ``GPUWARDEN_TEST_CRASH_AT`` names (``before:N``: just before its Nth record is
written; ``after:N``: once it is on disk). The plan writes eight records (finding, decision,
and an intent and an outcome for each of checkpoint, drain and requeue), so the sweep covers
16 points: before each record (the moment after the step before it took effect) and after it.
The job is a stand-in (SIMULATED work: it sleeps per step) speaking the real checkpoint
protocol; the finding is CONSTRUCTED; slurmctld, the slurmds, the drain and the requeue are
real. "Exactly once" is read from Slurm (the job's restart count, the node's drain) and from the
job's own log (one checkpoint), not from the engine's word.

The same for the offer back of a node a prediction held (:mod:`remediation.holds`): killed at
each boundary of the offer's four records, the restarted engine returns the node once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwarden.remediation.audit import read_records
from testbed.influxd import free_port
from testbed.slurm import LocalSlurm, slurm_available
from tests.remediation_util import poll, risk

pytestmark = [
    pytest.mark.skipif(not slurm_available(), reason="scripts/bootstrap.sh installs Slurm"),
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "t0ken-for-the-sweep"
RECORDS = 8  # finding, decision, intent+action for checkpoint, drain and requeue
POINTS = [f"{where}:{n}" for n in range(1, RECORDS + 1) for where in ("before", "after")]
NODE = "gpu02"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as s:
        yield s


def start_job(slurm: LocalSlurm, work: Path) -> str:
    script = work / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"exec {sys.executable} -m testbed.jobs.sim_job --state-dir {work}/state "
        f"--checkpoint-dir {work}/ckpt --step-s 0.1\n"
    )
    out = slurm.run("sbatch", "--parsable", "--requeue", "--exclusive", "-N1", "-w", NODE,
                    "-o", f"{work}/%j.out", "--chdir", str(ROOT), str(script))  # fmt: skip
    job = out.strip().split(";")[0]
    poll(lambda: job_state(slurm, job) == ("RUNNING", NODE), 60, f"job {job} running on {NODE}")
    poll(lambda: len(log_lines(work)) > 3, 60, "a few steps done")
    return job


def job_state(slurm: LocalSlurm, job: str) -> tuple[str, str]:
    line = slurm.run("squeue", "-h", "-j", job, "-o", "%T %N", check=False).split()
    return (line[0], line[1]) if len(line) == 2 else (line[0] if line else "", "")


def restarts(slurm: LocalSlurm, job: str) -> int:
    shown = slurm.run("scontrol", "show", "job", job)
    field = next(f for f in shown.split() if f.startswith("Restarts="))
    return int(field.split("=", 1)[1])


def node_flags(slurm: LocalSlurm) -> tuple[str, str]:
    shown = slurm.run("scontrol", "show", "node", NODE)
    state = next(f for f in shown.split() if f.startswith("State=")).split("=", 1)[1]
    reason = shown.split("Reason=", 1)[1].split(" [", 1)[0] if "Reason=" in shown else ""
    return state, reason


def log_lines(work: Path) -> list[list[str]]:
    path = work / "state" / "progress.log"
    return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []


SWEEP_POLICY = (
    '[[policy]]\nname = "sweep"\nkinds = ["failure_risk"]\n'
    'actions = ["checkpoint", "drain", "requeue"]\n'
)


class Serve:
    """``gpuwarden remediate serve`` on the real Slurm, live, no notifications."""

    def __init__(
        self,
        slurm: LocalSlurm,
        work: Path,
        crash_at: str = "",
        policies: str = SWEEP_POLICY,
        engine: str = "",
    ) -> None:
        self.port = free_port()
        (work / "token").write_text(TOKEN)
        config = work / "remediation.toml"
        config.write_text(
            f'[engine]\nlisten = "127.0.0.1:{self.port}"\ntoken_file = "{work}/token"\n'
            f'audit_log = "{work}/audit.jsonl"\ndry_run = false\nnotify_adapter = ""\n'
            'tick_s = 0.2\n' + engine +
            '[guards]\nmax_nodes_out = 4\nmax_fraction_out = 1.0\n'
            f'[slurm]\nconf = "{slurm.conf}"\ncheckpoint_dir = "{work}/ckpt"\n'
            'checkpoint_timeout_s = 30.0\n' + policies
        )  # fmt: skip
        # PYTHONFAULTHANDLER: an engine that will not stop is ended with SIGABRT (below), which
        # then prints every thread's stack to its log
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1",
               "SLURM_CONF": str(slurm.conf)}  # fmt: skip
        env.pop("GPUWARDEN_TEST_CRASH_AT", None)
        if crash_at:
            env["GPUWARDEN_TEST_CRASH_AT"] = crash_at
        self.log = work / f"engine-{crash_at or 'after'}.log"
        self.out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(config), "serve"],
            cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        poll(self.up, 60, "the engine's /healthz")

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                return True
        except OSError:
            return False

    def post(self, body: bytes) -> int:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/findings", data=body, method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0  # the engine died mid-request

    def stop(self) -> None:
        """SIGTERM, as systemd stops it; an engine still running a minute later is a failure,
        and its stacks (SIGABRT) say where it was."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.proc.send_signal(signal.SIGABRT)
                    self.proc.wait(timeout=30)
                    raise AssertionError(
                        "the engine did not stop within 60 s of SIGTERM:\n"
                        + self.log.read_text(errors="replace")[-6000:]
                    ) from None
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.out.close()


def plan_done(audit: Path) -> bool:
    done = {r["action"] for r in read_records(audit) if r["event"] == "action"}
    return {"checkpoint", "drain", "requeue"} <= done


@pytest.mark.parametrize("crash_at", POINTS)
def test_a_crash_at_any_boundary_loses_nothing_and_repeats_nothing(
    slurm: LocalSlurm, tmp_path: Path, crash_at: str
) -> None:
    # each case starts from an empty cluster (this module's own): a case that failed before
    # its scancel (below) left its job requeued, pending for gpu02 (so not on it: squeue -w
    # and scancel -w would not see it), and it took the node back before the next case's job
    def left() -> list[str]:
        return slurm.run("squeue", "-h", "-o", "%i", check=False).split()

    if left():
        slurm.run("scancel", *left(), check=False)
    poll(lambda: not left(), 60, "no job left")
    slurm.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME", check=False)
    poll(lambda: node_flags(slurm)[0].startswith("IDLE"), 60, f"{NODE} back in service")
    job = start_job(slurm, tmp_path)
    finding = risk(NODE)
    body = json.dumps(finding.to_json()).encode()

    doomed = Serve(slurm, tmp_path, crash_at)
    try:
        doomed.post(body)
        doomed.proc.wait(timeout=120)
    finally:
        doomed.stop()  # one that never reached its point is not left running
    assert doomed.proc.returncode == -signal.SIGKILL, f"never reached {crash_at}"

    engine = Serve(slurm, tmp_path)
    try:
        # the sender retries until the engine answers (the poster does): 202 when the
        # decision had not reached the disk, 409 when it had (and the restart resumed it)
        assert engine.post(body) in (202, 409)
        poll(lambda: plan_done(tmp_path / "audit.jsonl"), 120, "the plan to finish")
    finally:
        engine.stop()

    records = list(read_records(tmp_path / "audit.jsonl"))
    actions = [r for r in records if r["event"] == "action"]
    for kind in ("checkpoint", "drain", "requeue"):
        ok = [r for r in actions if r["action"] == kind and r["outcome"] == "ok"]
        assert len(ok) == 1, (crash_at, kind, actions)
    decisions = [r for r in records if r["event"] == "decision" and r["verdict"] == "act"]
    assert len(decisions) == 1
    # Slurm agrees: the node drained with our reason, the job requeued exactly once
    state, reason = node_flags(slurm)
    assert "DRAIN" in state and reason.startswith("gpuwarden:"), (state, reason)
    assert restarts(slurm, job) == 1
    requeued = next(r for r in actions if r["action"] == "requeue" and r["outcome"] == "ok")
    assert requeued["details"]["requeued"] == [job]
    # and the job saved once, for this request (its own log, before it was requeued)
    saves = [ln for ln in log_lines(tmp_path) if ln[2] == "checkpoint" and ln[4] == "0"]
    assert len(saves) == 1, saves
    slurm.run("scancel", job, check=False)
    poll(lambda: job_state(slurm, job)[0] in ("", "CANCELLED", "COMPLETED"), 60, "job gone")


def test_the_sweep_covers_every_record_of_the_plan() -> None:
    """16 points: before and after each of the plan's 8 records."""
    assert len(POINTS) == 2 * RECORDS == 16


# -- the offer back after a prediction's hold (remediation.holds) --------------------------------

#: the engine runs the return check itself (a check that passes: the node is fine)
HOLD_ENGINE = 'return_requires = "command"\nreturn_check_command = ["true"]\n'
HOLD_POLICIES = (
    '[[policy]]\nname = "predicted"\nkinds = ["failure_risk"]\nactions = ["drain"]\n'
    '[[policy]]\nname = "prediction-expired"\nkinds = ["prediction_expired"]\n'
    'actions = ["uncordon"]\n'
)
#: the drain writes records 1-4 (finding, decision, intent, action); the offer at the hold's
#: end 5-8 (its finding, decision, and the uncordon's intent and action)
OFFER_POINTS = [f"{where}:{n}" for n in range(5, 9) for where in ("before", "after")]


@pytest.mark.parametrize("crash_at", OFFER_POINTS)
def test_a_crash_while_a_held_node_is_offered_back_returns_it_once(
    slurm: LocalSlurm, tmp_path: Path, crash_at: str
) -> None:
    """A node drained on a prediction with a 2 s horizon (CONSTRUCTED): the engine offers it
    back when the hold ends, and is SIGKILLed at each boundary of that offer. Restarted, it
    returns the node exactly once: one ``prediction_expired`` decided, one uncordon recorded
    done, and Slurm shows the node back in service."""
    slurm.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME", check=False)
    poll(lambda: not node_flags(slurm)[0].startswith(("DRAIN", "IDLE+DRAIN")), 60, "resumed")
    finding = replace(risk(NODE), evidence={"horizon_s": 2.0})
    body = json.dumps(finding.to_json()).encode()
    doomed = Serve(slurm, tmp_path, crash_at, HOLD_POLICIES, HOLD_ENGINE)
    try:
        assert doomed.post(body) == 202
        doomed.proc.wait(timeout=120)
    finally:
        doomed.stop()
    assert doomed.proc.returncode == -signal.SIGKILL, f"never reached {crash_at}"

    audit = tmp_path / "audit.jsonl"

    def returned() -> bool:
        return any(
            r["event"] == "action" and r["action"] == "uncordon" and r["outcome"] == "ok"
            for r in read_records(audit)
        )

    engine = Serve(slurm, tmp_path, policies=HOLD_POLICIES, engine=HOLD_ENGINE)
    try:
        poll(returned, 120, "the held node returned")
        time.sleep(1.0)  # ticks go on (0.2 s): a second offer would show here
    finally:
        engine.stop()
    records = list(read_records(audit))
    offers = [
        r for r in records if r["event"] == "decision" and r["policy"] == "prediction-expired"
    ]
    assert [r["verdict"] for r in offers] == ["act"], (crash_at, offers)
    ok = [r for r in records if r["event"] == "action" and r["outcome"] == "ok"]
    assert [r["action"] for r in ok] == ["drain", "uncordon"], (crash_at, ok)
    state, _ = node_flags(slurm)
    assert "DRAIN" not in state, state
