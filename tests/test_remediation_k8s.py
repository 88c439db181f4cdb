"""Issue 7, must-show 3: the Kubernetes adapter, through the official client, against the
project's fake API server (SIMULATED cluster: no real API server can run on these machines)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.remediation.adapters.kubernetes import KubernetesAdapter
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import Action, ActionKind, Adapter, AdapterError
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from testbed.k8s import FakeKubernetes, matches_labels
from tests.remediation_util import RecordingAdapter, passed_check, risk


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes(token="s3cret") as k:
        for i in range(1, 5):
            k.add_node(f"gpu0{i}", {"gpuwarden.io/pool": "h100"})
        k.add_pod("train", "llama-0", "gpu02", {"app": "llama"})
        k.add_pod("train", "llama-1", "gpu02", {"app": "llama"})
        k.add_pod("serve", "api-0", "gpu02", {"app": "api"})
        k.add_pod("kube-system", "dcgm-abc", "gpu02", {"app": "dcgm"}, owner_kind="DaemonSet")
        k.add_pod("train", "llama-2", "gpu03", {"app": "llama"})
        # the training job tolerates one pod down; the API tolerates none
        k.add_pdb("train", "llama", {"app": "llama"}, disruptions_allowed=1)
        k.add_pdb("serve", "api", {"app": "api"}, disruptions_allowed=0)
        yield k


def adapter(fake: FakeKubernetes, tmp_path: Path, **kw: object) -> KubernetesAdapter:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    args = {"api_url": fake.url, "token_file": str(token), "evict_backoff_s": 0.01} | kw
    return KubernetesAdapter(**args)  # type: ignore[arg-type]


def drain(node: str = "gpu02") -> Action:
    return Action(
        ActionKind.DRAIN, "kubernetes", node=node, finding_id="f1", reason="gpuwarden: risk"
    )


def test_cordon_then_evictions_where_a_pdb_blocks_one(fake: FakeKubernetes, tmp_path: Path) -> None:
    k8s = adapter(fake, tmp_path, evict_attempts=3)
    fake.inject_conflicts(2)  # two writers race us on the node object
    outcome = k8s.perform(drain())
    node = fake.nodes["gpu02"]
    assert node["spec"]["unschedulable"] is True
    assert {"key": "gpuwarden.io/unhealthy", "value": "true", "effect": "NoSchedule"} in node[
        "spec"
    ]["taints"]
    assert node["metadata"]["annotations"]["gpuwarden.io/finding"] == "f1"
    assert node["metadata"]["labels"]["gpuwarden.io/state"] == "cordoned"
    # one llama pod may go (budget 1), the API pod may not; the DaemonSet pod is left alone
    assert outcome.status == "failed"
    assert outcome.details["evicted"] == ["train/llama-0"]
    assert outcome.details["blocked_by_pdb"] == ["serve/api-0", "train/llama-1"]
    assert outcome.details["attempts"]["serve/api-0"] == 3  # retried, then reported
    assert "still blocked by a PodDisruptionBudget" in outcome.message
    assert ("kube-system", "dcgm-abc") in fake.pods
    evictions = [r for r in fake.requests if r[0] == "POST" and r[1].endswith("/eviction")]
    assert sum(1 for r in evictions if r[2] == 429) == 3 + 3  # api-0 and llama-1, thrice each
    # the inventory sees gpu02 out
    assert k8s.inventory().out == frozenset({"gpu02"})


def test_blocked_eviction_goes_through_once_the_budget_allows(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    k8s = adapter(fake, tmp_path, evict_attempts=2)
    first = k8s.perform(drain())
    assert first.status == "failed"
    fake.set_pdb_allowed("serve", "api", 1)  # a replacement became ready elsewhere
    fake.set_pdb_allowed("train", "llama", 1)
    second = k8s.perform(drain())
    assert second.status == "ok", second.message
    assert [p for p in fake.pods.values() if p["spec"]["nodeName"] == "gpu02"] == [
        fake.pods[("kube-system", "dcgm-abc")]
    ]


def test_uncordon_removes_only_what_gpuwarden_added(fake: FakeKubernetes, tmp_path: Path) -> None:
    k8s = adapter(fake, tmp_path)
    fake.nodes["gpu01"]["spec"]["taints"] = [{"key": "other", "value": "x", "effect": "NoSchedule"}]
    fake.nodes["gpu01"]["metadata"]["annotations"]["team"] = "infra"
    k8s.perform(Action(ActionKind.CORDON, "kubernetes", node="gpu01", finding_id="f2", reason="r"))
    assert k8s.perform(Action(ActionKind.CORDON, "kubernetes", node="gpu01", finding_id="f2")).ok
    k8s.perform(Action(ActionKind.UNCORDON, "kubernetes", node="gpu01"))
    node = fake.nodes["gpu01"]
    assert not node["spec"].get("unschedulable")
    assert node["spec"]["taints"] == [{"key": "other", "value": "x", "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"] == {"team": "infra"}
    assert "gpuwarden.io/state" not in node["metadata"]["labels"]


def test_errors_are_clear(fake: FakeKubernetes, tmp_path: Path) -> None:
    k8s = adapter(fake, tmp_path)
    with pytest.raises(AdapterError, match="404"):
        k8s.perform(drain("gpu99"))
    bad = tmp_path / "bad"
    bad.write_text("wrong")
    wrong = KubernetesAdapter(api_url=fake.url, token_file=str(bad))
    with pytest.raises(AdapterError, match="401"):
        wrong.inventory()
    fake.stop()
    with pytest.raises(AdapterError, match="cannot reach the API server"):
        KubernetesAdapter(api_url="http://127.0.0.1:9", token_file=str(bad)).inventory()


def test_engine_drives_kubernetes_with_requeue_skipped(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    fake.set_pdb_allowed("serve", "api", 5)
    fake.set_pdb_allowed("train", "llama", 5)
    k8s = adapter(fake, tmp_path)
    notes = RecordingAdapter("webhook")
    audit = AuditLog(tmp_path / "audit.jsonl")
    settings = EngineSettings(
        dry_run=False,
        node_adapter="kubernetes",
        checkpoint_adapter="kubernetes",
        max_nodes_out=1,
        max_fraction_out=0.25,
    )
    engine = Engine(
        load_policies(DEFAULT_POLICIES), {"kubernetes": k8s, "webhook": notes}, audit, settings
    )
    assert engine.submit(risk("gpu02")).verdict == "act"
    assert engine.wait(30)
    # a second node would put 2 of 4 (50 %) of the pool out: queued for a human
    assert engine.submit(risk("gpu03")).verdict == "blast_radius"
    assert engine.wait(30)
    engine.close()
    outcomes = [
        (r["action"], r["outcome"])
        for r in read_records(audit.path)
        if r["event"] == "action" and r["finding_id"] == risk("gpu02").id
    ]
    assert outcomes == [
        ("notify", "ok"),
        ("checkpoint", "skipped"),
        ("drain", "ok"),
        ("requeue", "skipped"),
    ]
    assert fake.nodes["gpu03"]["spec"].get("unschedulable") is None


def test_label_selector_semantics() -> None:
    assert matches_labels({"a": "1", "b": "2"}, "a=1,b!=3,b")
    assert not matches_labels({"a": "1"}, "a=2")
    assert not matches_labels({"a": "1"}, "!a")


def test_hot_spares_are_a_label_in_kubernetes(fake: FakeKubernetes, tmp_path: Path) -> None:
    """The engine's spare pool on the Kubernetes adapter: idle nodes (no pods but DaemonSets)
    held cordoned and labelled ``gpuwarden.io/state=spare``; one put back before a requeue."""
    k8s = adapter(fake, tmp_path)
    inv = k8s.inventory()
    assert inv.idle == {"gpu01", "gpu04"} and inv.spares == frozenset()  # gpu02-03 run pods
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"kubernetes": k8s, "webhook": RecordingAdapter("webhook")},
        AuditLog(tmp_path / "audit.jsonl"),
        EngineSettings(dry_run=False, spares=1, node_adapter="kubernetes",
                       checkpoint_adapter="kubernetes", max_nodes_out=1, max_fraction_out=0.5),
    )  # fmt: skip
    assert engine.spares.refill() == ["gpu04"]
    node = fake.nodes["gpu04"]
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"]["gpuwarden.io/state"] == "spare"
    assert k8s.inventory().spares == {"gpu04"}
    # the spare does not count against max_nodes_out=1: gpu03 may still be taken out
    assert engine.guards.blast_radius("gpu03") == ""
    assert engine.spares.release_for("gpu03") == "gpu04"
    assert not fake.nodes["gpu04"]["spec"].get("unschedulable")
    assert "gpuwarden.io/state" not in fake.nodes["gpu04"]["metadata"]["labels"]
    engine.close()


def _inventory_from_models(k8s: KubernetesAdapter) -> tuple[object, ...]:
    """The blast-radius inventory as the adapter read it before 2026-11-27, from the client's
    models (0.4-0.5 s for 1,000 nodes): the reference the JSON reading must agree with."""
    nodes = k8s.core.list_node().items
    partitions, out, spares, candidates = {}, set(), set(), set()
    for n in nodes:
        labels = n.metadata.labels or {}
        partitions[n.metadata.name] = labels.get(k8s.pool_label, "default")
        ready = any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        if n.spec.unschedulable or not ready:
            out.add(n.metadata.name)
            if labels.get("gpuwarden.io/state") == "spare":
                spares.add(n.metadata.name)
        else:
            candidates.add(n.metadata.name)
    busy = {
        p.spec.node_name
        for p in k8s.core.list_pod_for_all_namespaces().items
        if p.spec.node_name
        and (p.status.phase or "") in ("Pending", "Running")
        and not any(o.kind == "DaemonSet" for o in p.metadata.owner_references or [])
    }
    return partitions, out, spares, candidates - busy if candidates else set()


@pytest.mark.parametrize("seed", range(8))
def test_the_inventory_read_as_json_agrees_with_the_clients_models(
    seed: int, tmp_path: Path
) -> None:
    """SIMULATED clusters (the fake API server): nodes cordoned, not ready, without
    conditions, spare or in pools; pods of every phase and owner. The inventory is read from
    the API server's JSON (the client's models cost 0.4-0.5 s for 1,000 nodes under the
    engine's lock); it must say what the models say."""
    import random

    r = random.Random(seed)
    with FakeKubernetes(token="s3cret") as fake:
        for i in range(40):
            labels = {}
            if r.random() < 0.3:
                labels["gpuwarden.io/pool"] = r.choice(["a", "b"])
            if r.random() < 0.2:
                labels["gpuwarden.io/state"] = r.choice(["spare", "cordoned"])
            fake.add_node(f"n{i}", labels)
            node = fake.nodes[f"n{i}"]
            if r.random() < 0.3:
                node["spec"]["unschedulable"] = r.random() < 0.7
            if r.random() < 0.15:
                node["status"]["conditions"] = [{"type": "Ready", "status": r.choice("FU")}]
            if r.random() < 0.1:
                del node["status"]["conditions"]
        for j in range(30):
            kind = r.choice(["ReplicaSet", "DaemonSet", "Job"])
            fake.add_pod("ns", f"p{j}", f"n{r.randrange(40)}", owner_kind=kind)
            pod = fake.pods[("ns", f"p{j}")]
            if r.random() < 0.3:
                pod["status"]["phase"] = r.choice(["Succeeded", "Failed", "Pending"])
            if r.random() < 0.1:
                del pod["metadata"]["ownerReferences"]
        k8s = adapter(fake, tmp_path)
        inv = k8s.inventory()
        partitions, out, spares, idle = _inventory_from_models(k8s)
        assert (inv.partitions, set(inv.out), set(inv.spares), set(inv.idle)) == (
            partitions,
            out,
            spares,
            idle,
        )
        assert out and idle  # the draw has both kinds


