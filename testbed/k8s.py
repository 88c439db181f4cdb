"""A small Kubernetes API server on loopback, for tests and the demo (no real one can run here).

It speaks exactly the subset the Kubernetes adapter uses, with the semantics that matter:

* ``GET /api/v1/nodes`` (``labelSelector``, ``fieldSelector`` on ``metadata.name``) and
  ``GET/PATCH/PUT /api/v1/nodes/{name}``: PATCH takes JSON merge or strategic-merge patches
  (merged as a JSON merge patch, which is what they are for the fields the adapter touches);
  PUT checks ``metadata.resourceVersion`` and answers **409 Conflict** when it is stale, as the
  real server does for a read-modify-write race;
* ``GET /api/v1/pods`` and ``/api/v1/namespaces/{ns}/pods`` with ``fieldSelector=
  spec.nodeName=...`` and equality/set-free ``labelSelector`` (``a=b,c!=d,e``);
* ``POST /api/v1/namespaces/{ns}/pods/{name}/eviction`` (policy/v1 ``Eviction``): refused with
  **429 TooManyRequests** when a PodDisruptionBudget selecting the pod allows no disruption,
  otherwise the pod is deleted and the budget's ``disruptionsAllowed`` goes down by one;
* errors are ``Status`` objects (``kind: Status``, ``code``, ``reason``, ``message``);
* bearer-token authentication (401 otherwise), every write bumps ``resourceVersion``.

It is a fake: no watch, no controllers, no admission. Tests seed it with :meth:`add_node`,
:meth:`add_pod`, :meth:`add_pdb`, and may :meth:`inject_conflicts` to exercise retries.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from testbed.influxd import free_port

Obj = dict[str, Any]


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _merge(target: Obj, patch: Obj) -> Obj:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def _get_path(obj: Obj, dotted: str) -> Any:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def matches_labels(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: Obj, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        neg = "!=" in term
        k, v = term.split("!=" if neg else "=", 1)
        if (str(_get_path(obj, k) or "") == v) == neg:
            return False
    return True


class FakeKubernetes:
    def __init__(self, token: str = "fake-token") -> None:
        self.token = token
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[tuple[str, str], Obj] = {}
        self.pdbs: dict[tuple[str, str], Obj] = {}
        self.requests: list[tuple[str, str, int]] = []
        self._conflicts = 0
        self._version = 1000
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    # -- seeding ------------------------------------------------------------------------------

    def _rv(self) -> str:
        self._version += 1
        return str(self._version)

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        with self._lock:
            self.nodes[name] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": str(uuid.uuid4()),
                    "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                    "annotations": {},
                    "resourceVersion": self._rv(),
                },
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        labels: dict[str, str] | None = None,
        owner_kind: str = "ReplicaSet",
    ) -> None:
        with self._lock:
            self.pods[(namespace, name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": dict(labels or {}),
                    "uid": str(uuid.uuid4()),
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": owner_kind,
                            "name": f"{name}-owner",
                            "uid": str(uuid.uuid4()),
                            "controller": True,
                        }
                    ],
                    "resourceVersion": self._rv(),
                },
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "app:1"}]},
                "status": {"phase": "Running"},
            }

    def add_pdb(
        self, namespace: str, name: str, match_labels: dict[str, str], disruptions_allowed: int
    ) -> None:
        with self._lock:
            self.pdbs[(namespace, name)] = {
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"selector": {"matchLabels": match_labels}},
                "status": {"disruptionsAllowed": disruptions_allowed},
            }

    def set_pdb_allowed(self, namespace: str, name: str, allowed: int) -> None:
        with self._lock:
            self.pdbs[(namespace, name)]["status"]["disruptionsAllowed"] = allowed

    def inject_conflicts(self, count: int) -> None:
        """The next ``count`` PUTs answer 409, as if another writer got there first."""
        with self._lock:
            self._conflicts = count

    # -- API ----------------------------------------------------------------------------------

    def handle(self, method: str, url: str, headers: Any, body: bytes) -> tuple[int, Obj]:
        if headers.get("Authorization", "") != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        parsed = urllib.parse.urlsplit(url)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(parsed.query).items()}
        path = parsed.path.rstrip("/")
        with self._lock:
            try:
                payload = json.loads(body) if body else {}
            except ValueError:
                return 400, _status(400, "BadRequest", "body is not JSON")
            return self._route(method, path, query, payload)

    def _route(self, method: str, path: str, query: dict[str, str], body: Obj) -> tuple[int, Obj]:
        if path == "/api/v1/nodes" and method == "GET":
            items = [
                n
                for n in self.nodes.values()
                if matches_labels(n["metadata"]["labels"], query.get("labelSelector", ""))
                and matches_fields(n, query.get("fieldSelector", ""))
            ]
            return 200, self._list("NodeList", items)
        if m := re.fullmatch(r"/api/v1/nodes/([^/]+)", path):
            return self._node(method, m.group(1), body)
        if m := re.fullmatch(r"/api/v1(?:/namespaces/([^/]+))?/pods", path):
            if method != "GET":
                return 405, _status(405, "MethodNotAllowed", method)
            items = [
                p
                for (ns, _), p in self.pods.items()
                if (m.group(1) is None or ns == m.group(1))
                and matches_labels(p["metadata"]["labels"], query.get("labelSelector", ""))
                and matches_fields(p, query.get("fieldSelector", ""))
            ]
            return 200, self._list("PodList", items)
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", path):
            if method != "POST":
                return 405, _status(405, "MethodNotAllowed", method)
            return self._evict(m.group(1), m.group(2))
        return 404, _status(404, "NotFound", f"the server could not find {path}")

    def _list(self, kind: str, items: list[Obj]) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {"resourceVersion": str(self._version)},
            "items": copy.deepcopy(items),
        }

    def _node(self, method: str, name: str, body: Obj) -> tuple[int, Obj]:
        node = self.nodes.get(name)
        if node is None:
            return 404, _status(404, "NotFound", f'nodes "{name}" not found')
        if method == "GET":
            return 200, copy.deepcopy(node)
        if method == "PATCH":
            body.get("metadata", {}).pop("resourceVersion", None)
            _merge(node, body)
        elif method == "PUT":
            given = str(body.get("metadata", {}).get("resourceVersion", ""))
            if self._conflicts > 0 or given != node["metadata"]["resourceVersion"]:
                self._conflicts = max(0, self._conflicts - 1)
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            body["metadata"]["name"] = name
            self.nodes[name] = node = copy.deepcopy(body)
        else:
            return 405, _status(405, "MethodNotAllowed", method)
        node["metadata"]["resourceVersion"] = self._rv()
        return 200, copy.deepcopy(node)

    def _evict(self, namespace: str, name: str) -> tuple[int, Obj]:
        pod = self.pods.get((namespace, name))
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        labels = pod["metadata"]["labels"]
        blocking = [
            pdb
            for (ns, _), pdb in self.pdbs.items()
            if ns == namespace
            and all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
        ]
        for pdb in blocking:
            if pdb["status"]["disruptionsAllowed"] < 1:
                return 429, _status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                )
        for pdb in blocking:
            pdb["status"]["disruptionsAllowed"] -= 1
        del self.pods[(namespace, name)]
        return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    # -- serving ------------------------------------------------------------------------------

    def start(self) -> FakeKubernetes:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                code, payload = fake.handle(self.command, self.path, self.headers, body)
                fake.requests.append((self.command, self.path, code))
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def do_PUT(self) -> None:
                self._serve()

            def do_PATCH(self) -> None:
                self._serve()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        port = free_port()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="k8sfake").start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
