"""The README and docs/ as an operator reads them: short, self-contained, every table sourced.

* README.md stays under 200 lines (issue 37, item 8) and every link in it and in docs/ points
  at a file inside this repository (a clone is all an operator has).
* Every table carries a comment on the line before it saying what it is: ``reference`` (a
  description: names, settings, who runs what), or a measured table's label (REAL, SIMULATED,
  CONSTRUCTED or MODEL), the command that produces it (a file that exists) and either the test
  that checks its figures (a test function that exists) or, after ``unchecked:``, why none can.
  A table pasted in without its source fails here.
* ``unchecked`` is allowed only for the tables listed in ``UNCHECKED`` below, each with the
  reason no test can hold it (issue 40, item 4): a new table must name its test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TABLE_HEAD = re.compile(r"^\|[-| :]+\|\s*$")
ANNOTATION = re.compile(r"^<!-- table: (?P<body>.+) -->$")
LABELS = {"REAL", "SIMULATED", "CONSTRUCTED", "MODEL"}
# (page, the command its tag names): how many of that page's tables from that command may stay
# unchecked, and why. Every other measured table names the test that checks its cells.
UNCHECKED = {
    ("NVML-REAL.md", "benchmarks/nvml_calls.py"): (
        1,
        "wall times on a lent H200; the output was not kept and CI has no GPU",
    ),
    ("NVML-REAL.md", "benchmarks/nvml_real.py"): (
        1,
        "wall and CPU times on a lent H200; the output was not kept and CI has no GPU",
    ),
}


def tables(page: Path) -> list[tuple[int, str]]:
    """(header line number, the line before it) of every table in ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    for i in range(1, len(lines) - 1):
        starts = lines[i].startswith("|") and not lines[i - 1].startswith("|")
        if starts and TABLE_HEAD.match(lines[i + 1]):
            found.append((i + 1, lines[i - 1]))
    return found


def problems_with(annotation: str) -> list[str]:
    """What is wrong with one table's annotation line ([] when nothing is)."""
    match = ANNOTATION.match(annotation)
    if not match:
        return [f"no '<!-- table: ... -->' line before it (found {annotation[:60]!r})"]
    body = match["body"]
    if body == "reference":
        return []
    parts = [p.strip() for p in body.split(";", 2)]
    if len(parts) != 3:
        return [f"want 'LABEL; from: `command`; checked: test | unchecked: why', got {body!r}"]
    label, source, check = parts
    found = []
    if label not in LABELS:
        found.append(f"label {label!r} is not one of {sorted(LABELS)}")
    command = re.fullmatch(r"from: `([^` ]+)[^`]*`", source)
    if not command or not (ROOT / command[1]).is_file():
        found.append(f"{source!r} names no file of this repository")
    if check.startswith("checked: "):
        path, _, name = check.removeprefix("checked: ").partition("::")
        test_file = ROOT / path
        if not test_file.is_file() or f"def {name}(" not in test_file.read_text(encoding="utf-8"):
            found.append(f"{check!r} names no test that exists")
    elif not (check.startswith("unchecked: ") and len(check) > len("unchecked: ") + 10):
        found.append(f"{check!r}: want 'checked: tests/x.py::test' or 'unchecked: <why>'")
    return found


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_stays_inside_the_repository(page: Path) -> None:
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        assert "://" not in target and not target.startswith("mailto:"), f"{page.name}: {target}"
        resolved = (page.parent / target.split("#", 1)[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert resolved.exists(), f"{page.name}: {target} does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_table_says_what_it_is_and_where_it_comes_from(page: Path) -> None:
    wrong = {line: problems_with(before) for line, before in tables(page)}
    assert {line: found for line, found in wrong.items() if found} == {}


def test_only_the_listed_tables_are_unchecked() -> None:
    found: dict[tuple[str, str], int] = {}
    for page in PAGES:
        for _, before in tables(page):
            command = re.search(r"from: `([^` ]+)[^`]*`; unchecked: ", before)
            if command:
                key = (page.name, command[1])
                found[key] = found.get(key, 0) + 1
    allowed = {key: count for key, (count, _) in UNCHECKED.items()}
    assert found == allowed, (
        "a table is unchecked that UNCHECKED does not list (or one it lists is checked now)"
    )


def test_the_annotation_check_bites() -> None:
    """The checker refuses what it must: these are the mistakes a pasted table makes."""
    src = "from: `benchmarks/goodput.py`"
    assert problems_with("| a | b |")
    assert problems_with(f"<!-- table: MEASURED; {src}; unchecked: too slow to rerun -->")
    assert problems_with("<!-- table: REAL; from: `benchmarks/nope.py`; unchecked: too slow -->")
    assert problems_with(f"<!-- table: REAL; {src}; checked: tests/test_demo.py::test_nope -->")
    assert problems_with(f"<!-- table: REAL; {src}; unchecked: -->")
    check = "tests/test_demo.py::test_the_docs_quote_the_backtest_for_three_seeds"
    assert problems_with(f"<!-- table: MODEL; {src}; checked: {check} -->") == []
