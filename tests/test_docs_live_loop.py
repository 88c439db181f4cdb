"""docs/LIVE-LOOP.md's fresh-seed table is what ``python -m demo.live_table`` makes of the
summaries ``gpuwarden demo --seed N`` printed (kept in ``docs/data/live-loop/``), row for row.
The runs themselves take 12 minutes a seed and are not repeated here: this checks that the
page quotes them exactly and that none is left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.live_table import row, table

ROOT = Path(__file__).resolve().parent.parent
RUNS = sorted((ROOT / "docs/data/live-loop").glob("seed-*.txt"))


def test_the_page_quotes_every_recorded_run_exactly() -> None:
    page = (ROOT / "docs/LIVE-LOOP.md").read_text(encoding="utf-8")
    assert len(RUNS) >= 3
    assert table(RUNS) in page


def test_a_summary_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError):
        row("reactive (x)\n  job (its step log) 1 run\n")
