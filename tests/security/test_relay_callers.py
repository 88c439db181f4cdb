"""Who may write what through the agent's relay (issue 38, point 2; docs/SECURITY.md).

Before, the relay checked tag keys, never values: a job on node-a posted a lagging rank
tagged ``node=node-z`` and analytics blamed node-z; a made-up job with no GPU did the same.
Now every point carries the relay's own ``cluster`` and ``node``; over the Unix socket the
caller's job is its cgroup's (the kernel names the caller's pid, ``SO_PEERCRED``), and over TCP
from loopback too (the kernel's socket table names the process at the other end); a caller in
no job's cgroup may name only a job holding one of this node's GPUs. Every line is
CONSTRUCTED; the relay is the agent's code, the caller a real process (this one, or a child)
on a real socket. The cgroup files are a CONSTRUCTED procfs holding the callers' pids, as
Slurm's cgroup v2 layout names a job; its ``net`` and each task's ``fd`` are the real ones.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.collector.jobside.reporter import Reporter
from gpuwarden.collector.relay import ReporterRelay
from tests.pod_env import in_a_pod

STEP = "job_step,job={job},rank=0,node={node} step_index=7i,step_time_s=1.25"


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_lines(self, lines: list[str]) -> None:
        self.lines += lines


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


def post(conn: http.client.HTTPConnection, body: str) -> tuple[int, str, str | None]:
    conn.request("POST", "/write", body.encode(), {"Content-Type": "text/plain"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    return resp.status, text, resp.getheader("Retry-After")


def slurm_cgroup(job: str) -> str:
    return f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"


def fake_task(proc: Path, pid: int, cgroup: str | None, *, fds: bool = True) -> None:
    """Task ``pid`` in the CONSTRUCTED procfs ``proc``: its cgroup file says ``cgroup`` (None:
    none to read), its ``fd`` is the real process's (``fds``), and ``net`` is this process's
    real ``/proc/net``, so a TCP caller is found from the kernel's own socket table and
    descriptors, as the agent finds it on a node."""
    (proc / str(pid)).mkdir(parents=True)
    if cgroup is not None:
        (proc / str(pid) / "cgroup").write_text(cgroup)
    if fds:
        (proc / str(pid) / "fd").symlink_to(f"/proc/{pid}/fd")
    if not (proc / "net").exists():
        (proc / "net").symlink_to(f"/proc/{os.getpid()}/net")


@pytest.fixture
def procfs(tmp_path: Path) -> Path:
    """A procfs in which this process is task 0 of Slurm job 4242 (cgroup v2)."""
    fake_task(tmp_path / "proc", os.getpid(), slurm_cgroup("4242"))
    return tmp_path / "proc"


@pytest.fixture
def relay(tmp_path: Path, procfs: Path) -> Iterator[tuple[ReporterRelay, Lines]]:
    sink = Lines()
    r = ReporterRelay(
        "127.0.0.1:0",
        sink,
        cluster="c",
        node="node-a",
        socket_path=str(tmp_path / "relay.sock"),
        procfs=str(procfs),
        jobs_here=lambda: {"4242"},
    )
    r.start()
    yield r, sink
    r.close()


def tcp(r: ReporterRelay) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(*r.address, timeout=10)


def test_a_point_speaks_for_the_relays_node_only(relay: tuple[ReporterRelay, Lines]) -> None:
    """A job of this node tags its rank as node-z's: the point is kept as node-a's."""
    r, sink = relay
    status, text, _ = post(tcp(r), STEP.format(job="4242", node="node-z"))
    assert status == 204, text
    assert len(sink.lines) == 1 and ",node=node-a" in sink.lines[0]
    assert "node-z" not in sink.lines[0] and ",cluster=c" in sink.lines[0]


def test_over_tcp_a_job_holding_none_of_this_nodes_gpus_is_refused(tmp_path: Path) -> None:
    """A caller in no job's cgroup names a made-up job (none of this node's GPUs is its): 503
    with Retry-After, nothing kept (a job's first report may come before the agent's next
    look at its GPUs: it retries)."""
    r = _relay_with(tmp_path, "0::/user.slice/user-1000.slice/session-1.scope\n", {"4242"},
                    listen="127.0.0.1:0")  # fmt: skip
    try:
        status, text, retry = post(tcp(r), STEP.format(job="9999", node="node-a"))
        own, _, _ = post(tcp(r), STEP.format(job="4242", node="node-a"))
    finally:
        r.close()
    assert (status, retry, own) == (503, "5", 204)
    assert "holds none of this node's GPUs" in text


def test_over_the_socket_the_job_is_the_callers_cgroups(
    relay: tuple[ReporterRelay, Lines],
) -> None:
    """This process is in job 4242's cgroup: it may not write job 1111's steps (403), and its
    own are kept."""
    r, sink = relay
    assert r.socket_path
    status, text, _ = post(_Unix(r.socket_path), STEP.format(job="1111", node="node-a"))
    assert (status, sink.lines) == (403, [])
    assert "its cgroup names 4242" in text
    status, _, _ = post(_Unix(r.socket_path), STEP.format(job="4242", node="node-z"))
    assert status == 204
    assert ",job=4242," in sink.lines[0] and ",node=node-a" in sink.lines[0]


def test_the_reporter_posts_over_the_socket(relay: tuple[ReporterRelay, Lines]) -> None:
    """The job-side reporter with a ``unix://`` url: its steps arrive, stamped."""
    r, sink = relay
    rep = Reporter(job="4242", rank=0, url=f"unix://{r.socket_path}", heartbeat_s=0)
    rep.step(1, step_time_s=0.5, tokens=1024, samples=4)
    assert rep.close(timeout_s=10)
    deadline = time.monotonic() + 30
    while not sink.lines and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rep.sent == 1 and rep.dropped == 0, rep.last_error
    assert ",job=4242," in sink.lines[0] and ",node=node-a" in sink.lines[0]


