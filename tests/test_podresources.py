"""Kubernetes job attribution through the kubelet's pod-resources API.

The kubelet is :class:`testbed.kubelet.FakeKubelet`: a real gRPC server on a unix
socket, answering what each test allocates (SIMULATED pods; no cluster here). The kubelet's
answer in the wire-format test is encoded in this file by hand from the field numbers of the
upstream ``api.proto`` (independently of the message declarations under test), with the fields
a 1.31 kubelet sends that the agent does not read. NVML answers are the CONSTRUCTED 8x H100
recording, with each test's processes in place of the recorded ones.
"""

from __future__ import annotations

import io
import logging
import os
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuwarden.collector import cli as agent_cli
from gpuwarden.collector import sources
from gpuwarden.collector.nvml.recorded import RecordedBackend
from gpuwarden.collector.podresources import (
    STALE_AFTER_S,
    Holder,
    PodResources,
    device_key,
    gpu_holders,
    messages,
)
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.core.store.lineprotocol import Point
from testbed.kubelet import FakeKubelet
from tests.pod_env import in_a_pod
from tests.test_agent import write_config

H100 = Path(__file__).parent / "golden" / "nvml-h100-8gpu" / "nvml.json"
UUID = [f"GPU-{i:08x}-0000-4000-8000-{i:012x}" for i in range(8)]  # the recording's GPUs
POD_UID = "3f2c8a9e-1b7d-4c55-9e0a-6d2b1c4e8f10"


# -- the wire, encoded by hand ---------------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): strings, messages, packed repeats."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def text(number: int, value: str) -> bytes:
    return ld(number, value.encode())


def kubelet_answer() -> bytes:
    """A ListPodResourcesResponse as a 1.31 kubelet sends it (api.proto field numbers)."""
    numa0 = ld(3, ld(1, varint(1 << 3 | 0) + varint(0)))  # topology {nodes {ID: 0}}
    gpus = text(1, "nvidia.com/gpu") + text(2, UUID[0]) + text(2, UUID[1] + "::3") + numa0
    memory = text(1, "memory") + varint(2 << 3 | 0) + varint(1 << 34) + numa0
    claim = text(2, "gpu-claim") + text(3, "train") + ld(4, text(2, "gpu.nvidia.com"))
    trainer = (
        text(1, "trainer")
        + ld(2, gpus)
        + ld(3, varint(2) + varint(3))  # cpu_ids, packed
        + ld(4, memory)
        + ld(5, claim)  # dynamic_resources
    )
    sidecar = text(1, "sidecar") + ld(2, text(1, "rdma/hca_shared") + text(2, "mlx5_0"))
    llama = text(1, "llama-0") + text(2, "train") + ld(3, trainer) + ld(3, sidecar)
    mig = text(1, "nvidia.com/gpu") + text(2, "MIG-9b1e6a3c-5d4f-5e2a-8c7b-0a1b2c3d4e5f")
    infer = text(1, "infer-7") + text(2, "serve") + ld(3, text(1, "server") + ld(2, mig))
    plugin = text(1, "nvidia-device-plugin-x2k9") + text(2, "kube-system")
    return ld(1, llama) + ld(1, infer) + ld(1, plugin)


def test_a_kubelet_answer_with_fields_the_agent_does_not_read_decodes():
    response = messages()["ListPodResourcesResponse"].FromString(kubelet_answer())
    held, unmapped = gpu_holders(response)
    trainer = Holder("train", "llama-0", "trainer")
    assert held == {UUID[0]: [trainer], UUID[1]: [trainer]}  # the "::3" replica: the GPU
    assert unmapped == ["MIG-9b1e6a3c-5d4f-5e2a-8c7b-0a1b2c3d4e5f"]
    assert trainer.job == "train/llama-0"


