"""TLS on the engine's endpoint and the agent's relay, mutual TLS on the engine, and every sender
verifying the server against a CA setting.

Certificates are CONSTRUCTED here (``testbed.certs``, Debian's openssl); the servers and the
senders are the production code on loopback; the findings are SIMULATED.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.collector.jobside.reporter import Reporter
from gpuwarden.collector.relay import ReporterRelay
from gpuwarden.core.poster import FindingPoster
from gpuwarden.core.tls import _diag_inode, client_context, loopback_peer_pids, server_context
from gpuwarden.remediation.audit import read_records
from gpuwarden.remediation.cli import main as remediate
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from gpuwarden.remediation.server import Endpoint, make_server
from testbed.certs import Certs, make_certs
from testbed.influxd import free_port
from tests.remediation_util import RecordingAdapter, poll, risk

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "t0ken-for-tests"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


class TlsEngine:
    """The engine's endpoint over HTTPS (optionally requiring client certificates)."""

    def __init__(self, tmp: Path, certs: Certs, mutual: bool) -> None:
        self.mutual = mutual
        self.sched = RecordingAdapter("slurm", {f"gpu0{i}": "gpu" for i in range(1, 9)})
        from gpuwarden.remediation.audit import AuditLog

        self.audit = AuditLog(tmp / "audit.jsonl")
        self.engine = Engine(
            load_policies(DEFAULT_POLICIES),
            {"slurm": self.sched, "webhook": RecordingAdapter("webhook")},
            self.audit,
            EngineSettings(dry_run=False, max_nodes_out=4, max_fraction_out=1.0),
        )
        self.endpoint = Endpoint(self.engine, TOKEN)
        tls = server_context(certs.server.cert, certs.server.key, certs.ca if mutual else "")
        self.server = make_server(self.endpoint, "127.0.0.1", 0, tls)
        self.port = self.server.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}/v1/findings"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def findings(self) -> list[dict]:
        return [r for r in read_records(self.audit.path) if r["event"] == "finding"]

    def close(self) -> None:
        self.server.shutdown()
        self.engine.close()


@pytest.fixture(params=[False, True], ids=["tls", "mtls"])
def engine(request: pytest.FixtureRequest, tmp_path: Path, certs: Certs) -> Iterator[TlsEngine]:
    e = TlsEngine(tmp_path, certs, mutual=request.param)
    try:
        yield e
    finally:
        e.close()


def poster_for(
    e: TlsEngine, tmp: Path, ca_file: str = "", cert_file: str = "", key_file: str = ""
) -> FindingPoster:
    (tmp / "token").write_text(TOKEN)
    return FindingPoster(
        e.url, str(tmp / "token"), ca_file=ca_file, cert_file=cert_file, key_file=key_file
    )


def test_a_sender_with_the_ca_posts_and_one_without_is_refused_by_its_own_check(
    engine: TlsEngine, certs: Certs, tmp_path: Path
) -> None:
    client = {"cert_file": certs.client.cert, "key_file": certs.client.key}
    good = poster_for(engine, tmp_path, certs.ca, **client)
    body = json.dumps(risk("gpu02").to_json()).encode()
    assert good._try(body) == ("delivered", "")
    # the system's CAs do not know ours: the sender will not talk to the server
    verdict, why = poster_for(engine, tmp_path, "", **client)._try(body)
    assert verdict == "retry" and "CERTIFICATE_VERIFY_FAILED" in why
    # another CA's certificate for the client: only an engine that checks clients refuses it
    stranger = poster_for(engine, tmp_path, ca_file=certs.ca, cert_file=certs.stranger.cert,
                          key_file=certs.stranger.key)  # fmt: skip
    body2 = json.dumps(risk("gpu03").to_json()).encode()
    verdict, why = stranger._try(body2)
    if engine.mutual:
        assert verdict == "retry", why
        no_cert = poster_for(engine, tmp_path, ca_file=certs.ca)
        assert no_cert._try(body2)[0] == "retry"
        assert [f["subject"]["node"] for f in engine.findings()] == ["gpu02"]
    else:
        assert verdict == "delivered"
        assert [f["subject"]["node"] for f in engine.findings()] == ["gpu02", "gpu03"]


def test_plain_http_and_a_silent_client_cost_nothing_but_their_own_connection(
    engine: TlsEngine, certs: Certs, tmp_path: Path
) -> None:
    import http.client
    import socket

    silent = socket.create_connection(("127.0.0.1", engine.port))  # connects, says nothing
    plain = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        plain.request("GET", "/healthz")
        plain.getresponse()
    ctx = client_context(certs.ca, certs.client.cert, certs.client.key)
    conn = http.client.HTTPSConnection("127.0.0.1", engine.port, timeout=10, context=ctx)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200  # while the silent client still holds its socket
    silent.close()


