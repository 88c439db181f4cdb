"""Issue 38, hole 2 (and issue 37's logrotate item): the journal is compacted, and nothing the
engine must remember is lost, nothing is done twice.

Two engines get the same SIMULATED 45 days of findings hour by hour (noise that only notifies,
XIDs that drain, checks that return nodes, host faults an operator approves or lets expire,
undos), on one hand-driven clock: one compacts its journal past a few hundred KiB, the other
never does. Every few days, and at the end, the two agree on everything the engine reads
(seen ids, nodes out and why, cooldowns, the lemon history in its window, waiting and approved
plans, open outcomes, precision), both live and restarted from copies of their logs; the
restarted pair then decides the same new findings the same way. CONSTRUCTED crashes: a
compaction that fails at each step leaves the live log whole, and a link a crash left behind
is not archived twice. Before this change there was no compaction (the setting did not exist)
and the log only grew.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.remediation.audit import AuditLog, JournalError, replay
from gpuwarden.remediation.clock import Clock
from gpuwarden.remediation.compact import archives, choose, compact_file, history, swap, tidy
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.outcomes import OutcomeSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from tests.remediation_util import HandClock, RecordingAdapter

NODES = {f"gpu{i:02d}": "a" for i in range(12)}
HOUR, DAY = 3600.0, 86400.0
SETTINGS = EngineSettings(
    dry_run=False, max_nodes_out=3, max_fraction_out=1.0, cooldown_s=2 * HOUR,
    actions_per_minute=10_000, lemon_count=3, lemon_window_s=3 * DAY, return_requires="none",
    pending_expire_s=6 * HOUR, seen_retention_s=DAY, approval=("cordon",),
    outcomes=OutcomeSettings(quick_pass_s=HOUR, clean_window_s=DAY, window_s=5 * DAY),
)  # fmt: skip
LOG = "audit.jsonl"


def engine_at(
    folder: Path, clock: HandClock, compact_bytes: int = 0, seen_retention_s: float = DAY
) -> Engine:
    return Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": RecordingAdapter("slurm", NODES), "webhook": RecordingAdapter("webhook")},
        AuditLog(folder / LOG),
        dataclasses.replace(
            SETTINGS, journal_compact_bytes=compact_bytes, seen_retention_s=seen_retention_s
        ),
        clock=Clock(wall=clock.wall, mono=clock.mono),
    )


def finding(clock: HandClock, kind: str, node: str, severity: Severity, **ev: Any) -> Finding:
    return Finding(
        kind=kind,
        subject={"cluster": "test", "node": node} | ({"gpu": "0"} if kind == "gpu_xid" else {}),
        severity=severity,
        time_ns=int(clock.wall() * 1e9),
        evidence=ev,
        confidence=1.0,
        summary=f"{kind} on {node}",
        source="agent",
    )


def view(e: Engine, clock: HandClock) -> dict[str, Any]:
    """What the engine reads of its memory: the cooldown and the lemon history within their
    windows (older entries are read by nothing; the whole log's replay keeps them anyway)."""
    m = e.memory
    lemon_from = clock.wall() - SETTINGS.lemon_window_s
    return {
        "seen": sorted(m.seen_findings),
        "digests": sorted(m.finding_digests.items()),
        "taken_out": sorted(m.taken_out),
        "cooling": sorted(  # the cooldown reads a node's last change within cooldown_s
            (n, round(t, 3))
            for n, t in m.last_action_at.items()
            if clock.mono() - t < SETTINGS.cooldown_s
        ),
        "lemon": sorted(
            (n, kept)
            for n, times in m.taken_out_at.items()
            if (kept := [(round(at.wall, 3), why) for at, why in times if at.wall >= lemon_from])
        ),
        "intents": sorted(m.intents),
        "approved": sorted(m.approved.items()),
        "approved_plans": sorted(m.approved_plans),
        "waiting": sorted(p["plan_id"] for p in e.pending()),
        "open": sorted(e.outcomes.open),
        "demoted": sorted(e.outcomes.demoted),
        "precision": sorted(e.outcomes.precision().items()),
    }


def restarted(folder: Path, into: Path, clock: HandClock) -> Engine:
    into.mkdir()
    shutil.copy2(folder / LOG, into / LOG)
    return engine_at(into, clock)


def hour(engines: list[Engine], clock: HandClock, rng: random.Random) -> None:
    """One SIMULATED hour: the same findings and operator acts for every engine."""
    events: list[tuple[str, Any]] = []
    for _ in range(rng.randint(2, 4)):  # noise: notify only, the bulk of a real journal
        kind = rng.choice(["link_flap", "memory_ce", "hung_task"])
        node = rng.choice(list(NODES))
        events.append(("submit", finding(clock, kind, node, Severity.WARNING, n=rng.random())))
    roll = rng.random()
    node = rng.choice(list(NODES))
    if roll < 0.06:
        events.append(("submit", finding(clock, "gpu_xid", node, Severity.CRITICAL, xid=79)))
    elif roll < 0.09:
        events.append(("submit", finding(clock, "soft_lockup", node, Severity.CRITICAL)))
    elif roll < 0.16:
        ev = {"check": "pass", "checked_ns": int(clock.wall() * 1e9)}
        events.append(("submit", finding(clock, "node_healthy", node, Severity.INFO, **ev)))
    elif roll < 0.18:
        events.append(("undo", (node, rng.choice(["false_alarm", "repaired"]))))
    elif roll < 0.22:
        events.append(("approve", None))
    for engine in engines:
        for what, arg in events:
            if what == "submit":
                engine.submit(arg)
            elif what == "undo" and arg[0] in engine.memory.taken_out:
                engine.undo(arg[0], "ops", reason=arg[1])
            elif what == "approve":
                plans = sorted(p["plan_id"] for p in engine.pending() if p["verdict"] == "approval")
                if plans:
                    engine.approve(plans[0], "ops")
            assert engine.wait(10)
        engine.tick()
        assert engine.wait(10) and engine.wait_compaction(30)
    clock.advance(HOUR)


def test_a_compacted_journal_remembers_what_the_whole_one_does(tmp_path: Path) -> None:
    clock, rng = HandClock(), random.Random(38)
    (tmp_path / "c").mkdir()
    (tmp_path / "w").mkdir()
    compacting = engine_at(tmp_path / "c", clock, compact_bytes=256 << 10)
    whole = engine_at(tmp_path / "w", clock)
    checks = 0
    for h in range(45 * 24):
        hour([compacting, whole], clock, rng)
        if h % (5 * 24) == 5 * 24 - 1:
            assert view(compacting, clock) == view(whole, clock)
            a = restarted(tmp_path / "c", tmp_path / f"rc{h}", clock)
            b = restarted(tmp_path / "w", tmp_path / f"rw{h}", clock)
            va, vb = view(a, clock), view(b, clock)
            assert set(va["seen"]) - set(vb["seen"]) == set() == set(vb["seen"]) - set(va["seen"])
            assert va == vb
            assert replay(a.audit.path).unfinished == []
            checks += 1
    assert checks == 9
    # the workload did what it should: drains, returns, outcomes, waits, expiries
    full = [json.loads(line) for line in (tmp_path / "w" / LOG).read_text().splitlines()]
    events = {r["event"] for r in full}
    assert {"outcome", "approval", "expired", "undo"} <= events, events
    assert sum(r["event"] == "action" and r["action"] == "drain" for r in full) >= 20
    # compacted several times; each archive whole up to its time; the live log far smaller
    arch = archives(tmp_path / "c" / LOG)
    assert len(arch) >= 3
    live = (tmp_path / "c" / LOG).stat().st_size
    assert live < (tmp_path / "w" / LOG).stat().st_size / 3
    # `remediate audit --all` over the archives and the live log: the whole history once
    key = ("event", "t", "finding_id", "action_id", "verdict", "outcome")
    told = [tuple(r.get(k) for k in key) for r in history(tmp_path / "c" / LOG)]
    assert [x for x in told if x[0] != "compacted"] == [tuple(r.get(k) for k in key) for r in full]
    first = json.loads((tmp_path / "c" / LOG).read_text().splitlines()[0])
    assert first["event"] == "compacted" and f"{first['archive']}.gz" == arch[-1].name
    # the restarted pair decides what comes next the same way, actions included
    a = restarted(tmp_path / "c", tmp_path / "final-c", clock)
    b = restarted(tmp_path / "w", tmp_path / "final-w", clock)
    assert a.resume() == b.resume() == []
    for _ in range(48):
        hour([a, b], clock, rng)
    assert view(a, clock) == view(b, clock)
    assert a.adapters["slurm"].calls == b.adapters["slurm"].calls


def test_what_the_reader_has_not_read_is_kept_as_it_is(tmp_path: Path) -> None:
    """Records past the outcome reader's offset (a plan running during the compaction) are
    copied verbatim, however old, and the reader's offset moves to where they now start."""
    path = tmp_path / LOG
    log = AuditLog(path)
    for i in range(10):
        log.append("decision", 1000.0 + i, finding_id=f"f{i}", verdict="no_policy", node="n")
    offset = path.stat().st_size
    log.append("intent", 1000.0, action_id="a1", action="drain", node="n", finding_id="f9")
    tail = path.read_bytes()[offset:]
    done = compact_file(path, offset, horizon=5000.0, now=6000.0)
    data = path.read_bytes()
    assert data.endswith(tail) and done.offset == len(data) - len(tail)
    assert done.dropped == 10 and done.kept == 0
    assert (tmp_path / done.archive.name).read_bytes()[offset:] == tail


def test_records_appended_while_the_records_are_chosen_are_kept(tmp_path: Path) -> None:
    """The engine chooses without a lock; what plans append meanwhile lands after the kept
    records, and the reader's offset maps to the same record."""
    path = tmp_path / LOG
    log = AuditLog(path)
    for i in range(10):
        log.append("decision", 1000.0 + i, finding_id=f"f{i}", verdict="no_policy", node="n")
    offset = path.stat().st_size
    chosen = choose(path, offset, horizon=1005.0)
    log.append("action", 9000.0, action_id="late", action="drain", node="n", outcome="ok")
    read_to = path.stat().st_size  # the reader read the late record too
    done = swap(path, chosen, now=9001.0)
    lines = path.read_text().splitlines()
    assert [json.loads(x).get("finding_id") for x in lines[1:6]] == [f"f{i}" for i in range(5, 10)]
    assert json.loads(lines[-1])["action_id"] == "late"
    assert done.offset + read_to - offset == path.stat().st_size


@pytest.mark.parametrize("fail_at", ["link", "replace"])
def test_a_compaction_that_fails_leaves_the_live_log_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: str
) -> None:
    """CONSTRUCTED: the compaction is cut after its copy is written (the link fails: a full
    disk's inode table, a read-only remount) or after its archive link (the replace fails, as a
    crash there would leave it): the live log is the whole log; the next compaction archives it
    once, and a link a crash left behind is not a second archive."""
    path = tmp_path / LOG
    log = AuditLog(path)
    for i in range(20):
        log.append("decision", 1000.0 + i, finding_id=f"f{i}", verdict="no_policy", node="n")
    before = path.read_bytes()
    real = getattr(os, fail_at)

    def failing(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, fail_at, failing)
    with pytest.raises(OSError):
        compact_file(path, path.stat().st_size, horizon=5000.0, now=6000.0)
    monkeypatch.setattr(os, fail_at, real)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))
    left = archives(path)
    assert len(left) == (1 if fail_at == "replace" else 0)  # the crash's link, the same file
    done = compact_file(path, path.stat().st_size, horizon=5000.0, now=6001.0)
    assert archives(path) == [done.archive]
    assert done.archive.read_bytes() == before


