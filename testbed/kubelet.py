"""A kubelet's pod-resources endpoint, for tests and demos on machines without Kubernetes.

It is the real thing on the wire: a gRPC server (grpcio) on a unix socket serving
``v1.PodResourcesLister/List`` with the messages of :mod:`collector.podresources`, so the
agent's client, its deadline, its channel and its decoding all run as they do against a
kubelet. What it answers is what the test allocated (:meth:`FakeKubelet.allocate`): nothing
here comes from a real cluster. It can also fail as a kubelet does (``fail`` a status code,
``delay_s`` past the caller's deadline, ``raw`` bytes that are not a valid answer) and go away
and come back (:meth:`stop`, :meth:`start`), which a restarting kubelet does with its socket.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent import futures
from typing import Any

import grpc

from gpuwarden.collector.podresources import GPU_RESOURCE, SERVICE, messages


class FakeKubelet:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        # (namespace, pod) -> {container: {resource: [device ids]}}
        self.pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self.fail: grpc.StatusCode | None = None
        self.delay_s = 0.0
        self.raw: bytes | None = None
        self.calls = 0
        self._lock = threading.Lock()
        self._server: Any = None

    # -- what the node holds ---------------------------------------------------------------

    def allocate(
        self,
        namespace: str,
        pod: str,
        device_ids: list[str],
        container: str = "main",
        resource: str = GPU_RESOURCE,
    ) -> None:
        with self._lock:
            containers = self.pods.setdefault((namespace, pod), {})
            containers.setdefault(container, {}).setdefault(resource, []).extend(device_ids)

    def release(self, namespace: str, pod: str) -> None:
        with self._lock:
            self.pods.pop((namespace, pod), None)

    def response(self) -> Any:
        """The ``ListPodResourcesResponse`` for what is allocated now."""
        out = messages()["ListPodResourcesResponse"]()
        with self._lock:
            for (namespace, pod), containers in self.pods.items():
                p = out.pod_resources.add(name=pod, namespace=namespace)
                for container, resources in containers.items():
                    c = p.containers.add(name=container)
                    for resource, ids in resources.items():
                        c.devices.add(resource_name=resource, device_ids=ids)
        return out

    # -- the server ------------------------------------------------------------------------

    def _list(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail is not None:
            context.abort(self.fail, "fake kubelet told to fail")
        return self.response()

    def _serialize(self, response: Any) -> bytes:
        return self.raw if self.raw is not None else bytes(response.SerializeToString())

    def start(self) -> FakeKubelet:
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=messages()["ListPodResourcesRequest"].FromString,
                    response_serializer=self._serialize,
                )
            },
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{os.path.abspath(self.socket_path)}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
