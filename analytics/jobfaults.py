"""The job or the hardware: application XIDs that hit a whole job at once, and those that
follow one GPU from job to job.

Some XIDs are the application's: 13 (a graphics engine exception) and 31 (a GPU memory page
fault), where NVIDIA's catalogue says "restart the application"; 43 (the GPU stopped
processing the application's channel; the catalogue: ignore) and 45 (preemptive cleanup after
an earlier error, or the processes killed). When a job crashes, or its processes are killed,
every GPU it ran on can log one, within a second of each other. Counted per node that looks
like 20 broken nodes; it is one broken job. Two rules tell them apart:

* ``job_app_fault`` (about the job: ``cluster, job``): one application XID code on at least
  ``job_share`` of the job's nodes (and at least ``job_min_nodes`` of them) within
  ``job_window_s`` of each other. One finding for the job, whatever the number of nodes; its
  owner is told (the shipped policy only notifies), and no node is blamed for it.
* ``gpu_app_xid_repeats`` (about one GPU: ``cluster, node, gpu``): the same application XID
  on one GPU in at least ``repeat_jobs`` *different* jobs within ``repeat_window_s``, not
  counting a job whose XID was part of a job-wide fault above. Different jobs (other
  programs, other users), one GPU: the GPU (the lemon rule, for application codes). The
  shipped policy cordons.

Both count distinct nodes, GPUs and jobs, never lines: a storm of one code on one GPU (an XID
repeated 100,000 times) is one node and one job, however long it lasts. InfluxDB aggregates,
so a storm is never exported point by point: the analysed window as one count per GPU, job
and ``bucket_s``; the ``repeat_window_s`` before as each GPU's first XID in each job. A job's
nodes are those whose ``gpu`` points carried its tag in the ``JOB_NODES_BEFORE_S`` before its
fault (a job the agents did not tag: the nodes with an XID).

Only what begins in the analysed window is reported (the fault's first XID; the moment a GPU's
count of jobs reached ``repeat_jobs``), and each finding is stamped at that moment, so the
overlapping windows of ``analyze --every`` give it the same id every time (the engine acts
once). NCCL errors are not collected by the agent; only XIDs are read here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gpuwarden.core.store.reader import InfluxReader, build_where, quote_ident

NS = 1_000_000_000
#: a job's nodes are those with its gpu points this long before its fault (a job that had
#: run for less still counts the nodes it had)
JOB_NODES_BEFORE_S = 600.0
#: at most this many names in a finding's evidence lists
MAX_LISTED = 50


@dataclass(frozen=True)
class JobFaultConfig:
    app_xids: tuple[int, ...] = (13, 31, 43, 45)
    """XIDs of the application's kind (NVIDIA: restart the application)."""
    job_share: float = 0.5
    """A code on at least this share of a job's nodes at once is the job's fault ..."""
    job_min_nodes: int = 2
    """... and on at least this many nodes."""
    job_window_s: float = 30.0
    """... within this long of each other."""
    repeat_jobs: int = 3
    """The same code on one GPU in this many different jobs is the GPU's ..."""
    repeat_window_s: float = 7 * 86400.0
    """... within this long."""
    bucket_s: int = 1
    """The points are read as one count per GPU, job and bucket of this many seconds."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "app_xids", tuple(int(x) for x in self.app_xids))
        if not 0.0 < self.job_share <= 1.0:
            raise ValueError("jobfaults.job_share must be within (0, 1]")
        if self.job_min_nodes < 2 or self.repeat_jobs < 2:
            raise ValueError("jobfaults.job_min_nodes and repeat_jobs must be at least 2")
        if self.job_window_s <= 0 or self.repeat_window_s <= 0 or self.bucket_s < 1:
            raise ValueError(
                "jobfaults.job_window_s, repeat_window_s and bucket_s must be positive"
            )


def config_from(data: Mapping[str, Any]) -> JobFaultConfig:
    return JobFaultConfig(**{**data, "app_xids": tuple(data.get("app_xids", ()))})


def defaults() -> dict[str, Any]:
    c = JobFaultConfig()
    return {
        "app_xids": list(c.app_xids),
        "job_share": c.job_share,
        "job_min_nodes": c.job_min_nodes,
        "job_window_s": c.job_window_s,
        "repeat_jobs": c.repeat_jobs,
        "repeat_window_s": c.repeat_window_s,
        "bucket_s": c.bucket_s,
    }


@dataclass(frozen=True)
class JobFault:
    """One application XID on most of one job's nodes at once."""

    cluster: str
    job: str
    xid: int
    first_ns: int
    last_ns: int
    nodes: tuple[str, ...]
    job_nodes: int
    gpus: int
    events: int

    @property
    def share(self) -> float:
        return len(self.nodes) / max(self.job_nodes, len(self.nodes))

    def describe(self) -> str:
        return (
            f"job {self.job}: XID {self.xid} on {len(self.nodes)} of its {self.job_nodes} nodes "
            f"({self.gpus} GPUs) within {(self.last_ns - self.first_ns) / NS:.0f} s: the job's "
            "fault (its code, its input or its end), not the nodes'"
        )


