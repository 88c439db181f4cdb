"""Limits everywhere (issue 38, point 5; docs/SECURITY.md, known holes 1, 2 and 4): what one
sender, or one key, can hold of the engine.

Each test drives the real ``gpuwarden remediate serve`` (:class:`IdentityEngine`: identities
on, live against the Kubernetes fake) and asserts what an attacker's requests did not get,
then that a legitimate finding posted meanwhile was acted on. Every finding is CONSTRUCTED.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.remediation_util import poll
from tests.security.identity_engine import IdentityEngine, xid

CAP, DEADLINE_S = 6, 8.0
TRICKLE_S = 40.0  # how long a slow client keeps trickling if nobody cuts it off (5x DEADLINE_S)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[IdentityEngine]:
    e = IdentityEngine(
        tmp_path,
        engine_keys=(
            f"max_connections = {CAP}\nmax_connections_per_peer = {CAP}\n"
            f"request_deadline_s = {DEADLINE_S}\n"
            'quota_agent_per_min = 10.0\napproval = ["drain"]\n'
        ),
        guard_keys="max_pending_per_node = 2\n",
    )
    try:
        yield e
    finally:
        e.close()


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def finding_ids(engine: IdentityEngine, node: str) -> list[str]:
    return [r["finding_id"] for r in engine.records("finding") if r["subject"]["node"] == node]


def test_slow_clients_hold_neither_threads_nor_the_door(engine: IdentityEngine) -> None:
    """``CAP`` clients each trickle a request a byte every 0.5 s (inside every per-read
    timeout): before, each held a thread for as long as it trickled, and there was no cap, so
    N such clients held N threads. Now one more client is turned away with 503 at once, the
    slow ones are cut at the request deadline, and the engine's threads stay bounded."""
    assert engine.proc is not None
    pid = engine.proc.pid
    # the engine's threads once idle: the connections of its start-up health checks are served
    # by threads that end a moment after their client closes, and a baseline read while one
    # still ran made the wait below for every slow client's thread never end (CI, twice)
    reads = [threads_of(pid)]
    while len(reads) < 4 or len(set(reads[-4:])) > 1:
        time.sleep(0.25)
        reads.append(threads_of(pid))
    baseline = reads[-1]
    cut: list[float] = []
    started = time.monotonic()
    peak = [0]

    def trickle() -> None:
        s = socket.create_connection(("127.0.0.1", engine.port), timeout=5)
        try:
            s.sendall(b"POST /v1/findings HTTP/1.1\r\nHost: x\r\n")
            while time.monotonic() - started < TRICKLE_S:
                s.sendall(b"X")
                time.sleep(0.5)
        except OSError:  # the engine shut the connection: the deadline
            cut.append(time.monotonic() - started)
        finally:
            s.close()

    slow = [threading.Thread(target=trickle) for _ in range(CAP)]
    for t in slow:
        t.start()

    # one more connection while the slow ones hold every place: turned away at once, not
    # queued (before: served, by one more thread)
    def turned_away() -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            return resp.status == 503 and resp.getheader("Retry-After") == "1"
        finally:
            conn.close()

    # every slow client holds a place (a thread each) before the one more knocks: on a loaded
    # machine the knock could otherwise come before the places are taken, and the slow ones
    # be cut at their deadline before it came again
    poll(
        lambda: threads_of(pid) >= baseline + CAP or not any(t.is_alive() for t in slow),
        TRICKLE_S,
        "the slow clients to be served",
    )
    poll(lambda: turned_away() or not any(t.is_alive() for t in slow), TRICKLE_S + 30,
         "a connection over the cap")  # fmt: skip
    assert any(t.is_alive() for t in slow), "no connection was turned away over the cap"
    while any(t.is_alive() for t in slow):
        peak[0] = max(peak[0], threads_of(engine.proc.pid))
        time.sleep(0.2)
    assert len(cut) == CAP, f"{CAP - len(cut)} slow clients trickled for {TRICKLE_S} s uncut"
    assert peak[0] <= baseline + CAP
    # and the engine serves: node-002's own agent reports a fatal XID, a plan waits approval
    status, reply = engine.post("node-002", "/v1/findings", xid("node-002"))
    assert status == 202 and reply["results"][0]["verdict"] == "approval", reply


