"""``gpuwarden remediate``: run the engine, feed it findings, read its audit log, steer it.

* ``serve``: the HTTP endpoint (``[engine] listen``) in front of the engine; SIGTERM/SIGINT
  stop it after the actions in flight finish;
* ``apply FILE``: findings from a file (a JSON list, or JSON lines; ``-`` = stdin) through the
  same engine, for a one-off or a replay; prints each decision;
* ``audit``: the audit trail as a table (or ``--json``), filtered by node or finding;
* ``precision``: each policy's outcomes (confirmed, refuted, unknown) and precision over
  ``[outcomes] window_s``, from the audit log (``--json``);
* ``pending``, ``approve PLAN``, ``undo NODE [--false-alarm | --repaired | --rma]``: talk to
  a running ``serve``, as the operator identity ``[engine] operator_identity`` (signed with
  ``operator_secret_file``);
* ``agent-key FAMILY NODE``: the key a node's agent signs with, derived from the family
  identity's master key (``[[identity]]`` with ``node = "*"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.core.cli import UsageError, add_common, config_path, configure_logging
from gpuwarden.core.config import ConfigError, check_secrets, read_secret
from gpuwarden.core.finding import Finding, FindingError
from gpuwarden.core.names import NodeName
from gpuwarden.core.signals import stop_event
from gpuwarden.core.signing import agent_key, sign_request
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.tls import client_context, server_context
from gpuwarden.remediation.adapters import create
from gpuwarden.remediation.audit import AuditLog, AuditLogBusyError, JournalError, read_records
from gpuwarden.remediation.clock import SYSTEM
from gpuwarden.remediation.compact import history
from gpuwarden.remediation.config import RemediationConfig, load_config
from gpuwarden.remediation.engine import Engine
from gpuwarden.remediation.identity import Keyring
from gpuwarden.remediation.lease import LEASE_LOST_EXIT, LeaseLostError, PostgresLease
from gpuwarden.remediation.model import Action, AdapterError, Outcome
from gpuwarden.remediation.outcomes import Outcomes
from gpuwarden.remediation.replay import SignatureMemory
from gpuwarden.remediation.server import Endpoint, make_server

log = logging.getLogger("gpuwarden.remediate")


def action_point(action: Action, outcome: Outcome, record: dict[str, Any]) -> Point:
    """The catalogue's ``remediation_action`` point for one audited action."""
    tags = {
        "cluster": action.cluster,
        "node": action.node,
        "job": action.job,
        "action": str(action.kind),
        "adapter": action.adapter,
        "outcome": str(outcome.status),
    }
    return Point(
        "remediation_action",
        {k: v for k, v in tags.items() if v},
        {
            "finding_id": action.finding_id,
            "action_id": action.id,
            "dry_run_active": bool(record["dry_run"]),
            "duration_s": float(record["duration_s"]),
            "message": outcome.message,
        },
        int(float(record["t"]) * 1e9),
    )


def outcome_point(record: dict[str, Any]) -> Point:
    """The catalogue's ``remediation_outcome`` point for one ``outcome`` record."""
    tags = {k: str(record.get(k, "")) for k in ("cluster", "node", "policy", "kind", "verdict")}
    evidence = record.get("evidence") or {}
    t = float(record["t"])
    return Point(
        "remediation_outcome",
        {k: v for k, v in tags.items() if v},
        {
            "finding_id": str(record.get("plan_id", "")),
            "action_id": ",".join(map(str, record.get("action_ids") or [])),
            "after_removal_s": round(t - float(record.get("removed_t", t)), 3),
            "message": str(evidence.get("why", ""))[:400],
        },
        int(t * 1e9),
    )