def test_the_same_answer_through_grpc(tmp_path):
    sock = str(tmp_path / "kubelet.sock")
    with FakeKubelet(sock) as kubelet:
        kubelet.raw = kubelet_answer()
        pods = PodResources(sock)
        pods.refresh()
    assert pods.holders(UUID[1], 1) == [Holder("train", "llama-0", "trainer")]
    assert pods.holders(UUID[2], 2) == []
    assert (pods.calls, pods.failures) == (1, 0)


@pytest.mark.parametrize(
    ("device_id", "key"),
    [
        (UUID[3], UUID[3]),  # deviceIDStrategy=uuid, the plugin's default
        ("5", "5"),  # deviceIDStrategy=index
        (UUID[3] + "::0", UUID[3]),  # time-sliced replica
        ("5::12", "5"),
        ("MIG-9b1e6a3c-5d4f-5e2a-8c7b-0a1b2c3d4e5f", ""),
        ("nvidia0/gi0", ""),
        ("", ""),
    ],
)
def test_device_ids_name_whole_gpus(device_id, key):
    assert device_key(device_id) == key


# -- the NVML source tags GPUs with pods -------------------------------------------------------


class Processes(RecordedBackend):
    """The CONSTRUCTED H100 recording with the processes this test puts on each GPU."""

    def __init__(self) -> None:
        super().__init__(H100, loop=True)
        self.on: dict[int, list[list[int]]] = {}

    def call(self, device: int | None, name: str, *args: Any) -> Any:
        if name == "nvmlDeviceGetComputeRunningProcesses" and device is not None:
            return self.on.get(device, [])
        return super().call(device, name, *args)


def pod_process(procfs: Path, pid: int, environ: str = "") -> None:
    """A process of pod POD_UID as cgroup v2 on a systemd kubelet shows it."""
    base = procfs / str(pid)
    base.mkdir(parents=True)
    scope = f"kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-ab12.scope"
    (base / "cgroup").write_text(f"0::/kubepods.slice/kubepods-burstable.slice/{scope}\n")
    (base / "environ").write_bytes(environ.encode())


@pytest.fixture
def node(tmp_path):
    procfs = tmp_path / "proc"
    procfs.mkdir()
    sock = str(tmp_path / "kubelet.sock")
    kubelet = FakeKubelet(sock).start()
    backend = Processes()
    ctx = SourceContext("k8s", "node-0", sysfs=tmp_path / "sys", procfs=procfs)
    settings = {"backend_instance": backend, "events": "off", "pod_resources_socket": sock}
    nvml = sources.create("nvml", ctx, settings)
    yield nvml, backend, kubelet, procfs
    nvml.close()
    kubelet.stop()


def jobs(points: list[Point], measurement: str = "gpu") -> dict[int, str]:
    return {
        int(p.tags["gpu"]): p.tags.get("job", "") for p in points if p.measurement == measurement
    }


def test_gpus_are_tagged_with_the_pod_that_holds_them(node):
    nvml, backend, kubelet, procfs = node
    pod_process(procfs, 4100)
    pod_process(procfs, 4101, "TORCHELASTIC_RUN_ID=llama-run\0RANK=9\0LOCAL_RANK=1\0")
    backend.on = {0: [[4100, 1 << 30]], 1: [[4101, 1 << 30]]}
    kubelet.allocate("train", "llama-0", [UUID[0], UUID[1], UUID[2]])
    points = nvml.collect(1)
    gpu = jobs(points)
    assert gpu[0] == "train/llama-0"  # the cgroup's pod UID, named by the kubelet
    # the cgroup (the system's word) wins over a job the environment claims (issue 38); the
    # rank, which only the environment knows, is kept
    assert gpu[1] == "train/llama-0"
    assert gpu[2] == "train/llama-0"  # held by the pod, no process yet
    assert gpu[3] == ""
    assert jobs(points, "gpu_process") == {0: "train/llama-0", 1: "train/llama-0"}
    # the pod UID is remembered under that name: the relay holds the pod's reports to it
    assert nvml.context.inventory.jobs.pods_named() == {f"pod-{POD_UID}": "train/llama-0"}
    rank = next(p for p in points if p.measurement == "gpu" and p.tags["gpu"] == "1")
    assert (rank.tags["rank"], rank.tags["local_rank"]) == ("9", "1")