def test_one_agent_key_gets_its_quota_and_no_more(engine: IdentityEngine) -> None:
    """node-001's key sends 14 distinct critical findings about its own node (before: every
    one was decided; hole 1). Its quota is 10 a minute: the rest get 429 with Retry-After and
    are not recorded. node-002's finding, sent meanwhile, is decided."""
    answers = []
    for gpu in range(14):
        body = json.dumps(xid("node-001", str(gpu))).encode()
        headers = engine.signed("node-001", "POST", "/v1/findings", body)
        conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=30)
        conn.request("POST", "/v1/findings", body=body, headers=headers)
        resp = conn.getresponse()
        answers.append((resp.status, resp.getheader("Retry-After")))
        resp.read()
        conn.close()
    # the first two plans wait for approval, the next eight find no room (503: not queued,
    # but within the quota they were received); past the quota, 429 before anything is read
    assert [s for s, _ in answers] == [202] * 2 + [503] * 8 + [429] * 4
    assert all(after is not None and int(after) >= 1 for s, after in answers if s == 429)
    assert len(finding_ids(engine, "node-001")) == 10
    status, _ = engine.post("node-002", "/v1/findings", xid("node-002"))
    assert status == 202 and len(finding_ids(engine, "node-002")) == 1


def test_refused_requests_spend_the_senders_quota(engine: IdentityEngine) -> None:
    """Found in review: requests an agent signed that the engine refused after checking the
    signature (403 on an operator's route, 404, a malformed finding) spent no quota, and each
    wrote and fsynced a signature record: 3,000 in 2 s. Each now costs a finding's worth of
    its quota (10 a minute here); past it, 429 before anything is read or recorded."""
    signatures = Path(f"{engine.audit}.signatures")
    before = len(signatures.read_text().splitlines()) if signatures.exists() else 0
    statuses = []
    for i in range(14):
        path = "/v1/undo/node-001" if i % 2 else "/v1/nothing-here"
        body = json.dumps({"n": i}).encode()
        statuses.append(engine.send("POST", path, body,
                                    engine.signed("node-001", "POST", path, body))[0])  # fmt: skip
    assert sorted(set(statuses[:10])) == [403, 404] and statuses[10:] == [429] * 4
    assert len(signatures.read_text().splitlines()) - before == 10
    status, _ = engine.post("node-001", "/v1/findings", xid("node-001"))
    assert status == 429  # the same bucket: its findings wait too


def test_plans_about_one_node_hold_a_bounded_share_of_the_queue(engine: IdentityEngine) -> None:
    """Five fatal XIDs about node-001, each a plan that waits for an operator
    (``approval = ["drain"]``): before, five plans waited (and each told a person); with
    ``max_pending_per_node = 2``, two wait and three are not queued: recorded ``queue_full``
    and answered 503 with Retry-After (not delivered: the sender tries again, and the same
    finding sent again is decided again, not a duplicate)."""
    sent = [xid("node-001", str(gpu)) for gpu in range(5)]
    answers = [engine.post("node-001", "/v1/findings", f) for f in sent]
    assert [status for status, _ in answers] == [202, 202, 503, 503, 503], answers
    assert answers[2][1]["results"][0]["verdict"] == "queue_full"
    status, listing = engine.send("GET", "/v1/pending", b"", engine.signed("alice", "GET",
                                  "/v1/pending", b""))  # fmt: skip
    assert status == 200
    assert [p["node"] for p in listing["pending"]] == ["node-001", "node-001"]
    status, again = engine.post("node-001", "/v1/findings", sent[2])
    assert status == 503 and again["results"][0]["verdict"] == "queue_full"  # decided again
    verdicts = [r["verdict"] for r in engine.records("decision") if r["node"] == "node-001"]
    assert sorted(verdicts) == ["approval"] * 2 + ["queue_full"] * 4
    status, reply = engine.post("node-002", "/v1/findings", xid("node-002"))
    assert status == 202 and reply["results"][0]["verdict"] == "approval"