def test_operator_commands_verify_the_engine(
    engine: TlsEngine, certs: Certs, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN)
    base = (
        f'[engine]\nlisten = "127.0.0.1:{engine.port}"\ntoken_file = "{tmp_path}/token"\n'
        f'tls_cert_file = "{certs.server.cert}"\ntls_key_file = "{certs.server.key}"\n'
        f'tls_client_cert_file = "{certs.client.cert}"\n'
        f'tls_client_key_file = "{certs.client.key}"\n'
    )
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(base + f'tls_ca_file = "{certs.ca}"\n')
    bad.write_text(base + f'tls_ca_file = "{certs.other_ca}"\n')
    assert remediate(["--config", str(good), "pending"]) == 0
    assert remediate(["--config", str(bad), "pending"]) == 1


def test_the_reporter_writes_through_a_tls_relay(certs: Certs) -> None:
    class Lines:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def write_lines(self, lines: list[str]) -> None:
            self.lines += lines

    sink = Lines()
    relay = ReporterRelay("127.0.0.1:0", sink, server_context(certs.server.cert, certs.server.key))
    relay.start()
    try:
        host, port = relay.address
        url = f"https://{host}:{port}"
        rep = Reporter("job-1", 0, url=url, ca_file=certs.ca, flush_interval_s=0.05, heartbeat_s=0)
        rep.step(1, 1.0, 1024, 8)
        rep.close()
        assert rep.sent == 1 and rep.last_error == ""
        assert len(sink.lines) == 1 and sink.lines[0].startswith("job_step,")
        blind = Reporter("job-1", 0, url=url, ca_file=certs.other_ca, flush_interval_s=0.05,
                         heartbeat_s=0)  # fmt: skip
        blind.step(2, 1.0, 1024, 8)
        # waited for: its first try failed verification (a close after 1 s raced a stall)
        poll(lambda: "CERTIFICATE_VERIFY_FAILED" in blind.last_error, 30, "the failed try")
        blind.close(timeout_s=0.5)
        assert blind.sent == 0 and "CERTIFICATE_VERIFY_FAILED" in blind.last_error
        assert len(sink.lines) == 1
    finally:
        relay.close()


def test_the_agent_posts_to_an_engine_that_requires_client_certificates(
    certs: Certs, tmp_path: Path
) -> None:
    """The production commands: ``gpuwarden remediate serve`` with mutual TLS and identities;
    ``gpuwarden agent --once`` reads a CONSTRUCTED XID 79 line and posts it. The client
    certificate (CN ``client``) must name the identity that signs: accepted for ``node-001``
    (``cert_names = ["client"]``), refused (403) for ``node-002``, whose certificate would
    carry its own name."""
    port = free_port()
    (tmp_path / "token").write_text(TOKEN)
    for name in ("node-001", "node-002", "alice"):
        (tmp_path / f"key-{name}").write_text(f"key-of-{name}")
    config = tmp_path / "remediation.toml"
    config.write_text(
        f'[engine]\nlisten = "127.0.0.1:{port}"\ntoken_file = "{tmp_path}/token"\n'
        f'audit_log = "{tmp_path}/audit.jsonl"\n'
        f'operator_identity = "alice"\noperator_secret_file = "{tmp_path}/key-alice"\n'
        f'dry_run = true\nnotify_adapter = "webhook"\nnode_adapter = "kubernetes"\n'
        f'tls_cert_file = "{certs.server.cert}"\ntls_key_file = "{certs.server.key}"\n'
        f'tls_client_ca_file = "{certs.ca}"\ntls_ca_file = "{certs.ca}"\n'
        f'tls_client_cert_file = "{certs.client.cert}"\n'
        f'tls_client_key_file = "{certs.client.key}"\n'
        f'[kubernetes]\napi_url = "http://127.0.0.1:1"\n'
        f'[[identity]]\nname = "alice"\nkind = "operator"\ncert_names = ["client"]\n'
        f'secret_file = "{tmp_path}/key-alice"\n'
        f'[[identity]]\nname = "node-001"\nkind = "agent"\nnode = "node-001"\n'
        f'cert_names = ["client"]\nsecret_file = "{tmp_path}/key-node-001"\n'
        f'[[identity]]\nname = "node-002"\nkind = "agent"\nnode = "node-002"\n'
        f'secret_file = "{tmp_path}/key-node-002"\n'
    )
    engine = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(config), "serve"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip

    def agent(node: str) -> subprocess.CompletedProcess[str]:
        conf = tmp_path / f"agent-{node}.toml"
        conf.write_text(
            f'[agent]\ncluster = "c"\nnode = "{node}"\nsources = ["xid"]\n'
            f'kmsg = "{tmp_path}/kmsg.log"\n'
            f'remediation_url = "https://127.0.0.1:{port}/v1/findings"\n'
            f'remediation_identity = "{node}"\n'
            f'remediation_hmac_secret_file = "{tmp_path}/key-{node}"\n'
            f'remediation_ca_file = "{certs.ca}"\nremediation_cert_file = "{certs.client.cert}"\n'
            f'remediation_key_file = "{certs.client.key}"\n[xid]\nlookback_s = 0.0\n'
        )
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", "agent", "--config", str(conf), "--once"],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip

    try:
        poll(lambda: remediate(["--config", str(config), "pending"]) == 0, 30, "the engine")
        (tmp_path / "kmsg.log").write_text(
            "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n"
        )
        refused = agent("node-002")
        assert "HTTP 403" in refused.stderr and "certificate names ['client']" in refused.stderr
        done = agent("node-001")
        assert done.returncode == 0, done.stderr
        found = poll(
            lambda: [r for r in read_records(tmp_path / "audit.jsonl") if r["event"] == "finding"],
            30,
            "the agent's finding",
        )
        assert [(f["kind"], f["via"]) for f in found] == [("gpu_xid", "http, signed by node-001")]
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(timeout=60)


