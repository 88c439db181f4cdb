"""From an :class:`~analytics.runner.Analysis` to findings and catalogue points.

Finding kinds (the remediation engine matches policies on them):

* ``straggler``: one rank slower than its peers; ``evidence.cause`` says gpu, pcie, power,
  nic, link or unknown (a gpu cause is actionable: the node can be drained; pcie names a link
  to check; power, a node whose board or rack holds every GPU back);
* ``pipeline_imbalance``: a pipeline stage slower than the others (a job layout matter, no
  machine to blame);
* ``load_imbalance``: spread over all workers, the slowest one changing step to step;
* ``link_congested``: a ToR switch (or a host, without topology) whose ports stay congested;
* ``config_drift``: a node whose GPUs are set up unlike the rest of their model's fleet
  (driver, VBIOS, ECC, persistence or MIG mode), or wait for a reset to change a mode;
* ``job_hang``: a job that stopped stepping but is still there (its GPUs held, its reporters
  beating); critical when it waits in a collective (GPUs spin, or ranks sit inside a step),
  with the suspect node in the subject when one node holds every rank that is behind, idle
  while the rest spin, or between steps while the rest wait inside one;
* ``job_config_mixed``: a job whose GPUs are not all set up alike; a warning when nothing else
  says so (no clear fleet setting: a rollout the job straddles), info when the odd nodes have
  their own ``config_drift`` findings.
* ``mfu_mismatch``: a job whose MFU (HFU with recomputation), counted from the shape it
  reported, and its GPUs' own GPM tensor-core activity are further apart than ``[mfu]
  mismatch_ratio`` allows: the reported shape (parameters, world size, tokens per step) or
  the GPU model is likely wrong, and so is the MFU (docs/MFU.md).
* ``job_app_fault``: one application XID (13, 31, 43, 45 by default) on most of one job's
  nodes at once: the job's fault, one finding about the job (cluster, job), no node's;
* ``gpu_app_xid_repeats``: the same application XID on one GPU in several different jobs:
  the GPU's (:mod:`analytics.jobfaults`).
"""

from __future__ import annotations

import math
from typing import Any

from gpuwarden.analytics.cadence import Advice
from gpuwarden.analytics.culprit import Stop
from gpuwarden.analytics.jobfaults import evidence_of, repeats_evidence
from gpuwarden.analytics.runner import Analysis
from gpuwarden.analytics.tasks import CONGESTION_FIELDS, JobResult
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point

SOURCE = "analytics"
KIND = {"worker": "straggler", "stage": "pipeline_imbalance", "spread": "load_imbalance"}
CAUSE = {"stage": "stage", "spread": "imbalance"}


def _behind_switch(a: Analysis, job: JobResult, worker: str | None) -> str:
    """The hot switch a slow worker is blamed on, if any."""
    cause, attr = a.attributions.get((job.job, worker or ""), ("", {}))
    return str(attr.get("switch", "")) if cause == "nic" else ""


def _job_findings(a: Analysis, job: JobResult) -> list[Finding]:
    out = []
    for s in job.stragglers:
        if s.kind == "worker" and _behind_switch(a, job, s.worker):
            continue  # reported once, with the switch's link_congested finding
        subject = {"cluster": job.cluster, "job": job.job}
        evidence: dict[str, Any] = s.to_json()
        onset = job.step_times.get(s.onset_step)
        last = job.step_times.get(s.last_step)
        if onset and last:
            evidence.update(onset_step_index=onset[0], onset_time_ns=onset[1], last_time_ns=last[1])
        cause = CAUSE.get(s.kind, "unknown")
        if s.kind == "stage":
            cause, attr = a.attributions.get((job.job, f"stage:{s.stage}"), (cause, {}))
            if attr:
                evidence["attribution"] = attr
        if s.kind == "worker" and s.worker is not None:
            subject["rank"] = s.worker
            if s.node:
                subject["node"] = s.node
            cause, attr = a.attributions.get((job.job, s.worker), ("unknown", {}))
            evidence["attribution"] = attr
        evidence["cause"] = cause
        if s.worker in job.straggler_cost_s:  # what fixing it would give back, in job time
            evidence["fix_gain_s"] = round(job.straggler_cost_s[s.worker], 3)
        severity = (
            Severity.WARNING if cause in ("gpu", "pcie", "power", "nic", "link") else Severity.INFO
        )
        out.append(
            Finding(
                kind=KIND[s.kind],
                subject={k: v for k, v in subject.items() if v},
                severity=severity,
                time_ns=a.end_ns,
                evidence=evidence,
                confidence=min(1.0, s.persistence),
                summary=f"job {job.job}: {s.describe()}; cause {cause}",
                source=SOURCE,
            )
        )
    return out