def test_a_request_larger_than_the_quota_is_refused_for_good(engine: IdentityEngine) -> None:
    """11 findings in one request against a quota of 10 a minute could never fit: 422 (not a
    429 retried until the findings go stale)."""
    batch = [xid("node-001", str(gpu)) for gpu in range(11)]
    status, reply = engine.post("node-001", "/v1/findings", batch)
    assert status == 422 and "send at most 10 at once" in reply["error"]


def test_an_agent_cannot_send_the_analyze_services_kinds(engine: IdentityEngine) -> None:
    """node-001's agent sends a checkpoint advice for a job (hole 2): before, it was accepted
    (the engine wrote the job's checkpoint-interval file and held a worker for it)."""
    advice = {
        "kind": "checkpoint_advice",
        "subject": {"cluster": "c", "node": "node-001", "job": "1234"},
        "severity": "info",
        "time_ns": time.time_ns(),
        "evidence": {"interval_s": 1.0},
        "summary": "checkpoint every second (CONSTRUCTED)",
        "source": "agent",
    }
    status, reply = engine.post("node-001", "/v1/findings", advice)
    assert status == 403 and "analyze service's kind" in reply["error"], reply
    assert finding_ids(engine, "node-001") == []


def test_one_peer_holds_a_quarter_of_the_places_and_the_others_are_served(
    tmp_path: Path,
) -> None:
    """One host (an IP address) that opens connections and trickles holds at most
    ``max_connections_per_peer`` of the engine's places (default: a quarter), and is turned
    away with 503 past it, while another host is served. Before: one address could hold every
    place, and every other sender got 503 until its deadline cut it."""
    cap = 8
    # the held connections must outlive the poll: with the short DEADLINE_S a loaded machine
    # let the deadline cut them before a knock came back 503 (2 fails in 7 beside a
    # benchmark). The poll ends at the first 503, so the long deadline costs nothing.
    held_s = 120.0
    engine = IdentityEngine(tmp_path, engine_keys=f"max_connections = {cap}\n"
                            f"request_deadline_s = {held_s}\n")  # fmt: skip
    held: list[socket.socket] = []
    try:

        def knock(source: str) -> int:
            conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=10,
                                              source_address=(source, 0))  # fmt: skip
            try:
                conn.request("GET", "/healthz")
                return conn.getresponse().status
            except OSError:
                return 0
            finally:
                conn.close()

        def hold() -> bool:
            """The trickling host takes every place it is given (a quarter: 2); held again
            when a knock was let in (the server drops a connection silent for 10 s on one
            read, its handler's timeout: a knock slower than that found none held, and the
            poll then waited in vain, 1 run in about 6 on a loaded machine)."""
            for s in held:
                s.close()
            held.clear()
            for _ in range(cap // 4):
                s = socket.create_connection(("127.0.0.1", engine.port), timeout=5,
                                             source_address=("127.0.0.1", 0))  # fmt: skip
                s.sendall(b"POST /v1/findings HTTP/1.1\r\nHost: x\r\n")
                held.append(s)
            return False  # (not turned away yet)

        hold()
        assert engine.proc is not None
        poll(lambda: knock("127.0.0.1") == 503 or hold(), held_s / 2,
             "the trickling host turned away")  # fmt: skip
        # another host is served meanwhile: node-002's agent, from 127.0.0.2
        body = json.dumps(xid("node-002")).encode()
        headers = engine.signed("node-002", "POST", "/v1/findings", body)
        conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=10,
                                          source_address=("127.0.0.2", 0))  # fmt: skip
        conn.request("POST", "/v1/findings", body=body, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 202, resp.read()
        conn.close()
        assert finding_ids(engine, "node-002")
    finally:
        for s in held:
            s.close()
        engine.close()
