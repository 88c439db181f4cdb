"""Which Kubernetes pod holds each GPU: the kubelet's pod-resources API.

The kubelet serves ``PodResourcesLister`` (``k8s.io/kubelet/pkg/apis/podresources/v1``,
GA since Kubernetes 1.28) over gRPC on a unix socket, by default
``/var/lib/kubelet/pod-resources/kubelet.sock``. Its ``List`` call answers, for every pod on
the node, the devices each container was allocated. The NVIDIA device plugin allocates GPUs as
resource ``nvidia.com/gpu`` and names each by:

* the GPU's UUID, ``GPU-…`` (its default ``deviceIDStrategy=uuid``), as NVML reports it;
* its index, ``0``, ``1``, … (``deviceIDStrategy=index``);
* either of these with ``::<replica>`` appended when the GPU is shared (time-slicing, MPS),
  so several pods can hold one GPU;
* ``MIG-…`` for a MIG instance. The agent reads whole GPUs, so MIG instances are not mapped
  (counted in :attr:`PodResources.unmapped` and said once in the log).

The agent uses this to name the pod (``<namespace>/<pod>``) of a GPU whose processes carry no
job in their environment: the process cgroup gives only the pod's UID, and a GPU a pod holds
while it is between processes (loading data, restarting) has no process at all.

The messages are declared here, field numbers as in the upstream ``api.proto``; only the fields
the agent reads are declared, and protobuf skips the others (CPU ids, memory, topology, DRA
claims) as unknown fields, so newer kubelets that add fields keep working.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpuwarden.collector.errors import CollectorError

log = logging.getLogger(__name__)
# grpc's C core would print its own INFO lines to stderr (e.g. at every kubelet restart); the
# agent logs what matters itself. Read when grpc is first imported; an explicit setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
GPU_RESOURCE = "nvidia.com/gpu"
# After this long without a successful answer the last map is dropped: a pod that ended while
# the kubelet was unreachable must not keep its name on an idle GPU for ever.
STALE_AFTER_S = 300.0

_STRING, _MESSAGE = "string", "message"
_SCHEMA: dict[str, list[tuple[str, int, str, str]]] = {
    # message: [(field, number, type, message type of a nested field)]
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, "PodResources")],
    "PodResources": [
        ("name", 1, _STRING, ""),
        ("namespace", 2, _STRING, ""),
        ("containers", 3, _MESSAGE, "ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _STRING, ""),
        ("devices", 2, _MESSAGE, "ContainerDevices"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _STRING, ""),
        ("device_ids", 2, _STRING, ""),
    ],
}
_REPEATED = {"pod_resources", "containers", "devices", "device_ids"}


@functools.cache
def messages() -> dict[str, Any]:
    """The message classes, built from :data:`_SCHEMA` in a pool of their own (no generated
    code, so no protobuf gencode/runtime version pairing to keep). Built on first use: an
    agent on a node without Kubernetes never imports protobuf."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(
        name="gpuwarden/podresources_v1.proto", package="v1", syntax="proto3"
    )
    spec = descriptor_pb2.FieldDescriptorProto
    kinds = {_STRING: spec.TYPE_STRING, _MESSAGE: spec.TYPE_MESSAGE}
    for name, fields in _SCHEMA.items():
        msg = fd.message_type.add(name=name)
        for field, number, kind, nested in fields:
            f = msg.field.add(name=field, number=number, type=kinds[kind])
            f.label = spec.LABEL_REPEATED if field in _REPEATED else spec.LABEL_OPTIONAL
            if nested:
                f.type_name = f".v1.{nested}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
        for name in _SCHEMA
    }


class PodResourcesError(CollectorError):
    """The kubelet could not be asked, or its answer could not be read."""


@dataclass(frozen=True, slots=True)
class Holder:
    """A container holding (part of) a GPU."""

    namespace: str
    pod: str
    container: str

    @property
    def job(self) -> str:
        return f"{self.namespace}/{self.pod}"


def device_key(device_id: str) -> str:
    """The GPU a device plugin id names (``GPU-…`` or an index), without a sharing replica
    suffix; ``""`` for ids that do not name a whole GPU (MIG instances)."""
    gpu = device_id.split("::", 1)[0].strip()
    if gpu.startswith("GPU-") or gpu.isdigit():
        return gpu
    return ""


def gpu_holders(
    response: Any, resources: Iterable[str] = (GPU_RESOURCE,)
) -> tuple[dict[str, list[Holder]], list[str]]:
    """``{GPU UUID or index: holders}`` from a ``ListPodResourcesResponse``, and the device ids
    of the wanted resources that name no whole GPU."""
    wanted = set(resources)
    held: dict[str, list[Holder]] = {}
    unmapped: list[str] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name not in wanted:
                    continue
                for device_id in devices.device_ids:
                    key = device_key(device_id)
                    if not key:
                        unmapped.append(device_id)
                        continue
                    holder = Holder(pod.namespace, pod.name, container.name)
                    if holder not in held.setdefault(key, []):
                        held[key].append(holder)
    return held, unmapped


