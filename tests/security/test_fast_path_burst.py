"""Found in a fifth review (2026-11-28, a helper reviewing as an attacker): a job could hold its
node's fatal XID behind a burst of its own making. The job let the OOM killer take its
children, each named anew (``prctl(PR_SET_NAME)``): each name opened an OOM episode and a
fast-path finding, all 2,000 under one id (a finding's id is its kind, subject, severity and
time bucket), queued one after the other, each charged to the node's quota of 60 a minute at
the engine; once 429s came the poster retried the first for up to an hour, and the XID 79
behind them waited (or was dropped, the queue full at 10,000). Kernel records and findings are
CONSTRUCTED; the agent, its poster and the HTTP are real.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.poster import FindingPoster
from gpuwarden.core.retry import Backoff
from tests.remediation_util import poll
from tests.scripted_server import Reply, ScriptedServer
from tests.security.test_agent_kmsg import XID79, run_agent


def _finding(kind: str, severity: Severity, n: int = 0) -> Finding:
    return Finding(kind=kind, subject={"cluster": "c", "node": "node-001", "gpu": str(n)},
                   severity=severity, time_ns=time.time_ns(),
                   summary=f"{kind} (CONSTRUCTED)", source="agent")  # fmt: skip


class QuotaSpent:
    """An engine that answers 429 to every warning (its quota spent on them), 202 otherwise;
    it keeps the kinds it took."""

    def __init__(self) -> None:
        self.took: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = 429 if body["severity"] == "warning" else 202
                if status == 202:
                    outer.took.append(body["kind"])
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/findings"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_a_critical_finding_is_not_held_behind_warnings_the_engine_will_not_take() -> None:
    engine = QuotaSpent()
    poster = FindingPoster(engine.url, retry=Backoff(base_s=0.05, max_s=0.2), max_age_s=3600)
    try:
        for n in range(20):  # warnings of distinct ids, the first already being retried
            poster.post(_finding("oom_kill", Severity.WARNING, n))
        poll(lambda: poster.retries >= 2, 30, "the first warning retried")
        poster.post(_finding("gpu_xid", Severity.CRITICAL))
        poll(lambda: engine.took == ["gpu_xid"], 30, "the XID delivered between the retries")
    finally:
        poster.close(timeout_s=0.5)
        engine.httpd.shutdown()


def test_the_same_finding_queued_or_sent_is_not_queued_again() -> None:
    """Word for word the same (id and content): sent once. Two findings under one id that say
    different things are both sent (two XIDs on GPUs the agent could not map to an index share
    the node's id: the engine, not the agent, decides what the second is)."""
    with ScriptedServer([], default=Reply(202)) as srv:
        poster = FindingPoster(f"{srv.url}/v1/findings", retry=Backoff(base_s=0.01, max_s=0.05))
        one = _finding("oom_kill", Severity.WARNING)
        other = Finding.from_json(one.to_json() | {"summary": "another process (CONSTRUCTED)"})
        assert other.id == one.id and other.digest != one.digest
        for _ in range(2000):
            poster.post(one)
        poster.post(other)
        poster.close(timeout_s=30)
        assert (len(srv.requests), poster.posted, poster.merged) == (2, 2, 1999)


def test_a_job_naming_each_oom_victim_anew_raises_one_finding(tmp_path: Path) -> None:
    """The agent reads 2,000 memory-cgroup OOM kills, each of a process named anew, then a
    fatal XID: one oom_kill finding (one episode per node) and the XID are posted."""
    records = [
        f"4,{i},{1000 + i},-;Memory cgroup out of memory: Killed process {5000 + i} "
        f"(w{i:06d}) total-vm:1kB"
        for i in range(2000)
    ]
    records.append(f"3,9999,99999,-;{XID79}")
    log = tmp_path / "kmsg.log"
    log.write_text("\n".join(records) + "\n")
    with ScriptedServer([], default=Reply(202)) as engine:
        out, posted = run_agent(tmp_path, str(log), engine)
    assert sorted(f["kind"] for f in posted) == ["gpu_xid", "oom_kill"]
    # every kill is still recorded as an os_event point
    assert sum(line.startswith("os_event") for line in out.splitlines()) == 2000


def test_a_409_for_an_id_this_agent_delivered_is_not_a_failure() -> None:
    """Found by a review of the merging (2026-11-28): a fatal XID is reported by the NVML
    events and by the kernel log, two findings under one id that say different things; the
    engine answers the second 409 (not the same content), which counted as failed and raised
    GpuwardenAgentCannotReachEngine on every fatal XID. The engine holds the first: a
    conflict, logged, not a failure."""
    conflict = json.dumps({"results": [{"verdict": "duplicate", "same_content": False}]})
    with ScriptedServer([Reply(202), Reply(409, conflict), Reply(409, conflict)]) as srv:
        poster = FindingPoster(f"{srv.url}/v1/findings", retry=Backoff(base_s=0.01, max_s=0.05))
        events = _finding("gpu_xid", Severity.CRITICAL)
        kmsg = Finding.from_json(events.to_json() | {"summary": "from the kernel log"})
        poster.post(events)
        poster.post(kmsg)
        stranger = _finding("gpu_xid", Severity.CRITICAL, n=3)  # an id it never delivered
        poster.post(stranger)
        poster.close(timeout_s=30)
    assert (poster.posted, poster.failed, poster.conflicts) == (1, 1, 2)
