"""Issue 39: a standby engine. Two ``gpuwarden remediate serve`` under one lease in a REAL
PostgreSQL, draining nodes of a REAL Slurm; the acting one is SIGKILLed at random journal
boundaries of CONSTRUCTED findings' plans; the standby takes over, the sender (listing both
URLs) finds it, and every drain happens exactly once (the audit and Slurm agree). How fast
the standby takes over is measured by the benchmark, not asserted here (a loaded machine).
``benchmarks/failover.py`` runs 20 plans and prints ``failover_p95_s=``."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.core.config import ConfigError
from gpuwarden.core.poster import FindingPoster, engine_urls
from gpuwarden.remediation.audit import read_records
from gpuwarden.remediation.cli import standby
from gpuwarden.remediation.config import load_config
from gpuwarden.remediation.lease import LeaseLostError, PostgresLease
from testbed.influxd import free_port
from testbed.postgres import LocalPostgres, postgres_available
from testbed.slurm import LocalSlurm, slurm_available
from tests.engine_pair import ROOT, EnginePair, drains
from tests.remediation_util import poll, risk
from tests.scripted_server import Reply, ScriptedServer

pytestmark = pytest.mark.skipif(
    not postgres_available(), reason="scripts/bootstrap.sh installs PostgreSQL"
)


@pytest.fixture(scope="module")
def pg() -> Iterator[LocalPostgres]:
    with LocalPostgres() as server:
        yield server


def test_one_engine_holds_the_lease_and_the_next_takes_it_when_it_goes(pg: LocalPostgres) -> None:
    first = PostgresLease(pg.dsn, "t-one", retry_s=0.05)
    second = PostgresLease(pg.dsn, "t-one", retry_s=0.05)
    other_cluster = PostgresLease(pg.dsn, "t-another", retry_s=0.05)
    never = threading.Event()
    assert first.acquire(never)
    assert other_cluster.acquire(never)  # another name, another lease
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    assert not second.acquire(stop)  # a standby while the first holds it
    assert second.tries > 3
    first.fence()  # confirmed just now
    first.release()
    with pytest.raises(LeaseLostError):
        first.fence()  # released: it may write nothing more
    assert second.acquire(never)  # the session ended, the lock with it
    second.release()
    other_cluster.release()


def test_an_engine_whose_session_is_ended_stops_writing_and_is_told(pg: LocalPostgres) -> None:
    """The server ends the session (an operator's pg_terminate_backend, a network cut seen by
    its keepalives): the holder's next check fails, it is told (the engine exits 75), and
    from then on its fence refuses every record."""
    lost: list[str] = []
    lease = PostgresLease(pg.dsn, "t-cut", retry_s=0.05, check_s=0.1, lost_after_s=2.0,
                          on_lost=lost.append)  # fmt: skip
    assert lease.acquire(threading.Event())
    lease.watch()
    admin = PostgresLease(pg.dsn, "t-admin")._connect()
    admin.execute("SELECT pg_terminate_backend(%s)", (lease._conn.info.backend_pid,))
    poll(lambda: lost, 10, "the holder to notice")
    with pytest.raises(LeaseLostError):
        lease.fence()
    standby = PostgresLease(pg.dsn, "t-cut", retry_s=0.05)
    assert standby.acquire(threading.Event())  # freed for the standby
    standby.release()
    lease.release()
    admin.close()


def test_a_silent_holder_is_fenced_before_the_server_could_free_its_lease(
    pg: LocalPostgres,
) -> None:
    """No confirmation for lost_after_s / 2 (a hung check, a paused VM): every record is
    refused, though no check has failed yet, well before the server drops the session."""
    now = [100.0]
    lease = PostgresLease(pg.dsn, "t-silent", lost_after_s=10.0, clock=lambda: now[0])
    assert lease.acquire(threading.Event())
    lease.fence()
    now[0] += 4.9
    lease.fence()
    now[0] += 0.2
    with pytest.raises(LeaseLostError):
        lease.fence()
    lease.release()


class Blackhole:
    """A TCP proxy to PostgreSQL that can be cut the way a network partition cuts: from
    :meth:`cut` on nothing passes and no error reaches the engine (its packets are taken and
    dropped); the server's side is closed ``free_after_s`` later, as the server's keepalives
    would notice the silence and end the session."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_off = threading.Event()
        self.server_sides: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.server_sides.append(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if not self.cut_off.is_set():
                with contextlib.suppress(OSError):
                    dst.sendall(data)

    def cut(self, free_after_s: float) -> None:
        self.cut_off.set()

        def free() -> None:
            for server in self.server_sides:
                with contextlib.suppress(OSError):
                    server.shutdown(socket.SHUT_RDWR)  # the server sees the session end
                server.close()

        threading.Timer(free_after_s, free).start()

    def close(self) -> None:
        self.listener.close()


def test_a_holder_cut_off_silently_stops_writing_before_the_server_frees_its_lease(
    pg: LocalPostgres,
) -> None:
    """A network partition: no error ever reaches the acting engine, and the server frees its
    lease only when its keepalives give up (lost_after_s). The engine must have stopped
    writing, and been told to exit, before the standby can hold the lease."""
    proxy = Blackhole(pg.port)
    lost: list[float] = []
    acting = PostgresLease(pg.dsn.replace(f"port={pg.port}", f"port={proxy.port}"), "t-cut-off",
                           check_s=0.2, lost_after_s=4.0,
                           on_lost=lambda why: lost.append(time.monotonic()))  # fmt: skip
    assert acting.acquire(threading.Event())
    acting.watch()
    time.sleep(0.5)
    acting.fence()  # confirmed through the proxy
    proxy.cut(free_after_s=acting.lost_after_s)
    refused: list[float] = []

    def watch_fence() -> None:
        while not refused:
            try:
                acting.fence()
            except LeaseLostError:
                refused.append(time.monotonic())
            time.sleep(0.01)

    threading.Thread(target=watch_fence, daemon=True).start()
    standby = PostgresLease(pg.dsn, "t-cut-off", retry_s=0.05)
    give_up = threading.Event()
    threading.Timer(60, give_up.set).start()  # a guard against a hang, not a speed limit
    assert standby.acquire(give_up)
    held_at = time.monotonic()
    assert refused and refused[0] < held_at  # it wrote nothing once the standby could act
    assert lost and lost[0] < held_at  # and it was told to exit before
    standby.release()
    acting.release()
    proxy.close()


def test_a_new_holder_acts_only_once_the_one_before_cannot(
    pg: LocalPostgres, tmp_path: Path
) -> None:
    """The holder's session is ended on the server's side (pg_terminate_backend; a PostgreSQL
    restart ends every session): the standby gets the lease at once, while the old holder
    learns it only at its next check and its fence still passes until then. The new holder
    must not act before the old one's fence refuses (before: it acted within milliseconds,
    up to check_s before the old one stopped)."""
    old = PostgresLease(pg.dsn, "gpuwarden-engine", check_s=0.9, lost_after_s=4.0,
                        on_lost=lambda why: None)  # fmt: skip
    assert old.acquire(threading.Event())
    old.watch()
    time.sleep(0.3)
    dsn = tmp_path / "dsn"
    dsn.write_text(pg.dsn)
    dsn.chmod(0o600)
    config_file = tmp_path / "r.toml"
    config_file.write_text(f'[engine]\naudit_log = "{tmp_path}/audit.jsonl"\n'
                           f'[lease]\ndsn_file = "{dsn}"\nretry_s = 0.02\ncheck_s = 0.9\n'
                           'lost_after_s = 4.0\n')  # fmt: skip
    refused: list[float] = []

    def watch_fence() -> None:
        while not refused:
            try:
                old.fence()
            except LeaseLostError:
                refused.append(time.monotonic())
            time.sleep(0.005)

    threading.Thread(target=watch_fence, daemon=True).start()
    admin = PostgresLease(pg.dsn, "t-admin")._connect()
    admin.execute("SELECT pg_terminate_backend(%s)", (old._conn.info.backend_pid,))
    acting, new = standby(load_config(config_file), threading.Event())
    acts_at = time.monotonic()
    assert acting and new is not None
    assert refused and refused[0] < acts_at, "both engines could write"
    new.release()
    old.release()
    admin.close()


def test_senders_list_engines_and_post_to_the_one_that_answers() -> None:
    assert engine_urls("http://a:1/v1/findings, http://b:2/v1/findings") == [
        "http://a:1/v1/findings",
        "http://b:2/v1/findings",
    ]
    for bad in ("", " , ", "http://a/ ftp://b/", "https://a/v1/findings http://b/v1/findings"):
        with pytest.raises(ConfigError):
            engine_urls(bad)
    nobody = f"http://127.0.0.1:{free_port()}/v1/findings"  # a standby does not listen
    with ScriptedServer([], default=Reply(202, "{}")) as srv:
        poster = FindingPoster(f"{nobody} {srv.url}/v1/findings")
        poster.post(risk("gpu01"))
        poster.post(risk("gpu02"))
        poster.close(timeout_s=10)
        assert poster.posted == 2 and poster.failed == 0
        assert poster.url == f"{srv.url}/v1/findings"  # kept: the second went straight there
        assert len(srv.requests) == 2


def test_a_refusal_from_another_address_does_not_take_the_findings() -> None:
    """The engine posted to is down for a moment and another address in the list answers 404
    (a stale address, now some other web server): that refusal is not believed over the
    engine, and once the engine is back, the findings go to it (before: the 404 became the
    address posted to, and every finding after was refused there for good)."""
    with ScriptedServer([], default=Reply(404, "not here")) as stray:
        port = free_port()
        engine_url = f"http://127.0.0.1:{port}/v1/findings"
        poster = FindingPoster(f"{engine_url} {stray.url}/v1/findings")
        assert poster._try(b"{}")[0] == "retry"  # the engine is down; the stray says 404
        assert poster.url == engine_url
        with ScriptedServer([], default=Reply(202, "{}"), port=port) as engine:
            poster.post(risk("gpu01"))
            poster.close(timeout_s=10)
            assert poster.posted == 1 and len(engine.requests) == 1


def test_a_standby_does_not_listen_and_stops_cleanly(pg: LocalPostgres, tmp_path: Path) -> None:
    held = PostgresLease(pg.dsn, "gpuwarden-engine")
    assert held.acquire(threading.Event())
    try:
        dsn = tmp_path / "dsn"
        dsn.write_text(pg.dsn)
        dsn.chmod(0o600)
        port = free_port()
        config = tmp_path / "r.toml"
        config.write_text(f'[engine]\nlisten = "127.0.0.1:{port}"\n'
                          f'audit_log = "{tmp_path}/audit.jsonl"\nnotify_adapter = ""\n'
                          f'[lease]\ndsn_file = "{dsn}"\nretry_s = 0.1\n')  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(config), "serve"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        said: list[bytes] = []
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: said.extend(proc.stdout or ()), daemon=True)
        reader.start()
        # it says so once its SIGTERM handler is in place (a fixed sleep raced a slow start)
        poll(lambda: any(b"standby: waiting for the lease" in ln for ln in said), 60,
             "the engine to say it waits as a standby")  # fmt: skip
        time.sleep(1)  # ten lease tries at retry_s = 0.1
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
        assert not (tmp_path / "audit.jsonl").exists()  # a standby opens nothing
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        assert proc.returncode == 0, b"".join(said).decode()
    finally:
        held.release()


