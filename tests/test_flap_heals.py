"""Issue 41, "flaps that heal return the node on their own": the whole path, from the port's
counters to the node back in service.

gpud's users report InfiniBand flaps that keep nodes drained until someone clears them. The
shipped policies only notify on a ``link_flap``; a site that cordons on it must get the node
back once the port has healed, with nobody's help. Here: the agent's real InfiniBand source
reads the golden ``ib-flap`` case's CONSTRUCTED sysfs tree (three link-downs in one window:
one ``link_flap`` warning), which goes, as the agent sends it, to the engine (a site policy
cordons the node) and to the agent's health gate; the port then stays quiet; after
``healthy_after_s`` the gate runs the node check (here: the infiniband probe's passing result)
and says ``node_healthy`` with the passing check; the engine's ``healthy-again`` policy puts
the node back (the cordon's outcome then waits for ``clean_window_s`` of clean running, to
be ``refuted``). Before this change, the gate had announced the node once at the start of
its stretch and a warning never started a new one: the node stayed out.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpuwarden.collector import sources
from gpuwarden.collector.check import PASS, Result, check_finding
from gpuwarden.collector.health import HealthGate
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.core.finding import Finding
from gpuwarden.remediation.audit import AuditLog, read_records
from gpuwarden.remediation.engine import Engine, EngineSettings
from gpuwarden.remediation.model import ActionKind
from gpuwarden.remediation.policy import DEFAULT_POLICIES, load_policies
from tests.remediation_util import RecordingAdapter, poll
from tests.test_golden import materialise

CASE = Path(__file__).parent / "golden" / "ib-flap"
S = 1_000_000_000
SITE_POLICY = {"name": "flap-cordon", "kinds": ["link_flap"], "actions": ["notify", "cordon"]}


def test_a_node_taken_out_for_a_flap_that_heals_comes_back_on_its_own(tmp_path: Path) -> None:
    sched = RecordingAdapter("slurm", {n: "gpu" for n in ("node-a", "node-b", "node-c")})
    audit = tmp_path / "audit.jsonl"
    engine = Engine(
        load_policies([SITE_POLICY, *DEFAULT_POLICIES]),
        {"slurm": sched, "webhook": RecordingAdapter("webhook")},
        AuditLog(audit),
        EngineSettings(dry_run=False, max_nodes_out=2, max_fraction_out=1.0),
    )
    verdicts: list[tuple[str, str]] = []

    def to_engine(finding: Finding) -> None:  # the agent's fast path
        verdicts.append((finding.kind, engine.submit(finding).verdict))

    gate = HealthGate(
        "golden", "node-a", to_engine, healthy_after_s=60,
        check=lambda t: check_finding("golden", "node-a", [Result("infiniband", PASS, "")], t),
    )  # fmt: skip

    def emit(finding: Finding) -> None:  # what the agent does with a source's finding
        gate.observe(finding)
        to_engine(finding)

    context = SourceContext("golden", "node-a", sysfs=tmp_path / "sys", procfs=tmp_path / "proc",
                            emit_finding=emit)  # fmt: skip
    ib = sources.create("infiniband", context, {"flap_count": 3, "flap_window_s": 60.0,
                                                "flap_recovery_s": 20.0})  # fmt: skip
    # the agent's clock: the cordon (step 9) is now, the checks after it a minute or two on
    t0 = time.time_ns() - 90 * S
    step = 0

    def cycle() -> None:
        nonlocal step
        now = t0 + step * 10 * S
        gate.cycle(now, ib.collect(now))
        for check in gate.checks:
            check.join(30)
        step += 1

    try:
        # the node has been healthy since its agent started, and said so once (not ours)
        materialise(CASE / "sysfs-0.csv", tmp_path)
        for _ in range(8):
            cycle()
        assert [v for k, v in verdicts if k == "node_healthy"] == ["not_ours"]
        # link_downed 1, then 3: one burst of three flaps, one link_flap, the node cordoned
        for name in ("sysfs-1.csv", "sysfs-2.csv"):
            materialise(CASE / name, tmp_path)
            cycle()
        assert ("link_flap", "act") in verdicts, verdicts
        assert engine.wait(30)
        assert "node-a" in sched.out  # the site's policy cordoned it
        # it flaps on within the same episode (no new finding): not healed yet
        port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
        (port / "counters/link_downed").write_text("4\n")
        cycle()
        (port / "state").write_text("4: ACTIVE\n")  # and comes back up
        (port / "phys_state").write_text("5: LinkUp\n")
        for _ in range(5):
            cycle()
        assert engine.wait(30)
        assert "node-a" in sched.out  # 60 s after the finding, but not after the last flap
        # then the port stays quiet: healthy_after_s later the check runs and the node is
        # announced with the passing check the engine asks for, and is back in service
        for _ in range(3):
            cycle()
        assert engine.wait(30)
        poll(lambda: "node-a" not in sched.out, 30, "node-a back in service")
    finally:
        ib.close()
    uncordons = [a for a in sched.calls if a.kind is ActionKind.UNCORDON]
    assert [a.node for a in uncordons] == ["node-a"]
    assert [v for k, v in verdicts if k == "node_healthy"][-1] == "act"
    # the cordon's outcome waits for the node to run clean for clean_window_s (then refuted:
    # the check passed within quick_pass_s of the removal); nothing confirms it meanwhile
    engine.outcomes.update()
    assert [r for r in read_records(audit) if r["event"] == "outcome"] == []
    engine.close()
