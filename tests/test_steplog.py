"""Work lost read from a training job's own step log (demo/steplog.py): hand-checked numbers
on CONSTRUCTED logs in the format testbed/jobs/train_job.py writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from demo.steplog import work_lost


def log(tmp: Path, events: list[dict]) -> Path:
    path = tmp / "steps.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"event": "st')  # torn
    return path


def run(t0: float, resume: int, steps: range, saves: tuple[int, ...] = ()) -> list[dict]:
    out = [{"event": "start", "t": t0, "resume_step": resume, "checkpoint": "", "nodes": "n"}]
    for i, step in enumerate(steps):
        out.append({"event": "step", "t": t0 + 1 + i, "step": step})
        if step in saves:
            out.append({"event": "save", "t": t0 + 1 + i, "step": step, "why": "cadence"})
    return out


def test_a_restart_costs_the_steps_since_the_checkpoint_and_the_time_not_stepping(tmp_path):
    # steps 1-10 at t = 1..10, a save at 5; the next run resumes from 5 at t = 20: steps
    # 6-12 at t = 21..27. Lost: 10 - 5 = 5 steps again, and 21 - 10 - 1 = 10 s not stepping.
    path = log(tmp_path, run(0, 0, range(1, 11), saves=(5,)) + run(20, 5, range(6, 13)))
    w = work_lost(path, step_s=1.0, gpus=24)
    assert (len(w.runs), len(w.stops)) == (2, 1)
    assert (w.recomputed, w.idle_s, w.lost_s) == (5, 10.0, 15.0)
    assert w.gpu_h == pytest.approx(15.0 * 24 / 3600)
    assert w.steps_done == 12


def test_a_job_down_at_the_end_has_lost_what_it_will_redo_and_the_time_since(tmp_path):
    path = log(tmp_path, run(0, 0, range(1, 11), saves=(5,)))
    down = work_lost(path, step_s=1.0, gpus=8, end=40.0)
    assert (down.recomputed, down.idle_s, down.lost_s) == (5, 29.0, 34.0)  # 40 - 10 - 1
    stepping = work_lost(path, step_s=1.0, gpus=8, end=11.0)  # still stepping at the end
    assert stepping.stops == []


def test_a_run_killed_before_its_first_step_counts_in_the_time_not_stepping(tmp_path):
    events = run(0, 0, range(1, 11), saves=(5,)) + run(15, 5, range(0)) + run(30, 5, range(6, 9))
    w = work_lost(log(tmp_path, events), step_s=1.0, gpus=8)
    assert (len(w.runs), len(w.stops)) == (3, 1)
    assert (w.recomputed, w.idle_s) == (5, 20.0)  # 31 - 10 - 1


def test_a_save_that_holds_training_up_is_lost_time(tmp_path):
    """A save at step 5 that held the job 3 s (step 6 at t = 9 instead of 6), one at step 8
    that held nothing (a background save's copy); a slow step without a save is not counted."""
    events = run(0, 0, range(1, 6), saves=(5,))  # steps 1-5 at t = 1..5
    events += [{"event": "step", "t": 9.0, "step": 6}, {"event": "step", "t": 10.0, "step": 7},
               {"event": "step", "t": 11.0, "step": 8},
               {"event": "save", "t": 11.5, "step": 8, "why": "cadence", "background": True},
               {"event": "step", "t": 12.0, "step": 9},
               {"event": "step", "t": 15.0, "step": 10}]  # fmt: skip
    w = work_lost(log(tmp_path, events), step_s=1.0, gpus=8)
    assert w.stops == [] and w.saves_s == 3.0 and w.lost_s == 3.0