def _drift_findings(a: Analysis) -> list[Finding]:
    return [
        Finding(
            kind="config_drift",
            subject={k: v for k, v in {"cluster": d.cluster, "node": d.node}.items() if v},
            severity=Severity.WARNING,
            time_ns=a.end_ns,
            evidence={
                "gpu_model": d.gpu_model,
                "gpus": d.gpus,
                "differences": [x.to_json() for x in d.differences],
                "jobs": d.jobs,
            },
            confidence=min(x.share for x in d.differences),
            summary=f"node {d.node} ({d.gpu_model or 'unknown model'}): {d.describe()}",
            source=SOURCE,
        )
        for d in a.drift
    ]


def _mfu_finding(job: JobResult, end_ns: int) -> Finding | None:
    """``mfu_mismatch``: the job's counted MFU and its GPUs' tensor activity disagree."""
    m, shape, ratio, limit = job.mfu, job.shape, job.estimate_ratio, job.mismatch_limit
    if m is None or shape is None or job.estimate is None or ratio is None or limit is None:
        return None
    counted, value = ("HFU", m.hfu) if m.hfu is not None else ("MFU", m.mfu)
    evidence: dict[str, Any] = {
        "mfu": round(m.mfu, 4),
        "hfu": None if m.hfu is None else round(m.hfu, 4),
        "tensor_active": round(job.estimate, 4),
        "ratio": None if math.isinf(ratio) else round(ratio, 3),
        "limit": round(limit, 3),
        "gpu_model": shape.gpu_model,
        "gpu_model_from": job.gpu_model_from,
        "dtype": shape.dtype,
        "params": shape.params,
        "layers": shape.layers,
        "hidden": shape.hidden,
        "seq_len": shape.seq_len,
        "world_size": shape.world_size,
        "tokens_per_s": round(m.tokens_per_s, 1),
        "flops_per_token": None if m.flops is None else m.flops.model,
        "assumed": "" if m.flops is None else m.flops.assumed,
    }
    apart = "one of them is zero" if math.isinf(ratio) else f"{ratio:.2f}x apart"
    return Finding(
        kind="mfu_mismatch",
        subject={k: v for k, v in {"cluster": job.cluster, "job": job.job}.items() if v},
        severity=Severity.WARNING,
        time_ns=end_ns,
        evidence=evidence,
        confidence=1.0 if math.isinf(ratio) else min(1.0, (ratio - 1.0) / (2 * (limit - 1.0))),
        summary=f"job {job.job}: {counted} {value:.1%} from the shape it reported, but its GPUs' "
        f"tensor cores were busy {job.estimate:.1%} ({apart}, over {limit:.2f}x): its reported "
        "model shape, world size, tokens per step or GPU model is likely wrong (and its MFU)",
        source=SOURCE,
    )


def _silence_findings(a: Analysis) -> list[Finding]:
    return [
        Finding(
            kind="node_silent",
            subject={k: v for k, v in {"cluster": s.cluster, "node": s.node}.items() if v},
            severity=Severity.WARNING,
            time_ns=a.end_ns,
            evidence={"silent_s": s.silent_s, "last_seen_ns": s.last_seen_ns},
            confidence=1.0,
            summary=f"node {s.node}: no word from its agent for {s.silent_s:.0f} s (it reported "
            "earlier): the agent, the node or its network is down",
            source=SOURCE,
        )
        for s in a.silent
    ]