def precision_table(path: str, config: RemediationConfig, as_json: bool) -> int:
    """Each policy's outcomes over ``[outcomes] window_s`` and its precision, read from the
    audit log (nothing is written: the running engine decides and records outcomes)."""
    outcomes = Outcomes(AuditLog(path), config.policies, SYSTEM, config.settings.outcomes)
    outcomes.update(write=False)
    rows = outcomes.table()
    if as_json:
        print(json.dumps(rows))
        return 0
    print(f"{'policy':<28} {'confirmed':>9} {'refuted':>8} {'unknown':>8} {'precision':>9} "
          f"{'min':>5}  state")  # fmt: skip
    for r in rows:
        value = "-" if r["precision"] is None else f"{r['precision']:.2f}"
        state = "demoted" if r["demoted"] else ""
        print(f"{r['policy']:<28} {r['confirmed']:>9} {r['refuted']:>8} {r['unknown']:>8} "
              f"{value:>9} {r['min_precision']:>5g}  {state}")  # fmt: skip
    return 0


def build_engine(
    config: RemediationConfig,
    seen_retention_s: float = 0.0,
    fence: Callable[[], None] | None = None,
) -> tuple[Engine, InfluxSink | None]:
    """The engine and its InfluxDB sink; ``fence`` guards every audit record from the first
    (:meth:`remediation.lease.PostgresLease.fence`)."""
    adapters = {}
    for name in config.adapter_names():
        try:
            adapters[name] = create(name, config[name])
        except (AdapterError, OSError) as exc:
            raise ConfigError(f"adapter {name}: {exc}") from None
    sink = None
    db = config["influxdb"]
    if db["url"]:
        sink = InfluxSink(
            SinkConfig(
                url=db["url"],
                database=db["database"],
                token=read_secret(db["token_file"]),
                spool_dir=db["spool_dir"],
                flush_interval_s=1.0,
            )
        )
        sink.start()

    def on_action(action: Action, outcome: Outcome, record: dict[str, Any]) -> None:
        if sink is not None:
            sink.write_points([action_point(action, outcome, record)])

    def on_outcome(record: dict[str, Any]) -> None:
        if sink is not None:
            sink.write_points([outcome_point(record)])

    audit = AuditLog(config["engine"]["audit_log"], exclusive=True)  # one engine per log
    audit.fence = fence
    engine = Engine(
        config.policies,
        adapters,
        audit,
        dataclasses.replace(config.settings, seen_retention_s=seen_retention_s),
        on_action=on_action,
        on_outcome=on_outcome,
    )
    return engine, sink