def test_server_context_refuses_old_protocols(certs: Certs) -> None:
    ctx = server_context(certs.server.cert, certs.server.key)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client_context(certs.ca).verify_mode == ssl.CERT_REQUIRED
    assert server_context(certs.server.cert, certs.server.key, certs.ca).verify_mode == (
        ssl.CERT_REQUIRED
    )


@pytest.mark.parametrize(
    ("server_family", "server_host", "client_family", "client_host"),
    [
        (socket.AF_INET, "127.0.0.1", socket.AF_INET, "127.0.0.1"),  # net/tcp
        (socket.AF_INET6, "::1", socket.AF_INET6, "::1"),  # net/tcp6
        (socket.AF_INET6, "::", socket.AF_INET, "127.0.0.1"),  # the peer as ::ffff:127.0.0.1
        (socket.AF_INET, "127.0.0.1", socket.AF_INET6, "::ffff:127.0.0.1"),  # mapped in tcp6
    ],
)
def test_a_loopback_peer_is_found_in_the_kernels_socket_table(
    server_family: int, server_host: str, client_family: int, client_host: str
) -> None:
    """The relay's TCP caller (docs/SECURITY.md, "The relay"): the process at the other end
    of a loopback connection, from the real /proc; none for a Unix socket."""
    server = socket.socket(server_family, socket.SOCK_STREAM)
    try:
        if server_family == socket.AF_INET6:
            server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        server.bind((server_host, 0))
    except OSError as exc:
        server.close()
        pytest.skip(f"no {server_host} here: {exc}")
    with server:
        server.listen()
        port = server.getsockname()[1]
        client = socket.socket(client_family, socket.SOCK_STREAM)
        try:
            client.connect((client_host, port))
        except OSError as exc:
            client.close()
            pytest.skip(f"cannot connect from {client_host}: {exc}")
        with client, server.accept()[0] as accepted:
            # the kernel's exact lookup (sock_diag) names the client's own socket, as the
            # client's family holds it (an AF_INET6 client to 127.0.0.1: mapped, in tcp6)
            table = "tcp" if client.family == socket.AF_INET else "tcp6"
            (src, sport), (dst, dport) = client.getsockname()[:2], client.getpeername()[:2]
            src, dst = ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed
            inode, uid = _diag_inode(table, src, sport, dst, dport) or (0, -1)
            assert (inode, uid) == (os.fstat(client.fileno()).st_ino, os.getuid())
            assert _diag_inode(table, src, sport, dst, dport ^ 1) is None  # no such socket
            assert loopback_peer_pids(accepted) == [os.getpid()]
            assert loopback_peer_pids(accepted, likely=[1, os.getpid()]) == [os.getpid()]
            assert loopback_peer_pids(accepted, "/nonexistent") == []
    a, b = socket.socketpair()
    with a, b:
        assert loopback_peer_pids(a) is None
