"""``gpuwarden check``, the active node check: each probe passes, fails or says why it cannot run.

The sysfs trees (PCI devices, InfiniBand ports) are CONSTRUCTED; NVML answers come from the
CONSTRUCTED 8x H100 recording; ``dcgmi`` is a stand-in script on PATH (no DCGM here); the disk
probe writes to real directories; the all-reduce runs REAL torch.distributed on gloo (CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwarden.collector import check
from gpuwarden.collector.config import load_config
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
    r = probe(tmp_path, "allreduce", probe_timeout_s=300.0)  # two torch imports on a busy CPU
    assert r.status == "pass" and "over gloo" in r.detail, r.detail


def test_the_command_is_clear_on_a_machine_without_gpus(tmp_path: Path) -> None:
    """``gpuwarden check --json`` here (no GPU, no DCGM, no InfiniBand): every probe says pass,
    fail or unavailable, and why; it fails closed: a probe asked for that cannot run fails,
    unless ``[check] optional`` lists it (before: unavailable passed, exit 0)."""
    argv = [sys.executable, "-m", "gpuwarden", "check", "--json",
            "--probes", "infiniband,disk,dcgm,gpu_matmul"]  # fmt: skip
    strict = config(tmp_path, disk_paths=[str(tmp_path)])
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
    cfg = load_config(str(config(tmp_path, probe_timeout_s=60.0, deadline_s=1.0)))
    (r,) = check.run_checks(cfg, ["dcgm"], strict=True)
    assert r.status == "fail" and "what was left of the check's deadline_s" in r.detail, r
    assert r.seconds < 60.0  # cut at the deadline, not at the probe's own 60 s
    # not strict (nothing to end by), the probe's own timeout stands
    assert check._timeout(60.0) == (60.0, "60 s")


def test_the_report_has_a_budget_and_says_what_it_did_not_deliver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--report`` with InfluxDB and the engine not answering (a listener that never
    accepts a request's answer) waits what ``report_timeout_s`` allows in all; before: 10 s
    flush, 10 s close and 15 s for the post, 35 s past the probes, and it printed "posted"
    for a finding it had given up on."""
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # accepts, never answers
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    path = config(tmp_path, report_timeout_s=2.0)
    path.write_text(path.read_text().replace(
        "[agent]\n", f'[agent]\nremediation_url = "{url}/v1/findings"\n') +
        f'[sink]\nurl = "{url}"\nspool_dir = "{tmp_path}/spool"\n')  # fmt: skip
    cfg = load_config(str(path))
    waits: list[float] = []
    from gpuwarden.core import poster as poster_mod
    from gpuwarden.core.store import sink as sink_mod

    for cls, name in ((sink_mod.InfluxSink, "flush"), (sink_mod.InfluxSink, "close"),
                      (poster_mod.FindingPoster, "close")):  # fmt: skip
        real = getattr(cls, name)

        def asked(self: object, timeout_s: float = 0.0, _real: object = real) -> object:
            # FindingPoster.close may wait twice its timeout (the queue, then the last try)
            waits.append(timeout_s * (2 if isinstance(self, poster_mod.FindingPoster) else 1))
            return _real(self, timeout_s)  # type: ignore[operator]

        monkeypatch.setattr(cls, name, asked)
    made: list[float] = []
    real_init = poster_mod.FindingPoster.__init__

    def init(self: poster_mod.FindingPoster, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self.timeout_s)

    monkeypatch.setattr(poster_mod.FindingPoster, "__init__", init)
    real_sink_init = sink_mod.InfluxSink.__init__

    def sink_init(self: sink_mod.InfluxSink, cfg: object, *args: object, **kw: object) -> None:
        real_sink_init(self, cfg, *args, **kw)  # type: ignore[arg-type]
        made.append(self.config.timeout_s)

    monkeypatch.setattr(sink_mod.InfluxSink, "__init__", sink_init)
    results = [check.Result("disk", check.PASS, "fine")]
    said = check.report(cfg, "node-7", results, time.time_ns())
    hole.close()
    assert "node_check points spooled" in said, said
    assert "node_healthy NOT delivered" in said and "posted" not in said, said
    # every wait the report asked for fits the budget together (flush, close, the post), and
    # the sink's and the poster's requests are cut inside it
    assert len(waits) >= 3 and sum(waits) <= 2.0, waits  # (close flushes again, for 0 s)
    assert made and all(t <= 1.0 for t in made), made