def _relay_with(
    tmp_path: Path,
    cgroup: str | None,
    here: set[str],
    pods: dict[str, str] | None = None,
    *,
    listen: str = "",
    fds: bool = True,
    sink: Lines | None = None,
) -> ReporterRelay:
    """A relay whose procfs gives this process ``cgroup`` (None: no readable cgroup);
    ``pods``: the pod UIDs the agent saw on this node's GPUs, and their names; ``fds``:
    whether this process's descriptors can be read there."""
    proc = tmp_path / "p"
    fake_task(proc, os.getpid(), cgroup, fds=fds)
    r = ReporterRelay(
        listen, sink or Lines(), cluster="c", node="node-a",
        socket_path=str(tmp_path / "r.sock"), procfs=str(proc), jobs_here=lambda: here,
        pods_named=(lambda: pods) if pods is not None else None,
    )  # fmt: skip
    r.start()
    return r


def test_a_caller_whose_cgroup_cannot_be_read_is_refused(tmp_path: Path) -> None:
    """Before (an attacker's review): the relay read the cgroup after the body, and a process
    that wrote its request and exited left no cgroup: the relay fell back to 'any job', and a
    point of a job named by the caller was kept. Now the caller is read at accept, and one
    whose cgroup cannot be read is refused."""
    r = _relay_with(tmp_path, None, {"4242"})
    try:
        status, text, _ = post(_Unix(str(r.socket_path)), STEP.format(job="4242", node="x"))
    finally:
        r.close()
    assert status == 403 and "cannot be read" in text


def test_a_pods_reporter_names_its_job_as_the_agent_does(tmp_path: Path) -> None:
    """A pod's cgroup names its UID; its reporter names ``<namespace>/<pod>``, as the agent
    tags the pod's GPUs (before, every such point got 403 and was dropped: the shipped
    DaemonSet serves the socket only). A pod job holding this node's GPUs is kept; another is
    told to retry (503)."""
    cgroup = "0::/kubepods/burstable/pod12345678-1234-1234-1234-123456789abc/c0ffee\n"
    r = _relay_with(tmp_path, cgroup, {"ml/trainer-0"})
    try:
        ok, _, _ = post(_Unix(str(r.socket_path)), STEP.format(job="ml/trainer-0", node="x"))
        other, _, _ = post(_Unix(str(r.socket_path)), STEP.format(job="ml/other", node="x"))
    finally:
        r.close()
    assert (ok, other) == (204, 503)


