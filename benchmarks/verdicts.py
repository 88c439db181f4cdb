"""Verdicts operators can trust (issue 41): which nodes the shipped policies would take out in
a SIMULATED week of a mixed fleet, against the scenario's ground truth.

The week (``--days`` 7, ``--nodes`` 64 x 8 GPUs) is an event timeline, not 1 Hz telemetry:

* **hardware faults** from the REAL StepFun process (:func:`simulation.faults.stepfun_process`:
  a random window of the InfiniteHBD trace, its servers mapped onto the nodes, its arrivals
  and repair times compressed ``--compression`` times, 20 by default: the week holds 140 days
  of the trace's faults), each resolved to the twin's fault type (:mod:`simulation.faults`);
  a fault with an XID writes that XID on its GPU's kernel log (an XID 74 repeats every 30 s
  for up to 20 minutes: a storm); an InfiniBand fault flaps its port; a fatal fault on a
  node of a multi-node job kills the job half the time (XID 45 on all its GPUs, 2-10 s after);
* **jobs**: every 12 hours the nodes are dealt into jobs of 1, 2, 4 or 8 nodes (and once in
  the week one job of 20); a multi-node job crashes with probability 0.3 (one application
  XID, 13, 31, 43 or 45, on every GPU it has within a second), any job has probability 0.2 of
  one application XID on one GPU (one rank's bug), and the 20-node job crashes with XID 43;
* **link flaps that heal**: ``--flaps`` ports go down 3 to 6 times in a few minutes, then stay up;
* **transient NFS stalls**: ``--stalls`` times an NFS server stops answering 8 to all nodes for
  30 to 120 s ("nfs: server ... not responding, still trying", then "... OK").

The product path, none of which sees the ground truth: each node's kernel lines are parsed
by the agent's parser (``parse_message``) and turned into points and fast-path findings by
the agent's own XID source (``XidSource``: its XID policy, storm episodes and OS rules) and
InfiniBand flap episodes (``InfinibandSource``); the points (and each job's ``gpu`` points)
go into a REAL influxd, where the analyze service's job-or-hardware rule
(:func:`analytics.jobfaults.find_app_faults`, on 6-hour windows, one every 3 hours: the
service's own runs overlap too) and its emitter
(:func:`analytics.emit.findings`) find the job-wide faults. Every finding then meets the
shipped DEFAULT policies by **policy evaluation** (``first_match``, as the engine's decide
step does; the engine's guards, which delay or hold removals but never add one, are not run):
a policy whose ladder holds ``drain`` or ``cordon`` takes the node out. Decisions about one
node within the engine's ``cooldown_s`` (1,800 s) of the one counted are one removal.

Ground truth (here only): a removal is *right* if the node had a hardware fault of the
scenario active (onset - 60 s to its repair + 60 s), *wrong* otherwise. A fault the twin calls
fatal should be removed within 10 minutes of its onset; one that is not is *missed*. The
missed are printed by type: the product deliberately only notifies for an InfiniBand port
that flaps (``link_flap``), so the StepFun cable and NIC faults count as missed in every arm.
A whole node down (:data:`AGENT_BLIND`) leaves no agent to see it and is counted apart.

Three arms, each from its own agents and analysis of the same events:

* ``shipped``: today's defaults;
* ``no-fold``: the same without the job-or-hardware analysis (``job_app_fault``,
  ``gpu_app_xid_repeats`` never raised): gpuwarden before the split (commit adaf9fa);
* ``app-xids-fatal``: the agents' ``[xid] extra_fatal_xids = [13, 31, 43, 45]``, as peers
  treat application XIDs (each GPU's XID a hardware fault of its node).

Seeds: 1-3 were the development seeds this file was written on; 8101-8105 (unused when this
was written) became development seeds too: their first run was stopped after seed 8102 showed
two job findings for the 20-node job (its crash, XID 43, and a second crash, XID 45, when a
hardware fault on one of its nodes killed it later), which changed how this file counts the
crash's finding (by its code) and, before that was understood, the analysis windows (now
overlapping, as the service runs). 8201-8205 (unused as seeds anywhere in the repository)
are the fresh seeds of the published figure.

    python -m benchmarks.verdicts [--seeds 8201-8205] [--nodes 64 --days 7]
    python -m benchmarks.verdicts --smoke    # 24 nodes, 1 day, 1 seed

Last line: ``wrong_drains_pct=<x> missed_faults_pct=<y> missed_before_pct=<z>`` (shipped arm,
all seeds; the goal: wrong <= 2 and missed <= missed_before).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.emit import findings as analytics_findings
from gpuwarden.analytics.jobfaults import find_app_faults
from gpuwarden.analytics.runner import Analysis
from gpuwarden.collector.attribution import NO_JOB, JobInfo
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.events import xid_point
from gpuwarden.collector.sources.infiniband import InfinibandSource, Port
from gpuwarden.collector.sources.kmsg import OsLine, XidLine, parse_message
from gpuwarden.collector.sources.xid import KmsgXidSource as XidSource
from gpuwarden.core.finding import Finding
from gpuwarden.core.store.lineprotocol import Point, encode_points
from gpuwarden.core.store.reader import InfluxReader
from gpuwarden.remediation.engine.decide import EngineSettings
from gpuwarden.remediation.model import ActionKind
from gpuwarden.remediation.policy import DEFAULT_POLICIES, first_match, load_policies
from gpuwarden.simulation.faults import resolve_all
from gpuwarden.simulation.faulttypes import DAY, Fault
from gpuwarden.simulation.spec import ScenarioSpec, StepfunSpec

S = 1_000_000_000
CLUSTER = "sim"
GPUS = 8
START_NS = 1_767_571_200 * S  # 2026-01-05T00:00:00Z, the twin's default start
APP_XIDS = (13, 31, 43, 45)
EPOCH_S = 12 * 3600.0
SIZES = (1, 2, 4, 8)
BIG_JOB = 20
BIG_XID = 43
CRASH_P = 0.3
ONE_GPU_P = 0.2
KILLS_JOB_P = 0.5
STORM_EVERY_S, STORM_FOR_S = 30.0, 1200.0
RIGHT_SLACK_S = 60.0
MISSED_AFTER_S = 600.0
REMOVES = {ActionKind.DRAIN, ActionKind.CORDON}
#: the analysis window (``[analysis] window_s``; the service's default is an hour): 6 hours,
#: so that a week is 56 analyses, not 336. Each analysis re-reads the nodes of every job-wide
#: fault of the week before it (one query each), so an hour's windows cost minutes a seed
WINDOW_S = 6 * 3600.0
ARMS = ("shipped", "no-fold", "app-xids-fatal")
JOB_RULE_KINDS = {"job_app_fault", "gpu_app_xid_repeats"}
#: fatal faults that leave no agent to see them: the whole node is down (Slurm marks a node
#: that stops answering DOWN by itself; gpuwarden's node_silent only notifies)
AGENT_BLIND = {"node_down"}


class Influx(Protocol):
    @property
    def url(self) -> str: ...

    def write(self, database: str, lines: str) -> None: ...

    def create_database(self, name: str) -> None: ...


@dataclass(frozen=True)
class Line:
    """One kernel-log line on one node (``gpu``: which GPU an XID line's PCI address is)."""

    t_s: float
    node: int
    text: str
    gpu: int | None = None
    job: str = ""


@dataclass(frozen=True)
class Flap:
    t_s: float
    node: int
    hca: int


@dataclass
class Week:
    """What happens (the events the agents see) and why (the ground truth, kept apart)."""

    nodes: int
    duration_s: float
    lines: list[Line] = field(default_factory=list)
    flaps: list[Flap] = field(default_factory=list)
    job_nodes: dict[str, tuple[float, float, tuple[int, ...]]] = field(default_factory=dict)
    """job -> (start, end, nodes): what the agents tag their gpu points with."""
    # ground truth: never read by the product path
    faults: list[Fault] = field(default_factory=list)
    big_crash: tuple[str, tuple[int, ...]] = ("", ())
    app_crashes: int = 0
    one_gpu_xids: int = 0
    heal_flaps: int = 0
    stalls: int = 0


def name(node: int) -> str:
    return f"node-{node:03d}"


def xid_text(xid: int, gpu: int, pid: int) -> str:
    return (
        f"NVRM: Xid (PCI:0000:{0x18 + 0x10 * gpu:02x}:00): {xid}, pid={pid}, "
        "name=python3, Ch 00000008"
    )


def build_week(
    seed: int, nodes: int, days: float, compression: float, flaps: int, stalls: int
) -> Week:
    rng = np.random.default_rng(seed)
    duration = days * DAY
    spec = ScenarioSpec(
        name=f"verdicts-{seed}",
        nodes=nodes,
        duration_s=int(duration),
        stepfun=StepfunSpec(compression=compression),
    ).validate()
    week = Week(nodes, duration, faults=resolve_all(spec, rng))
    # jobs: every EPOCH_S the nodes are dealt into jobs; one epoch holds the 20-node job
    epochs = int(np.ceil(duration / EPOCH_S))
    big_epoch = int(rng.integers(epochs)) if nodes >= BIG_JOB else -1
    running: list[tuple[str, float, float, tuple[int, ...]]] = []
    for e in range(epochs):
        lo, hi = e * EPOCH_S, min(duration, (e + 1) * EPOCH_S)
        order = [int(n) for n in rng.permutation(nodes)]
        k = 0
        while k < len(order):
            size = BIG_JOB if e == big_epoch and k == 0 else int(rng.choice(SIZES))
            members = tuple(sorted(order[k : k + size]))
            k += size
            job = f"{seed % 1000:03d}{e:02d}{k:03d}"
            running.append((job, lo, hi, members))
            week.job_nodes[job] = (lo, hi, members)
            t = float(rng.uniform(lo + 60, hi - 60))
            if e == big_epoch and size == BIG_JOB:
                week.big_crash = (job, members)
                crash(week, rng, job, members, t, BIG_XID)
            elif len(members) > 1 and rng.random() < CRASH_P:
                week.app_crashes += 1
                crash(week, rng, job, members, t, int(rng.choice(APP_XIDS)))
            if rng.random() < ONE_GPU_P:
                week.one_gpu_xids += 1
                node, gpu = int(rng.choice(members)), int(rng.integers(GPUS))
                week.lines.append(
                    Line(
                        float(rng.uniform(lo + 60, hi - 60)),
                        node,
                        xid_text(int(rng.choice((13, 31))), gpu, 4100),
                        gpu,
                        job,
                    )
                )
    # hardware faults: their kernel lines and flaps; a fatal one may kill its job
    for f in week.faults:
        job = next((j for j, lo, hi, m in running if lo <= f.onset_s < hi and f.node in m), "")
        if f.xid:
            repeat = f.xid == 74
            n = int(min(STORM_FOR_S, f.end_s - f.onset_s) // STORM_EVERY_S) + 1 if repeat else 1
            week.lines += [
                Line(
                    f.onset_s + i * STORM_EVERY_S, f.node, xid_text(f.xid, f.gpu, 4100), f.gpu, job
                )
                for i in range(n)
            ]
        if f.type == "ib_flap":  # the twin's flap: down once every FLAP_PERIOD_S while on
            week.flaps += [
                Flap(t, f.node, f.hca)
                for t in np.arange(f.onset_s, min(f.end_s, f.onset_s + 3600), 300.0)
            ]
        members = week.job_nodes[job][2] if job else ()
        if f.fatal and len(members) > 1 and rng.random() < KILLS_JOB_P:
            crash(week, rng, job, members, f.onset_s + float(rng.uniform(2, 10)), 45)
    # link flaps that heal, and NFS stalls
    for _ in range(flaps):
        node, hca, t = int(rng.integers(nodes)), int(rng.integers(8)), rng.uniform(0, duration)
        downs = int(rng.integers(3, 7))
        week.flaps += [Flap(float(t + 40 * i), node, hca) for i in range(downs)]
        week.heal_flaps += 1
    for _ in range(stalls):
        hit = rng.choice(nodes, size=int(rng.integers(min(8, nodes), nodes + 1)), replace=False)
        t, long = float(rng.uniform(0, duration - 300)), float(rng.uniform(30, 120))
        server = f"nfs{int(rng.integers(1, 4)):02d}"
        for n in (int(x) for x in hit):
            for i in range(int(long // 15) + 1):
                week.lines.append(
                    Line(t + 15 * i, n, f"nfs: server {server} not responding, still trying")
                )
            week.lines.append(Line(t + long + 1, n, f"nfs: server {server} OK"))
        week.stalls += 1
    week.lines.sort(key=lambda x: x.t_s)
    week.flaps.sort(key=lambda x: x.t_s)
    return week


def crash(
    week: Week, rng: np.random.Generator, job: str, members: Iterable[int], t: float, xid: int
) -> None:
    """One job's crash: ``xid`` on every GPU it has, within a second."""
    for node in members:
        for g in range(GPUS):
            week.lines.append(
                Line(t + float(rng.uniform(0, 1)), node, xid_text(xid, g, 4100 + g), g, job)
            )


# -- the product path -------------------------------------------------------------------------


def agents(week: Week, extra_fatal: tuple[int, ...]) -> tuple[list[Finding], list[Point]]:
    """What each node's agent writes and posts on the fast path for the week's events."""
    found: list[Finding] = []
    points: list[Point] = []
    xid_src: dict[int, XidSource] = {}
    ib_src: dict[int, InfinibandSource] = {}
    downed: Counter[tuple[int, int]] = Counter()

    def context(node: int) -> SourceContext:
        return SourceContext(CLUSTER, name(node), emit_finding=found.append)

    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "kmsg"
        empty.write_text("")
        for line in week.lines:
            src = xid_src.get(line.node)
            if src is None:
                settings = {"path": str(empty), "follow_s": 0, "extra_fatal_xids": extra_fatal}
                src = xid_src[line.node] = XidSource(context(line.node), settings)
            now = START_NS + int(line.t_s * S)
            parsed = parse_message(line.text, now, os_rules=src.os_rules)
            if isinstance(parsed, OsLine):
                points.append(src._os_event(parsed, now))
            elif isinstance(parsed, XidLine):
                job = JobInfo(line.job, str(line.gpu), str(line.gpu)) if line.job else NO_JOB
                points.append(
                    xid_point(
                        src.context,
                        src.policy,
                        xid=parsed.xid,
                        message=parsed.message,
                        source="kmsg",
                        now_ns=now,
                        gpu=line.gpu,
                        uuid="",
                        pid=parsed.pid,
                        job=job,
                        episodes=src.xid_episodes,
                        device=parsed.pci,
                    )
                )
        for src in xid_src.values():
            src.close()
    for flap in week.flaps:
        ib = ib_src.get(flap.node)
        if ib is None:
            ib = ib_src[flap.node] = InfinibandSource(context(flap.node), {})
        port = Port(f"mlx5_{flap.hca}", "1", "", (), ())
        key = (flap.node, flap.hca)
        now = START_NS + int(flap.t_s * S)
        if key not in downed:  # the cycle before: the port up, its count as it was
            ib._flaps(port, {"link_downed_total": downed[key], "state_code": 4}, now - 10 * S)
        downed[key] += 1
        ib._flaps(port, {"link_downed_total": downed[key], "state_code": 4}, now)
    return found, points


def job_points(week: Week, lines: list[Line]) -> list[Point]:
    """Each job's GPUs as their agents tag them (every 60 s, 10 minutes before each of its
    XIDs: what the job rule reads to know a job's nodes)."""
    out: dict[tuple[str, int, int, int], Point] = {}
    for line in lines:
        if not line.job:
            continue
        lo, _, members = week.job_nodes[line.job]
        t0 = max(lo, line.t_s - 600)
        for t in np.arange(np.floor(t0 / 60) * 60, line.t_s, 60.0):
            for n in members:
                for g in range(GPUS):
                    key = (line.job, n, g, int(t))
                    if key not in out:
                        tags = {"cluster": CLUSTER, "node": name(n), "gpu": str(g), "job": line.job}
                        out[key] = Point("gpu", tags, {"power_w": 400.0}, START_NS + int(t) * S)
    return list(out.values())


def analysed(influx: Influx, db: str, days: float, xids_at: list[float]) -> list[Finding]:
    """The analyze service's job-or-hardware rule and emitter, as ``analyze run --every``
    runs them: windows of ``[analysis] window_s`` (:data:`WINDOW_S`), one every half of it
    (the service's windows overlap more; a fault is stamped at its first XID, so the
    overlapping windows give it one id, and it is kept once). A window with no application XID from
    ``job_window_s`` before it to its end (``xids_at``: seconds) is skipped: both rules report
    only what begins in the window, so it would find nothing."""
    cfg = with_overrides(load_config(None, environ={}),
                         influxdb={"url": influx.url, "database": db},
                         analysis={"window_s": WINDOW_S})  # fmt: skip
    window = int(float(cfg["analysis"]["window_s"]) * S)
    out: dict[str, Finding] = {}
    reader = InfluxReader(**cfg.reader_kwargs())
    try:
        end, last = START_NS + window // 2, START_NS + int(days * DAY * S) + window // 2
        times = np.sort(np.asarray(xids_at, dtype=float))
        lead = cfg.jobfaults.job_window_s
        while end <= last:
            lo_s, hi_s = (end - window - START_NS) / S - lead, (end - START_NS) / S
            if np.searchsorted(times, hi_s) == np.searchsorted(times, lo_s):
                end += window // 2
                continue
            a = Analysis(end - window, end, "local")
            a.app_faults = find_app_faults(reader, cfg.jobfaults, end - window, end)
            a.repeat_window_s = cfg.jobfaults.repeat_window_s
            for f in analytics_findings(a):
                out.setdefault(f.id, f)
            end += window // 2
    finally:
        reader.close()
    return list(out.values())


def write(influx: Influx, db: str, points: list[Point]) -> None:
    lines = encode_points(points)
    for i in range(0, len(lines), 20_000):
        influx.write(db, "\n".join(lines[i : i + 20_000]))


@dataclass(frozen=True)
class Removal:
    node: str
    t_s: float
    policy: str
    kind: str


def decide(found: Iterable[Finding], cooldown_s: float) -> tuple[list[Removal], Counter[str]]:
    """The shipped policies' decisions: removals (one per node per ``cooldown_s``), and how
    many findings each policy matched."""
    policies = load_policies(DEFAULT_POLICIES)
    matched: Counter[str] = Counter()
    out: list[Removal] = []
    last: dict[str, float] = {}
    seen: set[str] = set()
    for f in sorted(found, key=lambda f: f.time_ns):
        if f.id in seen:  # the engine acts once per finding id
            continue
        seen.add(f.id)
        p = first_match(policies, f)
        matched[p.name if p else "(no policy)"] += 1
        node = f.subject.get("node", "")
        if p is None or not node or not REMOVES & {ActionKind(a) for a in p.actions}:
            continue
        t = (f.time_ns - START_NS) / S
        if node in last and t - last[node] < cooldown_s:
            continue
        last[node] = t
        out.append(Removal(node, t, p.name, f.kind))
    return out, matched


# -- scoring against the ground truth ---------------------------------------------------------


@dataclass
class Score:
    removals: list[tuple[Removal, bool]] = field(default_factory=list)
    should: int = 0
    missed: Counter[str] = field(default_factory=Counter)
    should_by_type: Counter[str] = field(default_factory=Counter)
    matched: Counter[str] = field(default_factory=Counter)
    job_findings: int = 0
    big_job_found: bool = False
    """Exactly one job finding for the 20-node crash."""
    big_job_findings: int = 0
    big_job_removed: int = 0
    blind: int = 0
    """Fatal faults no agent can see (the node is down): counted apart."""
    blind_missed: int = 0

    def __iadd__(self, o: Score) -> Score:
        self.removals += o.removals
        self.should += o.should
        self.missed += o.missed
        self.should_by_type += o.should_by_type
        self.matched += o.matched
        self.job_findings += o.job_findings
        self.big_job_found = self.big_job_found and o.big_job_found
        self.big_job_findings += o.big_job_findings
        self.big_job_removed += o.big_job_removed
        self.blind += o.blind
        self.blind_missed += o.blind_missed
        return self

    @property
    def wrong(self) -> int:
        return sum(1 for _, right in self.removals if not right)

    @property
    def wrong_pct(self) -> float:
        return 100.0 * self.wrong / len(self.removals) if self.removals else 0.0

    @property
    def missed_pct(self) -> float:
        return 100.0 * sum(self.missed.values()) / self.should if self.should else 0.0


def score(
    week: Week,
    removals: list[Removal],
    found: list[Finding],
    matched: Counter[str],
    cooldown_s: float,
) -> Score:
    s = Score(matched=matched)
    by_node: dict[str, list[Fault]] = defaultdict(list)
    for f in week.faults:
        by_node[name(f.node)].append(f)
    for r in removals:
        right = any(
            f.onset_s - RIGHT_SLACK_S <= r.t_s <= f.end_s + RIGHT_SLACK_S for f in by_node[r.node]
        )
        s.removals.append((r, right))
    for f in week.faults:
        if not f.fatal:
            continue
        covered = any(
            r.node == name(f.node) and f.onset_s - cooldown_s <= r.t_s <= f.onset_s + MISSED_AFTER_S
            for r in removals
        )  # a node removed for another fault just before is out already
        if f.type in AGENT_BLIND:
            s.blind += 1
            s.blind_missed += int(not covered)
            continue
        s.should += 1
        s.should_by_type[f.type] += 1
        if not covered:
            s.missed[f.type] += 1
    job, members = week.big_crash
    s.job_findings = sum(1 for f in found if f.kind == "job_app_fault")
    s.big_job_findings = sum(  # the crash's code: a fault that kills the job later is another
        1
        for f in found
        if f.kind == "job_app_fault"
        and f.subject.get("job") == job
        and f.evidence.get("xid") == BIG_XID
    )
    s.big_job_found = s.big_job_findings == 1
    big = {name(n) for n in members}
    s.big_job_removed = len({r.node for r in removals if r.node in big and not _right(s, r)})
    return s


def _right(s: Score, r: Removal) -> bool:
    return next(right for x, right in s.removals if x is r)


def run_seed(week: Week, influx: Influx, db_prefix: str, seed: int) -> dict[str, Score]:
    """Every arm's agents, analysis and decisions on one week."""
    cooldown = EngineSettings().cooldown_s
    out: dict[str, Score] = {}
    for arm in ("shipped", "app-xids-fatal"):
        extra = APP_XIDS if arm == "app-xids-fatal" else ()
        fast, points = agents(week, extra)
        db = f"{db_prefix}_{seed}_{arm.replace('-', '_')}"
        influx.create_database(db)
        write(influx, db, points + job_points(week, week.lines))
        app = [x.t_s for x in week.lines if (p := parse_message(x.text, None)) is not None
               and isinstance(p, XidLine) and p.xid in APP_XIDS]  # fmt: skip
        found = fast + analysed(influx, db, week.duration_s / DAY, app)
        removals, matched = decide(found, cooldown)
        out[arm] = score(week, removals, found, matched, cooldown)
        if arm == "shipped":
            kept = [f for f in found if f.kind not in JOB_RULE_KINDS]
            removals, matched = decide(kept, cooldown)
            out["no-fold"] = score(week, removals, kept, matched, cooldown)
    return out


# -- the report -------------------------------------------------------------------------------


def precision_table(s: Score) -> list[str]:
    rows = ["policy | findings matched | removals | right | wrong | precision"]
    per: dict[str, list[bool]] = defaultdict(list)
    for r, right in s.removals:
        per[r.policy].append(right)
    for p in sorted(set(s.matched) | set(per)):
        got = per.get(p, [])
        prec = f"{sum(got) / len(got):.3f}" if got else "n/a (notifies)"
        rows.append(
            f"{p} | {s.matched.get(p, 0)} | {len(got)} | {sum(got)} | "
            f"{len(got) - sum(got)} | {prec}"
        )
    return rows


def seeds_arg(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=seeds_arg, default=seeds_arg("8201-8205"))
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--compression", type=float, default=20.0)
    ap.add_argument("--flaps", type=int, default=12, help="link flaps that heal, per seed")
    ap.add_argument("--stalls", type=int, default=4, help="NFS stalls, per seed")
    ap.add_argument("--smoke", action="store_true", help="24 nodes, 1 day, seed 1")
    args = ap.parse_args(argv)
    if args.smoke:
        args.nodes, args.days, args.seeds, args.flaps, args.stalls = 24, 1.0, [1], 3, 1
    from testbed.influxd import LocalInfluxd

    total = {arm: Score(big_job_found=True) for arm in ARMS}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, LocalInfluxd(Path(tmp) / "influxd") as influx:
        for seed in args.seeds:
            week = build_week(
                seed, args.nodes, args.days, args.compression, args.flaps, args.stalls
            )
            scores = run_seed(week, influx, "verdicts", seed)
            for arm in ARMS:
                total[arm] += scores[arm]
            sh = scores["shipped"]
            print(
                f"[{time.monotonic() - t0:6.1f}s] seed {seed}: {len(week.faults)} hardware "
                f"faults ({sh.should} fatal), {week.app_crashes} job crashes + the "
                f"{len(week.big_crash[1])}-node one, {week.one_gpu_xids} one-GPU app XIDs, "
                f"{week.heal_flaps} healing flaps, {week.stalls} NFS stalls; shipped: "
                f"{len(sh.removals)} removals, {sh.wrong} wrong, "
                f"{sum(sh.missed.values())} missed; 20-node crash: job finding "
                f"{sh.big_job_found}, {sh.big_job_removed} nodes removed",
                flush=True,
            )
    print()
    print(
        f"SIMULATED week(s): {args.nodes} nodes x {GPUS} GPUs, {args.days:g} days, seeds "
        f"{args.seeds[0]}-{args.seeds[-1]}; hardware faults from the REAL StepFun process "
        f"compressed {args.compression:g}x; product path: the agent's parsers and sources, "
        "REAL influxd, analytics' job rule, the shipped DEFAULT policies (policy evaluation)."
    )
    print(
        "arm | removals | wrong | wrong % | fatal faults seen | missed | missed % | "
        "node down | not removed"
    )
    for arm in ARMS:
        s = total[arm]
        print(
            f"{arm} | {len(s.removals)} | {s.wrong} | {s.wrong_pct:.1f} | {s.should} | "
            f"{sum(s.missed.values())} | {s.missed_pct:.1f} | {s.blind} | {s.blind_missed}"
        )
    print(
        "(fatal faults seen: those the twin calls fatal that leave a sign on the node's agent;"
        " a node that is down leaves none, and is counted apart)"
    )
    sh = total["shipped"]
    print()
    print("Missed fatal faults by type, shipped (missed / fatal):")
    for t in sorted(sh.should_by_type):
        print(f"  {t}: {sh.missed.get(t, 0)} / {sh.should_by_type[t]}")
    print()
    print(
        "Precision per rule, shipped arm (a removal is right when its node had a hardware fault):"
    )
    print("\n".join(precision_table(sh)))
    print()
    print("Precision per rule, app-xids-fatal arm:")
    print("\n".join(precision_table(total["app-xids-fatal"])))
    print()
    print(
        f"20-node job crash: exactly one job finding on every seed: {sh.big_job_found}; its "
        f"nodes removed wrongly (shipped): {sh.big_job_removed}"
    )
    print(
        f"wrong_drains_pct={sh.wrong_pct:.1f} missed_faults_pct={sh.missed_pct:.1f} "
        f"missed_before_pct={total['no-fold'].missed_pct:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
