"""Issue 37, item 3: the Kubernetes manifests apply as they are, and every name one of them
uses exists in another.

No API server can run here, so the check is the one ``kubectl apply -f deploy/kubernetes/``
needs before the server is asked: every document of every ``*.yaml`` has ``apiVersion``,
``kind`` and a name, and every cross-reference resolves within the folder: the Service and port
the agent posts to, the claim, the ConfigMaps, the ServiceAccounts, the PriorityClass, one image
name, and the configurations in ConfigMaps load with gpuwarden's own loaders. Secrets are never
shipped (a known token would let anyone post findings): each Secret a manifest mounts must have
its ``kubectl create secret`` recipe in the folder. Before this change: the agent posted to
``gpuwarden-remediation...:8750`` (the Service is ``gpuwarden-remediate`` on 9470), two image
names, no Namespace, claim or ServiceAccount, ``check-initcontainer.yaml`` had no ``kind``, and
the agent ran at ``system-node-critical`` outside kube-system.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.collector.config import load_config as load_agent_config
from gpuwarden.remediation.config import load_config as load_engine_config

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "deploy/kubernetes"
NAMESPACE = "gpuwarden"


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(FOLDER.glob("*.yaml")):  # what kubectl apply -f takes
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for d in docs:
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            yield d["spec"]["template"]["spec"]


def named(docs: list[dict[str, Any]], kind: str) -> set[str]:
    return {d["metadata"]["name"] for d in docs if d["kind"] == kind}


def test_every_document_applies_as_an_object_in_our_namespace() -> None:
    docs = documents()
    assert docs
    for d in docs:
        assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), d
        cluster_wide = d["kind"] in ("Namespace", "PriorityClass", "ClusterRole",
                                     "ClusterRoleBinding")  # fmt: skip
        if not cluster_wide:
            assert d["metadata"].get("namespace") == NAMESPACE, d["metadata"]
    assert NAMESPACE in named(docs, "Namespace")


def test_every_reference_resolves() -> None:
    docs = documents()
    images, secrets = set(), set()
    for spec in pod_specs(docs):
        pc = spec.get("priorityClassName")
        if pc:
            assert pc in named(docs, "PriorityClass") and not pc.startswith("system-"), pc
        sa = spec.get("serviceAccountName")
        assert sa in named(docs, "ServiceAccount"), sa
        for v in spec.get("volumes", []):
            if "configMap" in v:
                assert v["configMap"]["name"] in named(docs, "ConfigMap"), v
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                assert claim in named(docs, "PersistentVolumeClaim"), v
            if "secret" in v:
                secrets.add(v["secret"]["secretName"])
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            images.add(c["image"])
            for probe in ("readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str):
                    assert port in {p.get("name") for p in c.get("ports", [])}, (probe, port)
    assert len(images) == 1, images
    recipes = "\n".join(p.read_text() for p in FOLDER.iterdir() if p.is_file())
    for secret in secrets:
        assert re.search(rf"kubectl -n {NAMESPACE} create secret generic {secret}\b", recipes)
    assert not [d for d in docs if d["kind"] == "Secret"], "no secret is shipped"


def test_the_agent_posts_to_the_engines_service_and_port() -> None:
    docs = documents()
    agent_cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"]
                    == "gpuwarden-agent")  # fmt: skip
    url = tomllib.loads(agent_cm["data"]["agent.toml"])["agent"]["remediation_url"]
    m = re.fullmatch(r"https?://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)/v1/"
                     r"findings", url)  # fmt: skip
    assert m, url
    service, namespace, port = m.group(1), m.group(2), int(m.group(3))
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == service)
    assert svc["metadata"]["namespace"] == namespace
    ports = svc["spec"]["ports"]
    assert port in [p["port"] for p in ports]
    # the Service's pods listen there: its target port is a named port of their container
    target = next(p["targetPort"] for p in ports if p["port"] == port)
    selector = svc["spec"]["selector"]
    backends = [
        d for d in docs if d["kind"] in ("Deployment", "DaemonSet")
        and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]  # fmt: skip
    assert backends, selector
    names = {p.get("name") for c in backends[0]["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])}  # fmt: skip
    assert target in names or isinstance(target, int)


def test_the_configurations_in_configmaps_load(tmp_path: Path) -> None:
    docs = documents()
    for d in docs:
        if d["kind"] != "ConfigMap":
            continue
        for key, text in d["data"].items():
            path = tmp_path / key
            path.write_text(text)
            if key == "agent.toml":
                load_agent_config(str(path))
            elif key == "remediation.toml":
                load_engine_config(path)


def test_the_agents_node_check_writes_only_where_its_container_can(tmp_path: Path) -> None:
    """The DaemonSet's root filesystem is read-only, and the node check's disk probe wrote in
    the default ``/tmp``: it failed on every node, every ``healthy_after_s``, and the agent
    reported its node as failing its check (found in review). Each disk path must lie in a
    writable mount of the agent's container."""
    docs = documents()
    (tmp_path / "agent.toml").write_text(_configmap(docs, "gpuwarden-agent", "agent.toml"))
    config = load_agent_config(str(tmp_path / "agent.toml"))
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "agent"]  # fmt: skip
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert "disk" in config["health"]["check_probes"]
    for path in config["check"]["disk_paths"]:
        assert any(Path(path).is_relative_to(m) for m in writable), (path, writable)