POD = "12345678-1234-1234-1234-123456789abc"
POD_CGROUP = f"0::/kubepods/burstable/pod{POD}/c0ffee\n"


def test_a_pod_writes_only_the_job_its_gpus_were_seen_under(tmp_path: Path) -> None:
    """docs/SECURITY.md's hole 6: two pods of different jobs on one node, both holding its
    GPUs. Before, over the socket a pod's points were checked as over TCP (a job holding this
    node's GPUs), so pod A wrote pod B's steps and they were kept. Now the agent remembers the
    name the kubelet gave each pod UID it saw on a GPU, and a pod seen so writes that job only
    (403 for another); a pod not seen yet gets 503 with Retry-After for any name (a pod
    restarted under its name has a new UID the agent has not seen; a pod whose GPUs are idle
    yet has a name no one may take)."""
    here = {"ml/trainer-0", "ml/other"}
    seen = _relay_with(tmp_path / "a", POD_CGROUP, here, {f"pod-{POD}": "ml/trainer-0"})
    try:
        own, _, _ = post(_Unix(str(seen.socket_path)), STEP.format(job="ml/trainer-0", node="x"))
        other, text, _ = post(_Unix(str(seen.socket_path)), STEP.format(job="ml/other", node="x"))
    finally:
        seen.close()
    assert (own, other) == (204, 403), text
    assert "not the caller's" in text
    unseen = _relay_with(tmp_path / "b", POD_CGROUP, here, {"pod-another": "ml/other"})
    try:
        taken, text, _ = post(_Unix(str(unseen.socket_path)), STEP.format(job="ml/other", node="x"))
        free, _, _ = post(_Unix(str(unseen.socket_path)), STEP.format(job="ml/trainer-0", node="x"))
    finally:
        unseen.close()
    assert (taken, free) == (503, 503), text  # 503: a restarted pod's new UID, until seen
    assert "another pod's" in text  # and a name no pod was seen as waits too: its pod's GPUs
    # may be idle yet (an attacker's review: an unseen pod took such a name, 204)


def test_the_agent_removes_only_its_own_socket(tmp_path: Path) -> None:
    """A newer agent made its own socket at the path: the older one's close leaves it."""
    r = _relay_with(tmp_path, None, set())
    assert r.socket_path
    os.unlink(r.socket_path)
    newer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    newer.bind(r.socket_path)
    try:
        r.close()
        assert os.path.exists(r.socket_path)
    finally:
        newer.close()


#: job A's training process: waits for its go, then posts each body over TCP and prints the
#: answers (a process of its own: the relay must find IT, not the relay's own end)
JOB_A = """
import http.client, sys
host, port = sys.argv[1], int(sys.argv[2])
sys.stdin.readline()
for body in sys.argv[3:]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("POST", "/write", body.encode(), {"Content-Type": "text/plain"})
    resp = conn.getresponse()
    print(resp.status, resp.read().decode().strip(), flush=True)
    conn.close()
"""


