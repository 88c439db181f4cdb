"""One configuration loader for every command: TOML file, then environment overrides, over the
defaults.

Each command declares its settings once, as ``{section: {key: default}}``; :func:`merge_config`
reads the TOML file over them, then any ``GPUWARDEN_<SECTION>_<KEY>`` environment variable
(``GPUWARDEN_AGENT_INTERVAL_S=5``, ``GPUWARDEN_SINK_URL=http://influx:8086``), and coerces
every value to its default's type: lists are comma-separated in the environment, booleans are
``true``/``false``/``1``/``0``. An unknown section or key in the file is an error, so a typo
never silently keeps a default. Secrets (tokens, passwords, HMAC keys) are never settings
themselves: a setting names the file that holds one, read by :func:`read_secret`.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwarden.core.errors import ConfigError

__all__ = ["ConfigError", "merge_config", "read_secret", "read_toml"]


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