def test_the_init_container_example_needs_nothing_from_gpuwardens_namespace() -> None:
    """The example is a fragment to copy (its name keeps ``kubectl apply -f`` off it) into a
    job's pod, in the job's namespace. Before, it mounted the ``gpuwarden-agent`` ConfigMap,
    which lives in ``gpuwarden``: a pod cannot mount another namespace's ConfigMap, so the job
    never started. Now its settings are environment variables the agent's config takes."""
    fragment = yaml.safe_load((FOLDER / "check-initcontainer.yaml.example").read_text())
    (container,) = fragment["initContainers"]
    assert container["image"] in {c["image"] for s in pod_specs(documents())
                                  for c in s["containers"]}  # fmt: skip
    assert not [v for v in fragment["volumes"] if {"configMap", "secret"} & v.keys()]
    assert "--config" not in container["command"]
    environ = {e["name"]: e.get("value", "node-x") for e in container["env"]}
    config = load_agent_config(None, environ=environ)  # every name a setting, every value valid
    assert config["agent"]["sysfs"] == "/host/sys" and config["health"]["expected_gpus"] == 8
    (probes,) = [a for a in container["command"] if "," in a]
    # a probe that needs torch passes as unavailable in this image: not asked for here
    assert not set(probes.split(",")) & {"gpu_matmul", "allreduce"}


def test_the_relay_is_reachable_from_the_nodes_own_pods_only() -> None:
    """Before: ``reporter_listen = "0.0.0.0:9465"`` with a ``hostPort``: any pod of the cluster
    reached every node's relay, unauthenticated. Now: no port at all, a Unix socket in a host
    folder the agent mounts (and the node's own training pods may)."""
    docs = documents()
    agent_cm = next(d for d in docs if d["kind"] == "ConfigMap"
                    and d["metadata"]["name"] == "gpuwarden-agent")  # fmt: skip
    agent = tomllib.loads(agent_cm["data"]["agent.toml"])["agent"]
    assert agent["reporter_listen"] == "" and agent["reporter_socket"].startswith("/run/gpuwarden/")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    containers = ds["spec"]["template"]["spec"]["containers"]
    ports = [p for c in containers for p in c.get("ports", [])]
    assert not [p for p in ports if p.get("hostPort") or p.get("containerPort") == 9465]
    mounts = {m["mountPath"] for c in containers for m in c.get("volumeMounts", [])}
    assert "/run/gpuwarden" in mounts


