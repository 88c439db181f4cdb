"""Two ``gpuwarden remediate serve`` processes under one lease: the failover test and
``benchmarks/failover.py`` drive them.

Both engines share one audit log and one ``[lease]`` in a REAL PostgreSQL
(:class:`testbed.postgres.LocalPostgres`), and drain nodes of a REAL Slurm
(:class:`testbed.slurm.LocalSlurm`). Each engine is a slot with a fixed port; a sender lists
both URLs (:class:`core.poster.FindingPoster`). A round posts one CONSTRUCTED finding whose plan
drains a node, and the acting engine is SIGKILLed at a random journal boundary
(``GPUWARDEN_TEST_CRASH_AT``, counted from the process's start: its lease record, the plans
it resumes, then the round's plan), or, when that point lies beyond what it writes, by the
harness once the plan is done. A dead slot is started again, as the new standby, with a new
random point. The failover time is from the acting engine's death (seen by ``waitpid``) to
the first ``/healthz`` answer of the other one.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gpuwarden.core.poster import FindingPoster
from gpuwarden.core.retry import Backoff
from gpuwarden.remediation.audit import read_records
from testbed.influxd import free_port
from testbed.postgres import LocalPostgres
from testbed.slurm import LocalSlurm
from tests.remediation_util import poll, risk

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "t0ken-for-the-failover"
#: records a drain-only plan writes: finding, decision, intent, action
PLAN_RECORDS = 4


class Slot:
    """One engine's place: a port, and the process now running there (or None)."""

    def __init__(self, name: str, work: Path, slurm: LocalSlurm, dsn_file: Path) -> None:
        self.name = name
        self.port = free_port()
        self.work = work
        self.config = work / f"engine-{name}.toml"
        self.config.write_text(
            f'[engine]\nlisten = "127.0.0.1:{self.port}"\ntoken_file = "{work}/token"\n'
            f'audit_log = "{work}/audit.jsonl"\ndry_run = false\nnotify_adapter = ""\n'
            'checkpoint_adapter = ""\ntick_s = 0.2\n'
            '[guards]\nmax_nodes_out = 8\nmax_fraction_out = 1.0\ncooldown_s = 0.0\n'
            'lemon_count = 0\nactions_per_minute = 1000\n'
            f'[lease]\ndsn_file = "{dsn_file}"\nretry_s = 0.2\n'
            f'[slurm]\nconf = "{slurm.conf}"\n'
            '[[policy]]\nname = "failover"\nkinds = ["failure_risk"]\nactions = ["drain"]\n'
        )  # fmt: skip
        self.slurm = slurm
        self.proc: subprocess.Popen[bytes] | None = None
        self.died_at: float | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/findings"

    def start(self, crash_at: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLURM_CONF": str(self.slurm.conf)}
        env.pop("GPUWARDEN_TEST_CRASH_AT", None)
        if crash_at:
            env["GPUWARDEN_TEST_CRASH_AT"] = crash_at
        self.starts += 1
        self.log = self.work / f"engine-{self.name}-{self.starts}.log"
        out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(self.config),
             "serve"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        out.close()
        self.died_at = None
        proc = self.proc

        def reap() -> None:
            proc.wait()
            if self.proc is proc:
                self.died_at = time.monotonic()

        threading.Thread(target=reap, daemon=True).start()

    def acted(self) -> bool:
        """Whether the process now (or last) in this slot served as the acting engine."""
        log = getattr(self, "log", None)
        return log is not None and b"remediation engine on http" in log.read_bytes()

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.died_at = time.monotonic()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Report:
    failovers_s: list[float] = field(default_factory=list)
    killed_in_journal: int = 0
    """Kills at a journal boundary (the engine's own SIGKILL)."""
    killed_between: int = 0
    """Kills by the harness after the round's plan was done (the point lay beyond it)."""
    rounds: int = 0
    standby_deaths: int = 0
    """Deaths of an engine that had not begun to act (its point came before it served)."""
    both_down: int = 0
    """Deaths while the other engine was down too (no takeover to time)."""
    findings: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)


