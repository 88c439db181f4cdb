"""Dashboards configuration: TOML file, then ``GPUWARDEN_<SECTION>_<KEY>`` overrides, over the
defaults. ``config/dashboards.sample.toml`` lists every setting with its default (a test checks
it equals :data:`DEFAULTS`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwarden.core.config import ConfigError, merge_config, read_secret

DEFAULTS: dict[str, dict[str, Any]] = {
    "influxdb": {
        # as Grafana's server reaches InfluxDB (Grafana queries it, not the browser)
        "url": "http://127.0.0.1:8086",
        "database": "gpuwarden",
        "username": "",
        "password_file": "",
        # the agents' collection interval: Grafana's "Min time interval" for $__interval
        "min_interval": "10s",
        "http_mode": "GET",
    },
    "grafana": {
        "url": "http://127.0.0.1:3000",
        # a service-account token; GRAFANA_TOKEN in the environment wins over the file
        "token_file": "",
        "folder": "gpuwarden",
        "datasource_uid": "gpuwarden-influxdb",
        "org_id": 1,
    },
    "alerts": {
        # Grafana's webhook contact point: the remediation engine's endpoint (or any receiver)
        "webhook_url": "http://127.0.0.1:9470/v1/alerts/grafana",
        "webhook_token_file": "",
        # optional Slack incoming webhook; warnings go there, critical alerts to the webhook. Its
        # URL is a credential: the file that holds it (Grafana reads it through $__file{})
        "slack_url_file": "",
        "evaluate_every": "1m",
        "gpu_temp_c": 87.0,
        "congestion_score": 0.02,
        "symbol_errors_per_10m": 100,
    },
}


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    return merge_config(DEFAULTS, path, environ, "dashboards")


def grafana_token(
    cfg: Mapping[str, Mapping[str, Any]], environ: Mapping[str, str] | None = None
) -> str:
    """``GRAFANA_TOKEN`` from the environment, else the token file's first line."""
    env = os.environ if environ is None else environ
    if env.get("GRAFANA_TOKEN"):
        return env["GRAFANA_TOKEN"].strip()
    from gpuwarden.dashboards.errors import DashboardError

    try:
        return read_secret(cfg["grafana"]["token_file"], "grafana.token_file")
    except ConfigError as exc:
        raise DashboardError(f"the Grafana token: {exc}") from None