def _advice_fields(v: Advice) -> dict[str, float]:
    return {
        "advised_interval_s": round(float(v.advised_s), 1),
        "current_interval_s": round(float(v.current_s), 1),
        "save_s": round(float(v.cost_s), 3),
        "mtbf_s": round(float(v.mtbf_s), 1),
        "waste_current_ratio": round(float(v.waste_current), 5),
        "waste_advised_ratio": round(float(v.waste_advised), 5),
        "history_weight_ratio": round(float(v.history_weight), 4),
    }


def _advice_findings(a: Analysis) -> list[Finding]:
    """A finding for each job whose advised interval would give back at least ``min_gain`` of
    its wall time (the measurement is written for every job that reports its saves)."""
    cluster = {j.job: j.cluster for j in a.jobs}
    return [
        Finding(
            kind="checkpoint_advice",
            subject={
                k: v for k, v in {"cluster": cluster.get(v.job, ""), "job": v.job}.items() if v
            },
            severity=Severity.INFO,
            time_ns=a.end_ns,
            evidence={**_advice_fields(v), "nodes": v.nodes},
            confidence=1.0,
            summary=v.describe(),
            source=SOURCE,
        )
        for v in a.advice
        if v.gain >= a.advice_min_gain
    ]


def _job_mix_findings(a: Analysis) -> list[Finding]:
    out = []
    for m in a.job_mix:
        why = (
            "the odd nodes have config_drift findings"
            if m.explained
            else "no fleet setting to compare with (a rollout under way?)"
        )
        evidence = {
            "gpu_model": m.gpu_model,
            "gpus": m.gpus,
            "fields": {
                name: [{"value": s.value, "gpus": s.gpus, "nodes": s.nodes} for s in settings]
                for name, settings in m.fields.items()
            },
            "explained": m.explained,
        }
        out.append(
            Finding(
                kind="job_config_mixed",
                subject={k: v for k, v in {"cluster": m.cluster, "job": m.job}.items() if v},
                severity=Severity.INFO if m.explained else Severity.WARNING,
                time_ns=a.end_ns,
                evidence=evidence,
                summary=f"job {m.job} ({m.gpu_model or 'unknown model'}) on GPUs set up "
                f"unlike each other: {m.describe()}; {why}",
                source=SOURCE,
            )
        )
    return out


def _hang_finding(job: JobResult, end_ns: int) -> Finding | None:
    h = job.hang
    if h is None:
        return None
    subject = {"cluster": job.cluster, "job": job.job, "node": h.culprit_node}
    q = h.quiet
    evidence: dict[str, Any] = {
        "silent_s": round(q.silent_s, 1),
        "patience_s": round(q.patience_s, 1),
        "last_step_index": q.last_step,
        "last_step_time_ns": q.last_step_ns,
        "median_step_s": q.median_step_s,
        "longest_gap_s": q.longest_gap_s,
        "gpus": h.gpus,
        "nodes": h.nodes,
        "busy_gpus": h.busy_gpus,
        "spinning": h.spinning,
        "ranks_beating": h.ranks_beating,
        "ranks_in_step": h.ranks_in_step,
        "waiting": h.waiting,
        "behind_ranks": h.behind,
        "idle_ranks": h.idle,
        "outside_ranks": h.outside,
        "suspect_nodes": h.suspect_nodes,
        **({"unconfirmed_nodes": h.unconfirmed_nodes} if h.unconfirmed_nodes else {}),
    }
    return Finding(
        kind="job_hang",
        subject={k: v for k, v in subject.items() if v},
        severity=Severity.CRITICAL if h.waiting else Severity.WARNING,
        time_ns=end_ns,
        evidence=evidence,
        confidence=min(1.0, q.silent_s / (2 * q.patience_s)),
        summary=f"job {job.job} hung: {h.describe()}",
        source=SOURCE,
    )


def _stop_finding(job: JobResult, s: Stop, end_ns: int) -> Finding:
    evidence = {
        **s.evidence,
        "method": s.method,
        "last_step_index": s.last_step,
        "last_step_time_ns": s.last_step_ns,
        "stopped_s": round(s.stopped_s, 1),
    }
    return Finding(
        kind="job_stopped",
        subject={
            k: v for k, v in {"cluster": job.cluster, "job": job.job, "node": s.node}.items() if v
        },
        severity=Severity.CRITICAL,
        time_ns=end_ns,
        evidence=evidence,
        confidence=1.0 if s.method == "finding" else 0.7,
        summary=s.describe(),
        source=SOURCE,
    )