def _listen_port(docs: list[dict[str, Any]], container: dict[str, Any], section: str,
                 key: str, configmap: str, file: str) -> tuple[str, int]:  # fmt: skip
    """The ``host:port`` a gpuwarden command in ``container`` binds for ``[section] key``: the
    environment's ``GPUWARDEN_<SECTION>_<KEY>`` if the container sets it, else the ConfigMap's
    file."""
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    listen = env.get(f"GPUWARDEN_{section.upper()}_{key.upper()}")
    if listen is None:
        cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"]
                  == configmap)  # fmt: skip
        listen = tomllib.loads(cm["data"][file])[section][key]
    host, _, port = str(listen).rpartition(":")
    return host, int(port)


def test_probes_point_at_a_port_and_path_the_container_serves() -> None:
    """Item 3: liveness and readiness probes for the agent (its health endpoint,
    collector/probes.py) and the engine (/healthz), each at a named port whose containerPort is
    the port the command binds, on an address the kubelet reaches (the pod IP, not loopback),
    and at a path that command answers. Before: the agent had no probes and no endpoint."""
    from gpuwarden.collector.probes import LIVE, READY
    from gpuwarden.remediation.server import HEALTH_PATH

    docs = documents()
    wanted = {
        "gpuwarden-agent": (("agent", "health_listen", "gpuwarden-agent", "agent.toml"),
                            {"livenessProbe": LIVE, "readinessProbe": READY}),
        "gpuwarden-remediate": (("engine", "listen", "gpuwarden-remediate", "remediation.toml"),
                                {"livenessProbe": HEALTH_PATH, "readinessProbe": HEALTH_PATH}),
    }  # fmt: skip
    seen = set()
    for d in docs:
        name = d["metadata"]["name"]
        if d["kind"] not in ("DaemonSet", "Deployment") or name not in wanted:
            continue
        (where, paths), (container,) = wanted[name], d["spec"]["template"]["spec"]["containers"]
        host, port = _listen_port(docs, container, *where)
        assert host not in ("127.0.0.1", "localhost", "::1", ""), (name, host)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe, path in paths.items():
            get = container[probe]["httpGet"]
            assert get["path"] == path, (name, probe, get)
            assert ports[get["port"]] == port, (name, probe, get, ports)
        seen.add(name)
    assert seen == set(wanted)


def test_no_host_device_goes_into_an_unprivileged_container() -> None:
    """Issue 37: the agent mounted the host's ``/dev/kmsg`` (a character device) into its
    unprivileged container, where the device cgroup refuses every read (EPERM): the xid source
    failed every cycle and ``/readyz`` never said ready. Now no container that is not
    privileged mounts a host device, and the agent reads the kernel log from the host's
    journal, mounted read-only below the root its configuration names."""
    docs = documents()
    for spec in pod_specs(docs):
        host = {v["name"]: v["hostPath"] for v in spec.get("volumes", []) if "hostPath" in v}
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if c.get("securityContext", {}).get("privileged"):
                continue
            for m in c.get("volumeMounts", []):
                path = host.get(m["name"])
                if path is None:
                    continue
                assert path.get("type") not in ("CharDevice", "BlockDevice"), (c["name"], path)
                assert not (path["path"] + "/").startswith("/dev/"), (c["name"], path)
    agent_cm = next(d for d in docs if d["kind"] == "ConfigMap"
                    and d["metadata"]["name"] == "gpuwarden-agent")  # fmt: skip
    root = tomllib.loads(agent_cm["data"]["agent.toml"])["agent"]["kernel_journal"]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    for journal in ("/var/log/journal", "/run/log/journal"):
        # the host's folder is mounted, read-only, where journalctl --root finds it
        covering = [m for m in agent["volumeMounts"] if m["name"] in host
                    and (journal + "/").startswith(host[m["name"]] + "/")]  # fmt: skip
        assert covering, journal
        (m,) = covering
        assert m.get("readOnly") is True, m
        inside = m["mountPath"] + journal[len(host[m["name"]]) :]
        assert inside == root.rstrip("/") + journal, (inside, root)
    assert "SYSLOG" not in agent["securityContext"]["capabilities"].get("add", [])


def _configmap(docs: list[dict[str, Any]], name: str, key: str) -> str:
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    return str(cm["data"][key])


