"""GPU events name the job they hit, even when they are read after its process has gone.

All inputs are CONSTRUCTED: job histories and ``/proc`` trees written by the tests, XID lines in
the driver's format. The golden cases ``xid-kmsg-job`` and ``nvml-gpu-lost`` show the same on
the line protocol.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.collector import sources
from gpuwarden.collector.attribution import NO_JOB, JobHistory, JobInfo
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.core.finding import Finding

S = 10**9
A = JobInfo("81234", "3", "3")
B = JobInfo("81300", "0", "0")


def test_an_event_gets_the_job_of_the_last_look_before_it():
    h = JobHistory(keep_s=600)
    h.saw(100 * S, {0: A, 1: NO_JOB}, {4100: A})
    h.saw(110 * S, {0: NO_JOB, 1: B}, {4200: B})  # A's process died between the looks
    assert h.job_at(105 * S, gpu=0) == A  # hit A, read after A had gone
    assert h.job_at(110 * S, gpu=0) == NO_JOB
    assert h.job_at(105 * S, gpu=1) == NO_JOB  # B was not there yet: not blamed
    assert h.job_at(99 * S, gpu=0) == NO_JOB  # before the agent first looked
    assert h.job_at(105 * S, gpu=7) == NO_JOB  # a GPU never seen
    assert h.job_at(105 * S) == NO_JOB  # no GPU, no pid


def test_the_pid_an_event_names_beats_the_gpu_job():
    """A GPU shared by two jobs is tagged with the one using most memory; an XID naming the
    other job's process is that job's."""
    h = JobHistory()
    h.saw(100 * S, {0: A}, {4100: A, 4200: B, 4300: NO_JOB})
    assert h.job_at(101 * S, gpu=0, pid=4200) == B
    assert h.job_at(101 * S, gpu=0, pid=4300) == A  # a process of no job: the GPU's
    assert h.job_at(101 * S, gpu=0, pid=9999) == A  # a pid never seen on a GPU: the GPU's
    assert h.job_at(101 * S, gpu=None, pid=4200) == B  # the PCI address was not known


def test_events_older_than_the_history_get_no_job():
    h = JobHistory(keep_s=60)
    h.saw(100 * S, {0: A}, {4100: A})
    h.saw(200 * S, {0: A}, {4100: A})
    assert h.job_at(150 * S, gpu=0) == A
    assert h.job_at(139 * S, gpu=0, pid=4100) == NO_JOB  # more than keep_s before the last look


def test_a_gpu_whose_jobs_churn_keeps_only_its_latest_changes():
    """Past ``max_changes``, the oldest are forgotten: an event from then gets no job, never
    the job of a later change."""
    h = JobHistory(keep_s=600, max_changes=3)
    for n in range(6):
        h.saw((100 + n) * S, {0: JobInfo(str(n))}, {})
    assert [h.job_at((100 + n) * S, gpu=0).job for n in range(6)] == ["", "", "", "3", "4", "5"]


def test_the_history_stays_bounded_over_a_long_life():
    h = JobHistory(keep_s=60, max_pids=100)
    for n in range(20_000):  # a job change on every GPU and new pids at every look
        now = n * 10 * S
        h.saw(now, {g: JobInfo(str(n + g)) for g in range(8)}, {n * 8 + g: A for g in range(8)})
    assert all(len(changes) <= 8 for changes in h._gpus.values())  # 60 s of 10 s looks
    assert len(h._pids) <= 100
    assert h.job_at(now - 5 * S, gpu=3) == JobInfo(str(n - 1 + 3))
    assert h.job_at(now, gpu=3) == JobInfo(str(n + 3))


looks = st.lists(
    st.tuples(
        st.integers(1, 30), st.lists(st.sampled_from([NO_JOB, A, B]), min_size=2, max_size=2)
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(looks, st.integers(0, 2_000))
def test_the_pruned_history_answers_as_one_that_keeps_every_look(steps, probe):
    """Only job changes are kept, and only for ``keep_s``: within that window every answer is
    the one a history of every look would give."""
    keep_s = 100
    h = JobHistory(keep_s=keep_s, max_changes=1000)
    every: list[tuple[int, list[JobInfo]]] = []
    now = 0
    for gap, jobs in steps:
        now += gap * S
        h.saw(now, dict(enumerate(jobs)), {})
        every.append((now, jobs))
    when = min(probe * S // 2, now + 10 * S)
    for gpu in (0, 1):
        before = [jobs[gpu] for t, jobs in every if t <= when]
        expected = before[-1] if before and when >= now - keep_s * S else NO_JOB
        assert h.job_at(when, gpu=gpu) == expected


def _xid_source(tmp_path: Path, lines: list[str], context: SourceContext):
    log = tmp_path / "kmsg.log"
    log.write_text("".join(line + "\n" for line in lines))
    return sources.create("xid", context, {"path": str(log), "lookback_s": 0.0})


def _proc(root: Path, pid: int, comm: str, environ: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "environ").write_bytes(environ.replace(" ", "\0").encode() + b"\0")


def test_without_nvml_a_running_process_named_by_the_xid_gives_its_job(tmp_path):
    """A kernel-log-only node: the pid is read from /proc while it still runs, but only when
    it is still the program the XID names (a reused pid is not blamed)."""
    proc = tmp_path / "proc"
    _proc(proc, 4100, "python3", "SLURM_JOB_ID=777 SLURM_PROCID=5 SLURM_LOCALID=1")
    _proc(proc, 4200, "bash", "SLURM_JOB_ID=778")  # pid 4200 was python3 when the XID fired
    context = SourceContext("c", "n1", sysfs=tmp_path, procfs=proc)
    source = _xid_source(
        tmp_path,
        [
            "NVRM: Xid (PCI:0000:18:00): 13, pid=4100, name=python3, Graphics Exception",
            "NVRM: Xid (PCI:0000:18:00): 13, pid=4200, name=python3, Graphics Exception",
            "NVRM: Xid (PCI:0000:18:00): 13, pid=4300, name=python3, Graphics Exception",
        ],
        context,
    )
    points = source.collect(1_800_000_000 * S)
    source.close()
    assert [(p.tags.get("job"), p.tags.get("rank")) for p in points] == [
        ("777", "5"),
        (None, None),
        (None, None),
    ]


def test_a_fatal_xid_finding_names_the_job_and_keeps_its_id(tmp_path):
    """The job goes into the finding's evidence and summary, not its subject: the NVML path and
    the kernel-log path may know the job differently, and must still de-duplicate."""
    line = "NVRM: Xid (PCI:0000:18:00.0): 79, pid='<unknown>', name=<unknown>, GPU has fallen off"
    found: dict[str, list[Finding]] = {}
    tagged: dict[str, str | None] = {}
    for label, history in (("known", {0: A}), ("unknown", {})):
        context = SourceContext("c", "n1", sysfs=tmp_path, procfs=tmp_path / label)
        context.inventory.gpus_by_pci["0000:18:00"] = (0, "GPU-0")
        context.inventory.jobs.saw(1_799_999_990 * S, history, {})
        found[label] = []
        context.emit_finding = found[label].append
        source = _xid_source(tmp_path, [line], context)
        tagged[label] = source.collect(1_800_000_000 * S)[0].tags.get("job")
        source.close()
    known, unknown = found["known"][0], found["unknown"][0]
    assert tagged == {"known": "81234", "unknown": None}
    assert known.evidence["job"] == "81234" and known.evidence["rank"] == "3"
    assert known.summary == "XID 79 on GPU 0 (job 81234 rank 3)"
    assert "job" not in unknown.evidence and unknown.summary == "XID 79 on GPU 0"
    assert known.id == unknown.id and "job" not in known.subject
