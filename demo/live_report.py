"""The live loop's terminal summary and HTML report: both arms' timelines (faults, findings
with the process that raised them, engine actions, Slurm drains, the job's steps) and what
each arm lost, read from the job's own step log."""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from demo.live import ArmResult
from gpuwarden.simulation.faulttypes import REGISTRY
from gpuwarden.simulation.spec import ScenarioSpec

ARM_WORDS = {
    "reactive": "the engine only notifies; the job and Slurm recover by themselves",
    "proactive": "the shipped policies",
}


def rel(r: ArmResult, t: float) -> float:
    return t - r.started_at


def fault_lines(r: ArmResult) -> list[str]:
    out = []
    for f in r.faults:
        pre = (
            f" (precursor from {f.precursor_start_s:.0f} s)"
            if f.precursor_start_s < f.onset_s
            else ""
        )
        out.append(f"{f.type} node-{f.node:03d} gpu {f.gpu} at {f.onset_s:.0f} s{pre}")
    return out


def findings_by_source(r: ArmResult) -> Counter[str]:
    return Counter(a.get("source", "?") for a in r.audit if a["event"] == "finding")


def actions(r: ArmResult, *, ok_only: bool = True) -> Counter[str]:
    return Counter(
        a["action"]
        for a in r.audit
        if a["event"] == "action" and (a.get("outcome") == "ok" or not ok_only)
    )


def predicted(r: ArmResult) -> list[dict[str, Any]]:
    return [a for a in r.audit if a["event"] == "finding" and a["kind"] == "failure_risk"]


REMOVING = ("cordon", "drain")


@dataclass(frozen=True)
class ActionOutcome:
    """One cordon or drain the engine did, and its outcome (issue 41): ``confirmed``,
    ``refuted`` or ``unknown`` from the engine's ``outcome`` record, or ``pending`` while no
    record has come (its windows, ``[outcomes] quick_pass_s`` and ``clean_window_s``, have
    not run out); ``evidence`` is the record's, or what the audit log shows so far."""

    t: float
    action: str
    node: str
    policy: str
    kind: str
    verdict: str
    evidence: str

    def line(self, started_at: float) -> str:
        return (f"{self.action} {self.node} at {self.t - started_at:.1f} s ({self.policy}, "
                f"{self.kind or '?'}): {self.verdict}: {self.evidence}")  # fmt: skip


def _words(evidence: Any) -> str:
    if not isinstance(evidence, dict):
        return str(evidence)
    out = str(evidence.get("why", ""))
    extra = {k: v for k, v in evidence.items() if k != "why"}
    return out + (" " + ", ".join(f"{k} {v}" for k, v in extra.items()) if extra else "")


def action_outcomes(
    audit: Sequence[dict[str, Any]], started_at: float = 0.0
) -> list[ActionOutcome]:
    """Each cordon and drain done for real in ``audit`` (the engine's records, as
    :func:`gpuwarden.remediation.audit.read_records` gives them), with its outcome."""
    policy_of = {  # a duplicate's decision (the finding sent again) names no policy
        str(r.get("finding_id")): str(r.get("policy", ""))
        for r in audit
        if r.get("event") == "decision" and r.get("verdict") != "duplicate"
    }
    verdicts = [r for r in audit if r.get("event") == "outcome"]
    out = []
    for i, r in enumerate(audit):
        if (r.get("event") != "action" or r.get("action") not in REMOVING
                or r.get("outcome") != "ok" or r.get("dry_run")):  # fmt: skip
            continue
        plan, node, t = str(r.get("finding_id", "")), str(r.get("node", "")), float(r["t"])
        known = next(
            (o for o in verdicts
             if o.get("plan_id") == plan or r.get("action_id") in (o.get("action_ids") or ())),
            None,
        )  # fmt: skip
        if known is not None:
            verdict, evidence = str(known.get("verdict", "")), _words(known.get("evidence"))
            kind = str(known.get("kind", ""))
        else:
            verdict, evidence, kind = "pending", _so_far(audit[i + 1 :], node, started_at), ""
        if not kind:
            kind = next((str(d.get("kind", "")) for d in audit
                         if d.get("event") == "finding" and d.get("finding_id") == plan),
                        "")  # fmt: skip
        out.append(ActionOutcome(t, str(r["action"]), node, policy_of.get(plan, ""), kind,
                                 verdict, evidence))  # fmt: skip
    return out


