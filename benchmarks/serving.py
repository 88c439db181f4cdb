"""An XID storm against the engine, and 64 reporters against one relay, on loopback only.

* **Engine**: ``gpuwarden remediate serve`` (the production command, a process of its own) with
  identities and signatures required (each simulated agent is ``agents/node-<i>``, signing with
  its own key, derived from the family's master key) and dry-run adapters (Kubernetes, against
  the testbed's fake API with one node per agent). 1,000 simulated agents each post a burst of
  critical findings (an XID 79, then the lost GPU, then an uncorrectable ECC error: what one
  failing GPU raises) at a moment drawn within 10 s, each signed as the agent's fast path signs
  it; a post that cannot connect or gets 5xx/429 is tried again as the fast path does (backoff),
  for at most 60 s. Afterwards the audit log is read: a finding the engine never recorded is
  **lost**. The blast-radius guard must stay exact: exactly ``max_nodes_out`` nodes would get
  a drain (a dry run: the engine records the drain it would run), however many fail at once.
* **Relay**: the agent's reporter relay (production code) with 64 job-side clients each
  posting 100 batches of 10 ``job_step`` lines, as fast as answered; a 5xx or 429 (the
  relay's "retry") is sent again after the reporter's own backoff, as the reporter does.

Latency is per request, from sending to the answer (the successful try). The loops are
bounded (a fixed number of requests, a 60 s retry budget) and every address is 127.0.0.1.

    uv run python -m benchmarks.serving [--agents 1000] [--burst 3] [--window-s 10]

Last lines: ``findings_p99_s=<x>`` then ``findings_lost=<n>`` (targets: <= 2 s and 0).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpuwarden.collector.jobside.reporter import RETRY as REPORTER_RETRY
from gpuwarden.collector.relay import ReporterRelay
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.retry import Backoff
from gpuwarden.core.signing import agent_key, sign_request
from gpuwarden.remediation.audit import read_records
from testbed.influxd import free_port
from testbed.k8s import FakeKubernetes

ROOT = Path(__file__).resolve().parent.parent
TOKEN, SECRET = "bench-token", "bench-secret"
KINDS: tuple[tuple[str, dict[str, int]], ...] = (
    ("gpu_xid", {"xid_code": 79}),
    ("gpu_lost", {}),
    ("ecc_dbe", {"ecc_dbe_delta": 1}),
)
MAX_NODES_OUT = 20


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Storm:
    def __init__(self, port: int, agents: int, burst: int, window_s: float) -> None:
        self.port, self.agents, self.burst, self.window_s = port, agents, burst, window_s
        self.latency: list[float] = []
        self.accepted = self.refused = self.gave_up = self.retried = 0
        self.sent_ids: set[str] = set()
        self.refusals: dict[int, int] = {}
        self._lock = threading.Lock()

    def agent(self, i: int, at: float) -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        conn: http.client.HTTPConnection | None = None
        node = f"node-{i:04d}"
        key = agent_key(SECRET.encode(), node)  # this agent's own key (its node's)
        for kind, evidence in KINDS[: self.burst]:
            f = Finding(
                kind=kind,
                subject={"cluster": "bench", "node": f"node-{i:04d}", "gpu": str(i % 8)},
                severity=Severity.CRITICAL,
                time_ns=time.time_ns(),
                evidence=dict(evidence),
                summary=f"node-{i:04d}: {kind}",
                source="agent",
            )
            body = json.dumps(f.to_json()).encode()
            with self._lock:
                self.sent_ids.add(f.id)
            deadline, tries = time.monotonic() + 60.0, 0
            while True:
                tries += 1
                signed = sign_request(key, "POST", "/v1/findings", body, f"agents/{node}")
                headers = {"Content-Type": "application/json", **signed}
                t0 = time.monotonic()
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                    conn.request("POST", "/v1/findings", body, headers)
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                except (OSError, http.client.HTTPException):
                    status = 0
                    if conn is not None:
                        conn.close()
                    conn = None
                took = time.monotonic() - t0
                if status in (202, 409):  # 409: it got there on an earlier try
                    with self._lock:
                        self.accepted += 1
                        self.latency.append(took)
                    break
                if status and status not in (429, 503) and status < 500:
                    with self._lock:
                        self.refused += 1
                        self.refusals[status] = self.refusals.get(status, 0) + 1
                    break
                if time.monotonic() > deadline:
                    with self._lock:
                        self.gave_up += 1
                    break
                with self._lock:
                    self.retried += 1
                time.sleep(Backoff(base_s=0.2, max_s=5.0).delay(tries))
        if conn is not None:
            conn.close()

    def run(self) -> float:
        t0 = time.monotonic() + 0.5
        starts = sorted(t0 + random.Random(i).uniform(0, self.window_s) for i in range(self.agents))
        with ThreadPoolExecutor(max_workers=self.agents) as pool:
            list(pool.map(self.agent, range(self.agents), starts))
        return time.monotonic() - t0


def engine_storm(args: argparse.Namespace, tmp: Path) -> tuple[Storm, int, int, float]:
    fake = FakeKubernetes(token="k").start()
    for i in range(args.agents):
        fake.add_node(f"node-{i:04d}")
    (tmp / "token").write_text(TOKEN)
    (tmp / "secret").write_text(SECRET)
    (tmp / "k8s").write_text("k")
    port = free_port()
    config = tmp / "remediation.toml"
    config.write_text(
        f'[engine]\nlisten = "127.0.0.1:{port}"\ntoken_file = "{tmp}/token"\n'
        f'audit_log = "{tmp}/audit.jsonl"\ndry_run = true\n'
        # every simulated agent is 127.0.0.1: one peer, which the per-peer cap would hold to
        # a quarter of the places; in a cluster each node is an address of its own
        "max_connections_per_peer = 128\n"
        'node_adapter = "kubernetes"\ncheckpoint_adapter = "kubernetes"\n'
        f"max_findings_per_request = 10\n[guards]\nmax_nodes_out = {MAX_NODES_OUT}\n"
        "max_fraction_out = 1.0\nactions_per_minute = 100000\n"
        # the storm's plans past the blast radius wait; past max_pending (500) a finding gets
        # 503 "too many plans wait" (queue_full), which its sender retries for a minute and
        # then gives up: a limit of its own (benchmarks/exhaustion.py), not what is measured
        # here, so every plan of the storm may wait
        f"max_pending = {args.agents * args.burst}\n"
        f'[kubernetes]\napi_url = "{fake.url}"\ntoken_file = "{tmp}/k8s"\n'
        f'[[identity]]\nname = "agents"\nkind = "agent"\nnode = "*"\n'
        f'secret_file = "{tmp}/secret"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(config), "serve"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp / "engine.log", "wb"),  # noqa: SIM115
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        storm = Storm(port, args.agents, args.burst, args.window_s)
        took = storm.run()
        time.sleep(2.0)  # the plans the last findings started
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        fake.stop()
    records = list(read_records(tmp / "audit.jsonl"))
    audited = {r["finding_id"] for r in records if r["event"] == "finding"}
    lost = len(storm.sent_ids - audited)
    drained = {
        r.get("node")
        for r in records
        if r["event"] == "action" and r.get("action") == "drain" and r.get("node")
    }
    return storm, lost, len(drained), took


def relay_load(clients: int, batches: int, lines: int) -> tuple[list[float], int, int, int, int]:
    """``(latencies, accepted lines, refused requests, lost lines, retried tries)``. A client
    does what the job-side reporter does: a post answered 5xx or 429 (the relay's "retry",
    e.g. its caller lookup past its budget) is sent again after the reporter's backoff
    (``RETRY``), for at most 60 s; the latency is the answered try's."""

    class Count:
        def __init__(self) -> None:
            self.lines = 0
            self.lock = threading.Lock()

        def write_lines(self, got: list[str]) -> None:
            with self.lock:
                self.lines += len(got)

    sink = Count()
    relay = ReporterRelay("127.0.0.1:0", sink)
    relay.start()
    host, port = relay.address
    latency: list[float] = []
    refused = retried = 0
    lock = threading.Lock()

    def client(rank: int) -> None:
        nonlocal refused, retried
        for b in range(batches):
            now = time.time_ns()
            body = "".join(
                f"job_step,cluster=bench,node=n{rank // 8},job=j,rank={rank} "
                f"step_index={b * lines + k}i,step_time_s=1.0,tokens_count=4096i,"
                f"samples_count=8i {now + k}\n"
                for k in range(lines)
            ).encode()
            deadline, tries = time.monotonic() + 60.0, 0
            while True:
                tries += 1
                conn = http.client.HTTPConnection(host, port, timeout=30)  # as the reporter
                t0 = time.monotonic()
                conn.request("POST", "/write?precision=ns", body, {"Content-Type": "text/plain"})
                resp = conn.getresponse()
                resp.read()
                took = time.monotonic() - t0
                conn.close()
                again = resp.status >= 500 or resp.status == 429
                if again and time.monotonic() < deadline:
                    with lock:
                        retried += 1
                    time.sleep(REPORTER_RETRY.delay(tries))
                    continue
                with lock:
                    latency.append(took)
                    if resp.status != 204:
                        refused += 1
                break

    try:
        with ThreadPoolExecutor(max_workers=clients) as pool:
            list(pool.map(client, range(clients)))
    finally:
        relay.close()
    sent = clients * batches * lines
    return latency, sink.lines, refused, sent - sink.lines, retried


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--burst", type=int, default=3, choices=(1, 2, 3))
    ap.add_argument("--window-s", type=float, default=10.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        storm, lost, drained, took = engine_storm(args, Path(tmp))
    sent = len(storm.sent_ids)
    print(f"engine (gpuwarden remediate serve, stdlib ThreadingHTTPServer, signatures required, "
          f"dry run): {args.agents} agents x {args.burst} findings within {args.window_s:.0f} s, "
          f"done in {took:.1f} s")  # fmt: skip
    print(f"  sent {sent}, accepted {storm.accepted}, refused {storm.refused} {storm.refusals}, "
          f"gave up {storm.gave_up}, retried tries {storm.retried}, lost {lost}")  # fmt: skip
    print(f"  latency p50 {pct(storm.latency, 0.5):.3f} s, p99 {pct(storm.latency, 0.99):.3f} s, "
          f"max {max(storm.latency, default=float('nan')):.3f} s")  # fmt: skip
    print(f"  blast radius: {drained} nodes would be drained (a dry run: the audit's drain "
          f"records; limit max_nodes_out = {MAX_NODES_OUT}): "
          f"{'exact' if drained == MAX_NODES_OUT else 'NOT EXACT'}")  # fmt: skip
    lat, accepted, refused, relay_lost, relay_retried = relay_load(64, 100, 10)
    print(f"relay (the agent's, stdlib ThreadingHTTPServer): 64 reporters x 100 batches of 10 "
          f"lines: accepted {accepted} lines, refused {refused} requests, retried tries "
          f"{relay_retried}, lost {relay_lost}; p50 {statistics.median(lat):.4f} s, "
          f"p99 {pct(lat, 0.99):.4f} s")  # fmt: skip
    print(f"findings_p99_s={pct(storm.latency, 0.99):.3f}")
    print(f"findings_lost={lost + storm.refused + storm.gave_up}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