def test_the_shipped_manifests_give_every_sender_its_own_identity() -> None:
    """Issue 38: the manifests used the legacy mode by default: one bearer token in one Secret,
    mounted by every agent and the engine, so one node's token could report, approve and undo
    for every node. Now the engine's configuration names an identity per sender (an agent
    family, each node signing with its own derived key; the analyze service; an operator) and
    no token or shared secret; every agent signs as ``agents/<its node>`` with a key that only
    its host holds (a hostPath file, not a Secret every node mounts)."""
    docs = documents()
    engine = tomllib.loads(_configmap(docs, "gpuwarden-remediate", "remediation.toml"))
    assert not engine["engine"].get("hmac_secret_file")
    # with identities, token_file is Prometheus' read-only token for GET /metrics (it posts,
    # approves and undoes nothing: docs/SECURITY.md), in the engine's Secret, which no agent
    # mounts (below)
    assert engine["engine"]["token_file"].startswith("/var/run/secrets/gpuwarden/keys/")
    kinds = {i["kind"]: i for i in engine["identity"]}
    assert set(kinds) == {"agent", "analytics", "operator"}
    assert kinds["agent"]["node"] == "*"
    agent = tomllib.loads(_configmap(docs, "gpuwarden-agent", "agent.toml"))["agent"]
    assert not agent.get("remediation_token_file")
    assert agent["remediation_identity"] == kinds["agent"]["name"] + "/{node}"
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    key_mount = next(m for m in container["volumeMounts"]
                     if m["mountPath"] == agent["remediation_hmac_secret_file"])  # fmt: skip
    volume = next(v for v in spec["volumes"] if v["name"] == key_mount["name"])
    assert volume["hostPath"]["type"] == "File", volume
    assert not [v for v in spec["volumes"] if "secret" in v], "every node mounts one Secret"
    recipe = (FOLDER / "00-namespace.yaml").read_text()
    assert f"agent-key {kinds['agent']['name']} NODE" in recipe
    assert volume["hostPath"]["path"] in recipe