@dataclass(frozen=True)
class XidRepeats:
    """One application XID on one GPU in several different jobs."""

    cluster: str
    node: str
    gpu: str
    xid: int
    at_ns: int
    """When the count of jobs reached ``repeat_jobs``."""
    jobs: tuple[tuple[str, int], ...]
    """(job, its first XID on this GPU), oldest first."""

    def describe(self) -> str:
        return (
            f"node {self.node} GPU {self.gpu}: XID {self.xid} in {len(self.jobs)} different jobs "
            f"({', '.join(j for j, _ in self.jobs[:5])}{', ...' if len(self.jobs) > 5 else ''}): "
            "the GPU, not the jobs"
        )


@dataclass
class AppFaults:
    jobs: list[JobFault] = field(default_factory=list)
    repeats: list[XidRepeats] = field(default_factory=list)


TAGS = ("cluster", "job", "node", "gpu")


def _xid_query(
    select: str, xid: int, start_ns: int, end_ns: int, where: Mapping[str, str] | None
) -> str:
    return (
        f"SELECT {select} FROM {quote_ident('gpu_event')}"
        + build_where(start_ns, end_ns, {"event": "xid", **(where or {})})
        + f" AND {quote_ident('xid_code')} = {int(xid)}"
    )


def _rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.select(
        *[pl.col(t).fill_null("") for t in TAGS],
        pl.col("time").dt.epoch("ns").alias("t"),
        pl.col("n").cast(pl.Int64),
    ).filter(pl.col("node") != "")


def read_xids(
    reader: InfluxReader,
    xid: int,
    start_ns: int,
    end_ns: int,
    bucket_s: int,
    where: Mapping[str, str] | None = None,
) -> pl.DataFrame:
    """``cluster, job, node, gpu, t (ns), n``: the count of XID ``xid`` per GPU, job and
    bucket (InfluxDB counts; a storm costs one row per bucket, not one per line)."""
    query = _xid_query(f"count({quote_ident('xid_code')}) AS n", xid, start_ns, end_ns, where)
    query += f" GROUP BY time({int(bucket_s)}s), {', '.join(quote_ident(t) for t in TAGS)}"
    return _rows(reader.aggregate_query(query + " fill(none)", TAGS, ("n",)))


def read_firsts(
    reader: InfluxReader,
    xid: int,
    start_ns: int,
    end_ns: int,
    where: Mapping[str, str] | None = None,
) -> pl.DataFrame:
    """``cluster, job, node, gpu, t (ns), n``: the first XID ``xid`` of each GPU in each job
    (one row per GPU and job, however many lines: a lone ``first()`` carries its time)."""
    query = _xid_query(f"first({quote_ident('xid_code')}) AS n", xid, start_ns, end_ns, where)
    query += f" GROUP BY {', '.join(quote_ident(t) for t in TAGS)}"
    return _rows(reader.aggregate_query(query, TAGS, ("n",))).with_columns(pl.lit(1).alias("n"))


def _bursts(
    cluster: str, job: str, events: pl.DataFrame, cfg: JobFaultConfig
) -> list[tuple[int, int, list[tuple[str, str]], int]]:
    """Groups of one job's events (``t, node, gpu, n``, sorted by time) on at least
    ``job_min_nodes`` nodes within ``job_window_s``: (first, last, [(node, gpu)], events).
    A group goes on while its events keep coming within ``job_window_s`` of the last."""
    window = int(cfg.job_window_s * NS)
    rows = list(events.select("t", "node", "gpu", "n").iter_rows())
    out = []
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j][0] - rows[i][0] <= window:
            j += 1
        if len({r[1] for r in rows[i:j]}) < cfg.job_min_nodes:
            i += 1
            continue
        while j < len(rows) and rows[j][0] - rows[j - 1][0] <= window:
            j += 1
        group = rows[i:j]
        out.append(
            (group[0][0], group[-1][0], sorted({(r[1], r[2]) for r in group}),
             sum(r[3] for r in group))
        )  # fmt: skip
        i = j
    return out


def _job_nodes(
    reader: InfluxReader, cluster: str, job: str, first_ns: int, last_ns: int
) -> set[str]:
    where = {"job": job} | ({"cluster": cluster} if cluster else {})
    lo = first_ns - int(JOB_NODES_BEFORE_S * NS)
    return set(reader.tag_values("gpu", "node", "power_w", lo, last_ns + NS, where))


