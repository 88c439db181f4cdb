"""The agent trusts no job (issue 38, item 2; issue 39, "the agent survives any job").

A job's user sets its environment (``SLURM_JOB_ID``, ``TORCHELASTIC_RUN_ID``, ``GPUWARDEN_JOB``,
``RANK``...); the system sets its cgroup. Each test drives the real agent process
(``python -m gpuwarden agent``). NVML answers are the CONSTRUCTED recording of the golden case
``xid-kmsg-job`` (2 H100s), with one process on each GPU at every tick, the test's own: real
child processes under the real ``/proc``, or pids of a procfs tree CONSTRUCTED by the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gpuwarden.core.store.lineprotocol.strict import parse_lines
from tests.scripted_server import ScriptedServer

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "golden" / "xid-kmsg-job" / "nvml.json"


def recording(tmp: Path, pids: tuple[int, int], model: str = "") -> Path:
    """The recording with one process on each GPU at every tick, ``pids``, (and, if given, GPU
    1's name replaced)."""
    data = json.loads(RECORDING.read_text())
    for tick in data["ticks"]:
        for gpu, pid in enumerate(pids):
            tick["answers"][f"{gpu}|nvmlDeviceGetComputeRunningProcesses|[]"] = {
                "v": [[pid, 75258312785]]
            }
        if model:
            tick["answers"]["1|nvmlDeviceGetName|[]"] = {"v": model}
    path = tmp / "nvml.json"
    path.write_text(json.dumps(data))
    return path


def agent_config(tmp: Path, nvml: Path, procfs: str, sink_url: str = "") -> Path:
    config = tmp / "agent.toml"
    config.write_text(
        f'[agent]\ncluster = "c"\nnode = "node-001"\ninterval_s = 0.05\nsources = ["nvml"]\n'
        f'procfs = "{procfs}"\nreporter_listen = ""\n'
        f'[nvml]\nbackend = "recorded"\nrecording = "{nvml}"\nloop = true\nevents = "poll"\n'
        f'jobmap_dir = ""\n'
        f'[sink]\nurl = "{sink_url or "http://127.0.0.1:9"}"\ndatabase = "x"\n'
        f'spool_dir = "{tmp / "spool"}"\nflush_interval_s = 0.05\n'
    )
    return config


def agent(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "agent", "--config", str(config), *args],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip


def gpu_tags(text: str) -> list[dict[str, str]]:
    """The tags of each ``gpu`` point in ``text`` (line protocol, read by the strict reader)."""
    return [dict(p.tags) for p in parse_lines(text, 0) if p.measurement == "gpu"]


def write_proc(procfs: Path, pid: int, environ: Mapping[str, str], cgroup: str) -> None:
    base = procfs / str(pid)
    base.mkdir(parents=True)
    (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))
    (base / "cgroup").write_text(cgroup)
    (base / "comm").write_text("python3\n")


def test_the_cgroup_names_the_job_not_the_environment(tmp_path: Path) -> None:
    """CONSTRUCTED procfs: a process in Slurm job 81300's cgroup that says it is job 90210
    (``SLURM_JOB_ID``, which its user sets) is tagged 81300; one that made itself a cgroup
    named ``job_77`` in its own systemd-delegated subtree is not job 77."""
    procfs = tmp_path / "proc"
    write_proc(procfs, 5000, {"SLURM_JOB_ID": "90210", "SLURM_PROCID": "3"},
               "0::/system.slice/slurmstepd.scope/job_81300/step_0/user/task_0\n")  # fmt: skip
    write_proc(procfs, 5001, {},
               "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_77\n")  # fmt: skip
    config = agent_config(tmp_path, recording(tmp_path, (5000, 5001)), str(procfs))
    done = agent(config, "--once")
    assert done.returncode == 0, done.stderr
    tags = {t["gpu"]: t for t in gpu_tags(done.stdout)}
    assert (tags["0"].get("job"), tags["0"].get("rank")) == ("81300", "3")
    assert "job" not in tags["1"]


# every character that can break a line-protocol tag, and a value past any sane length
HOSTILE = {
    "SLURM_JOB_ID": "1234\nfake,node=gpu99 power_w=1 0",
    "TORCHELASTIC_RUN_ID": "run\\",
    "GPUWARDEN_JOB": "a b,c=d\"e'f\rg",
    "RANK": "1\n",
    "LOCAL_RANK": "0 ",
    "SLURM_PROCID": "=",
    "SLURM_LOCALID": "x" * 100_000,
}
# a job whose first claim is unusable and second is a name: the second is taken
FALLBACK = {"SLURM_JOB_ID": "9" * 300, "TORCHELASTIC_RUN_ID": "llama-run", "RANK": "3"}


@contextmanager
def children(*environs: Mapping[str, str]) -> Iterator[list[int]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE, env={**env, "PATH": "/usr/bin:/bin"})
        for env in environs
    ]  # fmt: skip
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_hostile_job_environment_does_not_stop_the_agent(tmp_path: Path) -> None:
    """Two REAL processes under the real ``/proc``: one whose environment carries every
    hostile character in every variable attribution reads, one whose job id is too long and
    whose run id is fine. The agent runs its 3 cycles into its real sink (a loopback server
    answering 204): every cycle's GPU points arrive, the hostile values in none of them."""
    with (
        ScriptedServer([]) as influx,
        children(HOSTILE, FALLBACK) as pids,
    ):
        config = agent_config(tmp_path, recording(tmp_path, (pids[0], pids[1])), "/proc",
                              influx.url)  # fmt: skip
        done = agent(config, "--cycles", "3")
        body = b"\n".join(influx.bodies()).decode()
    assert done.returncode == 0, done.stderr
    tags = gpu_tags(body)
    assert sorted(t["gpu"] for t in tags) == ["0", "0", "0", "1", "1", "1"]
    assert all("job" not in t and "rank" not in t for t in tags if t["gpu"] == "0")
    assert all((t.get("job"), t.get("rank")) == ("llama-run", "3") for t in tags if t["gpu"] == "1")
    assert "fake" not in body and "gpu99" not in body and "xxxx" not in body


def test_a_point_the_encoder_refuses_is_dropped_and_counted(tmp_path: Path) -> None:
    """A hardware answer no grammar cleans: GPU 1's NVML name is CONSTRUCTED with a trailing
    backslash, which no line-protocol tag value can end with. Its points are dropped and
    counted in the sink's ``points_unencodable_total``; GPU 0's arrive every cycle."""
    procfs = tmp_path / "proc"
    procfs.mkdir()
    with ScriptedServer([]) as influx:
        nvml = recording(tmp_path, (4100, 4101), model="NVIDIA H100\\")
        done = agent(agent_config(tmp_path, nvml, str(procfs), influx.url), "--cycles", "3")
        body = b"\n".join(influx.bodies()).decode()
    assert done.returncode == 0, done.stderr
    assert sorted(t["gpu"] for t in gpu_tags(body)) == ["0", "0", "0"]
    counts = [
        int(field.split("=", 1)[1].rstrip("i"))
        for line in body.splitlines()
        if line.startswith("sink,")
        for field in line.split(" ")[1].split(",")
        if field.startswith("points_unencodable_total=")
    ]
    assert counts and counts[-1] > 0 and counts == sorted(counts)