def _app_fault_findings(a: Analysis) -> list[Finding]:
    """Stamped at the fault's first XID (or the XID that made the count), not the window's
    end: overlapping analyses give the same finding the same id."""
    out = [
        Finding(
            kind="job_app_fault",
            subject={k: v for k, v in {"cluster": f.cluster, "job": f.job}.items() if v},
            severity=Severity.WARNING,
            time_ns=f.first_ns,
            evidence=evidence_of(f),
            confidence=round(f.share, 3),
            summary=f.describe(),
            source=SOURCE,
        )
        for f in a.app_faults.jobs
    ]
    out += [
        Finding(
            kind="gpu_app_xid_repeats",
            subject={
                k: v for k, v in {"cluster": r.cluster, "node": r.node, "gpu": r.gpu}.items() if v
            },
            severity=Severity.WARNING,
            time_ns=r.at_ns,
            evidence=repeats_evidence(r, a.repeat_window_s),
            confidence=1.0,
            summary=r.describe(),
            source=SOURCE,
        )
        for r in a.app_faults.repeats
    ]
    return out


def findings(a: Analysis) -> list[Finding]:
    out: list[Finding] = []
    out += _app_fault_findings(a)
    for job in a.jobs:
        out += _job_findings(a, job)
        hang = _hang_finding(job, a.end_ns)
        if hang is not None:
            out.append(hang)
        if job.stop is not None:
            out.append(_stop_finding(job, job.stop, a.end_ns))
        mismatch = _mfu_finding(job, a.end_ns)
        if mismatch is not None:
            out.append(mismatch)
    out += _drift_findings(a)
    out += _job_mix_findings(a)
    out += _silence_findings(a)
    out += _advice_findings(a)
    cluster = next((j.cluster for j in a.jobs if j.cluster), "")
    behind: dict[str, dict[str, list[str]]] = {}  # switch -> job -> slow ranks it explains
    for job in a.jobs:
        for s in job.stragglers:
            if s.kind == "worker" and s.worker and (sw_name := _behind_switch(a, job, s.worker)):
                behind.setdefault(sw_name, {}).setdefault(job.job, []).append(s.worker)
    for ranks in (r for jobs in behind.values() for r in jobs.values()):
        ranks.sort(key=lambda w: (len(w), w))
    for rank, sw in enumerate(a.switches, start=1):
        if not sw.hot:
            continue
        subject = (
            {"cluster": cluster, "switch": sw.switch}
            if sw.switch not in sw.nodes
            else {
                "cluster": cluster,
                "node": sw.switch,
            }
        )
        out.append(
            Finding(
                kind="link_congested",
                subject={k: v for k, v in subject.items() if v},
                severity=Severity.WARNING,
                time_ns=a.end_ns,
                evidence={
                    "switch": sw.switch,
                    "rank": rank,
                    "score": round(sw.score, 4),
                    "peak_score": round(sw.peak_score, 4),
                    "hot_s": sw.hot_s,
                    "first_hot_ns": sw.first_hot_ns,
                    "last_hot_ns": sw.last_hot_ns,
                    "nodes": sw.nodes,
                    "jobs": sw.jobs,
                    "slow_ranks": behind.get(sw.switch, {}),
                },
                confidence=min(1.0, sw.hot_s / max(1.0, (a.end_ns - a.start_ns) / 1e9)),
                summary=(
                    f"switch {sw.switch} congested {sw.hot_s:.0f} s (mean score {sw.score:.3f}); "
                    f"jobs under it: {', '.join(j['job'] for j in sw.jobs) or 'none'}"
                ),
                source=SOURCE,
            )
        )
    return out