def test_a_fence_that_refuses_stops_the_compaction(tmp_path: Path) -> None:
    """An engine whose lease is not confirmed compacts nothing (it may no longer write)."""
    clock = HandClock()
    engine = engine_at(tmp_path, clock, compact_bytes=1024)
    for _ in range(10):
        engine.submit(finding(clock, "link_flap", "gpu01", Severity.WARNING))
        clock.advance(60.0)
    assert engine.wait(10)
    before = (tmp_path / LOG).read_bytes()

    def refused() -> None:
        raise JournalError("the lease is not confirmed")

    engine.audit.fence = refused
    engine.tick()
    assert engine.wait_compaction(30)
    assert (tmp_path / LOG).read_bytes() == before and archives(tmp_path / LOG) == []
    engine.audit.fence = None
    clock.advance(400.0)  # past COMPACT_RETRY_S
    engine.tick()
    assert engine.wait_compaction(30)
    assert len(archives(tmp_path / LOG)) == 1


def test_the_audit_trail_with_its_archives_shows_each_record_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpuwarden remediate audit --all``: the archives, then the live log, without the
    copies a compaction made (a drain that is still out is copied forward every time)."""
    from gpuwarden.remediation.cli import main as remediate

    path = tmp_path / LOG
    log = AuditLog(path)
    written = []
    for round_ in range(3):
        for i in range(5):
            fid = f"r{round_}-{i}"
            written.append(fid)
            log.append("decision", 1000.0 * (round_ + 1) + i, finding_id=fid, verdict="x", node="n")
        if round_ == 0:
            log.append("intent", 1000.0, action_id="a0", action="drain", node="m", finding_id="a")
            written.append("a")
        compact_file(path, path.stat().st_size, horizon=1e9, now=5000.0 + round_)
    assert remediate(["audit", "--log", str(path), "--all", "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    fids = [r["finding_id"] for r in shown if r["event"] != "compacted"]
    assert fids == written  # the unfinished intent once, though every live log carried it
    assert sum(r["event"] == "compacted" for r in shown) == 3


def test_the_shipped_engine_compacts_by_default() -> None:
    """``gpuwarden remediate serve`` reads 64 MiB from the sample configuration (and sets
    ``seen_retention_s``, without which nothing would be compacted)."""
    from gpuwarden.remediation.config import load_config

    root = Path(__file__).resolve().parent.parent
    settings = load_config(root / "config/remediation.sample.toml").settings
    assert settings.journal_compact_bytes == 64 << 20
    assert settings.journal_retain_s == 31 * DAY  # [outcomes] window_s, the longest, + a day


def test_archives_are_compressed_and_the_oldest_beyond_the_limit_removed(tmp_path: Path) -> None:
    """After each compaction the engine gzips its archives and keeps the newest
    ``journal_archives_keep``; a crash between the compressed copy's rename and the original's
    removal leaves both, and the next pass removes the original (history shows each record
    once throughout). A link that is the live log itself is never compressed or removed."""
    path = tmp_path / LOG
    log = AuditLog(path)
    for round_ in range(4):
        for i in range(3):
            log.append("decision", 1000.0 * round_ + i, finding_id=f"r{round_}-{i}", verdict="x")
        compact_file(path, path.stat().st_size, horizon=1e9, now=5000.0 - round_)  # clock back
    names = [a.name for a in archives(path)]
    assert len(names) == 4 and names == sorted(names)  # in the order made, though time ran back
    whole = [r["finding_id"] for r in history(path) if r["event"] != "compacted"]
    assert whole == [f"r{r}-{i}" for r in range(4) for i in range(3)]
    assert tidy(path, keep=0) == []
    assert all(a.name.endswith("Z.gz") for a in archives(path))
    assert [r["finding_id"] for r in history(path) if r["event"] != "compacted"] == whole
    # a crash after the compressed copy was renamed: the original is back beside it
    first = archives(path)[0]
    import gzip

    first.with_name(first.name.removesuffix(".gz")).write_bytes(gzip.decompress(first.read_bytes()))
    assert len(archives(path)) == 4  # the compressed one hides it
    # a compaction cut after its link: that name is the live log, and stays untouched
    stray = path.with_name(f"{LOG}.29990101T000000.000Z")
    os.link(path, stray)
    removed = tidy(path, keep=2)
    assert [p.name for p in removed] == [f"{n}.gz" for n in names[:2]]
    assert len(archives(path)) == 2 + 1  # and the stray link
    assert stray.exists() and os.stat(stray).st_ino == os.stat(path).st_ino
    assert not first.with_name(first.name.removesuffix(".gz")).exists()


# -- an attacker's review of the first version (each of these failed on it) -----------------


def _write(log: AuditLog, event: str, t: float, **record: Any) -> None:
    log.append(event, t, **record)


def _noise(log: AuditLog, node: str, t0: float, n: int) -> None:
    for i in range(n):
        fid = f"noise-{node}-{t0}-{i}"
        _write(log, "finding", t0 + i, finding_id=fid, kind="link_flap", subject={"node": node})
        _write(log, "decision", t0 + i, finding_id=fid, verdict="act", policy="host-warning",
               node=node, plan=[{"action_id": f"{fid}-n", "action": "notify"}])  # fmt: skip
        _write(log, "action", t0 + i, action_id=f"{fid}-n", action="notify", finding_id=fid,
               node=node, outcome="ok")  # fmt: skip


def _drain(log: AuditLog, fid: str, node: str, t: float, outcome: str = "ok") -> None:
    plan = [
        {"action_id": f"{fid}-d", "action": "drain"},
        {"action_id": f"{fid}-r", "action": "requeue"},
    ]
    _write(log, "decision", t, finding_id=fid, verdict="act", policy="fatal-gpu-event",
           node=node, plan=plan)  # fmt: skip
    _write(log, "action", t, action_id=f"{fid}-d", action="drain", finding_id=fid, node=node,
           outcome=outcome)  # fmt: skip
    if outcome == "ok":
        _write(log, "action", t, action_id=f"{fid}-r", action="requeue", finding_id=fid,
               node=node, outcome="ok")  # fmt: skip


def test_old_finished_plans_go_a_failed_drain_and_a_drained_node_included(tmp_path: Path) -> None:
    """A plan whose drain failed is finished (replay's rule: the ladder stops there), so its
    node's noise goes; a node drained and returned ten times keeps only its last return and
    that plan. Before: the failed drain kept 1,004 records of its node for good, and every
    drain and return a node ever had was kept (7,000 of 7,000 records)."""
    path = tmp_path / LOG
    log = AuditLog(path)
    _drain(log, "failed", "gpu07", 10.0, outcome="failed")
    _noise(log, "gpu07", 100.0, 50)
    for r in range(10):
        for n in range(5):
            node = f"gpu{n:02d}"
            _drain(log, f"d{r}-{n}", node, 1000.0 + r * 100 + n)
            _write(log, "action", 1050.0 + r * 100 + n, action_id=f"u{r}-{n}", action="uncordon",
                   finding_id=f"u{r}-{n}", node=node, outcome="ok")  # fmt: skip
    whole = replay(path)
    assert whole.unfinished == [] and whole.taken_out == set()
    done = compact_file(path, path.stat().st_size, horizon=1e6, now=2e6)
    left = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert done.kept == len(left) == 5  # each node's last return: the state it is in
    assert {r["node"] for r in left} == {f"gpu{n:02d}" for n in range(5)}
    assert replay(path).taken_out == set() and replay(path).unfinished == []


def test_a_node_still_out_stays_out_and_its_drain_is_not_redone(tmp_path: Path) -> None:
    path = tmp_path / LOG
    log = AuditLog(path)
    _drain(log, "old", "gpu03", 10.0)
    _noise(log, "gpu03", 100.0, 20)
    compact_file(path, path.stat().st_size, horizon=1e6, now=2e6)
    memory = replay(path)
    assert memory.taken_out == {"gpu03"} and memory.unfinished == []
    assert {"old-d", "old-r"} <= memory.done_actions


def test_apply_on_a_compacted_journal_does_not_act_on_what_it_forgot(tmp_path: Path) -> None:
    """``remediate apply`` keeps every id (no freshness check): on a compacted journal a
    finding older than the compaction may have been decided, so it is not acted on. Before:
    a finding that was a duplicate on the whole log was acted on again on the compacted one
    (the review's case: an XID decided in a cooldown, notify only)."""
    clock = HandClock()
    engine = engine_at(tmp_path, clock, compact_bytes=1)
    old = finding(clock, "link_flap", "gpu04", Severity.WARNING)  # notified, then forgotten
    assert engine.submit(old).verdict == "act"
    assert engine.wait(10)
    clock.advance(40 * DAY)
    engine.tick()
    assert engine.wait_compaction(30) and archives(tmp_path / LOG)
    engine.close()
    again = engine_at(tmp_path, clock, seen_retention_s=0.0)  # apply: keeps every id
    assert old.id not in again.memory.seen_findings  # forgotten by the compaction
    d = again.submit(old)
    assert d.verdict == "duplicate" and "compacted" in d.why
    assert again.submit(finding(clock, "gpu_xid", "gpu04", Severity.CRITICAL)).verdict == "act"


def test_a_folder_fsync_that_fails_after_the_swap_still_moves_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the compacted log is in place the swap must not fail: before, an EIO from the
    folder's fsync left the outcome reader's offset past the end of the new, shorter file."""
    import gpuwarden.remediation.compact as compact

    clock = HandClock()
    engine = engine_at(tmp_path, clock, compact_bytes=1)
    for _ in range(20):
        engine.submit(finding(clock, "link_flap", "gpu01", Severity.WARNING))
        clock.advance(DAY)
    assert engine.wait(10)

    def eio(folder: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(compact, "fsync_dir", eio)
    clock.advance(40 * DAY)
    engine.tick()
    assert engine.wait_compaction(30) and archives(tmp_path / LOG)
    assert engine.outcomes.offset == (tmp_path / LOG).stat().st_size


def test_history_shows_records_written_during_a_compaction_once(tmp_path: Path) -> None:
    """Records appended between the choice and the swap are in the archive and copied into
    the new live log; ``--all`` shows them once (before: twice)."""
    path = tmp_path / LOG
    log = AuditLog(path)
    for i in range(5):
        _write(log, "decision", 10.0 + i, finding_id=f"f{i}", verdict="no_policy")
    chosen = choose(path, path.stat().st_size, horizon=1e6)
    _write(log, "expired", 20.0, finding_id="late", verdict="approval")
    swap(path, chosen, now=2e6)
    _write(log, "decision", 30.0, finding_id="after", verdict="no_policy")
    ids = [r.get("finding_id") for r in history(path) if r["event"] != "compacted"]
    assert ids == [*(f"f{i}" for i in range(5)), "late", "after"]


def test_only_archives_are_archives_and_a_symlinked_log_is_compacted_where_it_lies(
    tmp_path: Path,
) -> None:
    """A logrotate ``.1.gz`` beside the log is not an archive (before: ``--all`` crashed on
    it); an ``audit_log`` that is a symlink is compacted beside its file, the link left as it
    is, and the file keeps its mode (before: the link was replaced by a file in its folder,
    and a log shipper's 0644 became 0640)."""
    real = tmp_path / "disk" / LOG
    real.parent.mkdir()
    link = tmp_path / "etc" / LOG
    link.parent.mkdir()
    link.symlink_to(real)
    clock = HandClock()
    engine = engine_at(link.parent, clock, compact_bytes=1)
    for _ in range(10):
        engine.submit(finding(clock, "link_flap", "gpu01", Severity.WARNING))
        clock.advance(DAY)
    assert engine.wait(10)
    real.chmod(0o644)
    (real.parent / f"{LOG}.1.gz").write_bytes(b"\x1f\x8b not ours")
    clock.advance(40 * DAY)
    engine.tick()
    assert engine.wait_compaction(30)
    assert link.is_symlink() and link.resolve() == real
    assert len(archives(real)) == 1 and archives(link) == []
    assert real.stat().st_mode & 0o777 == 0o644
    engine.submit(finding(clock, "link_flap", "gpu02", Severity.WARNING))
    assert "gpu02" in real.read_text()
    assert [r for r in history(real) if r.get("event") == "finding"]


def test_a_log_written_by_someone_else_meanwhile_is_not_swapped(tmp_path: Path) -> None:
    """A standby that took the lease while this engine chose may have appended: the swap is
    refused (the live log stays whole) instead of dropping its records from the live log."""
    path = tmp_path / LOG
    log = AuditLog(path)
    for i in range(5):
        _write(log, "decision", 10.0 + i, finding_id=f"f{i}", verdict="no_policy")
    chosen = choose(path, path.stat().st_size, horizon=1e6)
    standby = AuditLog(path)

    def fence() -> None:
        standby.append("intent", 20.0, action_id="x", action="drain", node="gpu05")

    before = path.read_bytes()
    with pytest.raises(OSError, match="changed"):
        swap(path, chosen, now=2e6, check=fence)
    assert path.read_bytes().startswith(before) and archives(path) == []
    assert replay(path).intents.keys() == {"x"}


def test_a_restart_remembers_how_large_the_log_was_after_its_compaction(tmp_path: Path) -> None:
    """Before, a restart forgot it, so a log whose kept part alone was past the limit was
    compacted (and archived whole) again at every start."""
    from gpuwarden.remediation.compact import compacted_size

    path = tmp_path / LOG
    log = AuditLog(path)
    for i in range(5):
        _write(log, "decision", 10.0 + i, finding_id=f"f{i}", verdict="no_policy")
    done = compact_file(path, path.stat().st_size, horizon=0.0, now=2e6)
    assert compacted_size(path) == done.size - len(path.read_bytes().splitlines(True)[0])
    assert compacted_size(tmp_path / "none") == 0


def test_a_compaction_made_while_the_clock_ran_ahead_refuses_nothing_new(tmp_path: Path) -> None:
    """A compaction's horizon from a clock a year ahead is not believed after a restart (it
    is held to what this clock allows), so a fresh XID is acted on. Before (a second review):
    every finding was a duplicate until real time caught up with that horizon."""
    clock = HandClock()
    log = AuditLog(tmp_path / LOG)
    ahead = clock.wall() + 365 * DAY
    log.append("compacted", ahead, horizon_t=ahead - 31 * DAY, kept=0, tail=0)
    engine = engine_at(tmp_path, clock, seen_retention_s=0.0)  # apply's engine
    d = engine.submit(finding(clock, "gpu_xid", "gpu04", Severity.CRITICAL, xid=79))
    assert d.verdict == "act", d.why


def test_the_audit_trail_of_a_symlinked_log_shows_its_archives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``remediate audit --all --log <link>``: the archives lie beside the file the link
    points to. Before (a second review): only the live log was shown."""
    from gpuwarden.remediation.cli import main as remediate

    real = tmp_path / "disk" / LOG
    real.parent.mkdir()
    link = tmp_path / LOG
    link.symlink_to(real)
    log = AuditLog(real)
    log.append("decision", 10.0, finding_id="old", verdict="x")
    compact_file(real, real.stat().st_size, horizon=1e9, now=2e6)
    log.append("decision", 20.0, finding_id="new", verdict="x")
    assert remediate(["audit", "--log", str(link), "--all", "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["finding_id"] for r in shown if r["event"] == "decision"] == ["old", "new"]


def test_a_removal_that_found_the_node_out_is_not_a_nodes_last_move(tmp_path: Path) -> None:
    """Found in review: gpuwarden drained n1; weeks later a removal found n1 out by someone
    else (``already_out``); compaction kept only that record as n1's last move, and after a
    restart n1 was no longer gpuwarden's (its return, undo and lemon history gone)."""
    path = tmp_path / LOG
    log = AuditLog(path)
    plans: list[tuple[str, float, dict[str, str]]] = [
        ("f1", 1000.0, {}),
        ("f2", 1000.0 + 40 * 86400, {"already_out": "admin: x"}),
    ]
    for fid, t, details in plans:
        a = {"action_id": f"a-{fid}", "action": "drain"}
        log.append("decision", t, finding_id=fid, verdict="act", node="n1", policy="p", plan=[a])
        log.append("intent", t, action_id=a["action_id"], action="drain", node="n1",
                   finding_id=fid)  # fmt: skip
        log.append("action", t, action_id=a["action_id"], action="drain", node="n1",
                   finding_id=fid, outcome="ok", details=details)  # fmt: skip
    assert replay(path).taken_out == {"n1"}
    compact_file(path, path.stat().st_size, horizon=1000.0 + 50 * 86400, now=1000.0 + 51 * 86400)
    assert replay(path).taken_out == {"n1"}


def test_a_waiting_plans_notification_is_kept_with_it(tmp_path: Path) -> None:
    """Found by a review (2026-11-28): a waiting plan's records are kept by its finding id,
    but the notification that told people of it is an action of ``<finding id>:<verdict>``,
    which a compaction dropped; a restart after it then told them again (resume() sends the
    notification of a waiting plan that no record shows)."""
    path = tmp_path / LOG
    log = AuditLog(path)
    fid = "f" * 24
    _write(log, "decision", 10.0, finding_id=fid, verdict="blast_radius", policy="fatal-xid",
           node="gpu03", plan=[{"action_id": "d", "action": "drain"}])  # fmt: skip
    _write(log, "action", 10.0, action_id="page", action="notify", finding_id=f"{fid}:blast_radius",
           node="gpu03", outcome="ok")  # fmt: skip
    _noise(log, "gpu03", 100.0, 5)
    compact_file(path, path.stat().st_size, horizon=1e6, now=2e6)
    memory = replay(path)
    assert [p.decision["finding_id"] for p in memory.waiting] == [fid]
    assert "page" in memory.recorded