def _so_far(later: Sequence[dict[str, Any]], node: str, started_at: float) -> str:
    """What the audit log shows of a removed node since: its checks, its return, an undo."""
    seen = []
    for r in later:
        at = f"{float(r.get('t', 0.0)) - started_at:.1f} s"
        event = r.get("event")
        subject = r.get("subject") or {}
        if event == "finding" and subject.get("node") == node:
            kind, check = r.get("kind"), (r.get("evidence") or {}).get("check")
            if kind == "node_check_failed" or (kind == "node_healthy" and check == "fail"):
                seen.append(f"failed its check at {at}")
            elif kind == "node_healthy" and check == "pass":
                seen.append(f"passed its check at {at}")
        elif event == "action" and r.get("node") == node and r.get("action") == "uncordon":
            if r.get("outcome") == "ok":
                seen.append(f"returned at {at}")
        elif event == "undo" and r.get("node") == node:
            seen.append(f"undone by {r.get('by', '?')} ({r.get('reason', '')}) at {at}")
    return "no verdict yet; " + ("; ".join(seen) if seen else "not returned")


def p95(values: Sequence[float]) -> float:
    return float(np.percentile(values, 95)) if values else math.nan


def arm_lines(r: ArmResult) -> list[str]:
    kills = sum(h.what == "kill" for h in r.twin_log)
    xids = [f"{h.node} at {rel(r, h.t):.1f} s" for h in r.twin_log if h.what == "xid"]
    src = findings_by_source(r)
    kinds = Counter(a["kind"] for a in r.audit if a["event"] == "finding")
    act = actions(r)
    drains = [f"{d.node} at {rel(r, d.t):.1f} s" for d in r.drains]
    lost = r.lost
    alerts = [f"{a['subject'].get('node')} GPU {a['subject'].get('gpu')} at "
              f"{rel(r, a['t']):.0f} s" for a in predicted(r)]  # fmt: skip
    return [
        f"{r.arm} ({ARM_WORDS.get(r.arm, '')})",
        f"  faults (the twin's ground truth) {'; '.join(fault_lines(r)) or 'none'}",
        f"  XID lines written (twin)         {', '.join(xids) or 'none'}",
        f"  processes killed by GPU losses   {kills}",
        f"  findings (signed HTTP), by source {', '.join(f'{k} {v}' for k, v in src.items())}",
        f"  findings by kind                 "
        f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or 'none'}",
        f"  failure-risk alerts (analyze)    {', '.join(alerts) or 'none'}",
        f"  engine actions (ok)              "
        f"{', '.join(f'{k} {v}' for k, v in sorted(act.items())) or 'none'}",
        f"  Slurm drains (sinfo)             {', '.join(drains) or 'none'}",
        *outcome_lines(r),
        f"  job (its step log)               {len(lost.runs)} runs, {lost.steps_done} steps; "
        f"{len(lost.stops)} stops: {lost.recomputed} steps recomputed, "
        f"{lost.idle_s:.0f} s not stepping; {lost.saves_s:.1f} s held by saves",
        f"  work lost                        {lost.gpu_h:.3f} GPU-h ({lost.lost_s:.0f} s of "
        f"{r.gpus} GPUs)",
    ]