def points(a: Analysis, found: list[Finding]) -> list[Point]:
    """The catalogue's derived measurements for this window, stamped at the window's end."""
    t = a.end_ns
    cluster = next((j.cluster for j in a.jobs if j.cluster), "")
    out: list[Point] = []
    clusters = {j.job: j.cluster for j in a.jobs}
    for name, b in a.badput.items():
        tags = {"cluster": clusters.get(name, ""), "job": name, "source": SOURCE}
        lost: dict[str, Any] = {"elapsed_s": round(b.elapsed_s, 3),
                                "productive_s": round(b.productive_s, 3)}  # fmt: skip
        # float() always: a sum of nothing is the int 0, and InfluxDB types a field once
        lost |= {f"{c}_s": round(float(v), 3) for c, v in b.seconds().items()}
        out.append(Point("badput", {k: x for k, x in tags.items() if x}, lost, t))
    for v in a.advice:
        tags = {"cluster": clusters.get(v.job, ""), "job": v.job}
        out.append(Point("checkpoint_advice", {k: x for k, x in tags.items() if x},
                         _advice_fields(v), t))  # fmt: skip
    for job in a.jobs:
        base = {"cluster": job.cluster, "job": job.job, "source": SOURCE}
        if job.mfu is not None and job.shape is not None:
            fields: dict[str, Any] = {
                "mfu_ratio": job.mfu.mfu,
                "model_flops_per_s": job.mfu.model_flops_per_s_per_gpu,
                "tokens_per_s": job.mfu.tokens_per_s,
                "goodput_ratio": job.mfu.goodput,
                "estimate_active": False,
            }
            if job.mfu.hfu is not None:
                fields["hfu_ratio"] = job.mfu.hfu
            if job.estimate is not None:  # the telemetry's own view, beside every MFU
                fields["tensor_active_ratio"] = job.estimate
            if job.mfu.flops is not None:
                fields["model_flops_per_token"] = float(job.mfu.flops.model)
                fields["flops_assumed_active"] = bool(job.mfu.flops.assumed)
                if job.mfu.flops.assumed:
                    fields["flops_assumption"] = job.mfu.flops.assumed
            tags = {**base, "gpu_model": job.shape.gpu_model, "dtype": job.shape.dtype}
            out.append(Point("mfu", {k: v for k, v in tags.items() if v}, fields, t))
        elif job.estimate is not None:
            fields = {
                "mfu_ratio": job.estimate,
                "tensor_active_ratio": job.estimate,
                "estimate_active": True,
            }
            out.append(Point("mfu", {k: v for k, v in base.items() if v}, fields, t))
        if job.energy:
            e = {
                k: v
                for k, v in job.energy.items()
                if k in ("energy_j", "j_per_token", "j_per_step", "power_w")
            }
            out.append(Point("energy", {"cluster": job.cluster, "job": job.job}, e, t))
        for s in job.stragglers:
            tags = {"cluster": job.cluster, "job": job.job, "kind": s.kind}
            for key, value in (
                ("rank", s.worker),
                ("node", s.node),
                ("stage", s.stage),
                ("dp_rank", s.dp_rank),
            ):
                if value is not None:
                    tags[key] = str(value)
            cause = (
                CAUSE.get(s.kind) or a.attributions.get((job.job, s.worker or ""), ("unknown",))[0]
            )
            fields = {
                "slowdown_ratio": s.slowdown,
                "persistence_ratio": s.persistence,
                "cause": cause,
            }
            if s.time_s is not None:
                fields["step_time_s"] = s.time_s
            if s.peer_time_s is not None:
                fields["peer_median_step_time_s"] = s.peer_time_s
            out.append(Point("straggler", {k: v for k, v in tags.items() if v}, fields, t))
    if a.ports.height:
        for row in a.ports.iter_rows(named=True):
            tags = {"cluster": cluster, "node": row["node"], "hca": row["hca"], "port": row["port"]}
            tags = {k: v for k, v in tags.items() if v}
            sw = a.switch_of.get(row["node"])
            if sw:
                tags["switch"] = sw
            fields = {c: row[c] for c in CONGESTION_FIELDS if row.get(c) is not None}
            if fields:
                out.append(Point("congestion", tags, fields, t))
    for f in found:
        ftags, ffields = f.to_point()
        out.append(Point("finding", ftags, ffields, f.time_ns))  # type: ignore[arg-type]
    return out
