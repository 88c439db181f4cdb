"""Issue 37, item 7: one command-line convention (``gpuwarden.core.cli``), in real processes.

Before: ``--config`` went before the subcommand for ``dashboards`` and after it for
``analyze``; ``--log-level verbose`` was a traceback; a missing config file was a traceback or
a silent default; there were three log formats and no JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gw(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwarden", *argv], cwd=cwd,
                          capture_output=True, text=True, check=False, timeout=300)  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["agent", "--once", "--config", "/nonexistent/agent.toml"],
        ["analyze", "run", "--config", "/nonexistent/analytics.toml"],
        ["analyze", "--config", "/nonexistent/analytics.toml", "run"],
        ["dashboards", "--config", "/nonexistent/dashboards.toml", "check"],
        ["dashboards", "check", "--config", "/nonexistent/dashboards.toml"],
        ["remediate", "--config", "/nonexistent/remediation.toml", "pending"],
        ["remediate", "audit", "--config", "/nonexistent/remediation.toml"],
    ],
)
def test_a_missing_config_file_is_a_message_and_exit_2(argv: list[str]) -> None:
    done = gw(*argv)
    assert done.returncode == 2, done.stderr
    assert "no such file" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "argv", [["agent", "--once"], ["dashboards", "check"], ["remediate", "pending"]]
)
def test_a_bad_log_level_is_a_usage_error_not_a_traceback(argv: list[str]) -> None:
    done = gw(*argv, "--log-level", "verbose")
    assert done.returncode == 2
    assert "invalid choice: 'verbose'" in done.stderr and "Traceback" not in done.stderr


def test_config_goes_before_or_after_the_subcommand(tmp_path: Path) -> None:
    config = tmp_path / "dashboards.toml"
    config.write_text('[grafana]\nfolder = "gw-test"\n')
    before = gw("dashboards", "--config", str(config), "check")
    after = gw("dashboards", "check", "--config", str(config))
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    assert before.stdout == after.stdout


def test_json_logs_are_one_object_a_line(tmp_path: Path) -> None:
    """A CONSTRUCTED agent whose NVML recording is missing: the source fails, and says so in
    the log, which ``--log-format json`` writes as JSON lines."""
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nnode = "n1"\nsources = ["nvml"]\n'
        f'[nvml]\nbackend = "recorded"\nrecording = "{tmp_path}/missing.json"\n'
    )
    done = gw("agent", "--config", str(config), "--once", "--log-format", "json", cwd=tmp_path)
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert records, done.stderr
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any(r["logger"].startswith("gpuwarden.") for r in records)


def test_remediate_audit_of_a_missing_log_says_so(tmp_path: Path) -> None:
    """Before: ``remediate audit --log /nonexistent`` printed nothing and exited 0."""
    done = gw("remediate", "audit", "--log", str(tmp_path / "nonexistent.jsonl"))
    assert done.returncode == 2 and "no audit log at" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["agent"],
        ["check"],
        ["analyze", "run"],
        ["remediate", "serve"],
        ["dashboards", "render"],
        ["replay", "list"],
        ["replay", "run"],
    ],
)
def test_every_installed_command_takes_the_log_flags(argv: list[str]) -> None:
    """Before: ``check`` and ``replay`` took neither ``--log-level`` nor ``--log-format``
    (``check --log-format json`` was 'unrecognized arguments')."""
    done = gw(*argv, "--help")
    assert done.returncode == 0, done.stderr
    assert "--log-level" in done.stdout and "--log-format" in done.stdout, done.stdout
    assert ("--config" in done.stdout) == (argv[0] != "replay")  # replay reads no config


def test_check_and_replay_write_json_logs(tmp_path: Path) -> None:
    missing = gw("check", "--config", str(tmp_path / "none.toml"), "--log-format", "json")
    assert missing.returncode == 2 and "no such file" in missing.stderr, missing.stderr
    listed = gw("replay", "list", "--log-format", "json", "--log-level", "warning")
    assert listed.returncode == 0 and "nodes" in listed.stdout, listed.stderr


def test_render_names_its_flags_as_the_other_commands_do() -> None:
    """``--url``, ``--start``, ``--end`` as ``analyze`` and ``replay`` name them (before:
    ``--influx-url``, ``--from``, ``--to`` only); the old names are still taken."""
    done = gw("dashboards", "render", "--help")
    for flag in ("--url", "--start", "--end", "--influx-url", "--from", "--to"):
        assert flag in done.stdout, flag
    bad = gw("dashboards", "render", "--start", "yesterday-ish", "--out", "/tmp/x")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