def test_over_tcp_from_loopback_a_job_writes_only_its_own_points(tmp_path: Path) -> None:
    """docs/SECURITY.md's hole 1: jobs 1111 (A) and 4242 (B) both hold this node's GPUs. A
    process of job A posts job B's steps to the relay's loopback port. Before, a TCP caller
    was unknown and only "does the job hold this node's GPUs" was asked: B's steps from A were
    kept (204). Now the relay finds the process at the other end of the connection in the
    kernel's socket table (its ``net/tcp``, then the process holding that socket in its
    ``fd``) when it accepts it, and holds it to its cgroup's job as over the Unix socket: 403
    for B's, and A's own are kept. The relay's own process is job B's here, so a relay that
    found its own end of the connection would take B's steps."""
    sink = Lines()
    r = _relay_with(tmp_path, slurm_cgroup("4242"), {"4242", "1111"}, listen="127.0.0.1:0",
                    sink=sink)  # fmt: skip
    host, port = r.address
    bodies = [STEP.format(job="4242", node="node-a"), STEP.format(job="1111", node="node-a")]
    job_a = subprocess.Popen(
        [sys.executable, "-c", JOB_A, host, str(port), *bodies],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        fake_task(tmp_path / "p", job_a.pid, slurm_cgroup("1111"))
        out, _ = job_a.communicate("go\n", timeout=60)
    finally:
        if job_a.poll() is None:
            job_a.kill()
        r.close()
    answers = [a.strip() for a in out.splitlines()]
    assert len(answers) == 2, out
    assert answers[0].startswith("403 ") and "its cgroup names 1111" in answers[0], out
    assert answers[1] == "204", out
    assert len(sink.lines) == 1 and ",job=1111," in sink.lines[0], sink.lines
    assert ",job=4242," not in "".join(sink.lines)


def test_a_loopback_tcp_caller_that_cannot_be_found_is_refused(tmp_path: Path) -> None:
    """A loopback peer whose process is not found among the processes' descriptors (here
    its ``fd`` cannot be read; on a node: it wrote its request and exited, or its socket was
    handed on) is refused, as a Unix-socket caller whose cgroup cannot be read: it cannot be
    told apart from any other job."""
    r = _relay_with(tmp_path, slurm_cgroup("4242"), {"4242"}, listen="127.0.0.1:0", fds=False)
    try:
        status, text, _ = post(tcp(r), STEP.format(job="4242", node="node-a"))
    finally:
        r.close()
    assert status == 403 and "cannot be found" in text, text


def test_the_reporter_posts_over_loopback_tcp(tmp_path: Path) -> None:
    """The job-side reporter with the relay's loopback port: its own job's steps are kept."""
    sink = Lines()
    r = _relay_with(tmp_path, slurm_cgroup("4242"), {"4242"}, listen="127.0.0.1:0", sink=sink)
    try:
        rep = Reporter(job="4242", rank=0, url=f"http://{r.address[0]}:{r.address[1]}",
                       heartbeat_s=0)  # fmt: skip
        rep.step(1, step_time_s=0.5, tokens=1024, samples=4)
        assert rep.close(timeout_s=10)
    finally:
        r.close()
    assert rep.sent == 1 and rep.dropped == 0, rep.last_error
    assert ",job=4242," in sink.lines[0] and ",node=node-a" in sink.lines[0]


def test_a_pods_reporter_is_kept_though_torchrun_names_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review item 8: the reporter in a pod under torchrun (``TORCHELASTIC_RUN_ID`` set), its
    job left to the environment. The agent saw the pod's GPUs under ``train/llama-0``, and the
    relay holds the pod to that name. Before, the reporter named the run id and every report
    was refused (403, counted in ``dropped``); now it names the pod, and its steps are kept."""

    in_a_pod(monkeypatch, tmp_path)
    sink = Lines()
    r = _relay_with(tmp_path, POD_CGROUP, {"train/llama-0"}, {f"pod-{POD}": "train/llama-0"},
                    sink=sink)  # fmt: skip
    try:
        rep = Reporter(rank=0, url=f"unix://{r.socket_path}", heartbeat_s=0)
        rep.step(1, step_time_s=0.5, tokens=1024, samples=4)
        assert rep.close(timeout_s=10)
    finally:
        r.close()
    assert (rep.job, rep.sent, rep.dropped) == ("train/llama-0", 1, 0), rep.last_error
    assert ",job=train/llama-0," in sink.lines[0]


# -- an attacker's review of the TCP lookup (each of these got 204 on the code before) -------


def test_a_caller_that_resets_its_connection_at_once_is_refused(tmp_path: Path) -> None:
    """A process of job 4242 sends job 1111's step and resets the connection (``SO_LINGER``
    0): the peer's address is gone by the lookup. Before, that read as "a peer on another
    host" and only "does the job hold this node's GPUs" was asked: 200 of 200 kept."""
    import struct

    sink = Lines()
    r = _relay_with(tmp_path, slurm_cgroup("4242"), {"4242", "1111"}, listen="127.0.0.1:0",
                    sink=sink)  # fmt: skip
    body = STEP.format(job="1111", node="node-a").encode()
    request = b"POST /write HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    try:
        for _ in range(40):
            with socket.socket() as c:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                c.connect(r.address)
                c.sendall(request)
        time.sleep(2.0)  # a guard against a slow relay, not a speed limit: nothing may come
    finally:
        r.close()
    assert not [line for line in sink.lines if ",job=1111," in line], sink.lines


