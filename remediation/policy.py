"""Declarative policies: which findings lead to which ladder of actions.

A policy matches on the finding's kind, a minimum severity, a minimum probability (or
confidence), required subject keys and exact evidence values; the first policy that matches
decides. Its ``actions`` are a ladder, done in order: ``notify → checkpoint → drain →
requeue`` for a node about to fail. In TOML (``config/remediation.sample.toml``)::

    [[policy]]
    name = "fatal-xid"
    kinds = ["gpu_xid"]
    min_severity = "critical"
    requires = ["node"]
    actions = ["notify", "checkpoint", "drain", "requeue"]

A policy can be limited to a group of nodes (``nodes``): by name pattern (shell-style),
Slurm partition, Slurm feature or Kubernetes label. Every key given must match; a list matches
when any of its entries does. Put such a policy before the general one it refines::

    [[policy]]
    name = "fatal-gpu-event-h100"
    kinds = ["gpu_xid"]
    min_severity = "critical"
    nodes = { partition = ["h100"], feature = ["nvswitch"], name = ["gpu-h100-*"],
              label = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3" } }
    actions = ["notify", "drain", "requeue"]

Partitions, features and labels come from the node adapter (:class:`~remediation.model.NodeFacts`,
cached by the engine); when they cannot be read, a policy that needs them does not match (the
next one decides) and the engine logs why.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.core.finding import SUBJECT_KEYS, Finding, Severity
from gpuwarden.remediation.errors import RemediationError
from gpuwarden.remediation.model import ActionKind, NodeFacts

SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class PolicyError(RemediationError, ValueError):
    """A policy that cannot work; the message names it and the setting."""


@dataclass(frozen=True)
class NodeSelector:
    """Which nodes a policy applies to (every key given must match; none given: all)."""

    name: tuple[str, ...] = ()
    partition: tuple[str, ...] = ()
    feature: tuple[str, ...] = ()
    label: Mapping[str, str] = field(default_factory=dict)

    @property
    def needs_facts(self) -> bool:
        return bool(self.partition or self.feature or self.label)

    def matches(self, node: str, facts: NodeFacts | None) -> bool:
        if self.name and not any(fnmatch.fnmatchcase(node, pat) for pat in self.name):
            return False
        if not self.needs_facts:
            return True
        if facts is None:
            return False
        if self.partition and not set(self.partition) & facts.partitions:
            return False
        if self.feature and not set(self.feature) & facts.features:
            return False
        return all(facts.labels.get(k) == v for k, v in self.label.items())

    @classmethod
    def from_mapping(cls, policy: str, data: Mapping[str, Any]) -> NodeSelector:
        unknown = set(data) - {"name", "partition", "feature", "label"}
        if unknown:
            raise PolicyError(f"policy {policy!r}: nodes has unknown keys {sorted(unknown)}")

        def strings(key: str) -> tuple[str, ...]:
            value = data.get(key, ())
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise PolicyError(f"policy {policy!r}: nodes.{key} must be a list of strings")
            return tuple(value)

        label = data.get("label", {})
        if not isinstance(label, Mapping) or not all(isinstance(v, str) for v in label.values()):
            raise PolicyError(f"policy {policy!r}: nodes.label must map label names to strings")
        return cls(strings("name"), strings("partition"), strings("feature"), dict(label))

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in ("name", "partition", "feature"):
            if getattr(self, key):
                out[key] = list(getattr(self, key))
        if self.label:
            out["label"] = dict(self.label)
        return out


@dataclass(frozen=True)
class Policy:
    name: str
    kinds: tuple[str, ...]
    actions: tuple[ActionKind, ...]
    min_severity: Severity = Severity.INFO
    min_probability: float = 0.0
    requires: tuple[str, ...] = ("node",)
    evidence: Mapping[str, Any] = field(default_factory=dict)
    nodes: NodeSelector = field(default_factory=NodeSelector)
    min_precision: float = 0.0
    """Below this precision (confirmed / (confirmed + refuted) outcomes over the engine's
    ``[outcomes] window_s``) the policy's plans are cut down to a notification until it
    recovers (:mod:`remediation.outcomes`); 0: never."""
    min_samples: int = 10
    """How many decided outcomes (confirmed or refuted) ``min_precision`` needs before it
    judges the policy."""

    def matches(
        self, finding: Finding, facts: Callable[[str], NodeFacts | None] | None = None
    ) -> bool:
        """Whether ``finding`` meets this policy; ``facts`` gives a node's partitions,
        features and labels (asked only when the policy's ``nodes`` needs them)."""
        if not self._matches(finding):
            return False
        if self.nodes == NodeSelector():
            return True
        node = finding.subject.get("node", "")
        if not node:
            return False
        known = facts(node) if self.nodes.needs_facts and facts is not None else None
        return self.nodes.matches(node, known)

    def _matches(self, finding: Finding) -> bool:
        if finding.kind not in self.kinds:
            return False
        if SEVERITY_RANK[finding.severity] < SEVERITY_RANK[self.min_severity]:
            return False
        sureness = finding.probability if finding.probability is not None else finding.confidence
        if self.min_probability > 0 and (sureness is None or sureness < self.min_probability):
            return False
        if any(not finding.subject.get(key) for key in self.requires):
            return False
        return all(finding.evidence.get(k) == v for k, v in self.evidence.items())

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Policy:
        name = str(data.get("name", ""))
        if not name:
            raise PolicyError("every [[policy]] needs a name")
        known = {"name", "kinds", "actions", "min_severity", "min_probability", "requires",
                 "min_precision", "min_samples"}  # fmt: skip
        unknown = set(data) - known - {"evidence", "nodes"}
        if unknown:
            raise PolicyError(f"policy {name!r}: unknown settings {sorted(unknown)}")
        try:
            actions = tuple(ActionKind(a) for a in data.get("actions", ()))
            severity = Severity(data.get("min_severity", "info"))
        except ValueError as exc:
            raise PolicyError(f"policy {name!r}: {exc}") from None
        kinds = tuple(str(k) for k in data.get("kinds", ()))
        if not kinds or not actions:
            raise PolicyError(f"policy {name!r}: needs at least one kind and one action")
        requires = tuple(str(k) for k in data.get("requires", ("node",)))
        if set(requires) - set(SUBJECT_KEYS):
            raise PolicyError(f"policy {name!r}: requires must be among {SUBJECT_KEYS}")
        probability = float(data.get("min_probability", 0.0))
        if not 0.0 <= probability <= 1.0:
            raise PolicyError(f"policy {name!r}: min_probability must be within [0, 1]")
        min_precision = float(data.get("min_precision", 0.0))
        if not 0.0 <= min_precision <= 1.0:
            raise PolicyError(f"policy {name!r}: min_precision must be within [0, 1]")
        min_samples = int(data.get("min_samples", 10))
        if min_samples < 1:
            raise PolicyError(f"policy {name!r}: min_samples must be at least 1")
        return cls(
            name=name,
            kinds=kinds,
            actions=actions,
            min_severity=severity,
            min_probability=probability,
            requires=requires,
            evidence=dict(data.get("evidence", {})),
            nodes=NodeSelector.from_mapping(name, data.get("nodes", {})),
            min_precision=min_precision,
            min_samples=min_samples,
        )

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kinds": list(self.kinds),
            "min_severity": str(self.min_severity),
            "min_probability": self.min_probability,
            "requires": list(self.requires),
            "actions": [str(a) for a in self.actions],
        }
        if self.evidence:
            out["evidence"] = dict(self.evidence)
        if self.nodes != NodeSelector():
            out["nodes"] = self.nodes.to_mapping()
        if self.min_precision > 0:
            out["min_precision"] = self.min_precision
            out["min_samples"] = self.min_samples
        return out


