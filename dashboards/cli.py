"""``gpuwarden dashboards``: export, push, check and render the dashboards and alert rules.

    gpuwarden dashboards export --out /etc/grafana/gpuwarden     # JSON + provisioning files
    gpuwarden dashboards push --url http://grafana:3000           # token: GRAFANA_TOKEN or file
    gpuwarden dashboards render --url http://127.0.0.1:8086 --database gpuwarden \\
        --start 2026-11-01T00:00:00Z --end 2026-11-01T06:00:00Z --out /tmp/dashboards
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import urllib3
import yaml

from gpuwarden.core.cli import UsageError, add_common, config_path, configure_logging
from gpuwarden.core.config import ConfigError, check_secrets, read_secret
from gpuwarden.core.timeparse import parse_when
from gpuwarden.dashboards.alerts import contact_points_file, route_snippet, rules_file
from gpuwarden.dashboards.config import grafana_token, load_config
from gpuwarden.dashboards.errors import DashboardError, PushError
from gpuwarden.dashboards.export import encode, generate
from gpuwarden.dashboards.grafana import parse_duration

log = logging.getLogger("gpuwarden.dashboards")

Config = Mapping[str, Mapping[str, Any]]


def datasource_file(cfg: Config) -> dict[str, Any]:
    i = cfg["influxdb"]
    ds: dict[str, Any] = {
        "name": "gpuwarden InfluxDB",
        "uid": cfg["grafana"]["datasource_uid"],
        "type": "influxdb",
        "access": "proxy",
        "url": i["url"],
        "orgId": cfg["grafana"]["org_id"],
        "jsonData": {
            "dbName": i["database"],
            "httpMode": i["http_mode"],
            "timeInterval": i["min_interval"],
        },
    }
    if i["username"]:
        ds["user"] = i["username"]
    if i["password_file"]:
        ds["secureJsonData"] = {"password": "$__file{" + i["password_file"] + "}"}
    return {"apiVersion": 1, "datasources": [ds]}


def provider_file(cfg: Config, dashboards_dir: str) -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "gpuwarden",
                "orgId": cfg["grafana"]["org_id"],
                "folder": cfg["grafana"]["folder"],
                "type": "file",
                "disableDeletion": False,
                "allowUiUpdates": False,
                "options": {"path": dashboards_dir, "foldersFromFilesStructure": False},
            }
        ],
    }


ROUTE_SNIPPET = "gpuwarden-routes.example.yaml"


def contact_point_warnings(cfg: Config) -> list[str]:
    """What the exported contact points will not do, said before an operator finds out from
    alerts that reach nobody (found in review)."""
    a, found = cfg["alerts"], []
    if not a["webhook_token_file"]:
        found.append(
            "alerts.webhook_token_file is empty: the contact point posts to the engine without "
            "a token, and the engine answers 401 (with identities it takes a bearer token only "
            "from an alerts identity, with [engine] alerts_unsigned = true: docs/DEPLOY.md, "
            "Grafana)"
        )
    if not a["slack_url_file"]:
        found.append(
            "alerts.slack_url_file is empty: warnings (a hot GPU, a link trained down, a "
            "silent agent) have no contact point of gpuwarden's and go through your "
            "organisation's notification policy tree (its default contact point): make sure "
            "people read it, or set slack_url_file"
        )
    return found


def export(cfg: Config, out: Path) -> list[Path]:
    """``out/dashboards/*.json``, ``out/provisioning/{datasources,dashboards,alerting}`` and,
    outside ``provisioning/``, :data:`ROUTE_SNIPPET`: the routes for a site that would rather
    route gpuwarden's alerts through its own notification policy tree (pasted by hand; as a
    provisioning file it would replace the tree)."""
    boards = generate()
    written = []
    (out / "dashboards").mkdir(parents=True, exist_ok=True)
    for name, board in boards.items():
        path = out / "dashboards" / f"gpuwarden-{name}.json"
        path.write_text(encode(board), encoding="utf-8")
        written.append(path)
    files = {
        "datasources/gpuwarden.yaml": datasource_file(cfg),
        "dashboards/gpuwarden.yaml": provider_file(cfg, str((out / "dashboards").resolve())),
        "alerting/gpuwarden-rules.yaml": rules_file(cfg),
        "alerting/gpuwarden-contact-points.yaml": contact_points_file(cfg),
    }
    for rel, doc in files.items():
        path = out / "provisioning" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        written.append(path)
    snippet = out / ROUTE_SNIPPET
    snippet.write_text(
        "# NOT a provisioning file. Grafana provisions the notification policy tree as one\n"
        "# resource: a file with `policies:` replaces the whole tree. gpuwarden's rules route\n"
        "# themselves (notification_settings); to route them through your own tree instead,\n"
        "# paste these routes under your default policy and drop notification_settings.\n"
        + yaml.safe_dump(route_snippet(cfg), sort_keys=False),
        encoding="utf-8",
    )
    written.append(snippet)
    return written


class Grafana:
    """The few Grafana HTTP API calls ``push`` needs, with a service-account token."""

    def __init__(self, url: str, token: str, timeout_s: float = 30.0) -> None:
        if not token:
            raise PushError("no Grafana token: set GRAFANA_TOKEN or [grafana] token_file")
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._http = urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout_s), retries=False)

    def call(self, method: str, path: str, body: Any = None, ok: Sequence[int] = (200,)) -> int:
        """The HTTP status, when it is one of ``ok``; otherwise :class:`PushError`."""
        try:
            resp = self._http.request(
                method,
                self.url + path,
                body=None if body is None else json.dumps(body).encode(),
                headers=self.headers,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise PushError(f"Grafana at {self.url} unreachable: {exc}") from exc
        if resp.status not in ok:
            text = resp.data[:300].decode(errors="replace")
            hint = " (check the token and its role)" if resp.status in (401, 403) else ""
            raise PushError(f"{method} {path}: HTTP {resp.status}{hint}: {text}")
        return int(resp.status)


def push(cfg: Config, url: str, token: str) -> list[str]:
    """Folder, datasource, dashboards, contact points and alert rules through the Grafana HTTP
    API; every call is an upsert, so pushing twice is harmless. The notification policy tree
    is never written (a PUT replaces all of it): the rules name their contact point."""
    g = Grafana(url, token)
    folder = cfg["grafana"]["folder"]
    done = []
    g.call("POST", "/api/folders", {"uid": folder, "title": folder}, ok=(200, 409, 412))
    ds = datasource_file(cfg)["datasources"][0]
    if g.call("GET", f"/api/datasources/uid/{ds['uid']}", ok=(200, 404)) == 404:
        g.call("POST", "/api/datasources", ds)
    done.append(f"datasource {ds['uid']}")
    for board in generate().values():
        body = {"dashboard": board, "folderUid": folder, "overwrite": True}
        g.call("POST", "/api/dashboards/db", {**body, "message": "gpuwarden push"})
        done.append(f"dashboard {board['uid']}")
    for point in contact_points_file(cfg, read=_read_secret)["contactPoints"]:
        for r in point["receivers"]:
            body = {"name": point["name"], **r}
            path = f"/api/v1/provisioning/contact-points/{r['uid']}"
            if g.call("PUT", path, body, ok=(200, 202, 404)) == 404:
                g.call("POST", "/api/v1/provisioning/contact-points", body, ok=(200, 201, 202))
            done.append(f"contact point {r['uid']}")
    for group in rules_file(cfg)["groups"]:
        for rule in group["rules"]:
            body = {**rule, "folderUID": folder, "ruleGroup": group["name"]}
            body["orgID"] = group["orgId"]
            path = f"/api/v1/provisioning/alert-rules/{rule['uid']}"
            if g.call("PUT", path, body, ok=(200, 404)) == 404:
                g.call("POST", "/api/v1/provisioning/alert-rules", body, ok=(200, 201))
            done.append(f"alert rule {rule['uid']}")
    return done


def _read_secret(path: str) -> str:
    try:
        return read_secret(path)
    except ConfigError as exc:
        raise PushError(str(exc)) from None


def _render(args: argparse.Namespace, cfg: Config) -> int:
    from gpuwarden.dashboards.influx import InfluxQLClient
    from gpuwarden.dashboards.render import render_all

    client = InfluxQLClient(
        args.influx_url or cfg["influxdb"]["url"], args.database or cfg["influxdb"]["database"]
    )
    start = parse_when(args.start) // 10**6
    end = parse_when(args.end) // 10**6
    done = render_all(
        client,
        generate(),
        start,
        end,
        Path(args.out),
        args.label,
        parse_duration(args.min_interval or cfg["influxdb"]["min_interval"]),
    )
    for name, panels in done.items():
        empty = [p.title for p in panels if not p.points]
        print(
            f"{name}: {len(panels)} panels, {len(empty)} without data"
            + (f" ({', '.join(empty)})" if empty else "")
        )
    print(f"open {Path(args.out) / 'index.html'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwarden dashboards",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(parser, config_help="dashboards TOML (config/dashboards.sample.toml)")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write dashboard JSON and Grafana provisioning files")
    ex.add_argument("--out", required=True)
    pu = sub.add_parser("push", help="upsert folder, datasource, dashboards, alert rules")
    pu.add_argument("--url", help="Grafana URL (default: [grafana] url)")
    sub.add_parser("check", help="build and check every dashboard; print the problems")
    re_ = sub.add_parser("render", help="PNG panels on HTML pages, from InfluxDB, no Grafana")
    # --url, --start and --end as every other command names them; the old names still work
    re_.add_argument("--url", "--influx-url", dest="influx_url", default="",
                     help="InfluxDB URL (default: [influxdb] url)")  # fmt: skip
    re_.add_argument("--database", default="")
    re_.add_argument("--start", "--from", dest="start", required=True, help="an RFC 3339 time")
    re_.add_argument("--end", "--to", dest="end", default="now", help="an RFC 3339 time or now")
    re_.add_argument("--out", required=True)
    re_.add_argument("--min-interval", default="", help="e.g. 30s (default: [influxdb])")
    re_.add_argument(
        "--label",
        default="data: as found in InfluxDB",
        help="printed on every page: say whether the data is real or simulated",
    )
    for sp in (ex, pu, sub.choices["check"], re_):
        add_common(sp, sub=True, config_help="dashboards TOML (config/dashboards.sample.toml)")
    args = parser.parse_args(argv)
    configure_logging(args)
    try:
        cfg = load_config(config_path(args))
        if args.command in ("export", "push"):
            for warning in contact_point_warnings(cfg):
                log.warning("%s", warning)
        if args.command == "export":
            for path in export(cfg, Path(args.out)):
                print(path)
        elif args.command == "push":
            # push reads the contact points' secrets itself (the API does not read $__file{});
            # export leaves them to Grafana, on its own host, and checks nothing here
            token = grafana_token(cfg)
            check_secrets(cfg, only=("alerts.webhook_token_file", "alerts.slack_url_file"))
            for line in push(cfg, args.url or cfg["grafana"]["url"], token):
                print("pushed", line)
        elif args.command == "check":
            boards = generate()
            print(
                f"{len(boards)} dashboards, "
                f"{sum(len(b['panels']) for b in boards.values())} panels: OK"
            )
        else:
            return _render(args, cfg)
    except (DashboardError, ConfigError, ValueError, UsageError) as exc:
        print(f"gpuwarden dashboards: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