def outcome_lines(r: ArmResult) -> list[str]:
    """The report's lines on each removal's outcome (one line each, or one saying none)."""
    found = action_outcomes(r.audit, r.started_at)
    if not found:
        return ["  outcomes of cordons and drains  none taken"]
    head = "  outcomes of cordons and drains  "
    return [(head if i == 0 else " " * len(head)) + o.line(r.started_at)
            for i, o in enumerate(found)]  # fmt: skip


def summary(spec: ScenarioSpec, results: Sequence[ArmResult]) -> list[str]:
    lines = [""]
    for r in results:
        lines += [*arm_lines(r), ""]
    by_arm = {r.arm: r for r in results}
    proactive = by_arm.get("proactive")
    if proactive is not None:
        delays = [d for _, d in proactive.xid_to_drain_s()]
        lines.append(
            f"XID line to Slurm DRAIN (proactive): {', '.join(f'{d:.2f} s' for d in delays) or '-'}"
        )
        # a "p95" of the two or three XIDs of one run is nearly its maximum: the count says so
        lines.append(f"xid_to_drain_p95_s={p95(delays):.3f} samples={len(delays)}")
    for arm in ("reactive", "proactive"):
        if arm in by_arm:
            lines.append(f"work_lost_{arm}_gpu_h={by_arm[arm].lost.gpu_h:.4f}")
    if "reactive" in by_arm and "proactive" in by_arm:
        a, b = by_arm["reactive"].lost.lost_s, by_arm["proactive"].lost.lost_s
        saved = 100.0 * (a - b) / a if a > 0 else math.nan
        lines.append(f"work_saved_pct={saved:.1f}")
    return lines


# -- the HTML report --------------------------------------------------------------------------

LANES = ("faults (twin)", "XID / kill (twin)", "agent findings", "analyze findings",
         "engine actions", "Slurm drains")  # fmt: skip
COLOURS = {
    "notify": "#7f7f7f",
    "checkpoint": "#2ca02c",
    "drain": "#d62728",
    "requeue": "#ff7f0e",
    "uncordon": "#1f77b4",
    "cordon": "#9467bd",
}


