"""One command-line convention for every ``gpuwarden <command>``.

* ``--config FILE`` is taken before or after a subcommand (``gpuwarden remediate --config X
  serve`` and ``gpuwarden remediate serve --config X`` mean the same); a config file that does
  not exist is a clear message and exit 2, never a traceback.
* ``--log-level debug|info|warning|error`` and ``--log-format text|json``: a bad value is
  argparse's usage error (exit 2). ``json`` writes one object per line (``time`` in RFC 3339
  UTC, ``level``, ``logger``, ``message``, and ``exc`` with the traceback when there is one),
  what a log shipper (Vector, Fluent Bit, Loki's promtail) parses without a pattern.

Each command's parser calls :func:`add_common` on itself and on each subparser, then
:func:`configure_logging` and :func:`config_path` after parsing.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def add_common(
    parser: argparse.ArgumentParser,
    *,
    sub: bool = False,
    config_help: str = "",
    config: bool = True,
) -> None:
    """``--config``, ``--log-level`` and ``--log-format`` on ``parser``. On a subparser
    (``sub``) their defaults are suppressed, so a value given before the subcommand stands.
    A command that reads no configuration (``replay``) passes ``config=False``: it takes no
    ``--config`` rather than one it would ignore."""
    default = argparse.SUPPRESS
    if config:
        parser.add_argument("--config", default=default if sub else None,
                            help=config_help or "TOML configuration")  # fmt: skip
    parser.add_argument("--log-level", choices=LEVELS, type=str.lower,
                        default=default if sub else "info")  # fmt: skip
    parser.add_argument("--log-format", choices=FORMATS,
                        default=default if sub else "text")  # fmt: skip


def configure_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    fmt = getattr(args, "log_format", "text")
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler._gpuwarden = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in list(root.handlers):  # ours from an earlier call; another's (a test's) stays
        if getattr(old, "_gpuwarden", False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(str(getattr(args, "log_level", "info")).upper())


class UsageError(Exception):
    """A bad argument or a missing file: the command prints it and exits 2."""


def config_path(args: argparse.Namespace) -> str | None:
    """The ``--config`` given, checked to be a readable file; None when none was given."""
    given = getattr(args, "config", None)
    if given is None:
        return None
    path = Path(given)
    if not path.is_file():
        raise UsageError(f"--config {given}: no such file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise UsageError(f"--config {given}: {exc.strerror}") from None
    return str(path)