def test_a_gpu_shared_by_two_pods_keeps_the_process_pod_uid(node):
    nvml, backend, kubelet, procfs = node
    pod_process(procfs, 4100)
    backend.on = {0: [[4100, 1 << 30]]}
    kubelet.allocate("train", "a", [UUID[0] + "::0"])
    kubelet.allocate("train", "b", [UUID[0] + "::1"])
    kubelet.allocate("train", "c", ["1::0", "1::1"])  # one pod, two replicas: still one pod
    gpu = jobs(nvml.collect(1))
    assert gpu[0] == f"pod-{POD_UID}"
    assert gpu[1] == "train/c"


def test_a_pod_on_another_pods_gpu_is_not_named_as_that_pod(node, tmp_path):
    """Review of issue 38's pod rule: a pod that sees every GPU (or a privileged one) runs on
    the GPU the kubelet gave pod A. Its UID must not become A's name (it could then write A's
    points over the relay's socket and not its own): with two pod UIDs on the GPU, neither is
    named; a UID once named A and then seen on another pod's GPU is named neither."""
    nvml, backend, kubelet, procfs = node
    pod_process(procfs, 4100)  # pod POD_UID
    other = "bbbbbbbb-cccc-dddd-eeee-ffffffffffff"
    base = procfs / "4200"
    base.mkdir(parents=True)
    (base / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{other.replace('-', '_')}.slice/cri-containerd-cd.scope\n"
    )
    backend.on = {0: [[4100, 1 << 30], [4200, 1 << 20]]}
    kubelet.allocate("train", "llama-0", [UUID[0]])
    nvml.collect(1)
    assert nvml.context.inventory.jobs.pods_named() == {}
    # alone on A's GPU, then alone on B's: named A, then neither
    backend.on = {0: [[4100, 1 << 30]]}
    nvml.collect(2)
    assert nvml.context.inventory.jobs.pods_named() == {f"pod-{POD_UID}": "train/llama-0"}
    kubelet.allocate("train", "other-0", [UUID[1]])
    pod_process(procfs, 4101)  # the same pod, a new process: the kubelet is asked again
    backend.on = {1: [[4101, 1 << 30]]}
    nvml.collect(3)
    assert nvml.context.inventory.jobs.pods_named() == {}


def test_the_kubelet_is_asked_when_processes_change_not_every_cycle(node):
    nvml, backend, kubelet, procfs = node
    kubelet.allocate("train", "old", [UUID[0]])
    for _ in range(5):
        assert jobs(nvml.collect(1))[0] == "train/old"
    assert kubelet.calls == 1  # refresh_s (30 s) has not passed
    kubelet.release("train", "old")
    kubelet.allocate("train", "new", [UUID[0]])
    pod_process(procfs, 4100)
    backend.on = {0: [[4100, 1 << 30]]}  # the new pod's process appears
    assert jobs(nvml.collect(1))[0] == "train/new"  # asked before tagging
    assert kubelet.calls == 2


def test_a_kubelet_that_fails_costs_tags_not_data(node, caplog):
    nvml, backend, kubelet, procfs = node
    pod_process(procfs, 4100)
    backend.on = {0: [[4100, 1 << 30]]}
    kubelet.allocate("train", "llama-0", [UUID[0]])
    assert jobs(nvml.collect(1))[0] == "train/llama-0"
    for failure in (grpc.StatusCode.UNAVAILABLE, b"\xff\xff garbage", "stopped"):
        if isinstance(failure, grpc.StatusCode):
            kubelet.fail = failure
        elif isinstance(failure, bytes):
            kubelet.fail, kubelet.raw = None, failure
        else:
            kubelet.stop()
        nvml.tagger.pods._asked_at = -float("inf")  # the next cycle is due to ask
        with caplog.at_level(logging.WARNING):
            points = nvml.collect(1)
        assert len([p for p in points if p.measurement == "gpu"]) == 8  # nothing lost
        assert jobs(points)[0] == "train/llama-0"  # the last answer is kept a while
    said = [r.getMessage() for r in caplog.records if "pod-resources" in r.getMessage()]
    assert len(said) == 3 and "UNAVAILABLE" in said[0]
    assert "not a ListPodResourcesResponse" in said[1] and "socket is gone" in said[2]
    kubelet.raw = None
    kubelet.start()  # a restarted kubelet makes its socket anew
    nvml.tagger.pods._asked_at = -float("inf")
    with caplog.at_level(logging.WARNING):
        assert jobs(nvml.collect(1))[0] == "train/llama-0"
    assert "answers again" in caplog.records[-1].getMessage()


