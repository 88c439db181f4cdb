"""Exhaustion attacks on the engine and the relay, with legitimate traffic beside them (issue 38,
point 5, must-show 3). Loopback only; every finding and line is CONSTRUCTED.

* **Engine** (``gpuwarden remediate serve``, its own process, identities on, dry run against the
  Kubernetes fake): at once, ``--slow`` clients trickle a request a byte every 6 s; ``--stalled``
  clients announce a 1 MiB body, send half and stall; one compromised agent key (``node-0000``)
  floods 5,000 distinct critical findings about its own node, 10 a request, as fast as answered;
  and ``--agents`` other agents each post one fatal XID at a moment within the attack, retrying
  as the fast path does on 429/503 or a refused connection. Afterwards the audit log is read:
  every legitimate finding must have been decided (**lost** otherwise) and its plan run.
* **Relay** (``ReporterRelay``, the agent's code, in a process of its own with a counting sink):
  the same slow and stalled clients, a 1 MiB request of 12,000 lines in 12,000 distinct weeks
  from 1970 on, and a 70 KB tag, while 8 reporters post 100 batches of 10 ``job_step`` lines
  each (retrying on 503).

The engine's and the relay's threads and resident memory are sampled from ``/proc`` every 0.2 s;
the bounds they must stay under are printed beside the peaks: threads at most the idle count
plus ``max_connections`` (one per connection served) plus the executor's workers; memory is
reported, with the worst case the settings allow (``max_connections`` x ``max_body_bytes``).

    uv run python -m benchmarks.exhaustion [--agents 100] [--slow 150] [--stalled 60]

Last line: ``legit_lost=<n>`` (target 0).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.retry import Backoff
from gpuwarden.core.signing import agent_key, sign_request
from gpuwarden.remediation.audit import read_records
from testbed.influxd import free_port
from testbed.k8s import FakeKubernetes

ROOT = Path(__file__).resolve().parent.parent
SECRET = b"exhaustion-bench-secret"
MAX_CONNECTIONS = 128
WORKERS = 4
FLOOD = 5000


class Peaks:
    """Threads and RSS of one process, sampled until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid, self.threads, self.rss_kib = pid, 0, 0
        self.idle_threads, self.idle_rss_kib = self._sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> tuple[int, int]:
        threads = rss = 0
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("Threads:"):
                    threads = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        except OSError:
            pass
        return threads, rss

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            threads, rss = self._sample()
            self.threads, self.rss_kib = max(self.threads, threads), max(self.rss_kib, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def slow_client(port: int, until: float, every_s: float = 6.0) -> bool:
    """Trickle a request a byte every ``every_s`` until ``until``; True if the server cut it."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        return True
    try:
        s.sendall(b"POST /v1/findings HTTP/1.1\r\nHost: x\r\n")
        while time.monotonic() < until:
            s.sendall(b"X")
            time.sleep(every_s)
        return False
    except OSError:
        return True
    finally:
        s.close()


def stalled_upload(port: int, path: str, until: float) -> bool:
    """Announce 1 MiB, send half, stall until ``until``; True if the server cut it."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        return True
    try:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 20}\r\n\r\n".encode())
        s.sendall(b"[" + b" " * ((1 << 19) - 1))
        while time.monotonic() < until:
            time.sleep(0.5)
            s.sendall(b" ")
        return False
    except OSError:
        return True
    finally:
        s.close()


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    """One request; the status, or 0 when the connection failed."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except (OSError, http.client.HTTPException):
        return 0


def retried(send: Callable[[], int], budget_s: float = 60.0) -> int:
    """``send()`` until it is answered other than 429/503/no connection (as the fast path does),
    within ``budget_s``; the last status."""
    deadline, tries = time.monotonic() + budget_s, 0
    while True:
        tries += 1
        status = send()
        if status not in (0, 429, 503) or time.monotonic() > deadline:
            return status
        time.sleep(Backoff(base_s=0.2, max_s=5.0).delay(tries))


def xid(node: str, gpu: int) -> Finding:
    return Finding(
        kind="gpu_xid",
        subject={"cluster": "bench", "node": node, "gpu": str(gpu)},
        severity=Severity.CRITICAL,
        time_ns=time.time_ns(),
        evidence={"xid": 79},
        summary=f"XID 79 on {node} (CONSTRUCTED)",
        source="agent",
    )


def signed_post(port: int, node: str, findings: list[Finding]) -> int:
    body = json.dumps([f.to_json() for f in findings]).encode()
    key = agent_key(SECRET, node)
    headers = sign_request(key, "POST", "/v1/findings", body, f"agents/{node}")
    return post(port, "/v1/findings", body, {"Content-Type": "application/json", **headers})


@contextmanager
def engine_process(tmp: Path, nodes: int) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    fake = FakeKubernetes(token="k").start()
    for i in range(nodes):
        fake.add_node(f"node-{i:04d}")
    (tmp / "secret").write_text(SECRET.decode())
    (tmp / "k8s").write_text("k")
    port = free_port()
    (tmp / "remediation.toml").write_text(
        f'[engine]\nlisten = "127.0.0.1:{port}"\naudit_log = "{tmp}/audit.jsonl"\n'
        f"dry_run = true\nworkers = {WORKERS}\nmax_connections = {MAX_CONNECTIONS}\n"
        # attackers and agents alike are 127.0.0.1 here: the cap per peer is left out, so the
        # bounds are those of the total cap (tests/security/test_limits.py shows the per-peer one)
        f"max_connections_per_peer = {MAX_CONNECTIONS}\n"
        'node_adapter = "kubernetes"\ncheckpoint_adapter = "kubernetes"\n'
        f"max_findings_per_request = 10\n[guards]\nmax_nodes_out = {nodes}\n"
        "max_fraction_out = 1.0\nactions_per_minute = 100000\ncooldown_s = 0.0\n"
        f'[kubernetes]\napi_url = "{fake.url}"\ntoken_file = "{tmp}/k8s"\n'
        f'[[identity]]\nname = "agents"\nkind = "agent"\nnode = "*"\n'
        f'secret_file = "{tmp}/secret"\n'
    )
    log = (tmp / "engine.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(tmp / "remediation.toml"),
         "serve"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_healthy(port, "/healthz", proc)
        yield proc, port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        log.close()
        fake.stop()


def wait_healthy(port: int, path: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"no answer on {path} (exit {proc.poll()})")


def attack(port: int, slow: int, stalled: int, path: str, seconds: float) -> list[threading.Thread]:
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=slow_client, args=(port, until)) for _ in range(slow)]
    threads += [
        threading.Thread(target=stalled_upload, args=(port, path, until)) for _ in range(stalled)
    ]
    for t in threads:
        t.start()
    return threads


def engine_run(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    with engine_process(tmp, args.agents + 1) as (proc, port):
        peaks = Peaks(proc.pid)
        attackers = attack(port, args.slow, args.stalled, "/v1/findings", args.seconds)
        flood_status: dict[int, int] = {}

        def flood() -> None:
            end = time.monotonic() + args.seconds
            sent = 0
            while sent < FLOOD and time.monotonic() < end:
                batch = [xid("node-0000", sent + k) for k in range(10)]
                status = signed_post(port, "node-0000", batch)
                while status in (0, 503) and time.monotonic() < end:  # no room: knock again
                    time.sleep(0.05)
                    status = signed_post(port, "node-0000", batch)
                flood_status[status] = flood_status.get(status, 0) + 1
                sent += 10

        legit_ids: list[str] = []
        legit_status: list[int] = []
        lock = threading.Lock()

        def legit(i: int) -> None:
            time.sleep(random.Random(i).uniform(1.0, max(1.5, args.seconds - 5)))
            node = f"node-{i + 1:04d}"
            f = xid(node, i % 8)
            status = retried(lambda: signed_post(port, node, [f]))
            with lock:
                legit_ids.append(f.id)
                legit_status.append(status)

        workers = [threading.Thread(target=flood)]
        workers += [threading.Thread(target=legit, args=(i,)) for i in range(args.agents)]
        for t in workers:
            t.start()
        for t in workers + attackers:
            t.join()
        time.sleep(2.0)  # the last plans run
        peaks.stop()
    records = list(read_records(tmp / "audit.jsonl"))
    decided = {r["finding_id"] for r in records if r["event"] == "decision"}
    acted = {r["finding_id"] for r in records if r["event"] == "action"}
    flood_decided = sum(
        1 for r in records if r["event"] == "decision" and r.get("node") == "node-0000"
    )
    return {
        "idle_threads": peaks.idle_threads,
        "peak_threads": peaks.threads,
        "thread_bound": peaks.idle_threads + MAX_CONNECTIONS + WORKERS,
        "idle_rss_mib": peaks.idle_rss_kib / 1024,
        "peak_rss_mib": peaks.rss_kib / 1024,
        "legit_sent": len(legit_ids),
        "legit_lost": sum(1 for i in legit_ids if i not in decided or i not in acted),
        "legit_not_202": sum(1 for s in legit_status if s != 202),
        "flood_requests": sum(flood_status.values()),
        "flood_429": flood_status.get(429, 0),
        "flood_decided": flood_decided,
    }


RELAY_CHILD = """
import sys, threading, time
from gpuwarden.collector.relay import ReporterRelay
class Count:
    lines = 0
    lock = threading.Lock()
    def write_lines(self, got):
        with self.lock:
            Count.lines += len(got)
