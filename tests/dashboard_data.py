"""The data the dashboard tests query: one InfluxDB database holding everything gpuwarden
writes, each part from the path that really produces it.

* SIMULATED scenario ``fleet-tour`` (16 nodes, one hour: a slow GPU, a congested ToR, ECC
  errors ending in a row-remap failure, an XID 79, a node set up unlike the fleet), written
  through the sink;
* the agent itself (``Agent.collect``) on node ``node-h100`` over the golden inputs: the
  recorded 8xH100 NVML answers (constructed from NVML's documentation, see that case's
  provenance), the constructed RAPL/hwmon/thermal tree, the REAL kernel log with XID 119,
  and an InfiniBand tree with every counter the source reads (constructed here, growing);
  NVSwitch SXid lines (CONSTRUCTED in the driver's format) through the kernel-log source;
* analytics (``analyse`` + ``emit``) over the scenario in four windows: findings, MFU,
  stragglers, congestion, energy;
* the failure predictor (trained on this same hour: plumbing, not a model to trust) scoring
  every GPU every 5 minutes: ``failure_risk`` and its findings;
* the remediation engine (dry-run, the Kubernetes adapter against the project's fake API
  server) over all those findings: ``remediation_action``;
* outcomes (``remediation_outcome``, issue 41): a second engine, acting for real on an
  in-memory scheduler with the windows shortened and its clock moved by hand, takes out two of
  the scenario's nodes on CONSTRUCTED findings near the hour's end: one fails its check
  (confirmed), an operator puts the other back as a false alarm (refuted).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.analytics.config import AnalyticsConfig, load_config, with_overrides
from gpuwarden.analytics.emit import findings, points
from gpuwarden.analytics.predict.cli import dataset, train
from gpuwarden.analytics.predict.model import RiskModel
from gpuwarden.analytics.predict.scoring import score
from gpuwarden.analytics.runner import LocalExecutor, analyse
from gpuwarden.analytics.topology import write_topology
from gpuwarden.collector import sources
from gpuwarden.collector.agent import Agent
from gpuwarden.collector.jobside.reporter import Reporter
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.infiniband import COUNTERS
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.remediation.adapters.kubernetes import KubernetesAdapter
from gpuwarden.remediation.adapters.webhook import WebhookAdapter
from gpuwarden.remediation.audit import AuditLog
from gpuwarden.remediation.cli import action_point, outcome_point
from gpuwarden.remediation.clock import Clock
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import Action, Adapter, Outcome
from gpuwarden.remediation.outcomes import OutcomeSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from gpuwarden.simulation.generator import TAGS, ScenarioGenerator
from gpuwarden.simulation.spec import MEASUREMENTS, load_spec
from testbed.influxd import LocalInfluxd
from testbed.k8s import FakeKubernetes
from tests.remediation_util import RecordingAdapter
from tests.test_golden import GOLDEN, materialise

AGENT_NODE = "node-h100"
AGENT_CYCLES = 6
AGENT_EVERY_S = 300


@dataclass(frozen=True)
class Dataset:
    database: str
    start_ms: int
    end_ms: int
    cluster: str


def _ib_tree(root: Path, step: int) -> None:
    """Every counter the InfiniBand source reads, on two mlx5 ports, growing each step."""
    for hca, port in (("mlx5_0", "1"), ("mlx5_1", "1")):
        base = root / "class" / "infiniband" / hca / "ports" / port
        for i, name in enumerate(sorted(COUNTERS)):
            sub = "hw_counters" if name in _HW else "counters"
            path = base / sub / name
            path.parent.mkdir(parents=True, exist_ok=True)
            # data in 4-byte words and packets grow fast; errors and xmit_wait slowly
            rate = 10**9 if name.endswith("_data") else 10**7 if "packets" in name else i + 1
            path.write_text(f"{rate * (step + 1)}\n")
        for name, value in (
            ("state", "4: ACTIVE"),
            ("phys_state", "5: LinkUp"),
            ("rate", "400 Gb/sec (4X NDR)"),
            ("link_layer", "InfiniBand"),
        ):
            (base / name).write_text(value + "\n")


_HW = {
    "np_cnp_sent",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "np_ecn_marked_roce_packets",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "implied_nak_seq_err",
    "rnr_nak_retry_err",
    "duplicate_request",
    "req_cqe_error",
    "resp_cqe_error",
}


def _agent_points(tmp: Path, sink: InfluxSink, cluster: str, start_ns: int) -> None:
    sysfs = tmp / "sys"
    context = SourceContext(cluster, AGENT_NODE, sysfs=sysfs, procfs=tmp / "proc")
    nvml_case = GOLDEN / "nvml-h100-8gpu"
    materialise(nvml_case / "proc.csv", tmp)
    made = [
        sources.create(
            "nvml",
            context,
            {
                "backend": "recorded",
                "recording": str(nvml_case / "nvml.json"),
                "events": "poll",
                "jobmap_dir": str(tmp / "jobs"),
            },
        ),
        sources.create("power", context, {}),
        sources.create("thermal", context, {}),
        sources.create("infiniband", context, {}),
        sources.create(
            "xid", context, {"path": str(GOLDEN / "xid-kmsg-real" / "kmsg.log"), "lookback_s": 0.0}
        ),
    ]
    agent = Agent(
        made, sink, cluster=cluster, node=AGENT_NODE, sink_stats=lambda: sink.stats().fields()
    )
    context.emit_finding = agent.add_finding  # the fast path's findings, as agent_cli wires
    thermal_steps = sorted((GOLDEN / "power-thermal").glob("sysfs-*.csv"))
    for cycle in range(AGENT_CYCLES):
        materialise(thermal_steps[min(cycle, len(thermal_steps) - 1)], tmp)
        _ib_tree(sysfs, cycle)
        now = start_ns + (60 + cycle * AGENT_EVERY_S) * 10**9
        pts = agent.collect(now)
        for p in pts:
            assert check_point(p.measurement, p.tags, p.fields) == [], p
        sink.write_points(pts)
    for s in made:
        s.close()
    # NVSwitch SXids: CONSTRUCTED lines in the driver's format (no real NVSwitch log here),
    # 40 and 41 minutes into the hour, through the kernel-log source
    sxid_log = tmp / "sxid-kmsg.log"
    sxid_log.write_text(
        "[Sun Feb 23 16:40:00 2025] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, "
        "Non-fatal, Link 04 RX Short Error Rate\n"
        "[Sun Feb 23 16:41:00 2025] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 24007, Fatal, "
        "Link 30 sourcetrack TCEN0 crumbstore ECC DBE Error\n"
    )
    sxid = sources.create("xid", context, {"path": str(sxid_log), "lookback_s": 0.0})
    sxid_points = sxid.collect(start_ns)
    sxid.close()
    assert [p.measurement for p in sxid_points] == ["nvswitch_event", "nvswitch_event"]
    sink.write_points(sxid_points)


def _reporter_steps(url: str, database: str, cluster: str, start_ns: int) -> None:
    """A small job on the agent's node reporting through the real training-side reporter,
    with its loss (the scenario's jobs do not report one) and its checkpoint saves (every
    10 steps, each holding it up 20 s: analytics advises its interval from them)."""
    rep = Reporter("tiny-run", 0, url=url, database=database, cluster=cluster, node=AGENT_NODE)
    for i in range(120):
        t = start_ns + (30 * i + 5) * 10**9
        rep.step(i, 0.9 + 0.01 * (i % 7), 4096, 2, loss=4.0 * 0.99**i, time_ns=t)
        if i % 10 == 9:
            rep.checkpoint(i, 20.0, 300.0, time_ns=t + 10**9)
    assert rep.close(timeout_s=30) and rep.dropped == 0, rep.last_error


def _remediate(
    windows: list[tuple[int, list[Finding]]], nodes: list[str], tmp: Path, sink: InfluxSink
) -> int:
    """The remediation engine, in dry-run, over every finding analytics and the scorer made.

    Node actions go to the Kubernetes adapter against the project's fake API server (holding
    the scenario's nodes; dry-run changes nothing there), notifications to a webhook adapter
    with no receiver. The engine's clock is the window's end, so its ``remediation_action``
    events land inside the scenario's hour.
    """
    policies = load_policies(DEFAULT_POLICIES)
    now = [0.0]
    written = [0]

    def on_action(action: Action, outcome: Outcome, record: dict[str, Any]) -> None:
        sink.write_points([action_point(action, outcome, record)])
        written[0] += 1

    with FakeKubernetes(token="dash") as fake:
        for node in nodes:
            fake.add_node(node)
        (tmp / "k8s-token").write_text("dash")
        adapters: dict[str, Adapter] = {
            "kubernetes": KubernetesAdapter(api_url=fake.url, token_file=str(tmp / "k8s-token")),
            "webhook": WebhookAdapter(),
        }
        settings = EngineSettings(node_adapter="kubernetes", checkpoint_adapter="kubernetes")
        engine = Engine(
            policies,
            adapters,
            AuditLog(tmp / "audit.jsonl"),
            settings,
            clock=lambda: now[0],
            on_action=on_action,
        )
        for end_ns, found in windows:
            now[0] = end_ns / 1e9
            for f in found:
                engine.submit(f)
            assert engine.wait(60)
        engine.close()
    return written[0]


def _outcomes(nodes: list[str], end_s: float, tmp: Path, sink: InfluxSink, cluster: str) -> int:
    """Two outcomes from a real engine (not a dry run; an in-memory scheduler), its clock moved
    by hand within the scenario's last 20 minutes: a drain confirmed by a failed check, a
    cordon refuted by an operator's ``undo --false-alarm``."""
    wall = [end_s - 1200.0]
    written = [0]

    def on_outcome(record: dict[str, Any]) -> None:
        sink.write_points([outcome_point(record)])
        written[0] += 1

    settings = EngineSettings(
        dry_run=False, cooldown_s=0.0, max_nodes_out=8, max_fraction_out=1.0,
        return_requires="none", lemon_count=0,
        outcomes=OutcomeSettings(quick_pass_s=600.0, clean_window_s=600.0),
    )  # fmt: skip
    engine = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": RecordingAdapter("slurm", dict.fromkeys(nodes, "gpu")),
         "webhook": RecordingAdapter("webhook")},
        AuditLog(tmp / "outcomes-audit.jsonl"),
        settings,
        clock=Clock(wall=lambda: wall[0], mono=lambda: wall[0]),
        on_outcome=on_outcome,
    )  # fmt: skip

    def found(kind: str, node: str, **evidence: Any) -> Finding:
        return Finding(kind=kind, subject={"cluster": cluster, "node": node},
                       severity=Severity.CRITICAL, time_ns=int(wall[0] * 1e9),
                       evidence=evidence, confidence=1.0, summary=f"{kind} on {node}",
                       source="agent")  # fmt: skip

    first, second = nodes[0], nodes[1]
    for f in (found("gpu_xid", first, xid=79), found("fabric_unregistered", second)):
        assert engine.submit(f).verdict == "act"
        assert engine.wait(30)
        wall[0] += 60.0
    engine.submit(found("node_check_failed", first))
    assert engine.wait(30)
    wall[0] += 60.0
    engine.undo(second, "dashboards-test", reason="false_alarm")
    assert engine.wait(30)
    wall[0] += 60.0
    engine.tick()
    engine.close()
    return written[0]