class EnginePair:
    def __init__(self, work: Path, slurm: LocalSlurm, pg: LocalPostgres, seed: int) -> None:
        self.work = work
        self.slurm = slurm
        self.rng = random.Random(seed)
        (work / "token").write_text(TOKEN)
        dsn_file = work / "lease.dsn"
        dsn_file.write_text(pg.dsn)
        dsn_file.chmod(0o600)
        self.slots = [Slot("a", work, slurm, dsn_file), Slot("b", work, slurm, dsn_file)]
        self.poster = FindingPoster(
            " ".join(s.url for s in self.slots),
            str(work / "token"),
            retry=Backoff(base_s=0.05, max_s=0.5),
        )
        self.report = Report()

    @property
    def audit(self) -> Path:
        return self.work / "audit.jsonl"

    def crash_point(self) -> str:
        """A random journal boundary within what an engine writes in its first round."""
        return f"{self.rng.choice(('before', 'after'))}:{self.rng.randint(1, PLAN_RECORDS + 3)}"

    def start(self) -> None:
        first, second = self.slots
        first.start(self.crash_point())
        poll(first.up, 60, "the first engine to take the lease and serve")
        second.start(self.crash_point())

    def acting(self) -> Slot | None:
        return next((s for s in self.slots if s.alive() and s.up()), None)

    def round(self, node: str, timeout_s: float = 120.0) -> None:
        """One plan whose engine is killed at a random point; returns once the plan is done,
        the sender has it delivered, and both slots run again."""
        self.slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        # another GPU each time a node comes round again: a finding's id is its kind, subject
        # and time bucket, and the same id with other content is (rightly) refused
        finding = risk(node, gpu=str(sum(1 for f in self.report.nodes if f == node)))
        self.report.nodes.append(node)
        self.report.findings.append(finding.id)
        delivered = self.poster.posted
        self.poster.post(finding)
        killed = False
        deadline = time.monotonic() + timeout_s
        while True:
            for slot in self.slots:
                if slot.died_at is not None:
                    self.report.killed_in_journal += 1
                    self._failover(slot)
                    killed = True
            if self.poster.posted > delivered and plan_done(self.audit, finding.id):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"round for {node}: plan not done within {timeout_s} s")
            time.sleep(0.01)
        if not killed:  # the engine's point lay beyond this round: kill it now
            acting = poll(self._acting, 60, "an engine to act")
            if acting.died_at is not None:  # it died at its own point meanwhile
                self.report.killed_in_journal += 1
                self._failover(acting)
                self.report.rounds += 1
                return
            acting.kill()
            self.report.killed_between += 1
            self._failover(acting)
        self.report.rounds += 1

    def _acting(self) -> Slot | None:
        return next((s for s in self.slots if s.died_at is not None or s.up()), None)

    def _failover(self, dead: Slot) -> None:
        """``dead`` died: time the other slot's takeover, start ``dead`` again as standby."""
        died_at = dead.died_at
        assert died_at is not None
        other = next(s for s in self.slots if s is not dead)
        acted = dead.acted()
        dead.start(self.crash_point())  # the new standby: it waits for the lease
        if not acted:  # a standby died (before, or while, taking the lease): no failover
            self.report.standby_deaths += 1
            return
        if other.alive():
            # the standby takes over (or the engine just started in the dead one's place, when
            # it reaches the lease first): whichever serves first
            poll(lambda: other.died_at is not None or any(s.up() for s in self.slots), 60,
                 "an engine to act")  # fmt: skip
            if other.died_at is None:
                self.report.failovers_s.append(time.monotonic() - died_at)
                return
        self.report.both_down += 1  # the other died too (at its own point): not a failover

    def close(self) -> None:
        self.poster.close(timeout_s=5)
        for slot in self.slots:
            slot.stop()


def plan_done(audit: Path, finding_id: str) -> bool:
    return bool(drains(audit, finding_id))


def drains(audit: Path, finding_id: str) -> list[dict[str, object]]:
    """The drains of ``finding_id``'s plan that the audit records as done."""
    return [
        r for r in read_records(audit)
        if r.get("event") == "action" and r.get("action") == "drain"
        and r.get("outcome") == "ok" and r.get("finding_id") == finding_id
    ]  # fmt: skip