relay = ReporterRelay("127.0.0.1:0", Count())
relay.start()
print(relay.address[1], flush=True)
for line in sys.stdin:
    print(Count.lines, flush=True)
"""


def relay_run(args: argparse.Namespace) -> dict[str, float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RELAY_CHILD], cwd=ROOT, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        port = int(proc.stdout.readline())
        peaks = Peaks(proc.pid)
        attackers = attack(port, args.slow, args.stalled, "/write", args.seconds)
        week_ns = 7 * 86400 * 10**9
        centuries = "".join(
            f"job_step,job=j,rank=0 step_index={k}i {k * week_ns}\n" for k in range(12_000)
        ).encode()
        blob = ("job_step,job=" + "j" * 70_000 + " step_index=1i\n").encode()
        hostile = [retried(partial(post, port, "/write", b, {})) for b in (centuries, blob)]
        sent = [0]
        refused = [0]
        lock = threading.Lock()

        def reporter(rank: int) -> None:
            for b in range(100):
                body = "".join(
                    f"job_step,job=j,rank={rank} step_index={b * 10 + k}i,step_time_s=1.0\n"
                    for k in range(10)
                ).encode()
                status = retried(partial(post, port, "/write", body, {}))
                with lock:
                    sent[0] += 10
                    refused[0] += status != 204

        reporters = [threading.Thread(target=reporter, args=(r,)) for r in range(8)]
        for t in reporters:
            t.start()
        for t in reporters + attackers:
            t.join()
        peaks.stop()
        proc.stdin.write("count\n")
        proc.stdin.flush()
        kept = int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    return {
        "idle_threads": peaks.idle_threads,
        "peak_threads": peaks.threads,
        "thread_bound": peaks.idle_threads + MAX_CONNECTIONS,
        "idle_rss_mib": peaks.idle_rss_kib / 1024,
        "peak_rss_mib": peaks.rss_kib / 1024,
        "hostile_refused": sum(1 for s in hostile if s == 400),
        "legit_lines_sent": sent[0],
        "legit_lines_lost": sent[0] - kept,
        "legit_requests_refused": refused[0],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--slow", type=int, default=150)
    ap.add_argument("--stalled", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        engine = engine_run(args, Path(tmp))
    relay = relay_run(args)
    worst = MAX_CONNECTIONS  # MiB: max_connections x max_body_bytes (1 MiB)
    print(f"engine (remediate serve, dry run): {args.slow} slow clients, {args.stalled} stalled "
          f"1 MiB uploads, one agent key flooding, {args.agents} legitimate agents, "
          f"{args.seconds:.0f} s")  # fmt: skip
    print(f"  threads: idle {engine['idle_threads']}, peak {engine['peak_threads']} (bound "
          f"{engine['thread_bound']}); RSS idle {engine['idle_rss_mib']:.0f} MiB, peak "
          f"{engine['peak_rss_mib']:.0f} MiB (the settings allow up to +{worst} MiB)")  # fmt: skip
    print(f"  flood: {engine['flood_requests']} requests, {engine['flood_429']} answered 429, "
          f"{engine['flood_decided']} findings decided")  # fmt: skip
    print(f"  legitimate: {engine['legit_sent']} sent, {engine['legit_not_202']} not 202 in "
          f"the end, {engine['legit_lost']} not decided and acted on (audit)")  # fmt: skip
    print(f"relay: the same slow and stalled clients, 12,000 weeks in one request, a 70 KB tag "
          f"({relay['hostile_refused']} of 2 refused 400), 8 reporters x 100 batches")  # fmt: skip
    print(f"  threads: idle {relay['idle_threads']}, peak {relay['peak_threads']} (bound "
          f"{relay['thread_bound']}); RSS idle {relay['idle_rss_mib']:.0f} MiB, peak "
          f"{relay['peak_rss_mib']:.0f} MiB")  # fmt: skip
    print(f"  legitimate: {relay['legit_lines_sent']} lines sent, {relay['legit_lines_lost']} "
          f"lost, {relay['legit_requests_refused']} requests refused in the end")  # fmt: skip
    print(f"engine_peak_threads={engine['peak_threads']}")
    print(f"relay_peak_threads={relay['peak_threads']}")
    print(f"legit_lost={int(engine['legit_lost'] + relay['legit_lines_lost'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