NODE_LADDER = ("notify", "checkpoint", "drain", "requeue")
#: after a fatal event the job on the node has usually died with it (an XID 79 or a failed row
#: remap ends the CUDA processes there): drain first, so nothing new lands on the node, then
#: requeue what still runs. Asking a dead job to checkpoint would only hold the drain back
#: for checkpoint_timeout_s.
FATAL_LADDER = ("notify", "drain", "requeue")

# Shipped defaults (config/remediation.sample.toml repeats them; a test keeps the two equal).
DEFAULT_POLICIES: tuple[dict[str, Any], ...] = (
    {
        "name": "fatal-gpu-event",
        "kinds": [
            "gpu_xid",
            "gpu_lost",
            "gpu_missing",
            "nvswitch_sxid",
            "ecc_dbe",
            "row_remap_failure",
        ],
        "min_severity": "critical",
        "actions": list(FATAL_LADDER),
    },
    # The scorer emits a failure_risk finding only when a GPU's risk crosses the model's
    # operating threshold (chosen on training data for >= [predictor] min_precision alerts).
    # Its probability is calibrated -- "fails within the horizon" is rare, so even a sure
    # alert reads a few percent -- so gating on it again here would only silence the model.
    {
        "name": "predicted-gpu-failure",
        "kinds": ["failure_risk"],
        "min_probability": 0.0,
        "actions": list(NODE_LADDER),
    },
    # A GPU not registered with the NVLink fabric cannot start CUDA programs: no new work on
    # the node until Fabric Manager registers it (the operator uncordons; its running work,
    # if any, is left alone)
    {
        "name": "nvlink-fabric-unregistered",
        "kinds": ["fabric_unregistered"],
        "min_severity": "critical",
        "actions": ["notify", "cordon"],
    },
    # The node check failed (gpuwarden check --report, Slurm's HealthCheckProgram, or the
    # agent's check before it calls a node healthy): no work on a node that fails it
    {
        "name": "node-check-failed",
        "kinds": ["node_check_failed"],
        "min_severity": "critical",
        "actions": list(FATAL_LADDER),
    },
    # The host under the GPUs is failing (an uncorrected memory error, an NVMe device gone, a
    # CPU stuck in the kernel): no new work until someone looks; what runs is left alone
    {
        "name": "host-failing",
        "kinds": ["memory_ue", "nvme_error", "soft_lockup"],
        "min_severity": "critical",
        "actions": ["notify", "cordon"],
    },
    # OS and storage trouble that may be passing (a slow NFS server, Lustre reconnecting, a hung
    # task, an OOM kill, corrected memory errors, a flapping link): tell people
    {
        "name": "host-warning",
        "kinds": [
            *("nfs_not_responding", "lustre_error", "hung_task", "tasks_blocked", "oom_kill"),
            *("memory_ce", "nvme_error", "link_flap"),
        ],
        "min_severity": "warning",
        "actions": ["notify"],
    },
    # One application XID (13, 31, 43, 45) on most of one job's nodes at once: the job
    # crashed or was killed, its nodes are fine. Tell its owner (the notification carries the
    # job: route it by the job label); no node is taken out
    {
        "name": "job-app-fault",
        "kinds": ["job_app_fault"],
        "requires": ["job"],
        "actions": ["notify"],
    },
    # The same application XID on one GPU in several different jobs: the GPU (the lemon rule
    # for application codes). No new work on the node until someone looks; what runs stays
    {
        "name": "gpu-app-xid-repeats",
        "kinds": ["gpu_app_xid_repeats"],
        "min_severity": "warning",
        # notify only: the jobs it counts are job ids, which one user can multiply (three
        # small jobs pinned to a node) to have an innocent node taken out; add "cordon" where
        # jobs are attested (Slurm's cgroups) and few users share a node
        "actions": ["notify"],
    },
    # A hung job: no step for longer than its own patience, its GPUs still held. When its GPUs
    # spin in a collective and one node holds every rank that is behind or idle, take that
    # node out and requeue the job (a hung job cannot checkpoint); otherwise tell people.
    {
        "name": "job-hang-culprit",
        "kinds": ["job_hang"],
        "min_severity": "critical",
        "requires": ["node", "job"],
        "actions": ["notify", "drain", "requeue"],
    },
    # a job whose processes are gone, and one node to blame: a hardware finding on it around
    # the stop, or its ranks went silent first. Take it out and requeue the job, so that the
    # restart does not land on it again (the job is usually down already: no checkpoint)
    {
        "name": "job-stopped-culprit",
        "kinds": ["job_stopped"],
        "min_severity": "critical",
        "requires": ["node", "job"],
        "actions": ["notify", "drain", "requeue"],
    },
    {
        "name": "job-hang",
        "kinds": ["job_hang"],
        "requires": ["job"],
        "actions": ["notify"],
    },
    {
        "name": "slow-gpu",
        "kinds": ["straggler"],
        "evidence": {"cause": "gpu"},
        "requires": ["job"],
        "actions": ["notify"],
    },
    {
        "name": "slow-pcie-link",
        "kinds": ["straggler"],
        "evidence": {"cause": "pcie"},
        "requires": ["job"],
        "actions": ["notify"],
    },
    # every GPU of a node below its maximum clock under a power brake or hardware slowdown
    {
        "name": "slow-node-power",
        "kinds": ["straggler"],
        "evidence": {"cause": "power"},
        "requires": ["job"],
        "actions": ["notify"],
    },
    # A GPU set up unlike its fleet (driver, VBIOS, ECC, persistence, MIG) or waiting for a
    # reset: someone has to look (a rollout in progress is not a fault), so tell, do not act
    {
        "name": "gpu-config-drift",
        "kinds": ["config_drift"],
        "actions": ["notify"],
    },
    # A job on GPUs set up unlike each other that no config_drift finding explains (no clear
    # fleet setting: a rollout the job straddles); info-level mixes are the drifted nodes'
    {
        "name": "job-config-mixed",
        "kinds": ["job_config_mixed"],
        "min_severity": "warning",
        "requires": ["job"],
        "actions": ["notify"],
    },
    # A job whose MFU, counted from the shape it reported, and its GPUs' own tensor-core
    # activity disagree: its reported shape (or GPU model) is likely wrong; tell its owners
    {
        "name": "mfu-mismatch",
        "kinds": ["mfu_mismatch"],
        "requires": ["job"],
        "actions": ["notify"],
    },
    # a node whose agent stopped reporting: its GPUs are unwatched (the scheduler notices a
    # dead node by itself, not a dead agent); someone has to look
    {
        "name": "node-silent",
        "kinds": ["node_silent"],
        "actions": ["notify"],
    },
    {
        "name": "fabric",
        "kinds": ["link_congested", "link_down"],
        "requires": [],
        "actions": ["notify"],
    },
    # analytics' checkpoint advice: ask the job to checkpoint at the interval that minimises
    # its expected waste; a job whose hook does not take interval requests times out, and the
    # notification has told people
    {
        "name": "checkpoint-cadence",
        "kinds": ["checkpoint_advice"],
        "requires": ["job"],
        "actions": ["notify", "checkpoint_interval"],
    },
    {
        "name": "healthy-again",
        "kinds": ["node_healthy"],
        "actions": ["uncordon"],
    },
    # the engine's own finding when a prediction's hold on a node ends with no fault
    # (remediation.holds): tell people, and return the node through the return guards (with
    # return_requires = "check" it waits for a passing check newer than the hold's end)
    {
        "name": "prediction-expired",
        "kinds": ["prediction_expired"],
        "actions": ["notify", "uncordon"],
    },
)


def load_policies(data: Sequence[Mapping[str, Any]]) -> list[Policy]:
    policies = [Policy.from_mapping(p) for p in data]
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyError(f"policy names must be unique, got {names}")
    return policies


def first_match(
    policies: Sequence[Policy],
    finding: Finding,
    facts: Callable[[str], NodeFacts | None] | None = None,
) -> Policy | None:
    return next((p for p in policies if p.matches(finding, facts)), None)