def test_a_slow_kubelet_is_cut_off_at_the_deadline(tmp_path):
    sock = str(tmp_path / "kubelet.sock")
    with FakeKubelet(sock) as kubelet:
        kubelet.allocate("train", "llama-0", [UUID[0]])
        kubelet.delay_s = 1.0
        pods = PodResources(sock, timeout_s=0.2)
        pods.refresh()
    assert pods.failures == 1 and pods.held == {}


def test_the_last_answer_is_dropped_when_the_kubelet_stays_away(tmp_path):
    now = [0.0]
    sock = str(tmp_path / "kubelet.sock")
    kubelet = FakeKubelet(sock).start()
    kubelet.allocate("train", "llama-0", [UUID[0]])
    pods = PodResources(sock, refresh_s=30.0, clock=lambda: now[0])
    pods.refresh()
    kubelet.stop()
    asked = pods.calls
    for t in range(1, 12):  # 11 cycles of 10 s, processes changing in each
        now[0] = t * 10.0
        pods.refresh(changed=True)
    # asked at the first change (10 s), then, failing, only every refresh_s: 40, 70, 100 s
    assert pods.failures == 4
    assert pods.calls == asked  # the socket is gone: no call was even made
    assert pods.holders(UUID[0], 0)  # kept: the kubelet was away for less than STALE_AFTER_S
    now[0] = STALE_AFTER_S + 1.0
    pods.refresh()
    assert pods.holders(UUID[0], 0) == []


def test_a_node_without_kubernetes_asks_nothing(tmp_path):
    pods = PodResources(str(tmp_path / "no-kubelet.sock"))
    pods.refresh()
    assert (pods.calls, pods.failures, pods.held) == (0, 0, {})
    assert not os.path.exists(tmp_path / "no-kubelet.sock")


def test_the_agent_configuration_reaches_the_kubelet(tmp_path):
    """``gpuwarden agent --once`` with ``[nvml] pod_resources_*`` set in its TOML file: the
    recording's processes have no environment or cgroup here, so every GPU the fake kubelet
    allocated is tagged by the pod-resources answer alone (index device ids, a renamed
    resource)."""
    sock = str(tmp_path / "kubelet.sock")
    config = write_config(tmp_path)
    config.write_text(
        config.read_text().replace(
            'jobmap_dir = ""',
            f'jobmap_dir = ""\npod_resources_socket = "{sock}"\n'
            'pod_resources_names = ["example.com/accelerator"]',
        )
    )
    out = io.StringIO()
    with FakeKubelet(sock) as kubelet, redirect_stdout(out):
        kubelet.allocate("train", "llama-0", ["0", "1"], resource="example.com/accelerator")
        kubelet.allocate("train", "other", ["2"])  # nvidia.com/gpu: not a configured name
        assert agent_cli.main(["--config", str(config), "--once"]) == 0
    gpu = [ln for ln in out.getvalue().splitlines() if ln.startswith("gpu,")]
    tagged = sorted(ln.split(",gpu=")[1].split(",")[0] for ln in gpu if "job=train/" in ln)
    assert tagged == ["0", "1"]
    assert kubelet.calls == 1


