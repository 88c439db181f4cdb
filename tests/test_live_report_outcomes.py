"""Issue 41, must-show 4: the live loop's report gives each cordon and drain its outcome
(confirmed, refuted, unknown, or pending with what the audit log shows so far), with the
evidence. The audit records are CONSTRUCTED in the engine's shapes, written by the real
``AuditLog`` and read back by ``read_records`` as the live loop reads them; the live loop
itself is not run here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from demo.live import ArmResult
from demo.live_report import action_outcomes, outcome_lines
from gpuwarden.remediation.audit import AuditLog, read_records

T0 = 1_790_000_000.0


def constructed(path: Path) -> list[dict[str, Any]]:
    log = AuditLog(path)

    def finding(t: float, fid: str, kind: str, node: str, **evidence: Any) -> None:
        log.append("finding", T0 + t, finding_id=fid, kind=kind, source="agent",
                   subject={"cluster": "twin", "node": node}, evidence=evidence)  # fmt: skip

    def plan(t: float, fid: str, policy: str, node: str, *kinds: str) -> None:
        log.append("decision", T0 + t, finding_id=fid, verdict="act", policy=policy,
                   actions=list(kinds), node=node, why="",
                   plan=[{"action_id": f"{fid}-{k}", "action": k, "node": node,
                          "finding_id": fid} for k in kinds])  # fmt: skip

    def act(
        t: float, fid: str, kind: str, node: str, outcome: str = "ok", dry: bool = False
    ) -> None:
        log.append("action", T0 + t, action_id=f"{fid}-{kind}", action=kind, adapter="slurm",
                   node=node, cluster="twin", finding_id=fid, dry_run=dry, outcome=outcome,
                   message="")  # fmt: skip

    # n1: drained for an XID 79, then fails its check: confirmed
    finding(10, "f1", "gpu_xid", "n1", xid=79)
    plan(10, "f1", "fatal-gpu-event", "n1", "notify", "drain", "requeue")
    act(10.2, "f1", "notify", "n1")
    act(10.5, "f1", "drain", "n1")
    finding(40, "c1", "node_check_failed", "n1")
    log.append("outcome", T0 + 40.1, plan_id="f1", finding_id="f1", action_ids=["f1-drain"],
               policy="fatal-gpu-event", kind="gpu_xid", node="n1", verdict="confirmed",
               evidence={"why": "n1 failed its check", "finding": "c1"},
               removed_t=T0 + 10.5)  # fmt: skip
    # n2: cordoned, an operator says it was a false alarm: refuted
    finding(20, "f2", "fabric_unregistered", "n2")
    plan(20, "f2", "nvlink-fabric-unregistered", "n2", "notify", "cordon")
    act(20.3, "f2", "cordon", "n2")
    log.append("undo", T0 + 50, finding_id="u2", node="n2", by="alice", reason="false_alarm")
    log.append("outcome", T0 + 50.1, plan_id="f2", finding_id="f2", action_ids=["f2-cordon"],
               policy="nvlink-fabric-unregistered", kind="fabric_unregistered", node="n2",
               verdict="refuted", evidence={"by": "alice", "why": "operator alice undid it: "
                                             "false_alarm"})  # fmt: skip
    # n3: drained, passed its check and returned: no verdict yet (its windows run on)
    finding(30, "f3", "gpu_xid", "n3", xid=48)
    plan(30, "f3", "fatal-gpu-event", "n3", "notify", "drain", "requeue")
    act(30.4, "f3", "drain", "n3")
    # the agent sends f3 again (a retry): the engine records a duplicate decision, no policy
    # (the live runs of seeds 5201-5203 printed "(, gpu_xid)": the duplicate hid the policy)
    log.append("decision", T0 + 31, finding_id="f3", verdict="duplicate", policy="",
               actions=[], node="n3", why="seen")  # fmt: skip
    finding(60, "h3", "node_healthy", "n3", check="pass", checked_ns=int((T0 + 59) * 1e9))
    act(61, "h3", "uncordon", "n3")
    # n4: drained long ago, never returned: unknown
    finding(5, "f4", "job_hang", "n4")
    plan(5, "f4", "job-hang-culprit", "n4", "notify", "drain", "requeue")
    act(5.5, "f4", "drain", "n4")
    log.append("outcome", T0 + 70, plan_id="f4", finding_id="f4", action_ids=["f4-drain"],
               policy="job-hang-culprit", kind="job_hang", node="n4", verdict="unknown",
               evidence={"why": "not returned, and no check or operator said why"})  # fmt: skip
    # not removals: a dry run, a failed drain, a notification
    finding(80, "f5", "gpu_xid", "n5", xid=79)
    plan(80, "f5", "fatal-gpu-event", "n5", "notify", "drain")
    act(80.1, "f5", "drain", "n5", dry=True)
    act(80.2, "f5", "drain", "n6", outcome="failed")
    return list(read_records(path))


def test_each_removal_has_its_outcome_and_evidence(tmp_path: Path) -> None:
    got = action_outcomes(constructed(tmp_path / "audit.jsonl"), T0)
    assert [(o.action, o.node, o.policy, o.kind, o.verdict) for o in got] == [
        ("drain", "n1", "fatal-gpu-event", "gpu_xid", "confirmed"),
        ("cordon", "n2", "nvlink-fabric-unregistered", "fabric_unregistered", "refuted"),
        ("drain", "n3", "fatal-gpu-event", "gpu_xid", "pending"),
        ("drain", "n4", "job-hang-culprit", "job_hang", "unknown"),
    ]  # in the audit log's order; no dry run, no failed drain, no notification
    by_node = {o.node: o for o in got}
    assert by_node["n1"].verdict == "confirmed" and "failed its check" in by_node["n1"].evidence
    assert by_node["n2"].verdict == "refuted" and "false_alarm" in by_node["n2"].evidence
    assert by_node["n4"].verdict == "unknown" and "not returned" in by_node["n4"].evidence
    pending = by_node["n3"]
    assert (pending.verdict, pending.kind) == ("pending", "gpu_xid")
    assert pending.evidence == "no verdict yet; passed its check at 60.0 s; returned at 61.0 s"
    assert by_node["n1"].line(T0) == (
        "drain n1 at 10.5 s (fatal-gpu-event, gpu_xid): confirmed: n1 failed its check finding c1"
    )


def test_the_report_prints_a_line_per_removal(tmp_path: Path) -> None:
    audit = constructed(tmp_path / "audit.jsonl")
    arm = cast(ArmResult, SimpleNamespace(audit=audit, started_at=T0))
    lines = outcome_lines(arm)
    assert len(lines) == 4
    assert lines[0].startswith("  outcomes of cordons and drains  drain n1 at 10.5 s")
    assert any(": refuted: " in line and "n2" in line for line in lines)
    empty = cast(ArmResult, SimpleNamespace(audit=[], started_at=T0))
    assert outcome_lines(empty) == ["  outcomes of cordons and drains  none taken"]
