"""What fixing a straggling rank gives back (analytics.badput.straggler_costs): one pass over the
step log must give what the definition gives rank by rank (CONSTRUCTED step logs)."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.analytics.badput import straggler_cost_s, straggler_costs


def by_definition(timings: pl.DataFrame, worker: str, first: int, last: int) -> float:
    """Each step in ``first..last``: its wall time (slowest rank) minus the slowest other
    rank's, times the steps the sample stands for; steps with no other rank give nothing."""
    total = 0.0
    for _, rows in timings.filter(pl.col("step").is_between(first, last)).group_by("step"):
        others = rows.filter(pl.col("worker") != worker)["time_s"].to_list()
        if not others:
            continue
        n = rows["steps"][0] if "steps" in rows.columns else 1
        total += max(0.0, max(rows["time_s"].to_list()) - max(others)) * n
    return total


def test_a_worked_case() -> None:
    timings = pl.DataFrame({
        "worker": ["a", "b", "c"] * 3 + ["a"],
        "step": [0, 0, 0, 1, 1, 1, 2, 2, 2, 3],
        "time_s": [1.5, 1.0, 1.1, 1.0, 1.0, 1.2, 2.0, 2.0, 1.0, 9.0],
        "steps": [2, 2, 2, 1, 1, 1, 1, 1, 1, 1],
    })  # fmt: skip
    # step 0: a leads by 0.4 (x2 steps); step 1: c leads; step 2: a ties b; step 3: a alone
    assert straggler_costs(timings, {"a": (0, 3), "c": (0, 3), "b": (1, 1)}) == pytest.approx(
        {"a": 0.8, "c": 0.2, "b": 0.0}
    )
    assert straggler_cost_s(timings, "a", 1, 3) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["r0", "r1", "r2", "r3"]),
            st.integers(0, 6),
            st.sampled_from([0.5, 1.0, 1.0, 1.5, 2.0, 3.25]),  # repeats: ties
        ),
        min_size=1,
        max_size=40,
        unique_by=lambda r: (r[0], r[1]),
    ),
    first=st.integers(0, 6),
    length=st.integers(0, 6),
    weighted=st.booleans(),
)
def test_one_pass_equals_the_definition(rows, first, length, weighted) -> None:
    timings = pl.DataFrame(rows, schema=["worker", "step", "time_s"], orient="row")
    weights = None
    if weighted:
        weights = pl.DataFrame({"step": range(7), "steps": [1, 3, 1, 2, 5, 1, 4]})
    spans = {w: (first, first + length) for w in ("r0", "r1", "r2", "r3")}
    got = straggler_costs(timings, spans, weights)
    ref = timings.join(weights, on="step") if weights is not None else timings
    for w, (a, b) in spans.items():
        assert got[w] == pytest.approx(by_definition(ref, w, a, b)), w