def timeline(r: ArmResult, path: Path, duration_s: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 5.5), sharex=True, gridspec_kw={"height_ratios": [2, 3]}
    )
    for i, run in enumerate(r.lost.runs):
        if run.steps:
            xs = [rel(r, t) for _, t in run.steps]
            top.plot(xs, [s for s, _ in run.steps], lw=1.6, label=f"run {i + 1}")
        for step, t, _ in run.saves:
            top.plot(rel(r, t), step, "k|", ms=9)
    top.set_ylabel("job step")
    top.set_title(f"{r.arm}: the job's own step log (| = checkpoint saved)")
    if r.lost.runs:
        top.legend(loc="upper left", fontsize=8)
    y = {lane: len(LANES) - i for i, lane in enumerate(LANES)}
    for f in r.faults:
        if f.precursor_start_s < f.onset_s:
            span = f.onset_s - f.precursor_start_s
            bottom.barh(y["faults (twin)"], span, left=f.precursor_start_s, color="#fdd49e",
                        height=0.6)  # fmt: skip
        bottom.barh(y["faults (twin)"], f.end_s - f.onset_s, left=f.onset_s, color="#d7301f",
                    height=0.6)  # fmt: skip
        bottom.text(f.onset_s, y["faults (twin)"] + 0.35, f"{f.type} n{f.node}", fontsize=7)
    for h in r.twin_log:
        if h.what in ("xid", "kill"):
            bottom.plot(rel(r, h.t), y["XID / kill (twin)"], "v" if h.what == "xid" else "x",
                        color="#d62728" if h.what == "xid" else "black")  # fmt: skip
    for a in r.audit:
        t = rel(r, float(a["t"]))
        if a["event"] == "finding":
            lane = "agent findings" if a.get("source") == "agent" else "analyze findings"
            bottom.plot(t, y[lane], "o", ms=4, color="#1f77b4" if a["kind"] != "failure_risk"
                        else "#e6550d")  # fmt: skip
        elif a["event"] == "action" and a.get("outcome") == "ok":
            bottom.plot(t, y["engine actions"], "s", ms=5, color=COLOURS.get(a["action"], "k"))
    for d in r.drains:
        bottom.plot(rel(r, d.t), y["Slurm drains"], "D", color="#d62728")
    bottom.set_yticks([y[lane] for lane in LANES], LANES, fontsize=8)
    bottom.set_xlim(0, duration_s)
    bottom.set_xlabel("seconds since the twin started")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _table(rows: Sequence[Sequence[Any]], head: Sequence[str]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{cells}</tr>{body}</table>"


def write_report(
    out: Path,
    spec: ScenarioSpec,
    seed: int,
    results: Sequence[ArmResult],
    real: str,
    simulated: str,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    parts = [
        "<!doctype html><meta charset='utf-8'><title>gpuwarden live loop</title>",
        "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}"
        "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;"
        "padding:2px 6px}pre{background:#f6f6f6;padding:1em}</style>",
        f"<h1>gpuwarden live loop: {html.escape(spec.name)}, seed {seed}</h1>",
        f"<p>{html.escape(real)}</p><p>{html.escape(simulated)}</p>",
        f"<pre>{html.escape(chr(10).join(summary(spec, results)))}</pre>",
    ]
    for r in results:
        png = f"timeline-{r.arm}.png"
        timeline(r, out / png, spec.duration_s)
        parts.append(f"<h2>{html.escape(r.arm)}: {html.escape(ARM_WORDS.get(r.arm, ''))}</h2>")
        parts.append(f"<img src='{png}' width='100%'>")
        found = [
            (f"{rel(r, a['t']):.1f}", a["kind"], a.get("source", ""), a["subject"].get("node", ""),
             a["subject"].get("gpu", ""), a.get("via", ""), a.get("summary", "")[:120])
            for a in r.audit if a["event"] == "finding"
        ]  # fmt: skip
        parts.append("<h3>Findings, and the process that raised them</h3>")
        parts.append(_table(found, ["t (s)", "kind", "source", "node", "gpu", "via", "summary"]))
        acted = [
            (f"{rel(r, a['t']):.1f}", a["action"], a.get("node", ""), a.get("outcome", ""),
             a.get("message", "")[:120])
            for a in r.audit if a["event"] == "action"
        ]  # fmt: skip
        parts.append("<h3>Engine actions</h3>")
        parts.append(_table(acted, ["t (s)", "action", "node", "outcome", "message"]))
        verdicts = [
            (f"{rel(r, o.t):.1f}", o.action, o.node, o.policy, o.kind, o.verdict, o.evidence[:200])
            for o in action_outcomes(r.audit, r.started_at)
        ]
        parts.append("<h3>Each cordon and drain: its outcome (confirmed, refuted, unknown, or "
                     "pending), with its evidence</h3>")  # fmt: skip
        parts.append(_table(verdicts, ["t (s)", "action", "node", "policy", "finding",
                                       "outcome", "evidence"]))  # fmt: skip
        runs = [
            (i + 1, f"{rel(r, run.started):.1f}", run.resumed_from, run.checkpoint or "-",
             run.nodes, run.last_step)
            for i, run in enumerate(r.lost.runs)
        ]  # fmt: skip
        parts.append("<h3>The job's runs (its step log)</h3>")
        parts.append(_table(runs, ["run", "started (s)", "resumed from step", "checkpoint",
                                   "nodes", "last step"]))  # fmt: skip
    kinds = ", ".join(f"{k}: {t.defaults.signature}" for k, t in REGISTRY.items()
                      if k in {f.type for r in results for f in r.faults})  # fmt: skip
    parts.append(f"<p><small>Fault signatures (SIMULATED): {html.escape(kinds)}</small></p>")
    (out / "index.html").write_text("\n".join(parts), encoding="utf-8")
