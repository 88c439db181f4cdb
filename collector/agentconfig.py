"""The agent's configuration: TOML file, then environment overrides, over the defaults.

``config/agent.sample.toml`` lists every setting with its default (a test checks it equals
:data:`DEFAULTS`). An environment variable ``GPUWARDEN_<SECTION>_<KEY>`` overrides one setting,
e.g. ``GPUWARDEN_AGENT_INTERVAL_S=5`` or ``GPUWARDEN_SINK_URL=http://influx:8086``; lists are
comma-separated and booleans are ``true``/``false``/``1``/``0``.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.errors import CollectorError
from collector.sink import SinkConfig
from collector.xidcat import DEFAULT_FATAL_XIDS


class ConfigError(CollectorError):
    """A configuration file or override that cannot be used (the message names the setting)."""


DEFAULTS: dict[str, dict[str, Any]] = {
    "agent": {
        "cluster": "default",
        "node": "",
        "interval_s": 10.0,
        "source_timeout_s": 5.0,
        "sources": ["nvml", "xid", "infiniband", "power", "thermal"],
        "sysfs": "/sys",
        "procfs": "/proc",
        "kmsg": "/dev/kmsg",
        "remediation_url": "",
        "remediation_token_file": "",
        "reporter_listen": "127.0.0.1:9465",
    },
    "nvml": {
        "backend": "pynvml",
        "recording": "",
        "loop": False,
        "nvlink": True,
        "gpm": True,
        "processes": True,
        "events": "thread",
        "jobmap_dir": "/run/gpuwarden/jobs",
        "pod_resources_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
        "pod_resources_refresh_s": 30.0,
        "pod_resources_names": ["nvidia.com/gpu", "nvidia.com/gpu.shared"],
        "fabric_grace_s": 600.0,
        "info_every_s": 600.0,
    },
    "xid": {
        "path": "",
        "lookback_s": 300.0,
        "fatal_xids": list(DEFAULT_FATAL_XIDS),
        "extra_fatal_xids": [],
        "not_fatal_xids": [],
    },
    "infiniband": {"hcas": [], "rediscover_cycles": 60},
    "power": {"rapl": True, "hwmon": True},
    "thermal": {"thermal_zones": True, "hwmon": True},
    "health": {"healthy_after_s": 1800.0, "expected_gpus": 0},
    "sink": SinkConfig().to_mapping(),
}


@dataclass(frozen=True)
class AgentConfig:
    sections: Mapping[str, Mapping[str, Any]]

    def __getitem__(self, section: str) -> Mapping[str, Any]:
        return self.sections[section]

    @property
    def sink(self) -> SinkConfig:
        return SinkConfig.from_mapping(dict(self.sections["sink"]))

    def source_settings(self, name: str) -> dict[str, Any]:
        """A source's settings; the XID lists are shared by the nvml and xid sources."""
        settings = dict(self.sections.get(name, {}))
        if name == "nvml":
            xid = self.sections["xid"]
            for key in ("fatal_xids", "extra_fatal_xids", "not_fatal_xids"):
                settings[key] = xid[key]
        return settings


def _coerce(section: str, key: str, default: Any, value: Any, where: str) -> Any:
    what = f"{where}: {section}.{key}"
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no"):
                return False
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{what} must be true or false, got {value!r}")
    if isinstance(default, int) and not isinstance(default, bool):
        try:
            if isinstance(value, (float, bool)):
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{what} must be an integer, got {value!r}") from None
    if isinstance(default, float):
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{what} must be a number, got {value!r}") from None
    if isinstance(default, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{what} must be a list, got {value!r}")
        numeric = bool(default) and all(isinstance(d, int | float) for d in default)
        if key.endswith("xids") or numeric:
            kind = float if any(isinstance(d, float) for d in default) else int
            try:
                return [kind(v) for v in value]
            except (TypeError, ValueError):
                raise ConfigError(f"{what} must be a list of numbers") from None
        return [str(v) for v in value]
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string, got {value!r}")
    return value


def read_secret(path: str) -> str:
    """A token or password kept in a file (first and only line); "" when no file is set."""
    if not path:
        return ""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read secret file {path}: {exc}") from None


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {what} configuration {path}: {exc}") from exc


def merge_config(
    defaults: Mapping[str, Mapping[str, Any]],
    path: str | Path | None,
    environ: Mapping[str, str] | None,
    what: str,
    loaded: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """``defaults``, overridden by the TOML file at ``path`` (or its already ``loaded``
    content), then by ``GPUWARDEN_<SECTION>_<KEY>`` environment variables; every value coerced
    to its default's type. Shared by the agent's, the analytics' and the engine's configuration."""
    data: dict[str, dict[str, Any]] = copy.deepcopy({k: dict(v) for k, v in defaults.items()})
    if loaded is None and path is not None:
        loaded = read_toml(path, what)
    where = str(path) if path is not None else what
    for section, values in (loaded or {}).items():
        if section not in data or not isinstance(values, dict):
            raise ConfigError(f"{where}: unknown section [{section}]; known: {sorted(data)}")
        for key, value in values.items():
            if key not in data[section]:
                raise ConfigError(f"{where}: unknown setting {section}.{key}")
            default = defaults[section][key]
            data[section][key] = _coerce(section, key, default, value, where)
    env = os.environ if environ is None else environ
    for name, value in env.items():
        if not name.startswith("GPUWARDEN_"):
            continue
        rest = name[len("GPUWARDEN_") :].lower()
        section, _, key = rest.partition("_")
        if section in data and key in data[section]:
            data[section][key] = _coerce(section, key, defaults[section][key], value, name)
    return data


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    config = AgentConfig(merge_config(DEFAULTS, path, environ, "agent"))
    config.sink  # noqa: B018  (validates the sink section now, not at first write)
    if config["agent"]["interval_s"] <= 0 or config["agent"]["source_timeout_s"] <= 0:
        raise ConfigError("agent.interval_s and agent.source_timeout_s must be positive")
    return config