def test_a_node_agent_configured_as_shipped_speaks_for_its_own_node_only(tmp_path: Path) -> None:
    """The shipped engine configuration, started for real (``gpuwarden remediate serve``, the
    Kubernetes fake for the API server), and the shipped agent configuration's fast path with
    the key the recipe derives (``gpuwarden remediate agent-key agents NODE``): node-001's
    agent reports node-001 and is heard and acted on, and cannot report node-002. Only the key
    folder, the listen address, the audit log, the API server, ``dry_run = false`` (roll-out step 4)
    and ``max_fraction_out`` (two nodes) differ from the manifests. Every finding is CONSTRUCTED."""
    import os
    import subprocess
    import sys
    import time

    from gpuwarden.core.finding import Finding, Severity
    from gpuwarden.remediation.audit import read_records
    from testbed.influxd import free_port
    from testbed.k8s import FakeKubernetes
    from tests.remediation_util import poll

    docs = documents()
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("agents", "analyze", "admin", "monitor"):
        (keys / name).write_text(f"a test key for {name}, CONSTRUCTED\n")
        (keys / name).chmod(0o400)
    config = tmp_path / "remediation.toml"
    config.write_text(_configmap(docs, "gpuwarden-remediate", "remediation.toml")
                      .replace("/var/run/secrets/gpuwarden/keys/", f"{keys}/"))  # fmt: skip
    fake = FakeKubernetes(token="k").start()
    for node in ("node-001", "node-002"):
        fake.add_node(node)
    (tmp_path / "k8s").write_text("k")
    port = free_port()
    env = {
        **os.environ,
        "GPUWARDEN_ENGINE_LISTEN": f"127.0.0.1:{port}",
        "GPUWARDEN_ENGINE_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        "GPUWARDEN_KUBERNETES_IN_CLUSTER": "false",
        "GPUWARDEN_KUBERNETES_API_URL": fake.url,
        "GPUWARDEN_KUBERNETES_TOKEN_FILE": str(tmp_path / "k8s"),
        "GPUWARDEN_ENGINE_DRY_RUN": "false",  # step 4 of docs/DEPLOY.md: live
        "GPUWARDEN_GUARDS_MAX_FRACTION_OUT": "1.0",  # (a cluster of two nodes)
    }
    cmd = [sys.executable, "-m", "gpuwarden", "remediate", "--config", str(config)]
    derived = subprocess.run([*cmd, "agent-key", "agents", "node-001"], env=env, cwd=ROOT,
                             capture_output=True, text=True, check=True)  # fmt: skip
    (tmp_path / "agent.key").write_text(derived.stdout)
    log = (tmp_path / "engine.log").open("w")
    engine = subprocess.Popen([*cmd, "serve"], env=env, cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        agent_toml = tmp_path / "agent.toml"
        agent_toml.write_text(_configmap(docs, "gpuwarden-agent", "agent.toml"))
        agent = load_agent_config(str(agent_toml), {
            "GPUWARDEN_AGENT_REMEDIATION_URL": f"http://127.0.0.1:{port}/v1/findings",
            "GPUWARDEN_AGENT_REMEDIATION_HMAC_SECRET_FILE": str(tmp_path / "agent.key"),
        })  # fmt: skip

        def xid(node: str) -> Finding:
            return Finding(
                kind="gpu_xid", severity=Severity.CRITICAL, source="agent",
                subject={"cluster": "prod", "node": node, "gpu": "0"},
                summary="XID 79 (CONSTRUCTED)", evidence={"xid": 79},
                time_ns=time.time_ns(),
            )  # fmt: skip

        def heard(node: str) -> bool:
            records = read_records(tmp_path / "audit.jsonl")
            return any(r.get("event") == "finding" and r["subject"]["node"] == node
                       for r in records)  # fmt: skip

        def posted(node: str) -> tuple[int, int]:
            poster = agent.fast_path_poster("node-001")
            assert poster is not None
            poll(lambda: engine.poll() is not None or _answers(port), 60, "the engine")
            assert engine.poll() is None, (tmp_path / "engine.log").read_text()
            poster.post(xid(node))
            poster.close(timeout_s=30.0)
            return poster.posted, poster.failed

        assert posted("node-002") == (0, 1)
        assert posted("node-001") == (1, 0)
        assert heard("node-001") and not heard("node-002")
        # and acted on, as shipped (its notify_adapter = "" made every plan fail, before:
        # "no adapter configured for ['']", and the node stayed in service)
        poll(lambda: fake.nodes["node-001"]["spec"].get("unschedulable"), 60, "node-001 out")
        assert not fake.nodes["node-002"]["spec"].get("unschedulable")
    finally:
        engine.terminate()
        engine.wait(30)
        log.close()
        fake.stop()


def _answers(port: int) -> bool:
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/healthz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def test_the_namespace_admits_what_the_agent_needs() -> None:
    """The agent uses hostPath, hostPID and SYS_PTRACE, which Pod Security's baseline level
    refuses: the namespace says ``enforce: privileged`` (before: no label, so a cluster
    enforcing baseline by default refused every agent pod)."""
    docs = documents()
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    labels = ns["metadata"].get("labels", {})
    assert labels.get("pod-security.kubernetes.io/enforce") == "privileged", labels
    spec = next(s for s in pod_specs(docs) if s.get("hostPID"))
    assert any("hostPath" in v for v in spec["volumes"])


def test_the_grafana_identity_in_deploy_md_takes_what_grafana_sends(tmp_path: Path) -> None:
    """docs/DEPLOY.md's ``grafana`` identity (found in review: following DEPLOY, every alert
    Grafana posted was answered 401) loads, and its kinds are exactly those of the critical
    rules, the ones whose contact point is the engine."""
    import re
    import tomllib

    from gpuwarden.dashboards.alerts import rule_specs
    from gpuwarden.dashboards.cli import contact_point_warnings
    from gpuwarden.dashboards.config import load_config as load_dashboards_config
    from gpuwarden.remediation.config import load_config as load_remediation_config

    page = (ROOT / "docs/DEPLOY.md").read_text().partition("The engine must accept Grafana")[2]
    block = re.search(r"```toml\n(.*?)```", page, re.DOTALL)
    assert block is not None
    (tmp_path / "grafana").write_text("a test key, CONSTRUCTED\n")
    (tmp_path / "grafana").chmod(0o400)
    text = block.group(1).replace("/etc/gpuwarden/keys/", f"{tmp_path}/")
    doc = tomllib.loads(text)
    cfg = load_dashboards_config(None)
    critical = {s.kind for s in rule_specs(cfg) if s.severity == "critical"}
    assert set(doc["identity"][0]["kinds"]) == critical
    (tmp_path / "remediation.toml").write_text(text)
    engine = load_remediation_config(tmp_path / "remediation.toml")
    assert engine["engine"]["alerts_unsigned"] is True
    (grafana,) = engine.identities
    assert grafana.kind == "alerts" and set(grafana.kinds) == critical
    # and the exporter says when the token, or a contact point for warnings, is missing
    warned = contact_point_warnings(cfg)
    assert any("webhook_token_file is empty" in w for w in warned)
    assert any("slack_url_file is empty" in w for w in warned)


def test_an_operator_reaches_the_shipped_engine_with_their_own_key(
    tmp_path: Path, capsys: Any
) -> None:
    """Found in review (as a new operator): with the ConfigMap's remediation.toml and their own
    key (recipe step 3), ``gpuwarden remediate pending`` exited 2 on the engine pod's monitor
    token (a file only the pod has; a command signing as an identity never reads it), and
    would have called 0.0.0.0. Now it reads only the operator's key and calls the engine at
    127.0.0.1 (``kubectl port-forward``), or at ``[engine] url``."""
    from gpuwarden.remediation.cli import main
    from testbed.influxd import free_port

    port = free_port()  # nothing listens there: the command gets as far as calling
    key = tmp_path / "admin"
    key.write_text("a test key for admin, CONSTRUCTED\n")
    key.chmod(0o400)
    text = _configmap(documents(), "gpuwarden-remediate", "remediation.toml")
    assert '"/var/run/secrets/gpuwarden/keys/monitor"' in text  # not on this machine
    text = text.replace('listen = "0.0.0.0:9470"', f'listen = "0.0.0.0:{port}"').replace(
        "[engine]\n",
        f'[engine]\noperator_identity = "admin"\noperator_secret_file = "{key}"\n',
        1,
    )
    config = tmp_path / "remediation.toml"
    config.write_text(text)
    assert main(["--config", str(config), "pending"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the engine at http://127.0.0.1:{port}/v1/pending" in err, err
    url = f'[engine]\nurl = "http://localhost:{port}/"\n'
    config.write_text(text.replace("[engine]\n", url, 1))
    assert main(["--config", str(config), "pending"]) == 1
    assert f"http://localhost:{port}/v1/pending" in capsys.readouterr().err


def test_the_network_policy_example_admits_prometheus_to_the_agents_metrics_only() -> None:
    """docs/DEPLOY.md told operators to write a NetworkPolicy for the agent's unauthenticated
    /metrics; now one is shipped (an example: the Prometheus it admits is the site's). It
    selects the DaemonSet's pods, admits one peer to the port the DaemonSet names ``metrics``
    and the Prometheus example scrapes, and nothing else (the relay is a Unix socket on the
    node; the kubelet's probes come from the node)."""
    policy = yaml.safe_load((FOLDER / "agent-networkpolicy.yaml.example").read_text())
    assert policy["kind"] == "NetworkPolicy" and policy["metadata"]["namespace"] == NAMESPACE
    (agent,) = [d for d in documents() if d["kind"] == "DaemonSet"]
    labels = agent["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert {"namespaceSelector", "podSelector"} <= peer.keys()  # one peer: both must hold
    (port,) = rule["ports"]
    (container,) = agent["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["port"] == "metrics" and ports["metrics"] == 9466
    scrape = (ROOT / "deploy/prometheus/prometheus.example.yml").read_text()
    assert f"regex: {labels['app.kubernetes.io/name']};metrics" in scrape