def test_the_reporter_in_a_pod_names_the_job_as_the_agent_does(node, tmp_path, monkeypatch):
    """MFU joins the reporter's steps with the agent's GPU points by job: inside a pod with no
    job in its environment both must say ``<namespace>/<pod>``."""
    from gpuwarden.collector.attribution import parse_environ
    from gpuwarden.collector.jobside.reporter import Reporter, pod_job

    nvml, backend, kubelet, procfs = node
    pod_process(procfs, 4100)
    backend.on = {0: [[4100, 1 << 30]]}
    kubelet.allocate("train", "llama-0", [UUID[0]])
    agent_job = jobs(nvml.collect(1))[0]
    namespace = tmp_path / "namespace"
    namespace.write_text("train\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "llama-0"}
    assert pod_job(env, str(namespace)) == agent_job == "train/llama-0"
    assert pod_job(env | {"POD_NAMESPACE": "other"}, "/nonexistent") == "other/llama-0"
    assert pod_job({"HOSTNAME": "llama-0"}, str(namespace)) == ""  # not in Kubernetes
    assert pod_job(env, "/nonexistent") == ""  # no namespace known: no guess
    # with a job in the environment, both take it, in the same order of preference
    for job_env in (
        {"SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "r", "GPUWARDEN_JOB": "g"},
        {"TORCHELASTIC_RUN_ID": "r", "GPUWARDEN_JOB": "g"},
        {"GPUWARDEN_JOB": "g"},
    ):
        for key in (
            "SLURM_JOB_ID",
            "TORCHELASTIC_RUN_ID",
            "GPUWARDEN_JOB",
            "KUBERNETES_SERVICE_HOST",
        ):
            monkeypatch.delenv(key, raising=False)
        for key, value in job_env.items():
            monkeypatch.setenv(key, value)
        environ = "".join(f"{k}={v}\0" for k, v in job_env.items()).encode()
        assert Reporter(url="http://127.0.0.1:9").job == parse_environ(environ).job


def test_in_a_pod_the_reporter_names_the_pod_whatever_its_environment_says(
    node, tmp_path, monkeypatch, caplog
):
    """Review item 8: torchrun in a pod sets ``TORCHELASTIC_RUN_ID``; the agent tags the pod's
    GPUs ``<namespace>/<pod>`` all the same (its cgroup wins). Before, the reporter named the
    run id: its steps matched none of the job's GPUs, and the relay's socket refused them
    (403). Now, in a pod, the reporter names the pod; ``job=`` still wins, and the downward
    API's ``POD_NAME``/``POD_NAMESPACE`` win over the hostname and the service-account mount."""
    from gpuwarden.collector.jobside import reporter

    nvml, backend, kubelet, procfs = node
    pod_process(procfs, 4100, "TORCHELASTIC_RUN_ID=llama-run\0RANK=0\0")
    backend.on = {0: [[4100, 1 << 30]]}
    kubelet.allocate("train", "llama-0", [UUID[0]])
    agent_job = jobs(nvml.collect(1))[0]
    in_a_pod(monkeypatch, tmp_path)
    url = "http://127.0.0.1:9"
    assert reporter.Reporter(url=url).job == agent_job == "train/llama-0"
    assert reporter.Reporter("mine", url=url).job == "mine"
    # an Indexed Job's pod: its hostname is <job>-<index>, its name has a suffix more
    monkeypatch.setenv("HOSTNAME", "llama")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "0")
    with caplog.at_level("WARNING", logger=reporter.__name__):
        assert reporter.Reporter(url=url).job == "train/llama"  # a guess, and said so
    assert "set POD_NAME from the downward API" in caplog.text
    monkeypatch.setenv("POD_NAME", "llama-0")
    monkeypatch.setenv("POD_NAMESPACE", "train")
    (tmp_path / "namespace").write_text("other\n")
    assert reporter.Reporter(url=url).job == agent_job
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")  # not in Kubernetes: the environment's job
    assert reporter.Reporter(url=url).job == "llama-run"
