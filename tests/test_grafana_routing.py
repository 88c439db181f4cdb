"""Issue 37, item 5: Grafana provisioning adds gpuwarden's contact points and routing and never
replaces the organisation's notification policy tree.

Grafana provisions the whole tree as one resource: a provisioning file holding ``policies:``
(what ``export`` wrote before this change, in ``gpuwarden-contact-points.yaml``) replaces every
route a site had, and no file can add a subtree. So no exported provisioning file may hold
``policies`` or ``resetPolicies``; each rule names its contact point itself
(``notification_settings``, Grafana's simplified routing), and the routes for a site that
prefers its own tree come as a snippet outside ``provisioning/``. No Grafana server runs on
these machines: the files are checked against the fields Grafana's provisioning reads
(``pkg/services/provisioning/alerting`` in grafana/grafana), not loaded into a Grafana.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.dashboards.alerts import rule_specs
from gpuwarden.dashboards.cli import main as dashboards_cli
from gpuwarden.dashboards.config import load_config


def _export(tmp_path: Path, toml: str = "") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    conf = tmp_path / "dashboards.toml"
    conf.write_text(toml)
    out = tmp_path / "out"
    assert dashboards_cli(["export", "--config", str(conf), "--out", str(out)]) == 0
    return out


def _keys(doc: Any) -> set[str]:
    if isinstance(doc, dict):
        return set(doc) | {k for v in doc.values() for k in _keys(v)}
    if isinstance(doc, list):
        return {k for v in doc for k in _keys(v)}
    return set()


def test_no_provisioning_file_touches_the_policy_tree(tmp_path: Path) -> None:
    out = _export(tmp_path)
    files = sorted((out / "provisioning").rglob("*.yaml"))
    assert len(files) == 4
    for path in files:
        keys = _keys(yaml.safe_load(path.read_text()))
        assert not keys & {"policies", "resetPolicies"}, path


def _rules_and_contacts(out: Path) -> tuple[list[dict[str, Any]], set[str]]:
    alerting = out / "provisioning/alerting"
    rules = yaml.safe_load((alerting / "gpuwarden-rules.yaml").read_text())
    contacts = yaml.safe_load((alerting / "gpuwarden-contact-points.yaml").read_text())
    return [r for g in rules["groups"] for r in g["rules"]], {
        c["name"] for c in contacts["contactPoints"]
    }


def test_every_rule_routes_itself_to_a_contact_point_the_export_ships(tmp_path: Path) -> None:
    rules, contacts = _rules_and_contacts(_export(tmp_path))
    assert contacts == {"gpuwarden-webhook"}
    assert len(rules) == len(rule_specs(load_config(None, environ={})))
    for rule in rules:
        if rule["labels"]["severity"] == "warning":
            # no Slack: the site's own tree routes warnings; the engine's alerts identity
            # takes critical kinds only, and refused each warning with 403 (found in review)
            assert "notification_settings" not in rule, rule["uid"]
            continue
        ns = rule["notification_settings"]
        assert ns["receiver"] in contacts, rule["uid"]
        assert ns["group_by"] == ["alertname", "cluster", "node"]
    # with Slack, warnings go there and critical alerts still to the engine's webhook
    slack = tmp_path / "slack-url"
    slack.write_text("https://hooks.slack.example/T000/B000/XXXX\n")
    rules, contacts = _rules_and_contacts(
        _export(tmp_path / "s", f'[alerts]\nslack_url_file = "{slack}"\n')
    )
    assert contacts == {"gpuwarden-webhook", "gpuwarden-slack"}
    by_severity = {r["labels"]["severity"]: r["notification_settings"]["receiver"] for r in rules}
    assert by_severity == {"critical": "gpuwarden-webhook", "warning": "gpuwarden-slack"}


def test_the_route_snippet_lies_outside_provisioning_and_routes_what_the_rules_label(
    tmp_path: Path,
) -> None:
    out = _export(tmp_path)
    snippet = yaml.safe_load((out / "gpuwarden-routes.example.yaml").read_text())
    _, contacts = _rules_and_contacts(out)
    rules, _ = _rules_and_contacts(out)
    labels = {(r["labels"]["source"], r["labels"]["severity"]) for r in rules}
    routed = set()
    for route in snippet["routes"]:
        assert route["receiver"] in contacts
        m = {k: v for k, op, v in route["object_matchers"] if op == "="}
        routed.add((m["source"], m["severity"]))
    # without Slack, warnings are the site tree's own: no route of gpuwarden's for them
    assert {(s, v) for s, v in labels if v == "critical"} == routed
    assert not list((out / "provisioning").rglob("*routes*"))


@pytest.mark.parametrize("setting", ["webhook_token_file", "slack_url_file"])
def test_credentials_stay_in_their_files(tmp_path: Path, setting: str) -> None:
    """Grafana reads them through ``$__file{}``; the exported files never hold them."""
    secret = tmp_path / "secret"
    secret.write_text("https://hooks.slack.example/T000/B000/sEcReT\n")
    out = _export(tmp_path, f'[alerts]\n{setting} = "{secret}"\n')
    text = "\n".join(p.read_text() for p in out.rglob("*.yaml"))
    assert "sEcReT" not in text
    assert "$__file{" + str(secret) + "}" in text
