"""Kubernetes: cordon, taint, label and annotate nodes; evict pods through the Eviction API.

Uses the official ``kubernetes`` client (imported when the adapter is built, never before).
It connects with, in order: ``api_url`` + ``token_file`` (a service account token, or the test
fake), ``in_cluster`` (the pod's own service account), or a kubeconfig (``kubeconfig``/
``context``; empty = the client's default ``~/.kube/config``).

* **cordon**: ``spec.unschedulable = true``, the taint ``taint_key=true:NoSchedule``, the
  label ``gpuwarden.io/state=cordoned`` and annotations saying why (finding id and reason).
  The node is changed by read-modify-replace on its ``resourceVersion``; a 409 Conflict
  (someone else wrote the node in between) is retried on a fresh read.
* **drain**: cordon, then evict every pod on the node except DaemonSet and mirror (static)
  pods. Evictions honour PodDisruptionBudgets: a 429 is retried with backoff up to
  ``evict_attempts`` times; pods still blocked are reported (the outcome is ``failed`` and
  names them), never deleted around the budget.
* **uncordon**: the reverse, only removing what gpuwarden added.
* The blast-radius inventory counts unschedulable or not-Ready nodes as out; partitions are
  the values of ``pool_label`` (nodes without it form one pool).

No checkpoint or requeue here: on Kubernetes the eviction is what moves the work (its
controller recreates the pod elsewhere); checkpoints go through the elastic adapter.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gpuwarden.core.retry import Backoff
from gpuwarden.remediation.model import (
    ALREADY_OUT,
    Action,
    ActionKind,
    AdapterError,
    Inventory,
    NodeFacts,
    Outcome,
    Status,
)

ANNOTATION = "gpuwarden.io"
STATE_LABEL = "gpuwarden.io/state"


class KubernetesAdapter:
    name = "kubernetes"
    actions = frozenset({ActionKind.CORDON, ActionKind.DRAIN, ActionKind.UNCORDON})

    def __init__(
        self,
        *,
        kubeconfig: str = "",
        context: str = "",
        in_cluster: bool = False,
        api_url: str = "",
        token_file: str = "",
        verify_tls: bool = True,
        pool_label: str = "gpuwarden.io/pool",
        taint_key: str = "gpuwarden.io/unhealthy",
        evict_attempts: int = 5,
        evict_backoff_s: float = 2.0,
        conflict_attempts: int = 5,
        grace_period_s: int = -1,
        request_timeout_s: float = 60.0,
    ) -> None:
        from kubernetes import client, config

        if api_url:
            cfg = client.Configuration()
            cfg.host = api_url
            cfg.verify_ssl = verify_tls
            if token_file:
                with open(token_file, encoding="utf-8") as fh:
                    cfg.api_key = {"authorization": fh.read().strip()}
                cfg.api_key_prefix = {"authorization": "Bearer"}
            api_client = client.ApiClient(cfg)
        else:
            from kubernetes.config.config_exception import ConfigException

            try:
                if in_cluster:
                    config.load_incluster_config()
                    api_client = client.ApiClient()
                else:
                    api_client = config.new_client_from_config(
                        config_file=kubeconfig or None, context=context or None
                    )
            except ConfigException as exc:  # a traceback and a restart loop, before: say it
                where = (
                    "in-cluster service account"
                    if in_cluster
                    else (f"kubeconfig {kubeconfig or '~/.kube/config'}")
                )
                raise AdapterError(
                    f"the {where}: {exc} (set [kubernetes] kubeconfig, or api_url and "
                    "token_file; a systemd unit with ProtectHome= cannot read ~/.kube)"
                ) from None
        self._client = client
        self.core = client.CoreV1Api(api_client)
        self.pool_label = pool_label
        self.taint_key = taint_key
        self.evict_attempts = evict_attempts
        self.evict_backoff_s = evict_backoff_s
        # pods a PodDisruptionBudget protects are asked again, evict_backoff_s doubling
        self._evict_retry = Backoff(
            base_s=evict_backoff_s, max_s=float("inf"), attempts=evict_attempts, jitter=False
        )
        self.conflict_attempts = conflict_attempts
        self.grace_period_s = grace_period_s
        # (connect, read) for every API call: without it urllib3 waits for ever, and a stalled
        # API server or proxy held the engine's lock (the inventory is asked under it)
        self.timeout = (min(10.0, request_timeout_s), request_timeout_s)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            message = _message(exc)
            raise AdapterError(f"Kubernetes {what}: {exc.status} {exc.reason}: {message}") from None
        except HTTPError as exc:
            raise AdapterError(f"Kubernetes {what}: cannot reach the API server: {exc}") from None

    # -- what is there ------------------------------------------------------------------------

    def _items(self, what: str, fn: Any) -> list[dict[str, Any]]:
        """A list call's ``items`` as the API server's JSON, not the client's models: building
        those took 0.4-0.5 s for 1,000 nodes here (the blast-radius inventory, asked under the
        engine's lock on every tick of a storm); ``json.loads`` of the same answer, ~5 ms.
        The body is read inside :meth:`_call`, so an answer cut off (a reset, a timeout) is
        an :class:`AdapterError` like any other; so is an answer that is not a list of
        objects (the blast radius then refuses to act blind)."""

        def read(**timeout: Any) -> bytes:
            resp = fn(_preload_content=False, **timeout)
            try:
                return bytes(resp.data)
            finally:
                resp.release_conn()

        data = self._call(what, read)
        try:
            items = json.loads(data)["items"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise AdapterError(f"Kubernetes {what}: not a list answer ({exc!r:.200})") from None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise AdapterError(f"Kubernetes {what}: not a list of objects")
        return items

    def inventory(self) -> Inventory:
        partitions, out, spares, candidates = {}, set(), set(), set()
        for n in self._items("list nodes", self.core.list_node):
            meta, spec, status = (_obj(n, k) for k in ("metadata", "spec", "status"))
            name = meta.get("name")
            if not isinstance(name, str) or not name:
                raise AdapterError("Kubernetes list nodes: a node without a name")
            if name in partitions:  # else one node could be both out and an idle spare
                raise AdapterError(f"Kubernetes list nodes: {name!r} listed twice")
            labels = _obj(meta, "labels")
            pool = labels.get(self.pool_label)
            partitions[name] = pool if isinstance(pool, str) else "default"
            conditions = status.get("conditions")
            ready = any(
                isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in (conditions if isinstance(conditions, list) else ())
            )
            # any true value, as the client's models read it (a string "false" too: an odd
            # answer counts the node out, never in)
            if spec.get("unschedulable") or not ready:
                out.add(name)
                if labels.get(STATE_LABEL) == "spare":
                    spares.add(name)
            else:
                candidates.add(name)
        idle: frozenset[str] = frozenset()
        if candidates:  # in service and running nothing but DaemonSets
            busy = set()
            for p in self._items("list pods", self.core.list_pod_for_all_namespaces):
                node = _obj(p, "spec").get("nodeName")
                owners = _obj(p, "metadata").get("ownerReferences")
                if (
                    isinstance(node, str)
                    and node
                    and _obj(p, "status").get("phase") in ("Pending", "Running")
                    and not any(
                        isinstance(o, dict) and o.get("kind") == "DaemonSet"
                        for o in (owners if isinstance(owners, list) else ())
                    )
                ):
                    busy.add(node)
            idle = frozenset(candidates - busy)
        return Inventory(partitions, frozenset(out), frozenset(spares), idle)

    def node_facts(self, node: str) -> NodeFacts:
        """Its labels, and its pool (``pool_label``) as its partition."""
        n = self._call(f"read node {node}", self.core.read_node, node)
        labels = dict(n.metadata.labels or {})
        return NodeFacts(frozenset({labels.get(self.pool_label, "default")}), labels=labels)

    def hold_spare(self, node: str) -> None:
        """Keep ``node`` as a hot spare: cordoned and tainted like a node gpuwarden took out,
        labelled ``gpuwarden.io/state=spare``."""
        self._cordon(
            Action(ActionKind.CORDON, self.name, node=node, finding_id="hot-spare",
                   reason="gpuwarden: hot spare"),
            state="spare",
        )  # fmt: skip

    def release_spare(self, node: str) -> None:
        self._uncordon(Action(ActionKind.UNCORDON, self.name, node=node))

    def describe(self, action: Action) -> str:
        return {
            ActionKind.CORDON: f"cordon and taint {action.node}",
            ActionKind.DRAIN: f"cordon {action.node} and evict its pods (honouring PDBs)",
            ActionKind.UNCORDON: f"uncordon {action.node} and remove gpuwarden's taint",
        }.get(action.kind, f"{action.kind} {action.node}")

    def perform(self, action: Action) -> Outcome:
        if not action.node:
            raise AdapterError(f"{action.kind} needs a node; the finding named none")
        if action.kind is ActionKind.CORDON:
            return self._cordon(action)
        if action.kind is ActionKind.DRAIN:
            # (on a node cordoned by someone else too: a fault moves the work away either way)
            return self._evict_all(action, self._cordon(action))
        if action.kind is ActionKind.UNCORDON:
            return self._uncordon(action)
        raise AdapterError(f"kubernetes cannot {action.kind}")

    # -- node changes -------------------------------------------------------------------------

    def _rewrite_node(self, name: str, change: Any) -> Any:
        """Read-modify-replace with the resourceVersion; a 409 re-reads and tries again."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(self.conflict_attempts):
            node = self._call(f"read node {name}", self.core.read_node, name)
            if not change(node):
                return node  # nothing to change: idempotent
            try:
                return self.core.replace_node(name, node, _request_timeout=self.timeout)
            except ApiException as exc:
                if exc.status != 409 or attempt + 1 == self.conflict_attempts:
                    raise AdapterError(
                        f"Kubernetes replace node {name}: {exc.status} {_message(exc)}"
                    ) from None
        raise AdapterError(f"node {name}: still conflicting after {self.conflict_attempts} tries")

    def _cordon(self, action: Action, state: str = "cordoned") -> Outcome:
        client = self._client
        foreign: list[str] = []

        def change(node: Any) -> bool:
            taints = list(node.spec.taints or [])
            has_taint = any(t.key == self.taint_key for t in taints)
            annotations = node.metadata.annotations or {}
            labels = node.metadata.labels or {}
            if (
                node.spec.unschedulable
                and not has_taint
                and annotations.get(f"{ANNOTATION}/cordoned-by") != "gpuwarden"
            ):  # cordoned by someone else (kubectl cordon, an upgrade): theirs, left as it is
                foreign[:] = [annotations.get(f"{ANNOTATION}/reason") or "cordoned"]
                return False
            foreign.clear()  # (a 409 retry reads the node again)
            if (
                node.spec.unschedulable
                and has_taint
                and f"{ANNOTATION}/finding" in annotations
                and labels.get(STATE_LABEL) == state
            ):
                return False
            if not has_taint:
                taints.append(client.V1Taint(key=self.taint_key, value="true", effect="NoSchedule"))
            node.spec.taints = taints
            node.spec.unschedulable = True
            # a label, so that `kubectl get nodes -l gpuwarden.io/state=cordoned` lists them
            node.metadata.labels = {**labels, STATE_LABEL: state}
            node.metadata.annotations = {
                **annotations,
                f"{ANNOTATION}/finding": action.finding_id,
                f"{ANNOTATION}/reason": action.reason[:1000],
                f"{ANNOTATION}/cordoned-by": "gpuwarden",
            }
            return True

        self._rewrite_node(action.node, change)
        if foreign:
            return Outcome(Status.OK, f"{action.node} was cordoned already by someone else: "
                           "left to them, gpuwarden does not put it back",
                           {ALREADY_OUT: foreign[0]})  # fmt: skip
        return Outcome(Status.OK, f"cordoned and tainted {action.node}")

    def _uncordon(self, action: Action) -> Outcome:
        foreign: list[str] = []

        def change(node: Any) -> bool:
            annotations_now = node.metadata.annotations or {}
            foreign.clear()  # (a 409 retry reads the node again)
            if (
                node.spec.unschedulable
                and not any(t.key == self.taint_key for t in node.spec.taints or [])
                and annotations_now.get(f"{ANNOTATION}/cordoned-by") != "gpuwarden"
                and action.params.get("kind") != "operator_undo"
            ):  # cordoned by someone else since gpuwarden let go of it (a plan resumed after
                # a crash that had uncordoned it already, then an operator's kubectl cordon):
                # theirs, as for Slurm; found by a review of what a crash does (2026-11-28)
                foreign[:] = [annotations_now.get(f"{ANNOTATION}/reason") or "cordoned"]
                return False
            taints = [t for t in (node.spec.taints or []) if t.key != self.taint_key]
            annotations = {
                k: v
                for k, v in (node.metadata.annotations or {}).items()
                if not k.startswith(f"{ANNOTATION}/")
            }
            labels = {k: v for k, v in (node.metadata.labels or {}).items() if k != STATE_LABEL}
            if (
                not node.spec.unschedulable
                and taints == list(node.spec.taints or [])
                and labels == (node.metadata.labels or {})
                and annotations == (node.metadata.annotations or {})
            ):  # (gpuwarden's annotations on a node returned by hand go too: left, they made
                # a later cordon by someone else look like gpuwarden's)
                return False
            node.spec.taints = taints or None
            node.metadata.labels = labels
            node.spec.unschedulable = None
            node.metadata.annotations = annotations
            return True

        self._rewrite_node(action.node, change)
        if foreign:
            return Outcome(Status.OK, f"{action.node} was cordoned by someone else: left to "
                           "them", {ALREADY_OUT: foreign[0]})  # fmt: skip
        return Outcome(Status.OK, f"uncordoned {action.node}")

    # -- evictions ----------------------------------------------------------------------------

    def pods_on(self, node: str) -> list[Any]:
        pods = self._call(
            f"list pods on {node}",
            self.core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        ).items
        out = []
        for pod in pods:
            owners = pod.metadata.owner_references or []
            if any(o.kind == "DaemonSet" for o in owners):
                continue
            if "kubernetes.io/config.mirror" in (pod.metadata.annotations or {}):
                continue
            if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                continue
            out.append(pod)
        return out

    def _evict_all(self, action: Action, cordon: Outcome) -> Outcome:
        from kubernetes.client.exceptions import ApiException

        client = self._client
        pending = {(p.metadata.namespace, p.metadata.name) for p in self.pods_on(action.node)}
        evicted: list[str] = []
        attempts: dict[str, int] = {}
        for attempt in range(self.evict_attempts):
            for ns, name in sorted(pending):
                key = f"{ns}/{name}"
                attempts[key] = attempt + 1
                grace = None if self.grace_period_s < 0 else self.grace_period_s
                body = client.V1Eviction(
                    metadata=client.V1ObjectMeta(name=name, namespace=ns),
                    delete_options=client.V1DeleteOptions(grace_period_seconds=grace),
                )
                try:
                    self.core.create_namespaced_pod_eviction(
                        name, ns, body, _request_timeout=self.timeout
                    )
                except ApiException as exc:
                    if exc.status == 404:  # gone already: what we wanted
                        pending.discard((ns, name))
                        continue
                    if exc.status == 429:  # a PodDisruptionBudget says not now
                        continue
                    raise AdapterError(f"evict {key}: {exc.status} {_message(exc)}") from None
                pending.discard((ns, name))
                evicted.append(key)
            if not pending:
                break
            if not self._evict_retry.exhausted(attempt + 1):
                time.sleep(self._evict_retry.delay(attempt + 1))
        blocked = sorted(f"{ns}/{name}" for ns, name in pending)
        details = {**cordon.details, "evicted": evicted, "blocked_by_pdb": blocked,
                   "attempts": attempts}  # fmt: skip
        cordoned = cordon.message
        if blocked:
            return Outcome(
                Status.FAILED,
                f"{cordoned}; evicted {len(evicted)} pods; {blocked} still blocked by a "
                f"PodDisruptionBudget after {self.evict_attempts} attempts: a person must decide",
                details,
            )
        return Outcome(Status.OK, f"{cordoned}; evicted {len(evicted)} pods", details)


def _message(exc: Any) -> str:
    """An error answer's ``message``, or its body as it came (any body: an error answer is
    read inside the adapter's error handling, and what it holds must not escape it)."""
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else exc.body
    try:
        parsed = json.loads(body)
    except (TypeError, ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict) and "message" in parsed:
        return str(parsed["message"])[:500]
    return str(body or exc.reason)[:500]


def _obj(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """``parent[key]`` if it is an object, else ``{}`` (absent, null, or not an object)."""
    value = parent.get(key)
    return value if isinstance(value, dict) else {}
