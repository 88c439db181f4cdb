"""One configuration loader for every command: TOML file, then environment overrides, over the
defaults.

Each command declares its settings once, as ``{section: {key: default}}``; :func:`merge_config`
reads the TOML file over them, then any ``GPUWARDEN_<SECTION>_<KEY>`` environment variable
(``GPUWARDEN_AGENT_INTERVAL_S=5``, ``GPUWARDEN_SINK_URL=http://influx:8086``), and coerces
every value to its default's type: lists are comma-separated in the environment, booleans are
``true``/``false``/``1``/``0``. An unknown section or key in the file is an error, so a typo
never silently keeps a default. Secrets (tokens, passwords, HMAC keys) are never settings
themselves: a setting names the file that holds one, read by :func:`read_secret`.

**Secrets.** A setting whose name ends in one of :data:`SECRET_FILE_SUFFIXES` names a file
holding a secret (or a TLS private key). The secret itself is never a setting, neither in the
file nor in the environment: a setting is printed (``--print-config``), logged and kept in a
configuration file readable by whoever deploys it, and an environment variable is inherited by
every child process (the agent runs ``dcgmi``, ``nvidia-smi``) and readable in
``/proc/<pid>/environ``. ``[sink] password = ...`` or ``GPUWARDEN_SINK_TOKEN=...`` is refused
with the name of the ``..._file`` setting to use. Every command checks its secret files when it
starts (:func:`check_secrets`), so a missing or unreadable one is exit 2 at start, not a
failure at the first fatal event: the file must exist, be a regular file, be readable, hold
something, and not be writable by every user (anyone could put their own key there);
readable by every user is a warning, not a refusal (Docker and Kubernetes mount secrets 0444
or 0644 inside a container whose only user is the service; on a shared host it is a leak, and
the warning says how to fix it).
"""

from __future__ import annotations

import copy
import logging
import os
import stat
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuwarden.core.errors import ConfigError

__all__ = [
    "SECRET_FILE_SUFFIXES",
    "ConfigError",
    "check_secrets",
    "is_secret_file_setting",
    "merge_config",
    "read_secret",
    "read_toml",
]

log = logging.getLogger(__name__)

#: a setting whose name ends so names a file holding a secret
SECRET_FILE_SUFFIXES = (
    "token_file", "secret_file", "password_file", "key_file", "url_file", "dsn_file"
)  # fmt: skip
MAX_SECRET_BYTES = 1 << 20
_WARNED: set[str] = set()  # secret files already warned about (readable by every user)


def is_secret_file_setting(key: str) -> bool:
    return key.endswith(SECRET_FILE_SUFFIXES)


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
    if isinstance(default, dict):  # a TOML table (not from the environment: no syntax there)
        if not isinstance(value, dict):
            raise ConfigError(f"{what} must be a table (set it in the TOML file), got {value!r}")
        return copy.deepcopy(value)
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


def read_secret(path: str, setting: str = "") -> str:
    """A token or password kept in a file (its content, stripped); "" when no file is set.
    Refused (:class:`ConfigError`, naming ``setting``): a file that is missing, not a regular
    file, unreadable, empty, larger than 1 MiB, or writable by every user."""
    if not path:
        return ""
    what = f"{setting} = {path}" if setting else f"secret file {path}"
    try:
        st = os.stat(path)  # follows symlinks: Kubernetes mounts a secret through ..data/
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what}: not a regular file")
        if st.st_mode & stat.S_IWOTH:
            raise ConfigError(
                f"{what}: writable by every user (mode {stat.S_IMODE(st.st_mode):04o}), so "
                "anyone could put their own secret there; chmod o-w it (600 or 640)"
            )
        if st.st_size > MAX_SECRET_BYTES:
            raise ConfigError(f"{what}: {st.st_size} bytes, not a secret (over 1 MiB)")
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what}: not UTF-8 text") from None
    if not text:
        raise ConfigError(f"{what}: the file is empty")
    if st.st_mode & stat.S_IROTH and path not in _WARNED:
        _WARNED.add(path)  # once per file: a sender re-reads its token at each post
        log.warning(
            "%s is readable by every user on this machine (mode %04o): chmod o-r it (600, or "
            "640 with the service's group) unless only the service runs here (a container)",
            what,
            stat.S_IMODE(st.st_mode),
        )
    return text


def check_secrets(
    sections: Mapping[str, Mapping[str, Any]],
    skip: Iterable[str] = (),
    only: Iterable[str] | None = None,
) -> list[str]:
    """Reads and checks every secret file the settings name (:func:`read_secret`), at a
    command's start; ``skip`` lists ``section.key`` settings another machine reads (a Dask
    worker, Grafana), ``only`` (when given) the ones this command reads. Returns the settings
    checked."""
    skipped = set(skip)
    wanted = None if only is None else set(only)
    checked = []
    for section, values in sections.items():
        for key, value in values.items():
            name = f"{section}.{key}"
            if wanted is not None and name not in wanted:
                continue
            if is_secret_file_setting(key) and value and name not in skipped:
                read_secret(str(value), name)
                checked.append(name)
    return checked


def _url_password(url: str) -> bool:
    try:
        return bool(urllib.parse.urlsplit(url).password)
    except ValueError:
        return False


def _secret_value_error(section: str, key: str, known: Mapping[str, Any], where: str) -> None:
    """A secret given as a setting (``password`` where ``password_file`` exists)."""
    if f"{key}_file" in known:
        raise ConfigError(
            f"{where}: {section}.{key} is a secret, and a secret is never a setting (it would be "
            f"printed, logged and kept in the configuration): put it in a file only the service "
            f"can read (chmod 600) and set {section}.{key}_file to its path"
        )


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
                _secret_value_error(section, key, data[section], where)
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
        elif section in data:  # GPUWARDEN_SINK_TOKEN: refused, never silently ignored
            _secret_value_error(section, key, data[section], name)
            # a typo (GPUWARDEN_HEALTH_EXPECTED_GPU) would leave the default in force: said,
            # not refused, as scripts keep switches of their own under the same prefix
            log.warning("%s names no setting of the %s configuration (no %s.%s): ignored",
                        name, what, section, key)  # fmt: skip
    for section, values in data.items():
        for key, value in values.items():
            if key.endswith("url") and isinstance(value, str) and _url_password(value):
                raise ConfigError(
                    f"{where}: {section}.{key} holds a password (user:password@ in the URL), and "
                    "a secret is never a setting: give the user alone and the password in a "
                    "*_password_file (or *_token_file) setting"
                )
    return data
