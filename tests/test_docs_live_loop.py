"""docs/LIVE-LOOP.md's fresh-seed table is what ``python -m demo.live_table`` makes of the
summaries ``gpuwarden demo --seed N`` printed (kept in ``docs/data/live-loop/``), row for row.
The runs themselves take 12 minutes a seed and are not repeated here: this checks that the
page quotes them exactly and that none is left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.live_table import row, table
from tests.test_docs_tables import on_page

ROOT = Path(__file__).resolve().parent.parent
RUNS = sorted((ROOT / "docs/data/live-loop").glob("seed-*.txt"))
#: each table on the page: the fresh seeds of one measurement (5101-5103 at 7d86ee6; 5201-5203
#: at 8f42cec)
GROUPS = ["seed-510?.txt", "seed-520?.txt"]


@pytest.mark.parametrize("group", GROUPS)
def test_the_page_quotes_every_recorded_run_exactly(group: str) -> None:
    runs = sorted((ROOT / "docs/data/live-loop").glob(group))
    assert len(runs) == 3
    assert on_page(table(runs), "LIVE-LOOP.md")  # whole: no row more, none less


def test_every_recorded_run_is_in_a_table() -> None:
    grouped = {p for g in GROUPS for p in (ROOT / "docs/data/live-loop").glob(g)}
    assert set(RUNS) == grouped


def test_a_summary_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError):
        row("reactive (x)\n  job (its step log) 1 run\n")


def test_the_stated_fault_rate_is_in_one_unit() -> None:
    """The page compares the scenario's job MTBF (2.75 h: two faults in 330 s at 60x) with
    StepFun's for a 3-node job, both in the same (compressed, cluster) hours. Before, it set
    2.75 compressed hours against 32 hours of loop time and said "12 times"; it is ~700."""
    from demo.live import TIME_SCALE
    from gpuwarden.analytics.cadence import stepfun_rate_per_node_s

    prose = " ".join((ROOT / "docs/LIVE-LOOP.md").read_text(encoding="utf-8").split())
    scenario_h = 330 * TIME_SCALE / 3600 / 2
    stepfun_h = 1 / (3 * stepfun_rate_per_node_s()) / 3600
    assert f"a job MTBF of {scenario_h:g} h" in prose
    assert f"MTBF of about {round(stepfun_h, -1):,.0f} h" in prose
    assert f"{stepfun_h / TIME_SCALE:.0f} h of loop time at {TIME_SCALE:g}x" in prose
    assert f"about {round(stepfun_h / scenario_h, -2):.0f} times as faulty" in prose


def _value(pattern: str, text: str) -> str:
    import re

    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, pattern
    return found[1]


def test_the_prose_beside_todays_table_is_the_recorded_runs() -> None:
    """The work saved, the alerts' leads and the XID-to-DRAIN span the page gives for seeds
    5201-5203, from their kept summaries."""
    prose = " ".join((ROOT / "docs/LIVE-LOOP.md").read_text(encoding="utf-8").split())
    runs = [
        p.read_text(encoding="utf-8")
        for p in sorted(ROOT.glob("docs/data/live-loop/seed-520?.txt"))
    ]
    saved = [float(_value(r"^work_saved_pct=(\S+)$", r)) for r in runs]
    mean = sum(saved) / len(saved)
    assert f"**Work saved: {saved[0]}, {saved[1]} and {saved[2]} % (mean {mean:.1f} %)**" in prose
    leads = []
    for r in runs:
        proactive = r[r.index("\nproactive (") :]
        node = _value(r"ecc_row_remap (\S+) gpu", proactive)
        drained = float(_value(rf"Slurm drains \(sinfo\)\s+.*?{node} at ([\d.]+) s", proactive))
        alerted = float(
            _value(r"failure-risk alerts \(analyze\)\s+\S+ GPU \d+ at (\d+) s", proactive)
        )
        assert 0 <= drained - alerted <= 2.0  # "drained within 2 s of it"
        fault = int(_value(r"ecc_row_remap \S+ gpu \d+ at (\d+) s", proactive))
        alert = int(_value(r"failure-risk alerts \(analyze\)\s+\S+ GPU \d+ at (\d+) s", proactive))
        leads.append(fault - alert)
    assert (
        f"the failure-risk alert came {leads[0]}, {leads[1]} and {leads[2]} s before the "
        "ECC-failing node's row-remap failure and the node was drained within 2 s of it"
    ) in prose
    delays = [float(_value(r"^XID line to Slurm DRAIN \(proactive\): (\S+) s$", r)) for r in runs]
    assert f"drained {min(delays):.2f} to {max(delays):.2f} s after its line" in prose


def test_the_xid_to_drain_figures_are_the_recorded_run() -> None:
    """The XID-line-to-DRAIN figures the page gives, from ``benchmarks/live_loop.py``'s kept
    output: both sides' p50 and maximum, and three faults each."""
    text = (ROOT / "docs/data/xid-drain/2026-11-27.txt").read_text(encoding="utf-8")
    prose = " ".join((ROOT / "docs/LIVE-LOOP.md").read_text(encoding="utf-8").split())
    now = _value(r"^as it is \(follow_s = 0\.1\) +(\d+ +\S+ +\S+ +\S+)", text).split()
    was = _value(r"^before \(log read at each cycle\) +(\d+ +\S+ +\S+ +\S+)", text).split()
    assert now[0] == was[0] == "3"
    assert f"**p50 {now[1]} s, max {now[3]} s** (before: p50 {was[1]} s, max {was[3]} s" in prose