def serve(config: RemediationConfig) -> int:
    e = config["engine"]
    stop = stop_event(signal.SIGTERM, signal.SIGINT)
    try:
        acting, lease = standby(config, stop)
        if not acting:
            return 0  # stopped while a standby: nothing was opened
        # a finding re-sent past this is refused as stale by the endpoint: its id need not be
        # kept. With a lease, no record (so no action) without a confirmed hold, from the
        # first record the engine writes on start
        engine, sink = build_engine(
            config,
            e["max_finding_age_s"] + e["max_clock_skew_s"] + 60.0,
            fence=lease.fence if lease is not None else None,
        )
        if lease is not None:
            engine.audit.append("lease", time.time(), lease=lease.name, holder=holder_name(),
                                tries=lease.tries)  # fmt: skip
    except LeaseLostError as exc:
        log.critical("%s: exiting so that the engine holding the lease acts alone", exc)
        return LEASE_LOST_EXIT
    keyring = Keyring(config.identities)
    if not keyring:
        log.warning("no identities configured: one shared token%s serves every caller (the "
                    "legacy mode; see docs/SECURITY.md, 'Identities and scopes')",
                    " and secret" if e["hmac_secret_file"] else "")  # fmt: skip
    audit_log = Path(e["audit_log"])
    endpoint = Endpoint(
        engine,
        read_secret(e["token_file"]),
        keyring=keyring,
        signatures=SignatureMemory(
            audit_log.with_name(audit_log.name + ".signatures"), e["max_clock_skew_s"]
        ),
        secret=read_secret(e["hmac_secret_file"]).encode(),
        max_body_bytes=e["max_body_bytes"],
        max_findings=e["max_findings_per_request"],
        max_finding_age_s=e["max_finding_age_s"],
        max_clock_skew_s=e["max_clock_skew_s"],
        alerts_unsigned=e["alerts_unsigned"],
        quotas_per_min={
            kind: e[f"quota_{kind}_per_min"] for kind in ("agent", "analytics", "alerts", "shared")
        },
    )
    host, _, port = e["listen"].rpartition(":")
    tls = None
    if e["tls_cert_file"]:
        tls = server_context(e["tls_cert_file"], e["tls_key_file"], e["tls_client_ca_file"])
    server = make_server(
        endpoint,
        host or "127.0.0.1",
        int(port),
        tls,
        max_connections=e["max_connections"],
        max_connections_per_peer=e["max_connections_per_peer"],
        request_deadline_s=e["request_deadline_s"],
    )
    threading.Thread(target=server.serve_forever, daemon=True, name="http").start()
    mode = "DRY-RUN (nothing is changed)" if config.settings.dry_run else "LIVE"
    log.info(
        "remediation engine on http://%s:%s, %s, adapters %s",
        *server.server_address[:2],
        mode,
        sorted(engine.adapters),
    )
    resumed = engine.resume()  # plans a crash or a stop left unfinished, reconciled first
    if resumed:
        log.warning("resumed %d unfinished plans from the audit log", len(resumed))
    while not stop.wait(e["tick_s"]):
        engine.tick()
    server.shutdown()
    engine.close()
    if lease is not None:
        lease.release()  # after the last record: the standby replays a finished log
    if sink is not None:
        sink.close()
    return 0


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def standby(config: RemediationConfig, stop: threading.Event) -> tuple[bool, PostgresLease | None]:
    """With ``[lease] dsn_file``: wait, as a standby, for the lease: (True, the held lease),
    or (False, None) when stopped first. Without one: (True, None), the only engine."""
    le = config["lease"]
    if not le["dsn_file"]:
        return True, None
    lease = PostgresLease(
        read_secret(le["dsn_file"], "lease.dsn_file"),
        le["name"],
        retry_s=le["retry_s"],
        check_s=le["check_s"],
        lost_after_s=le["lost_after_s"],
    )
    log.info("standby: waiting for the lease %r (%s)", le["name"], holder_name())
    if not lease.acquire(stop):
        return False, None
    lease.watch()  # confirmed every check_s from now: the start (a long replay) is covered
    # the engine that held it before may not know yet (its session ended on the server's
    # side: its last confirmation lets it write for up to lost_after_s / 2): wait that out
    # before the first record, so that two engines never act at once
    quiet = lease.lost_after_s / 2 + lease.check_s
    log.warning("took the lease %r (%s); acting in %.1f s, once any engine before has stopped",
                le["name"], holder_name(), quiet)  # fmt: skip
    if stop.wait(quiet):
        lease.release()
        return False, None
    lease.fence()  # (raises when the hold was lost meanwhile)
    return True, lease


