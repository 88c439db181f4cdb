"""Issue 41, the job or the hardware: an application XID on most of one job's nodes at once is
one finding about the job (its owner told, no node moved); the same code on one GPU across
different jobs is the GPU (cordoned); a storm of one code on one GPU is one episode.

Every input is CONSTRUCTED: XID points made by the agent's own ``xid_point`` (what a node's
agent writes for a kernel-log XID line) and ``gpu`` points tagged with the job, written to the
REAL influxd (Debian 1.6.7); the analysis is the analyze service's (``analyse`` + ``findings``),
and every finding goes to the real remediation engine with the shipped default policies and
recording adapters in place of Slurm and the webhook.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.emit import findings
from gpuwarden.analytics.jobfaults import read_firsts, read_xids
from gpuwarden.analytics.runner import LocalExecutor, analyse
from gpuwarden.collector import sources
from gpuwarden.collector.attribution import JobInfo
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.events import xid_point
from gpuwarden.core.finding import Finding
from gpuwarden.core.store.lineprotocol import encode_points
from gpuwarden.core.store.lineprotocol.encode import Point
from gpuwarden.core.store.reader import InfluxReader
from gpuwarden.core.xidcat import XidPolicy
from gpuwarden.remediation.audit import AuditLog
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import ActionKind
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from tests.remediation_util import RecordingAdapter

S = 10**9
END = 1_790_000_000 * S
NODES = [f"n{i:02d}" for i in range(24)]
MESSAGE = "Xid (PCI:0000:18:00): 43, pid=4100, name=python3, Ch 00000008"


def xid_points(
    node: str, gpu: int, job: str, xid: int, t_ns: int, emitted: list[Finding]
) -> list[Point]:
    """The ``gpu_event`` point the node's agent writes for this XID (and, through
    ``emitted``, whatever it would post on the fast path)."""
    context = SourceContext("c", node)
    context.emit_finding = emitted.append
    point = xid_point(
        context, XidPolicy(), xid=xid, message=MESSAGE, source="kmsg", now_ns=t_ns,
        gpu=gpu, uuid=f"GPU-{node}-{gpu}", pid=4100, job=JobInfo(job, str(gpu), str(gpu)),
    )  # fmt: skip
    return [point]


def gpu_points(nodes: list[str], job: str, start_ns: int, end_ns: int) -> list[Point]:
    """The job's GPUs reporting every 10 s (8 per node), tagged with it."""
    return [
        Point("gpu", {"cluster": "c", "node": n, "gpu": str(g), "job": job}, {"power_w": 500.0}, t)
        for n in nodes
        for g in range(8)
        for t in range(start_ns, end_ns, 10 * S)
    ]


def write(influxd, db: str, points: list[Point]) -> None:
    lines = encode_points(points)
    for i in range(0, len(lines), 20_000):
        influxd.write(db, "\n".join(lines[i : i + 20_000]))


def analysed(influxd, db: str, end_ns: int = END) -> list[Finding]:
    """What one analysis of the hour up to ``end_ns`` finds (the analyze service's path)."""
    cfg = with_overrides(
        load_config(None, environ={}),
        influxdb={"url": influxd.url, "database": db},
        analysis={"silent_after_s": 0.0},
    )
    return findings(analyse(cfg, end_ns - 3600 * S, end_ns, LocalExecutor()))


def engine(tmp: Path) -> tuple[Engine, RecordingAdapter, RecordingAdapter]:
    sched = RecordingAdapter("slurm", {n: "gpu" for n in NODES})
    notes = RecordingAdapter("webhook")
    e = Engine(
        load_policies(DEFAULT_POLICIES),
        {"slurm": sched, "webhook": notes},
        AuditLog(tmp / "audit.jsonl"),
        EngineSettings(dry_run=False, cooldown_s=0.0, actions_per_minute=10_000),
    )
    return e, sched, notes


