"""Faults the agent sees in a GPU's own fields: new uncorrectable ECC errors and a failed row
remap become ``gpu_event`` points and critical findings on the fast path, tagged with the job
the GPU had at the last look; the Grafana rules that mean the same meet the same policy.

NVML answers are the CONSTRUCTED 8x H100 recording with counters changed by the test between
cycles (SIMULATED faults); jobs come from a /proc tree the test writes."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.collector import sources
from gpuwarden.collector.nvml.recorded import RecordedBackend
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.core.finding import Finding, Severity
from tests.test_golden import GOLDEN

S = 10**9


class Faulty(RecordedBackend):
    """The recording, with GPU 6's volatile DBE counter and remap-failure flag set by the test."""

    def __init__(self) -> None:
        super().__init__(GOLDEN / "nvml-h100-8gpu" / "nvml.json")
        self.dbe = 0
        self.remap_failed = 0

    def call(self, device: int | None, name: str, *args: Any) -> Any:
        from gpuwarden.collector.sources.nvml.poll import GPU_FIELD_IDS

        answer = super().call(device, name, *args)
        if name == "nvmlDeviceGetFieldValues" and device == 6 and len(answer) > 1:
            answer = [list(a) for a in answer]
            for i, (fid, _scope) in enumerate(args[0]):
                if fid == GPU_FIELD_IDS["ecc_dbe_volatile_total"][0]:
                    answer[i] = [0, self.dbe]
                elif fid == GPU_FIELD_IDS["remapped_rows_failure_active"][0]:
                    answer[i] = [0, self.remap_failed]
        return answer


def test_new_dbes_and_a_failed_remap_are_events_and_fast_path_findings(tmp_path):
    proc = tmp_path / "proc" / "4106"
    proc.mkdir(parents=True)
    (proc / "environ").write_bytes(b"SLURM_JOB_ID=4242\0SLURM_PROCID=6\0")
    found: list[Finding] = []
    context = SourceContext("c", "n1", sysfs=tmp_path, procfs=tmp_path / "proc")
    context.emit_finding = found.append
    backend = Faulty()
    source = sources.create("nvml", context, {"backend_instance": backend, "events": "poll"})
    steps: list[list[str]] = []
    script = [(0, 0), (0, 0), (2, 0), (2, 0), (1, 0), (3, 1), (3, 1)]  # (dbe, remap failed)
    for step, (dbe, failed) in enumerate(script):
        backend.dbe, backend.remap_failed = dbe, failed
        points = source.collect(step * 10 * S)
        steps.append([p.tags["event"] for p in points if p.measurement == "gpu_event"])
    source.close()
    # step 2: two new DBEs; step 4: the counter went down (a driver reload): nothing;
    # step 5: two more and the remap failed; a lasting state is said once
    assert steps == [[], [], ["ecc_dbe"], [], [], ["ecc_dbe", "row_remap_failure"], []]
    assert [(f.kind, f.subject["gpu"], f.time_ns // S) for f in found] == [
        ("ecc_dbe", "6", 20),
        ("ecc_dbe", "6", 50),
        ("row_remap_failure", "6", 50),
    ]
    first = found[0]
    assert first.severity is Severity.CRITICAL and first.evidence["ecc_dbe_new"] == 2
    assert first.evidence["job"] == "4242" and "(job 4242 rank 6)" in first.summary


def test_the_first_cycle_only_learns(tmp_path):
    """An agent that starts on a GPU with old DBEs and a failed remap says nothing of them
    (the alert rules and the node's health gate still see the state)."""
    found: list[Finding] = []
    context = SourceContext("c", "n1", sysfs=tmp_path, procfs=tmp_path)
    context.emit_finding = found.append
    backend = Faulty()
    backend.dbe, backend.remap_failed = 7, 1
    source = sources.create("nvml", context, {"backend_instance": backend, "events": "poll"})
    events = [p for step in range(3) for p in source.collect(step * 10 * S)
              if p.measurement == "gpu_event"]  # fmt: skip
    source.close()
    assert events == [] and found == []


@pytest.mark.parametrize(
    ("uid", "policy"),
    [
        ("gw-fatal-xid", "fatal-gpu-event"),
        ("gw-fatal-sxid", "fatal-gpu-event"),
        ("gw-ecc-dbe", "fatal-gpu-event"),
        ("gw-row-remap-failure", "fatal-gpu-event"),
        ("gw-fabric-unregistered", "nvlink-fabric-unregistered"),
    ],
)
def test_an_alert_and_the_agents_own_finding_meet_the_same_policy(uid, policy):
    """Each Grafana rule that means what an agent finding means carries that finding's kind,
    so the default policy that acts on the agent's fast path acts on the page too."""
    from gpuwarden.dashboards.alerts import rule_specs
    from gpuwarden.dashboards.config import load_config
    from gpuwarden.remediation.policy import DEFAULT_POLICIES, first_match, load_policies

    spec = next(r for r in rule_specs(load_config(environ={})) if r.uid == uid)
    finding = Finding(spec.kind, {"cluster": "c", "node": "n1", "gpu": "0"}, Severity.CRITICAL, 0)
    matched = first_match(load_policies(DEFAULT_POLICIES), finding)
    assert matched is not None and matched.name == policy