def _risk_model(cfg: AnalyticsConfig, start_ns: int, end_ns: int) -> RiskModel:
    """The failure predictor trained on this same hour (one ECC failure with a precursor, one
    XID 79): a plumbing model, so failure_risk comes from the real scorer -- its numbers mean
    nothing beyond this test."""
    ds = dataset(cfg, start_ns, end_ns, LocalExecutor())
    model, _ = train(cfg, [ds], version="dashboards-test")
    return model


def load(influxd: LocalInfluxd, database: str, tmp: Path) -> Dataset:
    influxd.create_database(database)
    spec = dataclasses.replace(load_spec("fleet-tour"), measurements=MEASUREMENTS).validate()
    gen = ScenarioGenerator(spec, seed=1)
    sink = InfluxSink(
        SinkConfig(
            url=influxd.url, database=database, spool_dir=str(tmp / "spool"), batch_size=20_000
        )
    )
    cluster = ""
    for chunk in gen.chunks(ticks_per_chunk=60):
        for m, df in chunk.items():
            sink.write_frame(df, m, tags=[t for t in TAGS[m] if t in df.columns])
            if not cluster and "cluster" in df.columns and df.height:
                cluster = str(df["cluster"][0])
    _agent_points(tmp / "agent", sink, cluster, spec.start_ns)
    _reporter_steps(influxd.url, database, cluster, spec.start_ns)
    assert sink.close(timeout_s=120)

    topo = tmp / "topology.csv"
    switches = dict(zip(gen.node_names, gen.switch_of, strict=True))
    write_topology({**switches, AGENT_NODE: "P99-S1"}, topo)
    cfg = with_overrides(
        load_config(environ={}),
        influxdb={"url": influxd.url, "database": database},
        analysis={"topology": str(topo), "spool_dir": str(tmp / "aspool")},
    )
    end_ns = spec.start_ns + spec.duration_s * 10**9
    windows = 4
    step = (end_ns - spec.start_ns) // windows
    out = InfluxSink(SinkConfig(url=influxd.url, database=database, spool_dir=str(tmp / "aspool2")))
    risk = _risk_model(cfg, spec.start_ns, end_ns)
    nodes = [*gen.node_names, AGENT_NODE]
    remediate: list[tuple[int, list[Finding]]] = []
    for w in range(windows):
        a = analyse(cfg, spec.start_ns + w * step, spec.start_ns + (w + 1) * step, LocalExecutor())
        found = findings(a)
        for k in range(3):  # the failure predictor, every 5 minutes
            at = spec.start_ns + w * step + (k + 1) * step // 3
            scored = score(cfg, risk, at, LocalExecutor(), cluster=cluster, nodes=nodes)
            out.write_points(scored.points)
            found += scored.findings
        out.write_points(points(a, found))
        remediate.append((spec.start_ns + (w + 1) * step, found))
    assert _remediate(remediate, nodes, tmp, out) > 0
    assert _outcomes(gen.node_names, end_ns / 1e9, tmp, out, cluster) == 2
    assert out.close(timeout_s=120)
    return Dataset(database, spec.start_ns // 10**6, end_ns // 10**6, cluster)
