"""``gpuwarden check``, the active node check: each probe passes, fails or says why it cannot run.

The sysfs trees (PCI devices, InfiniBand ports) are CONSTRUCTED; NVML answers come from the
CONSTRUCTED 8x H100 recording; ``dcgmi`` is a stand-in script on PATH (no DCGM here); the disk
probe writes to real directories; the all-reduce runs REAL torch.distributed on gloo (CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuwarden.collector import check
from gpuwarden.collector.config import load_config
from gpuwarden.core.config import ConfigError
from testbed.sysfstree import build_node_tree, hca_port
from tests.test_gpucount import pci_tree

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "tests/golden/nvml-h100-8gpu/nvml.json"


def config(tmp: Path, **check_settings: object) -> Path:
    path = tmp / "agent.toml"
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in check_settings.items())
    path.write_text(
        f'[agent]\nnode = "node-7"\nsysfs = "{tmp}/sys"\n'
        f'[nvml]\nbackend = "recorded"\nrecording = "{H100}"\n'
        f"[health]\nexpected_gpus = 8\n[check]\n{extra}"
    )
    return path


def probe(tmp: Path, name: str, **settings: object) -> check.Result:
    return check.PROBES[name](load_config(str(config(tmp, **settings))))


def test_gpu_count(tmp_path: Path) -> None:
    pci_tree(tmp_path / "sys", 8)
    r = probe(tmp_path, "gpu_count")
    assert r.status == "pass" and "8 on the PCI bus; 8 seen by NVML" in r.detail, r.detail
    pci_tree(tmp_path / "sys", 9)
    r = probe(tmp_path, "gpu_count")
    assert r.status == "fail" and "9 on the PCI bus" in r.detail


def test_gpu_count_without_nvml_or_gpus(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(f'[agent]\nsysfs = "{tmp_path}/sys"\n[nvml]\nbackend = "recorded"\n'
                    f'recording = "{tmp_path}/none.json"\n')  # fmt: skip
    r = check.probe_gpu_count(load_config(str(path)))
    assert r.status == "unavailable" and "NVML not readable" in r.detail
    pci_tree(tmp_path / "sys", 8)  # GPUs on the bus that NVML cannot read: the driver is gone
    r = check.probe_gpu_count(load_config(str(path)))
    assert r.status == "fail" and "8 on the PCI bus, but NVML not readable" in r.detail


def test_infiniband(tmp_path: Path) -> None:
    assert probe(tmp_path, "infiniband").status == "unavailable"
    build_node_tree(tmp_path / "sys", hcas=4)
    assert probe(tmp_path, "infiniband").status == "pass"
    r = probe(tmp_path, "infiniband", ib_rate_gbps=800.0)
    assert r.status == "fail" and "4 of 4 ports down or slow" in r.detail
    (hca_port(tmp_path / "sys", "mlx5_2") / "state").write_text("1: DOWN\n")
    r = probe(tmp_path, "infiniband")
    assert r.status == "fail" and "mlx5_2/1: 1: DOWN" in r.detail


def test_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "scratch").mkdir()
    assert probe(tmp_path, "disk", disk_paths=[str(tmp_path / "scratch")]).status == "pass"
    r = probe(tmp_path, "disk", disk_paths=[str(tmp_path / "gone")])
    assert r.status == "fail" and "gone" in r.detail

    real_fsync = os.fsync

    def hung(fd: int) -> None:  # a mount that stops answering
        time.sleep(3)
        real_fsync(fd)

    monkeypatch.setattr(check.os, "fsync", hung)
    r = probe(tmp_path, "disk", disk_paths=[str(tmp_path / "scratch")], disk_timeout_s=0.5)
    assert r.status == "fail" and "no answer within 0.5 s" in r.detail


def test_dcgm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert probe(tmp_path, "dcgm").status == "unavailable"
    (tmp_path / "bin").mkdir()
    dcgmi = tmp_path / "bin/dcgmi"
    dcgmi.write_text('#!/bin/sh\necho "level $3"\nexit 0\n')
    dcgmi.chmod(0o755)
    r = probe(tmp_path, "dcgm", dcgm_level=2)
    assert r.status == "pass" and "dcgmi diag -r 2: exit 0 level 2" in r.detail
    dcgmi.write_text('#!/bin/sh\necho "Memory: Fail"\nexit 226\n')
    assert probe(tmp_path, "dcgm").status == "fail"


def test_allreduce_on_gloo(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    r = probe(tmp_path, "allreduce", probe_timeout_s=300.0, deadline_s=300.0)  # two torch imports
    assert r.status == "pass" and "over gloo" in r.detail, r.detail


def test_the_command_is_clear_on_a_machine_without_gpus(tmp_path: Path) -> None:
    """``gpuwarden check --json`` here (no GPU, no DCGM, no InfiniBand): every probe says pass,
    fail or unavailable, and why; it fails closed: a probe asked for that cannot run fails,
    unless ``[check] optional`` lists it (before: unavailable passed, exit 0)."""
    argv = [sys.executable, "-m", "gpuwarden", "check", "--json",
            "--probes", "infiniband,disk,dcgm,gpu_matmul"]  # fmt: skip
    # an InfiniBand site's setting: infiniband taken out of the default optional list
    strict = config(tmp_path, disk_paths=[str(tmp_path)], optional=["dcgm", "gpu_matmul"])
    done = subprocess.run([*argv, "--config", str(strict)], cwd=ROOT, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    status = {p["name"]: p["status"] for p in out["probes"]}
    assert status == {"infiniband": "fail", "disk": "pass", "dcgm": "unavailable",
                      "gpu_matmul": "unavailable"}  # fmt: skip
    ib = next(p for p in out["probes"] if p["name"] == "infiniband")
    assert ib["detail"].startswith("could not run:") and "[check] optional" in ib["detail"]
    cfg = config(tmp_path, disk_paths=[str(tmp_path)],
                 optional=["infiniband", "dcgm", "gpu_matmul"])  # fmt: skip
    done = subprocess.run([*argv, "--config", str(cfg)], cwd=ROOT, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] is True and out["node"] == "node-7"
    assert [p["name"] for p in out["probes"]] == ["infiniband", "disk", "dcgm", "gpu_matmul"]
    assert all(p["status"] in ("pass", "fail", "unavailable") and p["detail"]
               for p in out["probes"])  # fmt: skip
    pci_tree(tmp_path / "sys", 7)  # 7 of the 8 expected GPUs on the bus
    failed = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "check", "--config", str(cfg), "--probes",
         "gpu_count"], cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert failed.returncode == 1
    assert "FAIL" in failed.stdout and "node-7: NOT healthy" in failed.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "check", "--probes", "nope"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown probes ['nope']" in bad.stderr


def test_a_probe_running_at_the_deadline_is_cut_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37, item 4: the check ends inside slurmd's 60 s. Before, ``deadline_s`` only
    kept probes from starting: a ``dcgmi diag`` started just before it ran its whole
    ``probe_timeout_s`` (the operator's review: 55 s and a drained healthy node)."""
    (tmp_path / "bin").mkdir()
    dcgmi = tmp_path / "bin/dcgmi"
    dcgmi.write_text("#!/bin/sh\nexec sleep 60\n")  # a diagnostic that takes its time
    dcgmi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")

    # a first probe takes half the deadline: dcgm, started then, has 1.5 s of its 3 s left
    def slow(cfg: object) -> check.Result:
        time.sleep(1.5)
        return check.Result("gpu_count", check.PASS, "")

    monkeypatch.setitem(check.PROBES, "gpu_count", slow)
    cfg = load_config(str(config(tmp_path, probe_timeout_s=3.0, deadline_s=3.0,
                                 disk_timeout_s=3.0)))  # fmt: skip
    _, r = check.run_checks(cfg, ["gpu_count", "dcgm"], strict=True)
    assert r.status == "fail" and "what was left of the check's deadline_s" in r.detail, r
    # not strict (nothing to end by), the probe's own timeout stands
    assert check._timeout(60.0) == (60.0, "60 s")