def test_an_odd_list_answer_is_refused(fake: FakeKubernetes, tmp_path: Path) -> None:
    """An answer that is not a list of named objects, or nested past Python's recursion
    limit, is an AdapterError (the blast radius then refuses to act blind); before the JSON
    reading, a node without a name crashed the inventory, and a string ``unschedulable``
    counts the node out, as the client's models read it."""
    k8s = adapter(fake, tmp_path)

    class Answer:
        data = b""

        def release_conn(self) -> None:
            pass

    k8s.core.list_node = lambda **kw: Answer()
    node = {"metadata": {"name": "gpu09"}, "status": {"conditions": []}}
    Answer.data = json.dumps({"items": [node | {"spec": {"unschedulable": "false"}}]}).encode()
    inv = k8s.inventory()
    assert inv.partitions == {"gpu09": "default"} and inv.out == {"gpu09"}
    items: object
    for items in (
        [{"metadata": None, "spec": [], "status": "x"}],
        [["not", "an", "object"]],
        [{"metadata": {"name": 7}}],
        [node, node],  # one name twice: it could be both out and an idle spare
        {"a": 1},
    ):
        Answer.data = json.dumps({"items": items}).encode()
        with pytest.raises(AdapterError, match="list nodes"):
            k8s.inventory()
    for data in (b"<html>proxy error</html>", b"[" * 100_000 + b"]" * 100_000):
        Answer.data = data
        with pytest.raises(AdapterError, match="not a list answer"):
            k8s.inventory()


