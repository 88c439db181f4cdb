"""``gpuwarden <command> ...``: one command for every part of gpuwarden.

    gpuwarden agent --config /etc/gpuwarden/agent.toml          # the node agent (every GPU node)
    gpuwarden check --config /etc/gpuwarden/agent.toml --json   # the active node check
    gpuwarden analyze run --config analytics.toml --every 60s   # analytics on Dask
    gpuwarden remediate --config remediation.toml serve         # the remediation engine
    gpuwarden dashboards export --out /etc/grafana/gpuwarden    # Grafana dashboards and alerts
    gpuwarden replay generate week-mixed --out /tmp/week        # SIMULATED scenarios, replay
    gpuwarden demo                                              # the main job, end to end

Each command imports only its own package (and ``core``), so a GPU node that installed
``gpuwarden[agent]`` runs ``gpuwarden agent`` without analytics' dependencies, and a command
whose extra is not installed says which one to install. ``gpuwarden <command> --help`` gives
the command's own options. This module is the launcher: it imports the others by name and
nothing of the product imports it. ``demo`` and ``backtest`` run from a source checkout only:
the wheel carries neither the demo nor its models, and an installed ``gpuwarden`` neither lists
them nor imports a top-level ``demo`` (another distribution's, where one is installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

#: command -> (module with main(argv), the extra it needs, what it is)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "agent": ("gpuwarden.collector.cli", "agent", "the node agent: one per GPU node"),
    "check": ("gpuwarden.collector.check", "agent", "the active node check: probes, exit 0 or 1"),
    "analyze": (
        "gpuwarden.analytics.cli",
        "analytics",
        "analytics on Dask over InfluxDB; findings",
    ),
    "remediate": (
        "gpuwarden.remediation.cli",
        "remediation",
        "the remediation engine and its operators",
    ),
    "dashboards": ("gpuwarden.dashboards.cli", "dashboards", "Grafana dashboards and alert rules"),
    "replay": (
        "gpuwarden.simulation.cli",
        "simulation",
        "SIMULATED scenarios; traces into InfluxDB",
    ),
    "demo": ("demo.run", "all", "the main job: the live loop, end to end on local defaults"),
    "backtest": ("demo.backtest", "all", "a model of the engine over a SIMULATED day"),
}


#: the repository root when running from a checkout (site-packages when installed)
ROOT = Path(__file__).resolve().parent.parent


def in_checkout() -> bool:
    """Whether this is a source checkout, whose ``demo`` package is ours. Installed, a
    top-level ``demo`` is some other distribution's (PyPI has one): never imported."""
    return (ROOT / "pyproject.toml").is_file() and (ROOT / "demo" / "run.py").is_file()


def _origin(package: str) -> Path | None:
    """Where ``package`` is (already imported, or would be imported from), without running it."""
    loaded = sys.modules.get(package)
    if loaded is not None:
        where = getattr(loaded, "__file__", None)
        return Path(where).resolve() if where else None
    spec = importlib.util.find_spec(package)
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None


def offered() -> dict[str, tuple[str, str, str]]:
    """The commands this installation runs: ``demo`` and ``backtest`` in a checkout only."""
    return {n: c for n, c in COMMANDS.items() if in_checkout() or not c[0].startswith("demo.")}


def usage() -> str:
    commands = offered()
    width = max(map(len, commands))
    lines = [f"  {name:<{width}}  {what}" for name, (_, _, what) in commands.items()]
    return (
        "usage: gpuwarden <command> [options]   (gpuwarden <command> --help for its options)\n\n"
        "commands:\n" + "\n".join(lines)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"gpuwarden {version('gpuwarden')}")
        except PackageNotFoundError:
            print("gpuwarden (not installed as a package)")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"gpuwarden: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, extra, _ = COMMANDS[name]
    if name not in offered():
        print(
            f"gpuwarden {name}: runs from a source checkout (bash scripts/demo.sh); "
            "the installed package carries no demo",
            file=sys.stderr,
        )
        return 2
    if module_name.startswith("demo."):
        # ours, from the checkout, even where another distribution's demo comes first on
        # sys.path (site-packages precedes the editable install's root): looked up, not run,
        # before it is imported
        if str(ROOT) not in sys.path[:1]:
            sys.path.insert(0, str(ROOT))
        found = _origin("demo")
        if found is None or not found.is_relative_to(ROOT / "demo"):
            print(f"gpuwarden {name}: the demo package here is {found}, not this checkout's",
                  file=sys.stderr)  # fmt: skip
            return 2
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if exc.name is None or top in ("gpuwarden", "demo", "testbed"):
            raise
        print(
            f"gpuwarden {name}: {exc.name} is not installed; "
            f"install the '{extra}' extra: pip install 'gpuwarden[{extra}]'",
            file=sys.stderr,
        )
        return 2
    code: int = module.main(rest)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