class _Trickle:
    """An HTTP listener that answers one byte every 0.3 s (``trickle``), or at once with 204
    (counting the POSTs): a socket timeout does not bound the first."""

    def __init__(self, trickle: bool, status: bytes = b"204 No Content") -> None:
        import socket
        import threading

        self.posts = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.trickle, self.status = trickle, status
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: object) -> None:
        import socket

        assert isinstance(conn, socket.socket)
        try:
            conn.recv(65536)
            if not self.trickle:
                self.posts += 1
                body = b'{"error":"field type conflict"}' if self.status[:1] == b"4" else b""
                conn.sendall(b"HTTP/1.1 " + self.status + b"\r\nContent-Type: application/json"
                             b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
                return
            for byte in b"HTTP/1.1 204 No Content\r\nX-Slow: " + b"y" * 10_000:
                conn.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            pass
        finally:
            conn.close()


def _report_config(tmp: Path, influx: str, engine: str) -> Path:
    path = config(tmp, report_timeout_s=2.0)
    path.write_text(path.read_text().replace(
        "[agent]\n", f'[agent]\nremediation_url = "{engine}/v1/findings"\n') +
        f'[sink]\nurl = "{influx}"\nspool_dir = "{tmp}/spool"\n')  # fmt: skip
    return path


def test_the_report_is_cut_at_its_budget_whatever_the_servers_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--report`` gets ``report_timeout_s`` in all. Before: 10 s flush, 10 s close and 15 s
    for the post, 35 s past the probes, and a server that trickles (a socket timeout does not
    bound it) held it longer still; it printed "posted" for a finding it had given up on. The
    report now runs on a thread the check stops waiting for at the budget: here the work
    itself never ends, and the check still answers, saying what it did not do."""
    cfg = load_config(str(_report_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9")))
    import threading

    never = threading.Event()
    monkeypatch.setattr(check, "_report", lambda *a, **k: never.wait())
    said = check.report(cfg, "node-7", [check.Result("disk", check.PASS, "")], time.time_ns())
    assert said == "the report stopped: not finished within [check] report_timeout_s (2 s)"


def test_a_secret_on_a_hung_mount_does_not_hold_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--report`` reads its secret files before the probes; on a hung network mount a read
    never returns. Before, the check read them on its main thread and waited with it (past
    slurmd's limit, before a single probe ran); now the read gets the report's budget, the
    report is off, and the probes run and give their verdict. A hung read is played by a
    ``read_secret`` that waits (up to 60 s, so the code before this ends too, and fails)."""
    from gpuwarden.core import config as core_config

    pci_tree(tmp_path / "sys", 8)
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    path = _report_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9")
    path.write_text(path.read_text() + f'token_file = "{token}"\n')  # in [sink], the last
    hung = threading.Event()
    monkeypatch.setattr(core_config, "read_secret", lambda *a, **k: hung.wait(60) and "")
    try:
        code = check.main(["--config", str(path), "--probes", "gpu_count", "--report"])
    finally:
        hung.set()
    err = capsys.readouterr().err
    assert code == 0, err
    assert ("the results will not be reported: its secret files were not read within "
            "[check] report_timeout_s (2 s)") in err, err  # fmt: skip
    assert "posted to" not in err and "points" not in err, err


def test_the_engine_hears_a_pass_while_influxdb_trickles(tmp_path: Path) -> None:
    """The finding goes to the engine first, beside the write to InfluxDB: a passing check
    is what returns the node. Before, the post waited for the sink, and with InfluxDB
    trickling the engine received nothing (the operator's review: 0 POSTs)."""
    influx, engine = _Trickle(trickle=True), _Trickle(trickle=False)
    cfg = load_config(str(_report_config(tmp_path, influx.url, engine.url)))
    said = check.report(cfg, "node-7", [check.Result("disk", check.PASS, "")], time.time_ns())
    influx.sock.close()
    engine.sock.close()
    assert engine.posts == 1, said
    assert "node_healthy posted to" in said and "NOT delivered" not in said, said


def test_a_finding_not_delivered_is_said_so(tmp_path: Path) -> None:
    """Before: "posted" after every try had failed (8 tries, then given up)."""
    engine = _Trickle(trickle=True)
    cfg = load_config(str(_report_config(tmp_path, "http://127.0.0.1:9", engine.url)))
    said = check.report(cfg, "node-7", [check.Result("disk", check.FAIL, "x")], time.time_ns())
    engine.sock.close()
    assert "posted" not in said, said
    assert "node_check_failed NOT delivered" in said or "the report stopped" in said, said


def test_a_probe_that_cannot_be_cut_is_left_behind_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML's init and the matrix product run in this process: their own timeouts cannot cut
    them. Before, an init that hung ran past the deadline (the review: 5 s against 1 s);
    now the strict check stops waiting at the deadline (and GRACE_S) and fails it."""
    import threading

    never = threading.Event()
    monkeypatch.setattr(check, "GRACE_S", 0.0)
    monkeypatch.setitem(check.PROBES, "gpu_count", lambda cfg: never.wait())
    cfg = load_config(str(config(tmp_path, deadline_s=0.5, probe_timeout_s=0.5,
                                 disk_timeout_s=0.5)))  # fmt: skip
    (r,) = check.run_checks(cfg, ["gpu_count"], strict=True)
    assert r.status == "fail" and "did not finish by the check's deadline_s" in r.detail, r
    never.set()


@pytest.mark.parametrize(
    "bad",
    [
        {"report_timeout_s": float("inf")},
        {"deadline_s": 1e309},
        {"deadline_s": 1e10},
        {"report_timeout_s": 1e13},
    ],
)
def test_timeouts_the_check_cannot_keep_are_refused(tmp_path: Path, bad: dict[str, float]) -> None:
    """An infinite or huge budget (past threading's TIMEOUT_MAX) crashed the check
    (OverflowError past its except: the node was drained 'without naming a probe')."""
    from gpuwarden.core.config import ConfigError

    path = config(tmp_path)
    settings = "".join(f"{k} = {v!r}\n" for k, v in bad.items())  # inf and 1e309: TOML's inf
    path.write_text(path.read_text() + settings)
    with pytest.raises(ConfigError, match=next(iter(bad))):
        load_config(str(path))


def test_a_longer_probe_timeout_than_the_deadline_still_loads(tmp_path: Path) -> None:
    """The deadline cuts it; the agent (which shares this configuration) must still start
    (the review: scripts/nvml_real.sh's GPUWARDEN_CHECK_PROBE_TIMEOUT_S=120 exited 2)."""
    cfg = load_config(str(config(tmp_path, probe_timeout_s=120.0)))
    assert cfg["check"]["probe_timeout_s"] == 120.0


def test_a_check_that_is_not_strict_runs_its_probes(tmp_path: Path) -> None:
    """Before: the default (strict=False) waited math.inf, an OverflowError, every time."""
    (tmp_path / "scratch").mkdir()
    cfg = load_config(str(config(tmp_path, disk_paths=[str(tmp_path / "scratch")])))
    (r,) = check.run_checks(cfg, ["disk"])
    assert r.status == "pass", r


def _hung_gpu_count(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[int]]:
    """gpu_count replaced by a probe that hangs until the event is set (NVML's init on a GPU
    off the bus), no grace, nothing left behind yet; the event and a list of its starts."""
    never = threading.Event()
    starts: list[int] = []

    def hung(cfg: object) -> check.Result:
        starts.append(1)
        never.wait()
        return check.Result("gpu_count", check.PASS, "")

    monkeypatch.setattr(check, "GRACE_S", 0.0)
    monkeypatch.setitem(check.PROBES, "gpu_count", hung)
    monkeypatch.setattr(check, "_LEFT_BEHIND", {})
    return never, starts


def test_a_probe_left_behind_is_not_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's gate runs the check again and again: a hung probe left behind at each
    deadline piled up one thread a run (the review: 2, 3, 4, 5 alive). While it still runs,
    the next check fails it without starting another."""
    never, starts = _hung_gpu_count(monkeypatch)
    cfg = load_config(str(config(tmp_path, deadline_s=0.3, probe_timeout_s=0.3,
                                 disk_timeout_s=0.3)))  # fmt: skip
    results = [check.run_checks(cfg, ["gpu_count"], strict=True)[0] for _ in range(3)]
    assert [r.status for r in results] == ["fail"] * 3
    assert "not started again" in results[1].detail and "not started again" in results[2].detail
    assert len(starts) == 1
    never.set()


@pytest.mark.parametrize(
    ("given", "code"), [("gpu_count, disk", 0), ("disk,", 0), ("", 2), (" , ", 2)]
)
def test_the_probe_list_is_read_as_people_write_it(tmp_path: Path, given: str, code: int) -> None:
    """``--probes "gpu_count, disk"`` (a space) or a trailing comma was 'unknown probes' and
    exit 2 (a prolog that fails drains the node); an empty list is refused, not 'healthy'
    after checking nothing."""
    (tmp_path / "scratch").mkdir()
    pci_tree(tmp_path / "sys", 8)
    path = config(tmp_path, disk_paths=[str(tmp_path / "scratch")])
    done = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--config", str(path),
                           "--probes", given], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=300)  # fmt: skip
    assert done.returncode == code, done.stdout + done.stderr


def test_the_points_are_on_disk_when_influxdb_never_answers(tmp_path: Path) -> None:
    """The check's sink wrote behind (5 s in memory): with InfluxDB hanging, the report was
    cut mid-send and its points were lost, not left for the next --report (the review: an
    empty segment). Now they are on disk before the first send."""
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # accepts, never answers
    engine = _Trickle(trickle=False)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    cfg = load_config(str(_report_config(tmp_path, url, engine.url)))
    said = check.report(cfg, "node-7", [check.Result("disk", check.PASS, "")], time.time_ns())
    hole.close()
    engine.sock.close()
    stored = sum(f.stat().st_size for f in (tmp_path / "spool-check").glob("*") if f.is_file())
    assert stored > 0, said


def test_hcas_on_the_bus_without_ports_fail_even_when_optional(tmp_path: Path) -> None:
    """infiniband is optional by default (a node with no HCA passes it). A node whose HCAs
    are on the PCI bus (class 0x0207) but show no port (mlx5_ib not loaded after a repair,
    a failed card) passed too, and was handed back as checked (the review). It fails now,
    whatever [check] optional says; an Ethernet-only node (no 0x0207) is still unavailable."""
    pci_tree(tmp_path / "sys", 8)  # two ConnectX set to InfiniBand, no class/infiniband
    r = probe(tmp_path, "infiniband")
    assert r.status == "fail" and "2 InfiniBand controllers on the PCI bus" in r.detail, r
    cfg = load_config(str(config(tmp_path)))
    assert "infiniband" in cfg["check"]["optional"]
    (strict,) = check.run_checks(cfg, ["infiniband"], strict=True)
    assert strict.status == "fail", strict
    for dev in (tmp_path / "sys/bus/pci/devices").iterdir():
        if (dev / "class").read_text().startswith("0x0207"):
            (dev / "class").write_text("0x020000\n")  # the same cards set to Ethernet
    assert probe(tmp_path, "infiniband").status == "unavailable"


def test_an_hca_gone_from_a_node_fails_when_the_count_is_set(tmp_path: Path) -> None:
    """One HCA of eight fallen off the bus leaves seven ports ACTIVE, which pass; with
    [check] expected_hcas = 8 the node fails (and with none left, it fails too, not
    'unavailable', so [check] optional cannot pass it)."""
    build_node_tree(tmp_path / "sys", hcas=8)
    assert probe(tmp_path, "infiniband", expected_hcas=8).status == "pass"
    shutil.rmtree(tmp_path / "sys/class/infiniband/mlx5_5")
    assert probe(tmp_path, "infiniband").status == "pass"  # the gap the setting closes
    r = probe(tmp_path, "infiniband", expected_hcas=8)
    assert r.status == "fail" and "7 of the 8 InfiniBand devices expected" in r.detail, r
    (hca_port(tmp_path / "sys", "mlx5_2") / "state").write_text("1: DOWN\n")
    r = probe(tmp_path, "infiniband", expected_hcas=8)
    assert "7 of the 8" in r.detail and "1 of 7 ports down or slow" in r.detail, r
    shutil.rmtree(tmp_path / "sys/class/infiniband")
    cfg = load_config(str(config(tmp_path, expected_hcas=8)))
    (strict,) = check.run_checks(cfg, ["infiniband"], strict=True)
    assert strict.status == "fail" and "8 expected ([check] expected_hcas)" in strict.detail
    assert probe(tmp_path, "infiniband").status == "unavailable"  # not set: as before
    pci_tree(tmp_path / "sys", 8)  # the controllers still on the bus: the driver is named
    r = probe(tmp_path, "infiniband", expected_hcas=8)
    assert r.status == "fail" and "mlx5_ib" in r.detail and "8 expected" in r.detail, r


def test_the_hca_count_is_of_cards_not_ports_functions_or_extras(tmp_path: Path) -> None:
    """A card with two ports is one; an SR-IOV virtual function (device/physfn) comes and
    goes with sriov_numvfs and is not counted; more cards than expected pass (a RoCE bond
    not formed yet); [infiniband] hcas, when it lists some, is what is judged."""
    sysfs = tmp_path / "sys"
    build_node_tree(sysfs, hcas=4)
    shutil.copytree(hca_port(sysfs, "mlx5_0"), hca_port(sysfs, "mlx5_0").parent / "2")
    assert probe(tmp_path, "infiniband", expected_hcas=4).status == "pass"
    assert probe(tmp_path, "infiniband", expected_hcas=5).status == "fail"  # 5 ports, 4 cards
    assert probe(tmp_path, "infiniband", expected_hcas=3).status == "pass"
    (sysfs / "class/infiniband/mlx5_3/device").mkdir()
    (sysfs / "class/infiniband/mlx5_3/device/physfn").symlink_to(sysfs / "class/infiniband/mlx5_0")
    r = probe(tmp_path, "infiniband", expected_hcas=4)
    assert r.status == "fail" and "3 of the 4" in r.detail, r
    path = config(tmp_path, expected_hcas=2)
    path.write_text(path.read_text() + '[infiniband]\nhcas = ["mlx5_1", "mlx5_2"]\n')
    (hca_port(sysfs, "mlx5_0") / "state").write_text("1: DOWN\n")  # not one it watches
    assert check.probe_infiniband(load_config(str(path))).status == "pass"
    shutil.rmtree(sysfs / "class/infiniband/mlx5_2")
    r = check.probe_infiniband(load_config(str(path)))
    assert r.status == "fail" and "1 of the 2" in r.detail, r
    path.write_text(path.read_text().replace('"mlx5_1", "mlx5_2"', '"mlx5-1"'))  # a typo
    r = check.probe_infiniband(load_config(str(path)))
    assert r.status == "fail" and "of [infiniband] hcas: mlx5-1" in r.detail, r


def test_an_hca_count_below_zero_is_refused_and_one_from_the_environment_is_taken(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="expected_hcas must be 0 or more"):
        load_config(str(config(tmp_path, expected_hcas=-1)))
    cfg = load_config(str(config(tmp_path)), environ={"GPUWARDEN_CHECK_EXPECTED_HCAS": "8"})
    assert cfg["check"]["expected_hcas"] == 8


def test_a_hung_mount_is_not_written_to_again_while_a_write_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung NFS mount left one thread (and one open temporary file) behind per check: the
    agent's gate piled them up (the review: 1, 2, ... 5 alive). While a write there hangs,
    the next check fails that path without starting another."""
    import threading

    never = threading.Event()
    calls: list[int] = []

    def hung(fd: int) -> None:
        calls.append(fd)
        never.wait()

    (tmp_path / "scratch").mkdir()
    monkeypatch.setattr(check.os, "fsync", hung)
    monkeypatch.setattr(check, "_LEFT_BEHIND", {})
    cfg = load_config(str(config(tmp_path, disk_paths=[str(tmp_path / "scratch")],
                                 disk_timeout_s=0.2)))  # fmt: skip
    first = check.PROBES["disk"](cfg)
    again = [check.PROBES["disk"](cfg) for _ in range(3)]
    assert first.status == "fail" and "no answer within 0.2 s" in first.detail, first
    assert all(r.status == "fail" and "has not returned yet" in r.detail for r in again), again
    assert len(calls) == 1
    never.set()


def test_points_influxdb_refused_are_not_called_written(tmp_path: Path) -> None:
    """A 400 (a field type conflict) drops the batch for good; the report said 'written'
    (the review). It says REFUSED now."""
    influx, engine = _Trickle(trickle=False, status=b"400 Bad Request"), _Trickle(trickle=False)
    cfg = load_config(str(_report_config(tmp_path, influx.url, engine.url)))
    said = check.report(cfg, "node-7", [check.Result("disk", check.PASS, "")], time.time_ns())
    influx.sock.close()
    engine.sock.close()
    assert "REFUSED by InfluxDB" in said and "written" not in said, said


def test_two_checks_at_once_start_a_hung_probe_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate can start a check while another still waits (a critical event, a short
    healthy_after_s): the probe was recorded only after the wait, so both started it (the
    review: 2 instances). It is recorded before, under a lock."""
    never, starts = _hung_gpu_count(monkeypatch)
    cfg = load_config(str(config(tmp_path, deadline_s=0.5, probe_timeout_s=0.5,
                                 disk_timeout_s=0.5)))  # fmt: skip
    got: list[check.Result] = []
    checks = [threading.Thread(target=lambda: got.extend(check.run_checks(
        cfg, ["gpu_count"], strict=True))) for _ in range(2)]  # fmt: skip
    for t in checks:
        t.start()
    for t in checks:
        t.join()
    assert len(starts) == 1 and [r.status for r in got] == ["fail", "fail"], got
    never.set()
