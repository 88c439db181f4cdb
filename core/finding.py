"""The ``Finding`` type: what analytics and the agent's event rules tell the remediation engine.

A finding says what was seen (``kind``), about what (``subject``), how bad (``severity``), how
sure (``confidence`` for detections, ``probability`` for predictions), the numbers behind it
(``evidence``) and when. Its ``id`` is stable: the same observation about the same subject in
the same time bucket always gets the same id, so the engine can de-duplicate findings that
arrive twice (a retry, two analysis hosts, the fast path and the slow path). The severity is
part of the id: a lesser finding (an ``info`` about the same GPU, posted first) can never take
the id of a critical one and make it a duplicate. ``digest`` covers the whole content, so that
a sender told "duplicate" can learn whether the engine holds *its* finding or another one.

Subject values are names (:mod:`core.names`): each is parsed into its key's type when the
finding is built, and a value that is not a name of its kind is a :class:`FindingNameError`
(the engine's endpoint answers 400). An empty value is allowed (it means "not known").

Findings cross from analytics to remediation as data (JSON), never as imports.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuwarden.core.errors import GpuwardenError
from gpuwarden.core.names import BadNameError, parse_subject

#: a finding's time bucket is at most a week (the agent's healthy_after_s makes the longest)
MAX_BUCKET_S = 7 * 86400
MAX_EVIDENCE_DEPTH = 32
"""Evidence nested deeper is refused (an attacker's 980 levels passed ``json.loads`` and then
broke ``json.dumps`` in the journal's writer, and its readers)."""
INT64 = 2**63
"""Integers (``time_ns``, evidence) must fit in 64 bits, as InfluxDB's and every JSON reader's
do: Python reads ``10**400`` from JSON as an int, and dividing it by ``1e9`` raised
``OverflowError`` in the engine's tick, on every restart after (the record was journaled)."""
MAX_KIND = 64
MAX_SOURCE = 128
MAX_SUMMARY = 4096
"""Characters of a finding's ``summary``: it is copied into every action's reason, so a
sender's 1 MB summary grew the engine's journal by 7 MB when acted on (found in review). A
finding that arrives over it is refused (:meth:`Finding.from_json`, the endpoint's 422); one
built here is cut to it (a hang on a large job lists many nodes)."""
MAX_EVIDENCE_BYTES = 16384
"""Evidence, as JSON: refused over it when it arrives, fitted when built here
(:func:`fit_evidence`: a 256-node job across a driver rollout lists every node per setting)."""
TRUNCATED = "evidence_truncated"
"""The evidence key :func:`fit_evidence` adds: each cut list's path and how many items it lost."""
SUBJECT_KEYS = ("cluster", "node", "gpu", "hca", "port", "switch", "job", "rank")


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class FindingError(GpuwardenError, ValueError):
    """A finding that breaks the contract; the message says which part."""


class FindingNameError(FindingError):
    """A subject value that is not a name of its kind (:mod:`core.names`)."""


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    subject: Mapping[str, str]
    severity: Severity
    time_ns: int
    evidence: Mapping[str, Any] = field(default_factory=dict)
    confidence: float | None = None
    probability: float | None = None
    summary: str = ""
    source: str = ""
    bucket_s: int = 300
    """Width of the time bucket that makes ``id`` stable across repeats of one observation."""
    _id: str = field(init=False, repr=False, compare=False)
    """``id``, computed once (the engine asks for it about 15 times a finding)."""

    def __post_init__(self) -> None:
        if not self.kind or not self.kind.replace("_", "").isalnum():
            raise FindingError(f"finding kind must be snake_case, got {self.kind[:80]!r}")
        for name, text, most in (
            ("kind", self.kind, MAX_KIND),
            ("source", self.source, MAX_SOURCE),
        ):
            if len(text) > most:
                raise FindingError(f"{name} is over {most} characters ({len(text)})")
        if len(self.summary) > MAX_SUMMARY:
            object.__setattr__(self, "summary", self.summary[: MAX_SUMMARY - 1] + "…")
        unknown = set(self.subject) - set(SUBJECT_KEYS)
        if unknown:
            raise FindingError(f"unknown subject keys {sorted(unknown)}; allowed {SUBJECT_KEYS}")
        if not self.subject:
            raise FindingError("a finding needs a subject (at least one of cluster/node/...)")
        try:
            object.__setattr__(self, "subject", parse_subject(self.subject))
        except BadNameError as exc:
            raise FindingNameError(str(exc)) from None
        for name, value in (("confidence", self.confidence), ("probability", self.probability)):
            if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise FindingError(f"{name} must be within [0, 1], got {value!r}")
        if not -INT64 <= self.time_ns < INT64:  # (stale, or from the future: the endpoint's)
            raise FindingError(f"time_ns must fit in 64 bits, got {str(self.time_ns)[:24]}")
        _check_evidence(self.evidence)
        if _json_size(self.evidence) > MAX_EVIDENCE_BYTES:
            object.__setattr__(self, "evidence", fit_evidence(self.evidence))
        if not 0 < self.bucket_s <= MAX_BUCKET_S:
            raise FindingError(
                f"bucket_s must be within 1 .. {MAX_BUCKET_S} s, got {self.bucket_s}"
            )
        object.__setattr__(self, "_id", self._compute_id())

    @property
    def id(self) -> str:
        return self._id

    def _compute_id(self) -> str:
        bucket = self.time_ns // (self.bucket_s * 1_000_000_000)
        # the bucket's width too: else a sender's own bucket_s (299) could claim the id a
        # later window of the usual one (300) will have, and make the real finding a duplicate
        key = [self.kind, sorted(self.subject.items()), bucket, str(self.severity), self.bucket_s]
        return hashlib.sha256(json.dumps(key, separators=(",", ":")).encode()).hexdigest()[:24]

    @property
    def digest(self) -> str:
        """A hash of everything the finding says (its JSON but the id): two findings with one
        id and one digest are the same finding sent twice."""
        content = {k: v for k, v in self.to_json().items() if k != "id"}
        text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "subject": dict(self.subject),
            "severity": str(self.severity),
            "time_ns": self.time_ns,
            "evidence": dict(self.evidence),
            "confidence": self.confidence,
            "probability": self.probability,
            "summary": self.summary,
            "source": self.source,
            "bucket_s": self.bucket_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """Parse and validate; a claimed ``id`` that does not match the content is refused, and
        so is a summary or evidence over its bound (a sender's text is refused, not cut)."""
        summary, evidence = data.get("summary", ""), data.get("evidence") or {}
        if isinstance(summary, str) and len(summary) > MAX_SUMMARY:
            raise FindingError(f"summary is over {MAX_SUMMARY} characters ({len(summary)})")
        if not isinstance(evidence, Mapping):  # (a list of pairs made a dict, then was cut)
            raise FindingError(f"evidence must be an object, got {type(evidence).__name__}")
        _check_evidence(evidence)  # (its depth first: json.dumps recurses)
        if (size := _json_size(evidence)) > MAX_EVIDENCE_BYTES:
            raise FindingError(f"evidence is over {MAX_EVIDENCE_BYTES} bytes as JSON ({size})")
        try:
            finding = cls(
                kind=str(data["kind"]),
                subject={str(k): str(v) for k, v in dict(data["subject"]).items()},
                severity=Severity(data["severity"]),
                time_ns=int(data["time_ns"]),
                evidence=dict(data.get("evidence") or {}),
                confidence=_opt_float(data.get("confidence")),
                probability=_opt_float(data.get("probability")),
                summary=str(data.get("summary", "")),
                source=str(data.get("source", "")),
                bucket_s=int(data.get("bucket_s", 300)),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            if isinstance(exc, FindingError):
                raise
            raise FindingError(f"malformed finding: {exc!r}") from exc
        claimed = data.get("id")
        if claimed is not None and claimed != finding.id:
            raise FindingError(f"finding id {claimed!r} does not match its content")
        return finding

    def to_point(self) -> tuple[dict[str, str], dict[str, object]]:
        """Tags and fields of the catalogue's ``finding`` measurement."""
        tags = {k: v for k, v in self.subject.items() if v != ""}
        tags.update(kind=self.kind, severity=str(self.severity))
        if self.source:
            tags["source"] = self.source
        fields: dict[str, object] = {
            "finding_id": self.id,
            "summary": self.summary,
            "evidence_json": json.dumps(self.evidence, sort_keys=True, default=str),
        }
        if self.probability is not None:
            fields["probability_ratio"] = self.probability
        if self.confidence is not None:
            fields["confidence_ratio"] = self.confidence
        return tags, fields


def _check_evidence(evidence: object) -> None:
    """Evidence is JSON-shaped data of bounded depth whose integers fit in 64 bits (the
    readers downstream divide them, compare them and write them to InfluxDB)."""
    stack: list[tuple[object, int]] = [(evidence, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            if not -INT64 <= value < INT64:
                raise FindingError(
                    f"evidence holds an integer beyond 64 bits: {str(value)[:24]}..."
                )
        elif isinstance(value, Mapping | list | tuple):
            if depth >= MAX_EVIDENCE_DEPTH:
                raise FindingError(f"evidence nested deeper than {MAX_EVIDENCE_DEPTH} levels")
            items = value.values() if isinstance(value, Mapping) else value
            stack.extend((v, depth + 1) for v in items)


def _json_size(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def fit_evidence(evidence: Mapping[str, Any]) -> dict[str, Any]:
    """``evidence`` within :data:`MAX_EVIDENCE_BYTES`: its longest list (of plain values first)
    halved until it fits, each cut counted under :data:`TRUNCATED` (``{"fields.a.0.nodes": 120}``);
    where no list is left to cut, only its short top-level values are kept. The finding itself
    is never dropped for its size (a hang on a 512-node job is still a hang)."""
    fitted: dict[str, Any] = json.loads(json.dumps(dict(evidence), default=str))
    cut: dict[str, int] = {}

    def noted() -> dict[str, Any]:
        return {**fitted, TRUNCATED: {k[:60]: n for k, n in list(cut.items())[:8]}}

    while _json_size(noted()) > MAX_EVIDENCE_BYTES:
        longest = _longest_list(fitted)
        if longest is None:
            break
        path, items = longest
        keep = len(items) // 2
        cut[path] = cut.get(path, 0) + len(items) - keep
        del items[keep:]
    if _json_size(noted()) > MAX_EVIDENCE_BYTES:  # long values no list holds
        fitted = {k: v for k, v in fitted.items() if _json_size(v) <= 256}
        cut["*"] = 1
        while fitted and _json_size(noted()) > MAX_EVIDENCE_BYTES:
            fitted.popitem()
    return noted()


def _longest_list(value: object) -> tuple[str, list[Any]] | None:
    """The list of two or more items in ``value`` that is longest as JSON, and where it is
    (dotted keys): a list of plain values first (a list of nodes, not the list of settings
    that holds them), else any."""
    best: dict[bool, tuple[int, str, list[Any]]] = {}
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, list):
            plain = not any(isinstance(x, list | dict) for x in v)
            size = _json_size(v)
            if len(v) > 1 and (plain not in best or size > best[plain][0]):
                best[plain] = (size, where, v)
            stack.extend((f"{where}.{i}".lstrip("."), x) for i, x in enumerate(v))
        elif isinstance(v, dict):
            stack.extend((f"{where}.{k}".lstrip("."), x) for k, x in v.items())
    found = best.get(True) or best.get(False)
    return None if found is None else (found[1][:120], found[2])


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
