"""Found by a review of what a crash loses (2026-11-28): a plan that waits for a person (a fatal
XID held by the blast radius, a plan waiting for approval) is told about by a notification sent
after its ``decision`` record, outside the plan's own ladder. An engine that stopped between
the two restored the plan as waiting and told nobody: the agent's re-send was a duplicate, and
the plan expired after ``pending_expire_s``, the node still in service, no page. Now the
restart sends the notification no record shows. The engine, its journal and the crash at a
journal boundary (``GPUWARDEN_TEST_CRASH_AT``, as the crash sweep uses) are real; the
scheduler is the testbed's recording one, the pager a file, the finding CONSTRUCTED.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.audit import CRASH_AT_ENV, AuditLog
from gpuwarden.remediation.engine import Engine
from gpuwarden.remediation.engine.decide import EngineSettings
from gpuwarden.remediation.model import Action, ActionKind, Outcome, Status
from gpuwarden.remediation.policy import Policy
from testbed.scheduler import RecordingAdapter

ROOT = Path(__file__).resolve().parent.parent


class Pager:
    """A notification adapter that appends each page to a file (it outlives the process)."""

    name = "webhook"
    actions = frozenset({ActionKind.NOTIFY})

    def __init__(self, path: Path) -> None:
        self.path = path

    def describe(self, action: Action) -> str:
        return "page"

    def perform(self, action: Action) -> Outcome:
        with self.path.open("a") as fh:
            fh.write(json.dumps({"node": action.node, "reason": action.reason}) + "\n")
        return Outcome(Status.OK, "paged")


def _engine(work: Path) -> tuple[Engine, RecordingAdapter]:
    policies = [Policy.from_mapping({"name": "fatal-xid", "kinds": ["gpu_xid"],
                                     "actions": ["notify", "drain"]})]  # fmt: skip
    scheduler = RecordingAdapter("slurm", {f"gpu0{i}": "p" for i in range(1, 9)})
    # no node may go out: the XID's plan waits for a person (blast_radius)
    settings = EngineSettings(dry_run=False, max_fraction_out=1.0, max_nodes_out=0)
    adapters = {"slurm": scheduler, "webhook": Pager(work / "pages.jsonl")}
    audit = AuditLog(str(work / "audit.jsonl"), exclusive=True)
    return Engine(policies, adapters, audit, settings), scheduler  # type: ignore[arg-type]


def first_life(work: str) -> None:
    """Run in a child process: the XID arrives; the engine dies after its decision record."""
    engine, _ = _engine(Path(work))
    t_ns = int((Path(work) / "t").read_text())
    engine.submit(Finding(kind="gpu_xid", subject={"cluster": "c", "node": "gpu02", "gpu": "0"},
                          severity=Severity.CRITICAL, time_ns=t_ns, evidence={"xid": 79},
                          summary="XID 79 (CONSTRUCTED)", source="agent"))  # fmt: skip
    engine.wait()


def _pages(work: Path) -> list[dict[str, str]]:
    path = work / "pages.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_a_plan_waiting_for_a_person_is_told_about_after_a_crash(tmp_path: Path) -> None:
    (tmp_path / "t").write_text(str(time.time_ns()))
    code = f"from tests.test_escalation_restart import first_life; first_life({str(tmp_path)!r})"
    # records of this process: 1 the engine's start, 2 the XID's decision (after it: the crash)
    env = {**os.environ, CRASH_AT_ENV: "after:2"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr  # it died at the boundary
    decisions = [json.loads(ln) for ln in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r.get("verdict") for r in decisions if r.get("event") == "decision"] == ["blast_radius"]
    assert _pages(tmp_path) == []  # nobody told before the crash

    engine, scheduler = _engine(tmp_path)
    engine.resume()
    engine.wait()
    engine.close()
    (page,) = _pages(tmp_path)
    assert page["node"] == "gpu02" and "needs a human (blast_radius)" in page["reason"]
    assert scheduler.calls == []  # still held: told, not acted on

    engine, _ = _engine(tmp_path)  # and once only: the next start finds the page recorded
    engine.resume()
    engine.wait()
    engine.close()
    assert len(_pages(tmp_path)) == 1