@pytest.mark.slow
@pytest.mark.skipif(not slurm_available(), reason="scripts/bootstrap.sh installs Slurm")
def test_the_standby_takes_over_and_no_drain_is_lost_or_repeated(
    pg: LocalPostgres, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as slurm:
        work = tmp_path_factory.mktemp("pair")
        pair = EnginePair(work, slurm, pg, seed=39)
        try:
            pair.start()
            for i in range(5):
                node = slurm.nodes[i % len(slurm.nodes)]
                pair.round(node)
                shown = slurm.run("scontrol", "show", "node", node)
                assert "DRAIN" in shown and "Reason=gpuwarden:" in shown, shown
        finally:
            pair.close()
    report = pair.report
    assert report.rounds == 5
    assert report.killed_in_journal + report.killed_between >= 5
    assert report.failovers_s, report  # (how fast: benchmarks/failover.py, not a test)
    records = list(read_records(work / "audit.jsonl"))
    for fid in report.findings:
        assert len(drains(work / "audit.jsonl", fid)) == 1, fid  # exactly once
        acts = [r for r in records if r["event"] == "decision" and r["finding_id"] == fid
                and r["verdict"] == "act"]  # fmt: skip
        assert len(acts) == 1, (fid, acts)
    takeovers = [r for r in records if r["event"] == "lease"]
    assert len(takeovers) >= 2  # the first engine, and at least one that took over
