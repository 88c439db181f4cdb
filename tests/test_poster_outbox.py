"""Found by a review of what a crash loses (2026-11-28): a fatal XID's fast-path finding lived
only in the poster's memory, retried for up to an hour while the engine was down or failing
over; nothing on the slow path drains a node for an XID, so an agent killed or restarted
meanwhile lost the drain for good. Now a critical finding is on disk (the outbox) before it is
queued, and the next poster on the folder posts it again. Findings are CONSTRUCTED; the
posters and their HTTP are real.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.poster import FindingPoster, Outbox
from gpuwarden.core.retry import Backoff
from tests.remediation_util import poll
from tests.scripted_server import Reply, ScriptedServer

FAST = Backoff(base_s=0.01, max_s=0.05)


def _finding(kind: str, severity: Severity, gpu: int = 0) -> Finding:
    return Finding(kind=kind, subject={"cluster": "c", "node": "node-001", "gpu": str(gpu)},
                   severity=severity, time_ns=time.time_ns(),
                   summary=f"{kind} (CONSTRUCTED)", source="agent")  # fmt: skip


def _kept(folder: Path) -> list[str]:
    """The findings an outbox folder holds (its lock file aside)."""
    return sorted(p.name for p in folder.glob("*.json"))


def _refused_url() -> str:
    """An engine that is down: a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/findings"


def test_a_critical_finding_the_engine_never_got_is_posted_by_the_next_start(
    tmp_path: Path,
) -> None:
    outbox = tmp_path / "spool/findings"
    dead = FindingPoster(_refused_url(), retry=FAST, outbox=str(outbox))
    xid = _finding("gpu_xid", Severity.CRITICAL)
    dead.post(xid)
    dead.post(_finding("ecc_warning", Severity.WARNING))  # a warning: memory only
    poll(lambda: dead.retries >= 2, 30, "the XID retried against the dead engine")
    assert len(_kept(outbox)) == 1  # on disk while it waits
    dead._closing.set()  # the process dies here (SIGKILL: no close, nothing more runs) ...
    assert dead.outbox is not None
    os.close(dead.outbox._lock_fd)  # ... and the kernel lets go of its lock

    with ScriptedServer([], default=Reply(202)) as engine:
        again = FindingPoster(f"{engine.url}/v1/findings", retry=FAST, outbox=str(outbox))
        poll(lambda: again.posted == 1, 30, "the XID posted by the next start")
        again.close(timeout_s=5)
        (body,) = [json.loads(b) for b in engine.bodies()]
    assert body == xid.to_json()  # word for word: the engine takes it once (its id)
    assert _kept(outbox) == []  # delivered: out of the outbox


def test_a_stopping_agent_keeps_what_it_could_not_deliver_and_refusals_leave(
    tmp_path: Path,
) -> None:
    outbox = tmp_path / "findings"
    poster = FindingPoster(_refused_url(), retry=FAST, outbox=str(outbox))
    poster.post(_finding("gpu_xid", Severity.CRITICAL))
    poster.close(timeout_s=0.2)  # systemctl restart while the engine is away
    assert len(_kept(outbox)) == 1
    with ScriptedServer([], default=Reply(400, '{"error": "no"}')) as engine:
        refused = FindingPoster(f"{engine.url}/v1/findings", retry=FAST, outbox=str(outbox))
        poll(lambda: refused.failed == 1, 30, "the engine's refusal")
        refused.close(timeout_s=5)
    assert _kept(outbox) == []  # refused for good: not posted again at every start


def test_an_outbox_file_that_is_not_its_finding_is_removed_not_posted(tmp_path: Path) -> None:
    """The folder is the agent's own; still, a torn or edited file is not a finding to act on."""
    outbox = Outbox(tmp_path / "findings")
    xid = _finding("gpu_xid", Severity.CRITICAL)
    outbox.keep(xid)
    outbox.close()
    other = _finding("gpu_xid", Severity.CRITICAL, gpu=5)
    (tmp_path / "findings" / Outbox.name(other)).write_text(json.dumps(xid.to_json()))
    (tmp_path / "findings" / ("0" * 32 + ".json")).write_text("{not json")
    assert [f.id for f in Outbox(tmp_path / "findings").left()] == [xid.id]
    assert _kept(tmp_path / "findings") == [Outbox.name(xid)]


def test_after_a_restart_the_other_paths_copy_is_a_conflict_not_a_failure(
    tmp_path: Path,
) -> None:
    """The same review: NVML events and the kernel log report one XID under one id. The
    events' copy was delivered before a restart; the kernel record is read again after it, and
    its copy gets a 409 (other content). Before: counted failed (the
    GpuwardenAgentCannotReachEngine alert on a restart). Its finding predates this poster."""
    conflict = json.dumps({"results": [{"verdict": "duplicate", "same_content": False}]})
    earlier = _finding("gpu_xid", Severity.CRITICAL)
    time.sleep(0.01)
    with ScriptedServer([Reply(409, conflict), Reply(409, conflict)]) as srv:
        # the agent's poster (its outbox): other posters (the node check's, analytics') make
        # findings before they start a poster, and a conflict there is a conflict
        poster = FindingPoster(f"{srv.url}/v1/findings", retry=FAST, outbox=str(tmp_path / "o"))
        poster.post(earlier)
        poster.post(_finding("gpu_xid", Severity.CRITICAL, gpu=3))  # new since the start
        poster.close(timeout_s=30)
    assert (poster.posted, poster.failed, poster.conflicts) == (0, 1, 2)


def test_one_agent_per_outbox_and_a_finding_json_cannot_hold_stays_in_memory(
    tmp_path: Path,
) -> None:
    """Found by the review of the outbox: a second agent on the same configuration (run by
    hand) posted the first one's kept findings and removed their files; evidence JSON cannot
    hold (a set) raised out of post() into the caller."""
    folder = tmp_path / "findings"
    first = Outbox(folder)
    with pytest.raises(OSError, match="another running agent"):
        Outbox(folder)
    second = FindingPoster(_refused_url(), retry=FAST, outbox=str(folder))
    assert second.outbox is None  # memory only, said in the log
    odd = Finding(kind="gpu_xid", subject={"cluster": "c", "node": "node-001"},
                  severity=Severity.CRITICAL, time_ns=time.time_ns(),
                  evidence={"gpus": {1, 2}}, source="agent")  # fmt: skip
    first.keep(odd)  # logged, not raised
    assert _kept(folder) == []
    second.close(timeout_s=0.1)