def test_an_answer_cut_off_is_an_adapter_error(tmp_path: Path) -> None:
    """A list answer whose body stops short (an API server restarting, a load balancer's
    reset) is an AdapterError, as before the JSON reading: read outside the adapter's error
    handling, urllib3's IncompleteRead escaped the guards, the tick and the serve loop
    (an attacker's review)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"items\": [")  # fmt: skip
            conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    k8s = KubernetesAdapter(api_url=f"http://127.0.0.1:{port}", token_file=str(token))
    try:
        with pytest.raises(AdapterError, match="list nodes"):
            k8s.inventory()
    finally:
        listener.close()


def _one_answer(answer: bytes, hold: bool = False) -> tuple[socket.socket, list[socket.socket]]:
    """A listener that answers each connection with ``answer`` (then holds it open, or
    closes it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(answer)
            if hold:
                held.append(conn)
            else:
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener, held


def test_an_api_server_that_stalls_is_an_adapter_error_after_the_timeout(
    tmp_path: Path,
) -> None:
    """Headers and part of a body, then nothing: before, no read timeout was set and the
    inventory (asked under the engine's lock) waited for ever (an attacker's review)."""
    listener, held = _one_answer(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"items": [', hold=True
    )
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    k8s = KubernetesAdapter(api_url=url, token_file=str(token), request_timeout_s=0.5)
    try:
        with pytest.raises(AdapterError, match="list nodes"):
            k8s.inventory()
    finally:
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize("body", [b"null", b"[]", b"7", b"[" * 100_000 + b"]" * 100_000])
def test_an_error_answer_of_any_body_is_an_adapter_error(body: bytes, tmp_path: Path) -> None:
    """A 500 whose JSON body is not an object: before, AttributeError (or RecursionError)
    escaped the adapter, past the guards and the serve loop (an attacker's review)."""
    head = f"HTTP/1.1 500 X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    listener, _ = _one_answer(head.encode() + body)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with pytest.raises(AdapterError, match="500"):
            KubernetesAdapter(api_url=url, token_file=str(token)).inventory()
    finally:
        listener.close()


def test_a_node_someone_else_cordoned_stays_theirs(fake: FakeKubernetes, tmp_path: Path) -> None:
    """Found in review: gpuwarden's cordon rewrote a node an administrator had cordoned
    (``kubectl cordon``), answered OK, and the engine counted it as its own: the node's next
    passing check uncordoned it. Now the node is left as it is, its pods are still moved (a
    fault moves the work away), and the outcome says whose the node is."""
    fake.set_pdb_allowed("train", "llama", 5)
    fake.nodes["gpu03"]["spec"]["unschedulable"] = True  # kubectl cordon gpu03
    k8s = adapter(fake, tmp_path)
    audit = AuditLog(tmp_path / "audit.jsonl")
    settings = EngineSettings(dry_run=False, node_adapter="kubernetes", max_nodes_out=4,
                              checkpoint_adapter="kubernetes",
                              max_fraction_out=1.0, predicted_kinds=())  # fmt: skip
    adapters: dict[str, Adapter] = {"kubernetes": k8s, "webhook": RecordingAdapter("webhook")}
    engine = Engine(load_policies(DEFAULT_POLICIES), adapters, audit, settings)
    try:
        assert engine.submit(risk("gpu03")).verdict == "act"
        assert engine.wait(30)
        (removal,) = [r for r in read_records(audit.path)
                      if r["event"] == "action" and r["action"] == "drain"]  # fmt: skip
        assert removal["outcome"] == "ok" and removal["details"]["already_out"] == "cordoned"
        assert removal["details"]["evicted"] == ["train/llama-2"]
        node = fake.nodes["gpu03"]
        assert not node["spec"].get("taints")
        assert not any(k.startswith("gpuwarden.io/") for k in node["metadata"]["annotations"])
        assert "gpuwarden.io/state" not in node["metadata"]["labels"]
        back = passed_check("gpu03")
        assert engine.submit(back).verdict == "not_ours"
        assert engine.wait(30)
        assert fake.nodes["gpu03"]["spec"]["unschedulable"] is True
    finally:
        engine.close()


def test_a_kubeconfig_that_cannot_be_read_is_an_adapter_error(tmp_path: Path) -> None:
    """Found in review: under the shipped systemd unit (ProtectHome=) ``~/.kube/config`` is
    out of reach, and the client's ConfigException escaped as a traceback (the unit restarted
    for ever); now it is the adapter's error, which the command reports and exits 2 on."""
    with pytest.raises(AdapterError, match=r"kubeconfig .*none.*set \[kubernetes\] kubeconfig"):
        KubernetesAdapter(kubeconfig=str(tmp_path / "none"))


def test_gpuwardens_marks_go_with_a_node_returned_by_hand(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    """Found in review: a node gpuwarden cordoned and someone uncordoned by hand kept
    gpuwarden's annotations (its uncordon found nothing else to change), and a later
    ``kubectl cordon`` of it then looked like gpuwarden's own."""
    k8s = adapter(fake, tmp_path)
    k8s.perform(Action(ActionKind.CORDON, "kubernetes", node="gpu01", finding_id="f", reason="r"))
    node = fake.nodes["gpu01"]
    node["spec"]["unschedulable"] = None  # kubectl uncordon, and the taint removed by hand
    node["spec"]["taints"] = []
    node["metadata"]["labels"].pop("gpuwarden.io/state")
    k8s.perform(Action(ActionKind.UNCORDON, "kubernetes", node="gpu01"))
    node = fake.nodes["gpu01"]  # (a PUT replaces the fake's object)
    assert not any(k.startswith("gpuwarden.io/") for k in node["metadata"]["annotations"])
    node["spec"]["unschedulable"] = True  # kubectl cordon gpu01
    again = k8s.perform(Action(ActionKind.CORDON, "kubernetes", node="gpu01", finding_id="g"))
    assert again.details["already_out"] == "cordoned"


def test_a_resumed_uncordon_leaves_a_cordon_made_since_by_someone_else(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    """Found by a review of what a crash does (2026-11-28): the engine uncordoned a node and
    died before recording it; meanwhile an operator cordoned the node for maintenance; the
    restarted engine resumed the plan and uncordoned it again, the operator's cordon with it.
    Now an uncordon leaves a node cordoned by someone else (as the Slurm adapter leaves a
    node drained by someone else); an operator's own undo still returns it."""
    k8s = adapter(fake, tmp_path)
    k8s.perform(Action(ActionKind.CORDON, "kubernetes", node="gpu01", finding_id="f", reason="r"))
    k8s.perform(Action(ActionKind.UNCORDON, "kubernetes", node="gpu01"))  # (then the crash)
    fake.nodes["gpu01"]["spec"]["unschedulable"] = True  # kubectl cordon gpu01
    resumed = k8s.perform(Action(ActionKind.UNCORDON, "kubernetes", node="gpu01"))
    assert resumed.ok and resumed.details["already_out"] == "cordoned"
    assert fake.nodes["gpu01"]["spec"]["unschedulable"] is True
    undo = Action(ActionKind.UNCORDON, "kubernetes", node="gpu01", params={"kind": "operator_undo"})
    assert k8s.perform(undo).ok
    assert not fake.nodes["gpu01"]["spec"].get("unschedulable")