def removed(sched: RecordingAdapter) -> list[tuple[str, str]]:
    return [(str(a.kind), a.node) for a in sched.calls
            if a.kind in (ActionKind.CORDON, ActionKind.DRAIN)]  # fmt: skip


def test_one_jobs_crash_puts_xid_43_on_20_nodes_one_job_finding_no_node_moved(
    influxd, influx_db, tmp_path
):
    """Must-show 2 of issue 41. Job 9001 runs on 20 nodes (8 GPUs each); it crashes and every
    one of its 160 GPUs logs XID 43 within one second. Before that, GPU 0 of n00 had logged
    XID 43 in two other jobs of its own: the crash must not make it a third (it was the job's
    fault, not the GPU's)."""
    crash = END - 1200 * S
    job_nodes = NODES[:20]
    emitted: list[Finding] = []
    points = gpu_points(job_nodes, "9001", crash - 1800 * S, crash)
    for k, node in enumerate(job_nodes):
        for g in range(8):
            points += xid_points(node, g, "9001", 43, crash + (k * 8 + g) * S // 200, emitted)
    for j, job in enumerate(("7001", "7002")):  # the same GPU, earlier, alone in its job
        points += xid_points("n00", 0, job, 43, crash - (3 - j) * 3600 * S, emitted)
    write(influxd, influx_db, points)
    assert emitted == []  # the agent's fast path says nothing: XID 43 is not a hardware fault

    found = analysed(influxd, influx_db)
    faults = [f for f in found if f.kind == "job_app_fault"]
    assert len(faults) == 1, [(f.kind, dict(f.subject)) for f in found]
    fault = faults[0]
    assert dict(fault.subject) == {"cluster": "c", "job": "9001"}
    assert fault.evidence["xid"] == 43
    assert fault.evidence["nodes_count"] == 20 and fault.evidence["job_nodes_count"] == 20
    assert fault.evidence["gpus_count"] == 160 and fault.evidence["nodes"] == job_nodes
    assert fault.time_ns == crash  # stamped at the crash: every window gives it one id
    assert [f for f in found if "node" in f.subject] == []  # no node's finding, no lemon

    e, sched, notes = engine(tmp_path)
    verdicts = [e.submit(f).verdict for f in found]
    assert verdicts == ["act"]
    assert e.wait(30)
    e.close()
    assert removed(sched) == []  # no node drained or cordoned
    assert [(str(a.kind), a.params["kind"], a.params["subject"].get("job")) for a in notes.calls
            ] == [("notify", "job_app_fault", "9001")]  # fmt: skip


def test_one_gpu_with_the_same_xid_in_three_jobs_is_reported(influxd, influx_db, tmp_path):
    """XID 43 on n05 GPU 3 in three different jobs (each on 4 nodes, the others clean):
    the GPU's finding, and the engine tells someone (the shipped policy only notifies: job
    ids are not users, and one user could multiply them to take an innocent node out). Two
    jobs are not enough."""
    emitted: list[Finding] = []
    points = []
    for j, job in enumerate(("8101", "8102", "8103")):
        t = END - (3 - j) * 900 * S
        points += gpu_points(["n04", "n05", "n06", "n07"], job, t - 600 * S, t)
        points += xid_points("n05", 3, job, 43, t, emitted)
    write(influxd, influx_db, points)

    assert analysed(influxd, influx_db, end_ns=END - 900 * S) == []  # before the third job
    found = analysed(influxd, influx_db)
    assert [(f.kind, dict(f.subject)) for f in found] == [
        ("gpu_app_xid_repeats", {"cluster": "c", "node": "n05", "gpu": "3"})
    ]
    assert found[0].evidence["jobs"] == ["8101", "8102", "8103"]
    e, sched, notes = engine(tmp_path)
    assert e.submit(found[0]).verdict == "act"
    assert e.wait(30)
    e.close()
    assert removed(sched) == []
    assert [(str(a.kind), a.node) for a in notes.calls] == [("notify", "n05")]


def test_two_jobs_on_one_gpu_are_nothing(influxd, influx_db):
    emitted: list[Finding] = []
    points = []
    for j, job in enumerate(("8201", "8202")):
        t = END - (2 - j) * 900 * S
        points += gpu_points(["n04", "n05"], job, t - 600 * S, t)
        points += xid_points("n05", 3, job, 43, t, emitted)
    write(influxd, influx_db, points)
    assert analysed(influxd, influx_db) == []


def test_a_storm_of_one_xid_on_one_gpu_is_one_node_not_a_job_fault(influxd, influx_db):
    """100,000 XID 43 on one GPU of a 4-node job within 1,000 s (analytics counts per second,
    never per point): one node is not most of the job, one job is not three."""
    emitted: list[Finding] = []
    start = END - 1500 * S
    points = gpu_points(["n10", "n11", "n12", "n13"], "9100", start - 600 * S, start)
    points += [
        p
        for i in range(100_000)
        for p in xid_points("n10", 2, "9100", 43, start + i * 10_000_000, emitted)
    ]
    write(influxd, influx_db, points)
    assert emitted == []
    assert analysed(influxd, influx_db) == []
    reader = InfluxReader(influxd.url, influx_db)
    try:  # what the rule reads of the storm: a count per second, one first XID per GPU and job
        counted = read_xids(reader, 43, END - 3600 * S, END, 1)
        firsts = read_firsts(reader, 43, END - 7 * 86400 * S, END)
    finally:
        reader.close()
    assert counted.height == 1000 and int(counted["n"].sum()) == 100_000
    assert firsts.select("node", "gpu", "job", "t").rows() == [("n10", "2", "9100", start)]


def test_a_storm_of_a_fatal_xid_is_one_fast_path_finding(tmp_path):
    """XID 95 (uncontained ECC error, fatal) logged 100,000 times on one GPU over 1,000 s: the
    agent writes every line's point (nothing is lost) but posts one finding at the start and
    one again each xid_resend_s (600 s) while it goes on, not 100,000 (nor only one, ever: a
    lost or refused first finding would leave a failing GPU in service)."""
    stamp = [f"Thu Nov 26 10:{s // 60:02d}:{s % 60:02d} 2026" for s in range(1000)]
    log = tmp_path / "kmsg.log"
    with log.open("w") as f:
        for i in range(100_000):
            f.write(f"[{stamp[i // 100]}] NVRM: Xid (PCI:0000:18:00): 95, pid=4100, "
                    "name=python3, Uncontained: FBHUB. RST: No, D-RST: No\n")  # fmt: skip
    context = SourceContext("c", "n1", sysfs=tmp_path, procfs=tmp_path / "proc")
    context.inventory.gpus_by_pci["0000:18:00"] = (0, "GPU-0")
    emitted: list[Finding] = []
    context.emit_finding = emitted.append
    source = sources.create("xid", context, {"path": str(log), "lookback_s": 0.0, "follow_s": 0})
    try:
        points = source.collect(1_800_000_000 * S)
        assert len(points) == 100_000
        assert [(f.kind, f.subject.get("gpu"), f.evidence["xid"]) for f in emitted] == [
            ("gpu_xid", "0", 95)
        ] * 2
        assert emitted[1].time_ns - emitted[0].time_ns == 600 * S  # sent again at 600 s
        source.committed(save=False)  # the agent's sink has them: not sent again
        with log.open("a") as f:  # quiet for more than xid_recovery_s (300 s): a new episode
            f.write("[Thu Nov 26 10:30:00 2026] NVRM: Xid (PCI:0000:18:00): 95, pid=4100, "
                    "name=python3, Uncontained: FBHUB. RST: No, D-RST: No\n")  # fmt: skip
        assert len(source.collect(1_800_000_000 * S)) == 1
        assert len(emitted) == 3
    finally:
        source.close()
