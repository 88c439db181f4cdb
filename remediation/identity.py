"""Who may move a node: the engine's identities and their scopes (issue 38).

Each sender to the engine is one identity, with a key of its own, and the engine acts only
within that identity's scope. Identities are ``[[identity]]`` tables, in the engine's
configuration or in the file ``[engine] identities_file`` names::

    [[identity]]
    name = "alice"                  # sent as X-Gpuwarden-Identity; the audit records it as 'by'
    kind = "operator"               # agent | analytics | alerts | operator
    secret_file = "/etc/gpuwarden/keys/alice"   # its key (never the key itself in a setting)

==============  ============================================================================
kind            scope
==============  ============================================================================
``agent``       findings whose subject node is its ``node`` (and only such findings), among
                them the evidence that returns that node to service (``node_healthy``);
                never the analyze service's kinds (:data:`ANALYTICS_KINDS`: a checkpoint
                advice, a straggler, a hang are a fleet's view, not one node's).
                ``node = "*"``: one identity per node, ``<name>/<node>``, each signing with
                its own key, derived from ``secret_file`` (:func:`core.signing.agent_key`,
                ``gpuwarden remediate agent-key NODE`` prints it): the engine keeps one secret
                and still tells every node from the others
``analytics``   findings of the kinds ``kinds`` (default: those ``gpuwarden analyze`` sends,
                :data:`ANALYTICS_KINDS`)
``alerts``      findings and Grafana/Alertmanager alerts of the kinds ``kinds`` only (required).
                It may sign, or, where ``[engine] alerts_unsigned`` allows it, send its key as
                ``Authorization: Bearer <key>`` to ``/v1/alerts/*`` (Grafana and Alertmanager
                cannot sign)
``operator``    approve, undo (``force`` too) and list pending plans; findings of any kind
                but one that returns a node to service (an operator uses ``undo`` for that)
==============  ============================================================================

A finding *returns a node to service* when its kind is ``node_healthy`` or any policy answers
that kind with ``uncordon``; only the node's own agent may send one. ``cert_names`` (default:
the name, and an agent's node): with mutual TLS, the client certificate's CN or a DNS SAN must
be one of them.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.core.config import ConfigError, read_secret
from gpuwarden.core.names import BadNameError, NodeName
from gpuwarden.core.signing import agent_key

KINDS = ("agent", "analytics", "alerts", "operator")
#: the finding kinds ``gpuwarden analyze`` sends (analytics/emit.py, analytics/predict)
ANALYTICS_KINDS = (
    "checkpoint_advice",
    "config_drift",
    "failure_risk",
    "gpu_app_xid_repeats",
    "job_app_fault",
    "job_config_mixed",
    "job_hang",
    "job_stopped",
    "link_congested",
    "link_down",
    "load_imbalance",
    "mfu_mismatch",
    "node_silent",
    "pipeline_imbalance",
    "straggler",
)
RETURN_KINDS = frozenset({"node_healthy"})
#: the engine's own findings: no sender may send one (a forged ``prediction_expired`` would
#: offer a held node back, :mod:`remediation.holds`)
ENGINE_KINDS = frozenset({"prediction_expired"})
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_KEYS = {"name", "kind", "secret_file", "node", "kinds", "cert_names"}


@dataclass(frozen=True)
class Identity:
    """One configured identity (its key stays in its file until the engine starts)."""

    name: str
    kind: str
    secret_file: str
    node: str = ""
    kinds: tuple[str, ...] = ()
    cert_names: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> Identity:
        unknown = set(data) - _KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
        name, kind = str(data.get("name", "")), str(data.get("kind", ""))
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{where}: name {name!r} must be letters, digits, '.', '_', '-'")
        where = f"{where} ({name})"
        if kind not in KINDS:
            raise ConfigError(f"{where}: kind {kind!r}; one of {list(KINDS)}")
        secret_file = str(data.get("secret_file", ""))
        if not secret_file:
            raise ConfigError(f"{where}: secret_file is required (the file that holds its key)")
        node = str(data.get("node", ""))
        if kind == "agent":
            if not node:
                raise ConfigError(f"{where}: an agent needs node (its own, or '*' for a family)")
            if node != "*":
                try:
                    NodeName(node)
                except BadNameError as exc:
                    raise ConfigError(f"{where}: {exc}") from None
        elif node:
            raise ConfigError(f"{where}: only an agent speaks for a node")
        kinds = _strings(data.get("kinds", []), f"{where}: kinds")
        if kind == "analytics" and not kinds:
            kinds = ANALYTICS_KINDS
        if kind == "alerts" and not kinds:
            raise ConfigError(
                f"{where}: an alert source needs kinds (the finding kinds it may send)"
            )
        if kind in ("agent", "operator") and kinds:
            raise ConfigError(f"{where}: kinds limits analytics and alerts identities only")
        cert_names = _strings(data.get("cert_names", []), f"{where}: cert_names")
        return cls(name, kind, secret_file, node, kinds, cert_names)


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{what} must be a list of strings")
    return tuple(value)


def load_identities(tables: Iterable[Any], where: str) -> tuple[Identity, ...]:
    """``[[identity]]`` tables as identities; names must be unique."""
    out: list[Identity] = []
    for i, table in enumerate(tables):
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: identity #{i + 1} is not a table")
        out.append(Identity.from_mapping(table, f"{where}: identity #{i + 1}"))
    names = [i.name for i in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: identity names must be unique, got {names}")
    return tuple(out)


@dataclass(frozen=True)
class Principal:
    """Who a request comes from, once authenticated: an identity (a family's member named
    ``<family>/<node>``), or, with no identities configured, the one shared credential."""

    name: str
    kind: str  # an identity kind, or "shared" (legacy: every scope) or "monitor" (reads)
    node: str = ""
    kinds: frozenset[str] | None = None  # None: any kind
    cert_names: frozenset[str] = frozenset()

    def may(self, route: str) -> bool:
        """May this principal use ``route`` (findings, alerts, operator, read, metrics)?"""
        if self.kind == "shared":
            return True
        allowed = {
            "agent": {"findings", "read", "metrics"},
            "analytics": {"findings", "read", "metrics"},
            "alerts": {"findings", "alerts", "read", "metrics"},
            "operator": {"findings", "operator", "read", "metrics"},
            "monitor": {"read", "metrics"},
        }
        return route in allowed.get(self.kind, set())

    def refuses(self, kind: str, node: str, returns_node: bool) -> str:
        """Why this principal may not send a finding of ``kind`` about ``node`` ("" if it may);
        ``returns_node``: the finding would put its node back in service."""
        if kind in ENGINE_KINDS:
            return f"{kind} is the engine's own finding: no sender may send it"
        if self.kind == "shared":
            return ""
        if returns_node and not (self.kind == "agent" and node and node == self.node):
            return (
                f"a {kind} finding returns a node to service: only the node's own agent may "
                f"send it, and {self.name} is not {node or 'a node'}'s agent"
            )
        if self.kind == "agent" and node != self.node:
            return f"agent {self.name} speaks for node {self.node} only, not {node or '(none)'}"
        if self.kind == "agent" and kind in ANALYTICS_KINDS:
            # a node knows its own hardware, not a job's cadence nor who else is slow: a
            # checkpoint_advice from it would set another node's job's interval
            return f"agent {self.name} may not send {kind}: the analyze service's kind"
        if self.kinds is not None and kind not in self.kinds:
            return f"{self.name} may send the kinds {sorted(self.kinds)} only, not {kind}"
        return ""


class Keyring:
    """The identities with their keys, read from their files (at start)."""

    def __init__(self, identities: Sequence[Identity]) -> None:
        self.identities = {i.name: i for i in identities}
        self._keys: dict[str, bytes] = {}
        for i in identities:
            text = read_secret(i.secret_file)
            if not text:
                raise ConfigError(f"identity {i.name}: secret file {i.secret_file} is empty")
            self._keys[i.name] = text.encode()
        owners: dict[bytes, str] = {}
        for name, key in self._keys.items():
            if key in owners:  # whoever holds it could act as either
                raise ConfigError(f"identities {owners[key]} and {name} share one key")
            owners[key] = name

    def __bool__(self) -> bool:
        return bool(self.identities)

    def lookup(self, claimed: str) -> tuple[Principal, bytes] | None:
        """The principal ``claimed`` names and the key it signs with, or None."""
        i = self.identities.get(claimed)
        if i is not None and i.node != "*":
            return self._principal(i, i.node, i.name), self._keys[i.name]
        family, _, node = claimed.partition("/")
        i = self.identities.get(family)
        if i is None or i.node != "*" or not node:
            return None
        try:
            node = NodeName(node)
        except BadNameError:
            return None
        return self._principal(i, node, claimed), agent_key(self._keys[i.name], node)

    def bearer(self, token: bytes) -> Principal | None:
        """The alert source whose key is ``token`` (compared in constant time with each)."""
        found = None
        for name, key in self._keys.items():
            i = self.identities[name]
            if hmac.compare_digest(token, key) and i.kind == "alerts":
                found = self._principal(i, "", name)
        return found

    @staticmethod
    def _principal(i: Identity, node: str, name: str) -> Principal:
        certs = set(i.cert_names) or {name, *([node] if node else [])}
        kinds = frozenset(i.kinds) if i.kinds else None
        return Principal(name, i.kind, node, kinds, frozenset(certs))