def _own_address() -> str | None:
    """One of this host's addresses that is not loopback (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: the route names the source
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_local_caller_from_the_nodes_own_address_is_held_to_its_job(tmp_path: Path) -> None:
    """A process binds its source to the node's own (non-loopback) address and connects to
    the relay's loopback port: it is still this host's process. Before: a peer on another
    host, and job 1111's step from job 4242's process was kept (204)."""
    own = _own_address()
    if own is None:
        pytest.skip("no address but loopback here")
    r = _relay_with(tmp_path, slurm_cgroup("4242"), {"4242", "1111"}, listen="127.0.0.1:0")
    try:
        conn = http.client.HTTPConnection(*r.address, timeout=10, source_address=(own, 0))
        status, text, _ = post(conn, STEP.format(job="1111", node="node-a"))
    finally:
        r.close()
    assert status == 403 and "its cgroup names 4242" in text, (status, text)


def test_a_unix_caller_the_relay_cannot_see_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SO_PEERCRED`` gives pid 0 for a caller outside the relay's pid namespace (an agent
    container without hostPID): unknown, refused. Before: "no job", and any job holding this
    node's GPUs could be named."""
    import gpuwarden.collector.relay as relay_module

    monkeypatch.setattr(relay_module, "peer_pid", lambda sock: None)
    r = _relay_with(tmp_path, slurm_cgroup("4242"), {"4242", "1111"})
    try:
        status, text, _ = post(_Unix(str(r.socket_path)), STEP.format(job="1111", node="node-a"))
    finally:
        r.close()
    assert status == 403 and "cannot be found" in text, (status, text)


def test_a_socket_passed_to_another_users_process_is_not_theirs(tmp_path: Path) -> None:
    """A process passes its connection to another user's process (job 1111's) and closes its
    own copy: the socket's owner (the kernel's word) is still the first one, and only its
    processes may hold it for the relay, so the post is refused. Before: the first holder
    found was taken, and the post was kept as job 1111's (204)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a process as another user")
    r = _relay_with(tmp_path, slurm_cgroup("4242"), {"4242", "1111"}, listen="127.0.0.1:0")
    conn = socket.create_connection(r.address)
    body = STEP.format(job="1111", node="node-a").encode()
    request = b"POST /write HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    victim = os.fork()
    if victim == 0:  # the other user's process, holding the passed socket
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.read(go_r, 1)
            conn.sendall(request)
            os.write(out_w, conn.recv(4096))
        finally:
            os._exit(0)
    try:
        fake_task(tmp_path / "p", victim, slurm_cgroup("1111"))
        os.chown(tmp_path / "p" / str(victim), 65534, 65534)  # its owner, as /proc shows
        conn.close()  # only the other user's process holds it now
        os.write(go_w, b"g")
        answer = os.read(out_r, 4096)
    finally:
        os.waitpid(victim, 0)
        for fd in (go_r, go_w, out_r, out_w):
            os.close(fd)
        r.close()
    assert answer.startswith((b"HTTP/1.0 403", b"HTTP/1.1 403")), answer


def test_a_lookup_past_its_budget_is_answered_retry(tmp_path: Path) -> None:
    """On a node whose owner's processes hold very many descriptors, the look may run past
    its budget: the caller is told to retry (503), not refused for good (an attacker's review
    of the first fix: a reporter's points were dropped with 403)."""
    r = _relay_with(tmp_path, slurm_cgroup("4242"), {"4242"}, listen="127.0.0.1:0")
    r.lookup_budget_s = 0.0
    try:
        status, text, _ = post(tcp(r), STEP.format(job="4242", node="node-a"))
    finally:
        r.close()
    assert status == 503 and "retry" in text, (status, text)


def test_this_hosts_addresses_come_from_the_kernels_lists() -> None:
    """Not by binding a socket to the address (true for every address where
    ``ip_nonlocal_bind`` is set: every remote caller would have been refused)."""
    from gpuwarden.core.tls import _local_addresses

    found = _local_addresses()
    assert "127.0.0.1" in found and "203.0.113.5" not in found
