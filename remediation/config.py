"""The engine's configuration: ``config/remediation.sample.toml`` shows every setting.

Sections: ``[engine]`` (endpoint, audit log, which adapter does what, approval), ``[guards]``,
``[outcomes]`` (each removal's outcome and each policy's precision: :mod:`remediation.outcomes`),
``[lease]`` (a standby engine: :mod:`remediation.lease`),
one section per adapter (its constructor's keyword arguments and defaults, so the two cannot
drift apart), ``[influxdb]`` (where ``remediation_action`` and ``remediation_outcome`` events
go; empty url = none) and
any number of ``[[policy]]`` tables (none given = the shipped :data:`DEFAULT_POLICIES`) and of
``[[identity]]`` tables (here or in ``[engine] identities_file``; :mod:`remediation.identity`).
Environment variables ``GPUWARDEN_<SECTION>_<KEY>`` override single settings.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.core.config import ConfigError, merge_config, read_toml
from gpuwarden.core.names import TemplateError, check_argv_template
from gpuwarden.remediation.adapters import ADAPTERS
from gpuwarden.remediation.engine import EngineSettings
from gpuwarden.remediation.holds import EXPIRED_KIND
from gpuwarden.remediation.identity import Identity, load_identities
from gpuwarden.remediation.model import ActionKind
from gpuwarden.remediation.outcomes import OutcomeSettings
from gpuwarden.remediation.policy import DEFAULT_POLICIES, Policy, PolicyError, load_policies

log = logging.getLogger("gpuwarden.remediation.config")


def adapter_defaults(name: str) -> dict[str, Any]:
    """An adapter's settings: its constructor's keyword arguments with their defaults."""
    module_name, _, cls_name = ADAPTERS[name].partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    out = {}
    for p in inspect.signature(cls).parameters.values():
        if p.kind is p.KEYWORD_ONLY:
            out[p.name] = list(p.default) if isinstance(p.default, tuple) else p.default
    return out


ENGINE = {
    "listen": "127.0.0.1:9470",
    "identities_file": "",
    "token_file": "",
    "hmac_secret_file": "",
    "audit_log": "/var/lib/gpuwarden/remediation/audit.jsonl",
    # compact the audit log past this size (remediation.compact: the whole log is archived
    # beside it as <audit_log>.<UTC time>Z; the live log keeps what the engine still needs);
    # 0: never (it then grows for as long as the engine runs)
    "journal_compact_bytes": 64 << 20,
    # archives are compressed, and only the newest this many kept (0: all); ship them
    # elsewhere where the audit trail must outlive them
    "journal_archives_keep": 16,
    "dry_run": True,
    "notify_adapter": "webhook",
    "checkpoint_adapter": "slurm",
    "node_adapter": "slurm",
    "approval": [],
    "return_requires": "check",
    "return_check_command": [],
    "return_check_timeout_s": 900.0,
    "return_workers": 2,
    # a node taken out on one of these kinds (a prediction, not a fault) is held out for the
    # prediction's horizon, at most max_prediction_hold_s, then offered back (remediation.holds)
    "predicted_kinds": ["failure_risk"],
    "max_prediction_hold_s": 86400.0,
    "workers": 4,
    "spares": 0,
    "tick_s": 5.0,
    "max_body_bytes": 1 << 20,
    "max_findings_per_request": 1000,
    "max_finding_age_s": 3600.0,
    "max_clock_skew_s": 300.0,
    "alerts_unsigned": False,
    "max_connections": 128,
    "max_connections_per_peer": 0,
    "request_deadline_s": 15.0,
    "quota_agent_per_min": 60.0,
    "quota_analytics_per_min": 6000.0,
    "quota_alerts_per_min": 600.0,
    "quota_shared_per_min": 6000.0,
    "tls_cert_file": "",
    "tls_key_file": "",
    "tls_client_ca_file": "",
    "tls_ca_file": "",
    "tls_client_cert_file": "",
    "tls_client_key_file": "",
    "operator_identity": "",
    "operator_secret_file": "",
    "url": "",
}
GUARDS = {
    "max_nodes_out": 2,
    "max_fraction_out": 0.1,
    "cooldown_s": 1800.0,
    "actions_per_minute": 20,
    "lemon_count": 3,
    "lemon_window_s": 7 * 86400.0,
    "inventory_ttl_s": 2.0,
    "pending_expire_s": 3600.0,
    "max_pending_per_node": 4,
    "max_pending": 500,
}
#: whether each removal was needed, and each policy's precision (remediation.outcomes)
OUTCOMES = {
    "quick_pass_s": 3600.0,
    "clean_window_s": 7 * 86400.0,
    "window_s": 30 * 86400.0,
    "margin": 0.05,
}
#: a standby engine (remediation.lease): empty dsn_file = one engine, no lease
LEASE = {
    # a libpq connection string ("host=db1 user=gpuwarden dbname=gpuwarden sslmode=verify-full
    # password=..."), in a file because it may hold a password
    "dsn_file": "",
    # every engine of one cluster names the same lease; another cluster, another name
    "name": "gpuwarden-engine",
    "retry_s": 0.5,
    "check_s": 1.0,
    "lost_after_s": 10.0,
}
INFLUXDB = {
    "url": "",
    "database": "gpuwarden",
    "token_file": "",
    "spool_dir": "/var/lib/gpuwarden/remediation/spool",
}


def defaults() -> dict[str, dict[str, Any]]:
    return {
        "engine": dict(ENGINE),
        "guards": dict(GUARDS),
        "outcomes": dict(OUTCOMES),
        "lease": dict(LEASE),
        **{name: adapter_defaults(name) for name in sorted(ADAPTERS)},
        "influxdb": dict(INFLUXDB),
    }


@dataclass(frozen=True)
class RemediationConfig:
    sections: Mapping[str, Mapping[str, Any]]
    policies: tuple[Policy, ...]
    identities: tuple[Identity, ...] = ()

    def __getitem__(self, section: str) -> Mapping[str, Any]:
        return self.sections[section]

    @property
    def settings(self) -> EngineSettings:
        e, g = self.sections["engine"], self.sections["guards"]
        return EngineSettings(
            dry_run=e["dry_run"],
            max_nodes_out=g["max_nodes_out"],
            max_fraction_out=g["max_fraction_out"],
            cooldown_s=g["cooldown_s"],
            actions_per_minute=g["actions_per_minute"],
            lemon_count=g["lemon_count"],
            lemon_window_s=g["lemon_window_s"],
            inventory_ttl_s=g["inventory_ttl_s"],
            pending_expire_s=g["pending_expire_s"],
            max_pending_per_node=g["max_pending_per_node"],
            max_pending=g["max_pending"],
            approval=tuple(e["approval"]),
            return_requires=e["return_requires"],
            return_check_command=tuple(e["return_check_command"]),
            return_check_timeout_s=e["return_check_timeout_s"],
            return_workers=e["return_workers"],
            predicted_kinds=tuple(e["predicted_kinds"]),
            max_prediction_hold_s=e["max_prediction_hold_s"],
            notify_adapter=e["notify_adapter"],
            checkpoint_adapter=e["checkpoint_adapter"],
            node_adapter=e["node_adapter"],
            workers=e["workers"],
            journal_compact_bytes=e["journal_compact_bytes"],
            journal_archives_keep=e["journal_archives_keep"],
            spares=e["spares"],
            outcomes=OutcomeSettings(**self.sections["outcomes"]),
        )

    def adapter_names(self) -> list[str]:
        e = self.sections["engine"]
        names = {e["notify_adapter"], e["checkpoint_adapter"], e["node_adapter"]} - {""}
        return sorted(names)


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> RemediationConfig:
    loaded = dict(read_toml(path, "remediation")) if path is not None else {}
    raw_policies = loaded.pop("policy", None)
    raw_identities = loaded.pop("identity", [])
    sections = merge_config(defaults(), path, environ, "remediation", loaded)
    identities = load_identities(raw_identities, str(path))
    if sections["engine"]["identities_file"]:
        more = read_toml(sections["engine"]["identities_file"], "identities")
        unknown = set(more) - {"identity"}
        if unknown:
            raise ConfigError(f"{sections['engine']['identities_file']}: only [[identity]] "
                              f"tables belong here, not {sorted(unknown)}")  # fmt: skip
        identities = load_identities(
            [*raw_identities, *more.get("identity", [])], sections["engine"]["identities_file"]
        )
    try:
        policies = load_policies(raw_policies if raw_policies is not None else DEFAULT_POLICIES)
    except PolicyError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    config = RemediationConfig(sections, tuple(policies), identities)
    if identities and sections["engine"]["hmac_secret_file"]:
        raise ConfigError(
            "engine.hmac_secret_file is the legacy shared secret: with identities each sender "
            "signs with its own key; remove hmac_secret_file"
        )
    e, g = config["engine"], config["guards"]
    for name in config.adapter_names():
        if name not in ADAPTERS:
            raise ConfigError(f"engine: unknown adapter {name!r}; known: {sorted(ADAPTERS)}")
    if g["max_nodes_out"] < 0 or not 0.0 <= g["max_fraction_out"] <= 1.0:
        raise ConfigError("guards.max_nodes_out must be >= 0, max_fraction_out within [0, 1]")
    if e["journal_compact_bytes"] < 0 or e["journal_archives_keep"] < 0:
        raise ConfigError("engine.journal_compact_bytes and journal_archives_keep must be >= 0")
    if e["max_body_bytes"] < 1024 or min(e["workers"], e["return_workers"]) < 1 or e["tick_s"] <= 0:
        raise ConfigError(
            "engine.max_body_bytes >= 1024, workers >= 1, return_workers >= 1, tick_s > 0"
        )
    if e["return_requires"] not in ("check", "command", "approval", "none"):
        raise ConfigError("engine.return_requires must be check, command, approval or none")
    if not e["max_prediction_hold_s"] > 0:
        raise ConfigError("engine.max_prediction_hold_s must be > 0")
    if e["predicted_kinds"] and not any(
        EXPIRED_KIND in p.kinds and ActionKind.UNCORDON in p.actions for p in policies
    ):
        log.warning(
            "no policy answers %s with uncordon: when a prediction's hold on a node (%s) "
            "ends, nobody is told and the engine does not offer it back (it returns only on a "
            "passing check newer than the hold's end, or by hand); add the shipped "
            "prediction-expired policy", EXPIRED_KIND, ", ".join(e["predicted_kinds"]),
        )  # fmt: skip
    if not e["notify_adapter"]:
        log.warning(
            "engine.notify_adapter is empty: plans run without their notifications (each is "
            "recorded as skipped) and nobody is told what gpuwarden did, nor of a plan that "
            "waits for a person (approval, a lemon, no room), which expires unseen after "
            'pending_expire_s; set it to "webhook" ([webhook]) unless another path tells '
            "people (the GpuwardenPlansWaiting alert, deploy/prometheus/)"
        )
    elif e["notify_adapter"] == "webhook" and not any(
        config["webhook"][k] for k in ("generic_url", "slack_url_file", "alertmanager_url")
    ):
        log.warning(
            "[webhook] names no receiver (generic_url, slack_url_file, alertmanager_url): "
            "gpuwarden's notifications, and its requests for a person, reach nobody (each is "
            "recorded as sent to nobody)"
        )
    asks = {ActionKind.CHECKPOINT, ActionKind.CHECKPOINT_INTERVAL}
    sl = config["slurm"]
    if (
        e["checkpoint_adapter"] == "slurm"
        and not (sl["checkpoint_dir"] or sl["checkpoint_signal"])
        and (asking := sorted(p.name for p in policies if asks & set(p.actions)))
    ):
        log.warning(
            "slurm.checkpoint_dir and checkpoint_signal are empty: the checkpoint steps of %s "
            "are skipped (no job is asked to save before its node is drained); set one "
            "(docs/DEPLOY.md, checkpoint requests)", asking,
        )  # fmt: skip
    if e["return_requires"] == "command" and not e["return_check_command"]:
        raise ConfigError("engine.return_requires = 'command' needs return_check_command")
    try:  # ssh must see '--' before {node}: refused here, before the engine serves
        check_argv_template(e["return_check_command"], "engine.return_check_command")
        check_argv_template(shlex.split(config["elastic"]["stop_command"]), "elastic.stop_command")
    except (TemplateError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    le = config["lease"]
    if le["retry_s"] <= 0 or not 0 < le["check_s"] < le["lost_after_s"] / 4:
        raise ConfigError(
            "lease.retry_s > 0, and 0 < lease.check_s < lease.lost_after_s / 4 "
            "(an engine must notice a lost lease well before the server frees it)"
        )
    o = config["outcomes"]
    if min(o["quick_pass_s"], o["clean_window_s"], o["window_s"]) <= 0 or not 0 <= o["margin"] < 1:
        raise ConfigError("outcomes: quick_pass_s, clean_window_s, window_s > 0; 0 <= margin < 1")
    if e["spares"] < 0 or g["lemon_count"] < 0 or g["lemon_window_s"] < 0:
        raise ConfigError("engine.spares, guards.lemon_count and lemon_window_s must be >= 0")
    return config