class PodResourcesClient:
    """One ``List`` call per :meth:`list`, over the kubelet's socket, with a deadline."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 1.0) -> None:
        import grpc

        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._grpc = grpc
        # the kubelet's own pod-resources client allows 16 MiB answers; so do we
        self._channel = grpc.insecure_channel(
            f"unix://{os.path.abspath(socket_path)}",
            options=[("grpc.max_receive_message_length", 16 << 20)],
        )
        # bytes both ways: the answer is decoded below, so a bad one gets our error message
        # rather than grpc's logged traceback
        self._list: Callable[..., bytes] = self._channel.unary_unary(LIST_METHOD)
        self._request = messages()["ListPodResourcesRequest"]().SerializeToString()

    def list(self) -> Any:
        """The kubelet's ``ListPodResourcesResponse``; :class:`PodResourcesError` otherwise."""
        from google.protobuf.message import DecodeError

        try:
            data = self._list(self._request, timeout=self.timeout_s)
        except self._grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            name = code.name if code is not None else "UNKNOWN"
            details = e.details() if hasattr(e, "details") else str(e)
            raise PodResourcesError(f"{name}: {details}") from e
        try:
            return messages()["ListPodResourcesResponse"].FromString(data)
        except DecodeError as e:
            raise PodResourcesError(
                f"the answer ({len(data)} bytes) is not a ListPodResourcesResponse: {e}"
            ) from e

    def close(self) -> None:
        self._channel.close()


class PodResources:
    """The GPU → pod map the agent tags with, kept fresh without asking every cycle.

    :meth:`refresh` asks the kubelet when ``refresh_s`` has passed since the last answer, or
    sooner when the caller saw the GPUs' processes change (a pod started or ended). A failed
    call is retried after ``refresh_s`` (not on every change), so a kubelet that is down costs
    at most one deadline per ``refresh_s``; it is logged once per failure streak and again when
    the kubelet answers. The last good map is kept through failures for
    :data:`STALE_AFTER_S`. A socket that does not exist (a node without Kubernetes) is not an
    error: the map is empty and nothing is asked.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        refresh_s: float = 30.0,
        timeout_s: float = 1.0,
        resources: Iterable[str] = (GPU_RESOURCE,),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.resources = tuple(resources)
        self.clock = clock
        self.held: dict[str, list[Holder]] = {}
        self.unmapped: list[str] = []
        self.calls = 0
        self.failures = 0
        self._client: PodResourcesClient | None = None
        self._asked_at = -float("inf")
        self._answered_at = -float("inf")
        self._failing = ""
        self._said_unmapped = False

    def refresh(self, changed: bool = False) -> None:
        now = self.clock()
        since = now - self._asked_at
        if since < self.refresh_s and not (changed and not self._failing):
            return
        self._asked_at = now
        if not os.path.exists(self.socket_path):
            # No kubelet on this node; or one restarting (it makes its socket anew), which
            # counts as a failure while an earlier answer is kept.
            if self._answered_at > -float("inf"):
                self._failed(now, "the socket is gone")
            return
        try:
            if self._client is None:
                self._client = PodResourcesClient(self.socket_path, self.timeout_s)
            self.calls += 1
            held, unmapped = gpu_holders(self._client.list(), self.resources)
        except PodResourcesError as e:
            self._failed(now, str(e))
            return
        self._answered_at = now
        self.held, self.unmapped = held, unmapped
        if self._failing:
            log.warning("kubelet pod-resources at %s answers again", self.socket_path)
            self._failing = ""
        if unmapped and not self._said_unmapped:
            self._said_unmapped = True
            log.warning(
                "kubelet pod-resources: %d allocated device(s) name no whole GPU (MIG "
                "instances?), e.g. %s; their GPUs are not tagged with a pod",
                len(unmapped),
                unmapped[0],
            )

    def _failed(self, now: float, message: str) -> None:
        self.failures += 1
        self._drop_client()  # a restarted kubelet listens on a new socket: connect afresh
        if message != self._failing:
            log.warning(
                "kubelet pod-resources at %s: %s; asked again every %.0f s; meanwhile GPUs keep "
                "the last answer (for at most %.0f s) or the pod UID of their processes' cgroup",
                self.socket_path,
                message,
                self.refresh_s,
                STALE_AFTER_S,
            )
        self._failing = message
        if now - self._answered_at > STALE_AFTER_S:
            self.held, self.unmapped = {}, []

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def holders(self, uuid: str, index: int) -> list[Holder]:
        """The containers holding the GPU with this UUID (or, for ``index`` device ids, this
        index); several when the GPU is shared."""
        return self.held.get(uuid) or self.held.get(str(index)) or []

    def close(self) -> None:
        self._drop_client()
