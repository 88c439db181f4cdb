"""The demo's HTML report: one page, PNG plots (matplotlib, no display), tables, provenance.

Plots: fleet health over the day, MFU and goodput per analysis window, stragglers, the
congestion heatmap (switch x window), predicted against actual failures per node, the
actions the engine took, and the work lost with and without proactive remediation.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from gpuwarden.analytics.badput import CAUSES

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import polars as pl
from matplotlib.lines import Line2D

from demo.accounting import Comparison
from gpuwarden.analytics.predict.model import RiskModel
from gpuwarden.analytics.runner import Analysis
from gpuwarden.simulation.generator import ScenarioGenerator
from gpuwarden.simulation.spec import ScenarioSpec

H = 3600.0
ACTION_MARK = {"checkpoint": ("o", "tab:green"), "drain": ("v", "tab:blue"),
               "requeue": ("s", "tab:purple"), "uncordon": ("^", "tab:olive")}  # fmt: skip


STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}"
    ".sim{background:#fff3cd;padding:8px}"
)


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def fleet_health(gen: ScenarioGenerator, audit: Sequence[dict[str, Any]], path: Path) -> str:
    hours = np.arange(0, gen.spec.duration_s / H + 1e-9, 0.25)
    down = [sum(1 for f in gen.faults if f.fatal and f.onset_s <= h * H < f.end_s) for h in hours]
    degraded = [
        sum(1 for f in gen.faults if not f.fatal and f.onset_s <= h * H < f.end_s) for h in hours
    ]
    t0 = gen.spec.start_ns / 1e9
    out: set[str] = set()
    out_at = []
    events = sorted(
        ((float(r["t"]) - t0, r) for r in audit if r.get("event") == "action"),
        key=lambda e: e[0],
    )
    events = [e for e in events if e[1].get("outcome") == "ok"]
    k = 0
    for h in hours:
        while k < len(events) and events[k][0] <= h * H:
            r = events[k][1]
            if r["action"] == "drain":
                out.add(r["node"])
            elif r["action"] == "uncordon":
                out.discard(r["node"])
            k += 1
        out_at.append(len(out))
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.step(hours, down, where="post", label="nodes/GPUs down (fatal fault)", color="tab:red")
    ax.step(
        hours,
        degraded,
        where="post",
        label="degraded (slow GPU, congestion...)",
        color="tab:orange",
    )
    ax.step(hours, out_at, where="post", label="drained by gpuwarden", color="tab:blue")
    ax.set(xlabel="hour of the simulated day", ylabel="count", title="Fleet health (SIMULATED)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def mfu_goodput(analyses: Sequence[Analysis], job: str, path: Path) -> str:
    xs, mfu, good = [], [], []
    for a in analyses:
        try:
            j = a.job(job)
        except KeyError:
            continue
        if j.mfu is None:
            continue
        xs.append((a.start_ns + a.end_ns) / 2e9)
        mfu.append(j.mfu.mfu)
        good.append(j.mfu.goodput)
    fig, ax = plt.subplots(figsize=(9, 3))
    if xs:
        hours = (np.array(xs) - analyses[0].start_ns / 1e9) / H
        ax.plot(hours, mfu, "o-", label="MFU")
        ax.plot(hours, good, "s-", label="goodput (productive share of wall time)")
    ax.set(xlabel="hour", ylim=(0, 1.05), title=f"{job}: MFU and goodput per window (SIMULATED)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def stragglers_plot(analyses: Sequence[Analysis], path: Path) -> str:
    """Per analysis window: each straggler found, by how much it was slower than its peers."""
    fig, ax = plt.subplots(figsize=(9, 3))
    t0 = analyses[0].start_ns / 1e9 if analyses else 0.0
    colours = {"worker": "tab:red", "stage": "tab:purple", "spread": "tab:gray"}
    for a in analyses:
        mid = ((a.start_ns + a.end_ns) / 2e9 - t0) / H
        for j in a.jobs:
            for s in j.stragglers:
                ax.scatter(mid, s.slowdown, color=colours.get(s.kind, "k"), s=30, alpha=0.7)
    handles = [Line2D([], [], color=c, marker="o", ls="", label=k) for k, c in colours.items()]
    ax.legend(handles=handles, fontsize=8)
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set(xlabel="hour", ylabel="slowdown vs peers", title="Stragglers per window (SIMULATED)")
    return _save(fig, path)


def congestion(analyses: Sequence[Analysis], path: Path) -> str:
    switches = sorted({s.switch for a in analyses for s in a.switches})
    grid = np.zeros((len(switches), len(analyses)))
    for w, a in enumerate(analyses):
        for s in a.switches:
            grid[switches.index(s.switch), w] = s.score
    fig, ax = plt.subplots(figsize=(9, 2.5 + 0.25 * len(switches)))
    im = ax.imshow(grid, aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_yticks(range(len(switches)), switches)
    ax.set(xlabel="analysis window", title="Congestion score by ToR switch (SIMULATED)")
    fig.colorbar(im, ax=ax, label="share of traffic waiting")
    return _save(fig, path)


def predicted_vs_actual(
    gen: ScenarioGenerator, risk: pl.DataFrame, threshold: float,
    audit: Sequence[dict[str, Any]], path: Path,
) -> str:  # fmt: skip
    names = gen.node_names
    t0 = gen.spec.start_ns / 1e9
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(names) + 1.5))
    if not risk.is_empty():
        per_node = risk.group_by("node", "t").agg(pl.col("risk").max()).sort("t")
        for node, g in per_node.group_by("node"):
            y = names.index(str(node[0]))
            high = g.filter(pl.col("risk") >= threshold)
            ax.scatter((high["t"].to_numpy() - t0) / H, np.full(high.height, y), s=4,
                       color="tab:orange", label="_")  # fmt: skip
    for f in gen.faults:
        if f.fatal:
            ax.scatter(
                f.onset_s / H,
                names.index(names[f.node]),
                marker="X",
                s=60,
                color="tab:red",
                zorder=3,
            )
    for r in audit:
        if (
            r.get("event") == "action"
            and r.get("outcome") == "ok"
            and r["action"] in ACTION_MARK
            and r.get("node") in names
        ):
            m, c = ACTION_MARK[r["action"]]
            lift = 0.15 * (1 + list(ACTION_MARK).index(r["action"]))  # a row per action kind
            ax.scatter(
                (float(r["t"]) - t0) / H,
                names.index(r["node"]) + lift,
                marker=m,
                s=25,
                color=c,
                zorder=4,
            )
    handles = [
        Line2D([], [], color="tab:orange", marker="o", ls="", ms=3, label="risk above threshold"),
        Line2D([], [], color="tab:red", marker="X", ls="", label="fatal fault (ground truth)"),
    ]
    handles += [
        Line2D([], [], color=c, marker=m, ls="", label=a) for a, (m, c) in ACTION_MARK.items()
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set(xlabel="hour", title="Predicted against actual failures, and what the engine did")
    return _save(fig, path)


def work_lost(c: Comparison, path: Path) -> str:
    fig, ax = plt.subplots(figsize=(6, 3))
    labels = ["reactive\n(remediation off)", "proactive\n(gpuwarden)"]
    rec = [c.reactive.recompute_s * c.gpus / H, c.proactive.recompute_s * c.gpus / H]
    down = [c.reactive.downtime_s * c.gpus / H, c.proactive.downtime_s * c.gpus / H]
    ax.bar(labels, rec, label="recomputed since last checkpoint", color="tab:red")
    ax.bar(labels, down, bottom=rec, label="restart / waiting", color="tab:gray")
    ax.set(ylabel="GPU-hours lost", title=f"Work lost: {c.work_saved_pct:.0f}% saved (SIMULATED)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _num(value: object) -> float:
    assert isinstance(value, int | float), value
    return float(value)


def _table(rows: Sequence[Sequence[Any]], head: Sequence[str]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def write_report(
    out: Path, *, spec: ScenarioSpec, gen: ScenarioGenerator, analyses: Sequence[Analysis],
    risk: pl.DataFrame, model: RiskModel, audit: Sequence[dict[str, Any]], comparison: Comparison,
    seed: int,
) -> Path:  # fmt: skip
    job = spec.jobs[0].name
    pngs = {
        "Fleet health": fleet_health(gen, audit, out / "fleet-health.png"),
        "MFU and goodput": mfu_goodput(analyses, job, out / "mfu-goodput.png"),
        "Stragglers": stragglers_plot(analyses, out / "stragglers.png"),
        "Congestion heatmap": congestion(analyses, out / "congestion.png"),
        "Predicted against actual failures": predicted_vs_actual(
            gen, risk, model.meta.threshold, audit, out / "predicted.png"
        ),
        "Work lost, with and without proactive remediation": work_lost(
            comparison, out / "work-lost.png"
        ),
    }
    t0 = spec.start_ns / 1e9
    stragglers = [
        (
            f"{(a.start_ns / 1e9 - t0) / H:.0f}-{(a.end_ns / 1e9 - t0) / H:.0f} h",
            s.kind,
            s.worker or ("" if s.stage is None else f"stage {s.stage}"),
            f"{s.slowdown:.2f}x",
            f"{s.persistence:.0%}",
        )
        for a in analyses
        for j in a.jobs
        for s in j.stragglers
    ]
    drift = [
        (
            f"{(a.start_ns / 1e9 - t0) / H:.0f}-{(a.end_ns / 1e9 - t0) / H:.0f} h",
            d.node,
            d.describe(),
        )
        for a in analyses
        for d in a.drift
    ] + [
        (
            f"{(a.start_ns / 1e9 - t0) / H:.0f}-{(a.end_ns / 1e9 - t0) / H:.0f} h",
            f"job {m.job}",
            m.describe(),
        )
        for a in analyses
        for m in a.job_mix
    ]
    actions = [
        (
            f"{(float(r['t']) - t0) / H:5.2f} h",
            r["action"],
            r.get("node", ""),
            r["outcome"],
            r.get("message", "")[:90],
        )
        for r in audit
        if r.get("event") == "action" and r["action"] != "notify"
    ]
    c = comparison
    stops = [
        (
            f"{_num(r['at_s']) / H:5.2f} h",
            r["node"],
            r["cause"],
            f"{_num(r['reactive_lost_s']) / 60:.0f}",
            f"{_num(r['proactive_lost_s']) / 60:.0f}",
            ""
            if r["moved_before_s"] is None
            else f"{_num(r['moved_before_s']) / 60:.0f} min before",
        )
        for r in c.reactive.rows
    ]
    false_alarms = sum(1 for r in c.proactive.rows if r.get("false_alarm"))
    badput = [
        (
            f"{(a.start_ns / 1e9 - t0) / H:.0f}-{(a.end_ns / 1e9 - t0) / H:.0f} h",
            name,
            f"{b.elapsed_s / 60:.0f}",
            *(f"{v / 60:.1f}" for v in b.seconds().values()),
        )
        for a in analyses
        for name, b in a.badput.items()
    ]
    figs = "".join(f"<h2>{html.escape(k)}</h2><img src='{v}'>" for k, v in pngs.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>gpuwarden demo</title>
<style>{STYLE}</style></head><body>
<h1>gpuwarden end-to-end demo</h1>
<p class="sim"><b>SIMULATED</b> cluster: scenario <code>{spec.name}</code> seed {seed} -- {
        html.escape(spec.description)
    }.
Fault times and kinds are drawn from the REAL StepFun fault process; precursor signatures are
the generator's.
InfluxDB, Slurm (slurmctld/slurmd), the analytics, the predictor (trained on other SIMULATED days:
{
        html.escape(model.meta.version)
    }) and the remediation engine are real. The day was replayed in minutes;
the engine's clock was the scenario's.</p>
<h2>Summary</h2>
{
        _table(
            [
                ("ETTR", f"{c.ettr(c.reactive):.3f}", f"{c.ettr(c.proactive):.3f}"),
                (
                    "GPU-hours lost",
                    f"{c.gpu_hours(c.reactive):.1f}",
                    f"{c.gpu_hours(c.proactive):.1f}",
                ),
                ("false alarms (needless moves)", "-", str(false_alarms)),
            ],
            ["", "reactive", "proactive"],
        )
    }
<p><b>work_saved_pct={c.work_saved_pct:.1f}</b></p>
{figs}
<h2>Job stops and what each cost (minutes)</h2>
{_table(stops, ["when", "node", "cause", "reactive", "proactive", "engine moved the job"])}
<h2>Badput by cause, per job and analysis window (minutes; analytics, from the job's steps)</h2>
{_table(badput, ["window", "job", "elapsed", *CAUSES]) if badput else "<p>none</p>"}
<h2>Stragglers found by analytics</h2>
{
        _table(stragglers, ["window", "kind", "where", "slowdown", "persistence"])
        if stragglers
        else "<p>none</p>"
    }
<h2>GPUs set up unlike their fleet (configuration drift)</h2>
{_table(drift, ["window", "node or job", "what differs"]) if drift else "<p>none</p>"}
<h2>Actions the engine took (live, on the local Slurm)</h2>
{_table(actions, ["when", "action", "node", "outcome", "message"])}
<p>Dashboards (Grafana JSON and provisioning) are in <code>grafana/</code> beside this page.</p>
</body></html>"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
