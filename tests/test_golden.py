"""Golden cases: recorded NVML answers and/or sysfs trees over steps, and the expected line
protocol of each step (STYLE.md 5). ``GPUWARDEN_UPDATE_GOLDEN=1 pytest tests/test_golden.py``
rewrites the expected files; review the diff before committing it.

Each case folder (``tests/golden/<case>/``) holds ``case.toml`` (sources, settings, steps and
the provenance of its inputs: real data or constructed), ``nvml.json`` (a recording),
``sysfs-<step>.csv`` and ``proc.csv`` (``path,value`` rows materialised into a tree; an
``environ`` value's spaces become NULs), ``kmsg.log`` (read whole) or ``kmsg-<step>.log`` (the
lines the kernel logs before that step, appended to the file the source follows), and
``expected-<step>.lp``. The sources share one context, as in the agent. The findings the sources
raise on the fast path during a step are ``findings-<step>.jsonl`` (kind, severity, subject,
summary, evidence); a case whose sources raise findings must have the file.
"""

from __future__ import annotations

import csv
import json
import os
import tomllib
from pathlib import Path

import pytest

from gpuwarden.collector import sources
from gpuwarden.collector.plausible import Screen
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.finding import Finding
from gpuwarden.core.store.lineprotocol import encode_points

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "case.toml").exists())
T0 = 1_763_000_000_000_000_000
STEP_NS = 10 * 10**9


def materialise(csv_path: Path, root: Path) -> None:
    """Write each ``path,value`` row as a file under ``root`` (in place, as sysfs changes)."""
    with csv_path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            target = root / row["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            value = row["value"]
            if target.name == "environ":
                target.write_bytes(value.replace(" ", "\0").encode() + b"\0")
                continue
            with open(target, "w", encoding="utf-8") as out:  # same inode, like sysfs
                out.write(value + "\n")


def run_case(
    case: Path, tmp: Path, nvml_backend: object = None, found: list[list[str]] | None = None
) -> list[list[str]]:
    """Each step's line protocol; ``nvml_backend`` replaces the recorded NVML backend;
    ``found`` gets each step's findings (one JSON line each)."""
    spec = tomllib.loads((case / "case.toml").read_text(encoding="utf-8"))
    raised: list[Finding] = []
    context = SourceContext(
        "golden", "node-a", sysfs=tmp / "sys", procfs=tmp / "proc", emit_finding=raised.append
    )
    if (case / "proc.csv").exists():
        materialise(case / "proc.csv", tmp)
    settings = spec.get("settings", {})
    made = []
    for name in spec["sources"]:
        s = dict(settings.get(name, {}))
        if name == "nvml":
            s.update(backend="recorded", recording=str(case / "nvml.json"), events="poll")
            s.setdefault("jobmap_dir", str(tmp / "jobs"))
            if nvml_backend is not None:
                s["backend_instance"] = nvml_backend
        if name == "xid":
            s.setdefault("follow_s", 0.0)  # read at each step only, as the case says
            s["path"] = str(case / "kmsg.log")
            if (case / "kmsg-0.log").exists():
                s["path"] = str(tmp / "kmsg.log")
                (tmp / "kmsg.log").touch()
        made.append(sources.create(name, context, s))
    steps = []
    screen = Screen()
    for step in range(spec["steps"]):
        if (case / f"sysfs-{step}.csv").exists():
            materialise(case / f"sysfs-{step}.csv", tmp)
        if (case / f"kmsg-{step}.log").exists():
            with (tmp / "kmsg.log").open("ab") as log:
                log.write((case / f"kmsg-{step}.log").read_bytes())
        now = T0 + step * STEP_NS
        points = [p for src in made for p in src.collect(now)]
        screen(points)  # as the agent does: implausible readings are left out
        for p in points:
            assert check_point(p.measurement, p.tags, p.fields) == [], p
        steps.append(encode_points(points))
        if found is not None:
            found.append([json.dumps({"kind": f.kind, "severity": str(f.severity),
                                      "subject": f.subject, "summary": f.summary,
                                      "evidence": f.evidence}, sort_keys=True)
                          for f in raised])  # fmt: skip
        raised.clear()
    for src in made:
        src.close()
    return steps


@pytest.mark.parametrize("name", CASES)
def test_golden_case(name: str, tmp_path: Path) -> None:
    case = GOLDEN / name
    spec = tomllib.loads((case / "case.toml").read_text(encoding="utf-8"))
    assert spec.get("provenance"), f"{name}: case.toml must say where its inputs come from"
    found: list[list[str]] = []
    steps = run_case(case, tmp_path, found=found)
    update = os.environ.get("GPUWARDEN_UPDATE_GOLDEN") == "1"
    for step, lines in enumerate(found):
        path = case / f"findings-{step}.jsonl"
        got = "".join(line + "\n" for line in lines)
        if update and (lines or path.exists()):
            path.write_text(got, encoding="utf-8")
        elif lines or path.exists():
            assert path.exists(), f"{path} missing; run with GPUWARDEN_UPDATE_GOLDEN=1"
            assert got == path.read_text(encoding="utf-8"), f"{name} step {step} findings differ"
    for step, lines in enumerate(steps):
        expected_path = case / f"expected-{step}.lp"
        got = "".join(line + "\n" for line in lines)
        if os.environ.get("GPUWARDEN_UPDATE_GOLDEN") == "1":
            expected_path.write_text(got, encoding="utf-8")
            continue
        assert expected_path.exists(), (
            f"{expected_path} missing; run with GPUWARDEN_UPDATE_GOLDEN=1"
        )
        assert got == expected_path.read_text(encoding="utf-8"), f"{name} step {step} differs"


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 5


def test_the_recorder_captures_everything_the_source_asks(tmp_path: Path, monkeypatch) -> None:
    """``python -m testbed.nvml.record`` (run where a GPU is) re-recording the CONSTRUCTED
    8x H100 case through the same Recorder: the new case replays to the same line protocol,
    so a real recording made with it is a complete golden case."""
    from gpuwarden.collector.nvml.recorded import RecordedBackend
    from testbed.nvml import record

    source = GOLDEN / "nvml-h100-8gpu"
    monkeypatch.setattr(record, "make_backend", lambda: RecordedBackend(source / "nvml.json"))
    out = tmp_path / "case"
    assert record.main([str(out), "--steps", "2", "--interval-s", "0"]) == 0
    spec = tomllib.loads((out / "case.toml").read_text(encoding="utf-8"))
    assert spec["steps"] == 2 and spec["provenance"].startswith("CONSTRUCTED: recorded from 8x")
    (out / "proc.csv").write_bytes((source / "proc.csv").read_bytes())  # the jobs' /proc
    assert run_case(out, tmp_path / "replayed") == run_case(source, tmp_path / "original")