def _job_faults(
    reader: InfluxReader, rows: pl.DataFrame, xid: int, cfg: JobFaultConfig
) -> list[JobFault]:
    """Every job-wide fault in ``rows`` (``read_xids`` or ``read_firsts``)."""
    out = []
    for (cluster, job), events in (
        rows.filter(pl.col("job") != "").sort("t").group_by(["cluster", "job"], maintain_order=True)
    ):
        for first, last, gpus, n in _bursts(str(cluster), str(job), events, cfg):
            nodes = sorted({node for node, _ in gpus})
            members = _job_nodes(reader, str(cluster), str(job), first, last) | set(nodes)
            fault = JobFault(
                str(cluster), str(job), xid, first, last, tuple(nodes), len(members),
                len(gpus), n,
            )  # fmt: skip
            if fault.share >= cfg.job_share:
                out.append(fault)
    return out


def find_app_faults(
    reader: InfluxReader,
    cfg: JobFaultConfig,
    start_ns: int,
    end_ns: int,
    where: Mapping[str, str] | None = None,
) -> AppFaults:
    """Job-wide application faults that began in ``[start_ns, end_ns)``, and GPUs whose
    count of jobs with one application XID reached ``repeat_jobs`` in it.

    The window is read as counts per second (a fault's shape); the ``repeat_window_s``
    before its end as each GPU's first XID in each job (one row per GPU and job, so a storm
    that lasts the week costs nothing more), from which the job-wide faults of the past are
    found again, to be left out of the GPUs' counts."""
    out = AppFaults()
    lookback = min(start_ns, end_ns - int(cfg.repeat_window_s * NS))
    for xid in cfg.app_xids:
        now = read_xids(reader, xid, start_ns - int(cfg.job_window_s * NS), end_ns,
                        cfg.bucket_s, where)  # fmt: skip
        found = _job_faults(reader, now, xid, cfg) if not now.is_empty() else []
        out.jobs += [f for f in found if start_ns <= f.first_ns < end_ns]
        firsts = read_firsts(reader, xid, lookback, end_ns, where)
        if firsts.is_empty():
            continue
        job_wide = {(f.cluster, f.job, node) for f in found for node in f.nodes}
        for f in _job_faults(reader, firsts, xid, cfg):
            job_wide.update((f.cluster, f.job, node) for node in f.nodes)
        out.repeats += _repeats(firsts, job_wide, xid, cfg, start_ns, end_ns)
    return out


def _repeats(
    rows: pl.DataFrame,
    job_wide: set[tuple[str, str, str]],
    xid: int,
    cfg: JobFaultConfig,
    start_ns: int,
    end_ns: int,
) -> list[XidRepeats]:
    """Per GPU: its jobs with this XID (a job-wide fault's excepted), by first time; reported
    when the ``repeat_jobs``-th of them within ``repeat_window_s`` came in the window."""
    firsts = (
        rows.filter(pl.col("job") != "")
        .group_by(["cluster", "node", "gpu", "job"])
        .agg(pl.col("t").min())
        .sort("t")
    )
    out = []
    window = int(cfg.repeat_window_s * NS)
    for (cluster, node, gpu), per_job in firsts.group_by(
        ["cluster", "node", "gpu"], maintain_order=True
    ):
        jobs = [
            (str(job), int(t))
            for job, t in per_job.select("job", "t").iter_rows()
            if (str(cluster), str(job), str(node)) not in job_wide
        ]
        for k in range(cfg.repeat_jobs - 1, len(jobs)):
            at = jobs[k][1]
            recent = [j for j in jobs[: k + 1] if at - j[1] <= window]
            if len(recent) >= cfg.repeat_jobs:
                if start_ns <= at < end_ns:
                    out.append(XidRepeats(str(cluster), str(node), str(gpu), xid, at,
                                          tuple(recent)))  # fmt: skip
                break
    return out


def listed(names: Iterable[str], cap: int = MAX_LISTED) -> list[str]:
    """At most ``cap`` of ``names`` (a finding's evidence stays small)."""
    return list(names)[:cap]


def evidence_of(fault: JobFault) -> dict[str, Any]:
    return {
        "xid": fault.xid,
        "nodes_count": len(fault.nodes),
        "job_nodes_count": fault.job_nodes,
        "share": round(fault.share, 3),
        "gpus_count": fault.gpus,
        "events_count": fault.events,
        "first_ns": fault.first_ns,
        "last_ns": fault.last_ns,
        "nodes": listed(fault.nodes),
    }


def repeats_evidence(r: XidRepeats, window_s: float) -> dict[str, Any]:
    return {
        "xid": r.xid,
        "jobs_count": len(r.jobs),
        "jobs": listed(j for j, _ in r.jobs),
        "first_ns": r.jobs[0][1],
        "last_ns": r.jobs[-1][1],
        "window_s": window_s,
    }


__all__ = [
    "AppFaults",
    "JobFault",
    "JobFaultConfig",
    "XidRepeats",
    "find_app_faults",
    "read_firsts",
    "read_xids",
]
