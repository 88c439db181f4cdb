"""The engine's `finding` record is written without an fsync of its own: the `decision` that
always follows it, under the same lock, is fsynced, and that makes the file durable up to
its end, the finding with it (docs/DURABILITY.md). CONSTRUCTED findings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation import audit as audit_module
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from tests.remediation_util import RecordingAdapter


def finding(node: str, t_ns: int) -> Finding:
    # a kind no default policy takes: decided at once ("no_policy"), nothing runs after
    return Finding(
        kind="fan_noise",
        subject={"cluster": "test", "node": node},
        severity=Severity.WARNING,
        time_ns=t_ns,
    )


def test_every_submit_returns_with_the_whole_journal_synced_by_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "audit.jsonl"
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": RecordingAdapter("slurm", {"gpu01": "a"})},
        AuditLog(log),
        EngineSettings(dry_run=True),
    )
    synced: list[int] = []  # the file's size when each fsync of it began
    real = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(audit_module.os, "fsync", recording)
    t0 = 1_800_000_000 * 10**9
    for i in range(20):
        before = len(synced)
        # new findings, and every fifth one sent twice (a duplicate: decided, recorded)
        d = engine.submit(finding(f"gpu{i:02d}", t0 + (i // 5) * 600 * 10**9))
        assert d.verdict == "no_policy"
        assert len(synced) - before == 1  # before: 2 (the finding's own, then the decision's)
        assert synced[-1] == log.stat().st_size  # nothing unsynced when it returns
        if i % 5 == 0:
            again = engine.submit(finding(f"gpu{i:02d}", t0 + (i // 5) * 600 * 10**9))
            assert again.verdict == "duplicate"
            assert synced[-1] == log.stat().st_size
    events = [r["event"] for r in read_records(log)]
    assert events.count("finding") == 20 and events.count("decision") == 24