def read_findings(path: str) -> Iterator[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        yield from json.loads(stripped)
        return
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def apply(config: RemediationConfig, path: str) -> int:
    engine, sink = build_engine(config)
    bad, number = 0, 0
    try:
        for number, data in enumerate(read_findings(path), 1):
            try:
                finding = Finding.from_json(data)
            except FindingError as exc:
                bad += 1
                print(f"#{number}: not a finding: {exc}", file=sys.stderr)
                continue
            d = engine.submit(finding)
            node = finding.subject.get("node", "-")
            actions = ",".join(str(a.kind) for a in d.actions) or "-"
            print(f"{finding.id}  {finding.kind:<16} {node:<10} {d.verdict:<12} {actions}  {d.why}")
    except JournalError as exc:
        print(f"stopped: {exc}; the findings from #{number} on were not decided", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"cannot read findings from {path}: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.close()
        if sink is not None:
            sink.close()
    return 1 if bad else 0


def audit(path: str, node: str, finding: str, as_json: bool, everything: bool = False) -> int:
    """Print the audit trail: the live log, or with ``everything`` its archives first
    (:func:`remediation.compact.history`: each record once)."""
    torn: list[int] = []
    real = Path(os.path.realpath(path))  # a symlinked log's archives lie beside its file
    for r in history(real) if everything else read_records(path, torn):
        if node and r.get("node") != node:
            continue
        if finding and not str(r.get("finding_id", "")).startswith(finding):
            continue
        if as_json:
            print(json.dumps(r))
            continue
        what = r.get("action") or r.get("verdict") or r.get("kind") or ""
        outcome = r.get("outcome", "")
        timing = f"{r['duration_s']:.3f}s +{r['since_finding_s']:.3f}s" if "duration_s" in r else ""
        text = r.get("message") or r.get("why") or r.get("summary") or ""
        print(
            f"{r.get('time', '')}  {r.get('event', ''):<8} {str(r.get('finding_id', ''))[:12]:<12} "
            f"{r.get('node', '') or '-':<10} {what:<12} {outcome:<8} {timing:<18} {text}"
        )
    if torn:
        print(f"(skipped torn lines {torn})", file=sys.stderr)
    return 0


def call(config: RemediationConfig, method: str, path: str, body: bytes = b"") -> int:
    """Talk to a running ``serve`` as the operator: signed as ``operator_identity`` with the
    key in ``operator_secret_file`` when set (an engine with identities requires it); else, in
    the legacy mode, with the shared token, a POST signed with ``hmac_secret_file`` if set."""
    e = config["engine"]
    url = engine_url(e) + path
    context = None
    if e["tls_cert_file"]:
        context = client_context(
            e["tls_ca_file"], e["tls_client_cert_file"], e["tls_client_key_file"]
        )
    headers = {"Content-Type": "application/json"} if method == "POST" else {}
    if e["operator_identity"]:
        key = read_secret(e["operator_secret_file"]).encode()
        if not key:
            raise ConfigError("engine.operator_identity needs operator_secret_file (its key)")
        headers |= sign_request(key, method, path, body, e["operator_identity"])
    else:
        headers["Authorization"] = f"Bearer {read_secret(e['token_file'])}"
        secret = read_secret(e["hmac_secret_file"]).encode()
        if secret and method == "POST":
            headers |= sign_request(secret, method, path, body)
    req = urllib.request.Request(url, body if method == "POST" else None, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            print(json.dumps(json.loads(resp.read()), indent=2))
            return 0
    except urllib.error.HTTPError as exc:
        print(f"{exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
    except urllib.error.URLError as exc:
        print(f"cannot reach the engine at {url}: {exc.reason}", file=sys.stderr)
    return 1


def engine_url(e: Mapping[str, Any]) -> str:
    """Where the operator commands reach the engine: ``[engine] url``, else ``listen`` with
    an address that listens everywhere (``0.0.0.0``, ``::``) read as this host's loopback
    (the shipped Kubernetes engine listens on ``0.0.0.0:9470``: an operator there reaches it
    through ``kubectl port-forward`` on 127.0.0.1)."""
    if e["url"]:
        return str(e["url"]).rstrip("/")
    host, _, port = str(e["listen"]).rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "[::]": "[::1]", "::": "[::1]"}.get(host, host)
    return f"{'https' if e['tls_cert_file'] else 'http'}://{host}:{port}"


def operator_secrets(e: Mapping[str, Any]) -> tuple[str, ...]:
    """The secret settings an operator command reads: its identity's key, or (legacy) the
    shared token and secret; and its TLS client key. (The engine's own read-only ``monitor``
    token file is not read by a command that signs as an identity: the shipped ConfigMap
    names one that only exists in the engine's pod.)"""
    own = (
        ("engine.operator_secret_file",)
        if e["operator_identity"]
        else ("engine.token_file", "engine.hmac_secret_file")
    )
    return (*own, "engine.tls_client_key_file")


def print_agent_key(config: RemediationConfig, family: str, node: str) -> int:
    """The key of ``<family>/<node>``: what that node's agent keeps in its key file."""
    found = [i for i in config.identities if i.name == family and i.node == "*"]
    if not found:
        raise ConfigError(f"no [[identity]] {family!r} with kind = 'agent' and node = '*'")
    print(agent_key(read_secret(found[0].secret_file).encode(), str(NodeName(node))).decode())
    return 0


OPERATOR_ONLY = ("engine.operator_secret_file", "engine.tls_client_key_file")  # not the engine's


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpuwarden remediate", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    config_help = "TOML (config/remediation.sample.toml shows every setting)"
    add_common(p, config_help=config_help)
    p.add_argument("-v", "--verbose", action="store_true", help="the same as --log-level debug")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the HTTP endpoint and the engine")
    ap = sub.add_parser("apply", help="run findings from a file through the engine")
    ap.add_argument("findings", help="JSON list or JSON lines of findings; - for stdin")
    live = ap.add_mutually_exclusive_group()
    live.add_argument("--dry-run", action="store_true", default=None, help="force dry-run")
    live.add_argument("--live", action="store_true", help="act (overrides engine.dry_run)")
    au = sub.add_parser("audit", help="print the audit trail")
    au.add_argument("--log", help="audit log (default: engine.audit_log)")
    au.add_argument("--node", default="")
    au.add_argument("--finding", default="", help="a finding id or its prefix")
    au.add_argument("--json", action="store_true")
    au.add_argument(
        "--all", action="store_true", help="its archives too, oldest first, each record once"
    )
    sub.add_parser(
        "pending",
        help="plans waiting for approval or for room, and nodes a prediction holds "
        "(running engine)",
    )
    apr = sub.add_parser("approve", help="approve a waiting plan (running engine)")
    apr.add_argument("plan_id")
    un = sub.add_parser("undo", help="put a node gpuwarden took out back (running engine)")
    un.add_argument("node")
    un.add_argument("--force", action="store_true", help="even one gpuwarden did not take out")
    why = un.add_mutually_exclusive_group()
    why.add_argument("--false-alarm", dest="reason", action="store_const", const="false_alarm",
                     help="its removal was not needed: the outcome is refuted")  # fmt: skip
    why.add_argument("--repaired", dest="reason", action="store_const", const="repaired",
                     help="it was repaired: the outcome is confirmed")  # fmt: skip
    why.add_argument("--rma", dest="reason", action="store_const", const="rma",
                     help="it went back to the vendor and returned: confirmed")  # fmt: skip
    pr = sub.add_parser("precision", help="each policy's outcomes and precision (audit log)")
    pr.add_argument("--log", help="audit log (default: engine.audit_log)")
    pr.add_argument("--json", action="store_true")
    ak = sub.add_parser("agent-key", help="print a node's own key (an agent family's identity)")
    ak.add_argument("family", help="the [[identity]] with node = '*'")
    ak.add_argument("node")
    for sp in sub.choices.values():
        add_common(sp, sub=True, config_help=config_help)
    args = p.parse_args(argv)
    if args.verbose:
        args.log_level = "debug"
    configure_logging(args)
    try:
        config = load_config(config_path(args))
        # every secret file this subcommand reads, checked now (exit 2), not at first use
        if args.command in ("serve", "apply"):
            check_secrets(config.sections, skip=OPERATOR_ONLY)
        elif args.command in ("pending", "approve", "undo"):
            check_secrets(config.sections, only=operator_secrets(config["engine"]))
        if args.command == "apply" and (args.live or args.dry_run):
            sections = {k: dict(v) for k, v in config.sections.items()}
            sections["engine"]["dry_run"] = not args.live
            config = RemediationConfig(sections, config.policies, config.identities)
        if args.command == "serve":
            return serve(config)
        if args.command == "apply":
            return apply(config, args.findings)
        if args.command == "precision":
            log_path = args.log or config["engine"]["audit_log"]
            if not Path(log_path).is_file():
                raise UsageError(f"no audit log at {log_path}")
            return precision_table(log_path, config, args.json)
        if args.command == "audit":
            log_path = args.log or config["engine"]["audit_log"]
            if not Path(log_path).is_file():  # before: printed nothing and exited 0
                raise UsageError(f"no audit log at {log_path}")
            return audit(log_path, args.node, args.finding, args.json, args.all)
        if args.command == "pending":
            return call(config, "GET", "/v1/pending")
        if args.command == "approve":
            return call(config, "POST", f"/v1/approve/{args.plan_id}", b"{}")
        if args.command == "agent-key":
            return print_agent_key(config, args.family, args.node)
        said = {"reason": args.reason} if args.reason else {}
        body = json.dumps({"force": args.force, **said}).encode()
        return call(config, "POST", f"/v1/undo/{args.node}", body)
    except (ConfigError, ValueError, AuditLogBusyError, UsageError) as exc:
        print(f"gpuwarden remediate: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
