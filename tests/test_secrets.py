"""Issue 37, item 6: secrets come only from files, are never printed, and every secret file a
command reads is read and checked when it starts.

Before this change the agent's ``[sink] password`` and ``token`` were plain settings (and
``--print-config`` printed them; ``GPUWARDEN_SINK_TOKEN`` set them from the environment), the
agent first read ``remediation_token_file`` at the first fatal event, a missing secret file of
the analyze service surfaced only when it posted, and an empty or world-writable one was used
as it was. Every command here is the real ``gpuwarden`` entry point, in this process.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwarden.analytics.cli import main as analyze_main
from gpuwarden.analytics.config import DEFAULTS as ANALYTICS
from gpuwarden.collector.cli import main as agent_main
from gpuwarden.collector.config import DEFAULTS as AGENT
from gpuwarden.collector.config import load_config as load_agent_config
from gpuwarden.core.config import ConfigError, read_secret
from gpuwarden.dashboards.cli import main as dashboards_main
from gpuwarden.dashboards.config import DEFAULTS as DASHBOARDS
from gpuwarden.remediation.cli import main as remediate_main
from gpuwarden.remediation.config import defaults as remediation_defaults

SECRET = "s3cret-value-9f1c"


def _secret(tmp: Path, mode: int = 0o600, text: str = SECRET + "\n") -> Path:
    path = tmp / f"secret-{mode:o}-{len(text)}"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_no_command_has_a_secret_as_a_setting() -> None:
    """Every secret-looking setting names a file (the agent's sink had password and token)."""
    # a Slack incoming-webhook URL carries its own credential in the path
    looks_secret = re.compile(r"(^|_)(password|token|secret|api_key|credentials?)$|^slack_url$")
    for command, sections in (("agent", AGENT), ("analyze", ANALYTICS),
                              ("remediate", remediation_defaults()),
                              ("dashboards", DASHBOARDS)):  # fmt: skip
        for section, values in sections.items():
            bad = [k for k in values if looks_secret.search(k) and k != "credentials"]
            assert not bad, (command, section, bad)


@pytest.mark.parametrize(
    ("toml", "env", "setting"),
    [
        (f'[sink]\ntoken = "{SECRET}"\n', {}, "sink.token"),
        (f'[sink]\npassword = "{SECRET}"\n', {}, "sink.password"),
        ("", {"GPUWARDEN_SINK_TOKEN": SECRET}, "sink.token"),
        ("", {"GPUWARDEN_SINK_PASSWORD": SECRET}, "sink.password"),
        (f'[sink]\nurl = "http://u:{SECRET}@influx:8086"\n', {}, "sink.url"),
        ("", {"GPUWARDEN_SINK_URL": f"https://u:{SECRET}@influx:8086"}, "sink.url"),
    ],
)
def test_a_secret_given_as_a_setting_is_refused_and_never_printed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    toml: str,
    env: dict[str, str],
    setting: str,
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(toml)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert agent_main(["--config", str(config), "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    if setting.endswith(".url"):
        assert f"{setting} holds a password" in err
    else:
        assert f"{setting} is a secret" in err and f"set {setting}_file" in err


def test_print_config_shows_a_secret_files_path_never_its_content(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = _secret(tmp_path)
    config = tmp_path / "agent.toml"
    config.write_text(f'[sink]\ntoken_file = "{token}"\n[agent]\nremediation_token_file = '
                      f'"{token}"\n')  # fmt: skip
    assert agent_main(["--config", str(config), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert f'token_file = "{token}"' in out and SECRET not in out
    sink = load_agent_config(config).sink
    assert sink.token == SECRET and SECRET not in repr(sink)  # read from the file, not shown


def test_the_sink_reads_its_password_and_token_from_their_files(tmp_path: Path) -> None:
    from gpuwarden.core.store.sink import SinkConfig

    token, password = _secret(tmp_path), _secret(tmp_path, text="pw-7\n")
    cfg = SinkConfig.from_mapping({"token_file": str(token), "password_file": str(password)})
    assert (cfg.token, cfg.password) == ("", "")  # settings hold paths; reading is explicit
    read = cfg.with_secrets()
    assert (read.token, read.password) == (SECRET, "pw-7")
    assert SECRET not in repr(read) and "pw-7" not in repr(read)
    assert "token" not in read.to_mapping() and "password" not in read.to_mapping()


# -- every secret file checked at start, per command ------------------------------------------

Run = Callable[[Path, Path], int]


def _agent(tmp: Path, config: Path) -> int:
    return agent_main(["--config", str(config), "--once"])


def _analyze(tmp: Path, config: Path) -> int:
    return analyze_main(["run", "--config", str(config), "--local", "--no-write"])


def _remediate_apply(tmp: Path, config: Path) -> int:
    findings = tmp / "findings.jsonl"
    findings.write_text("")
    return remediate_main(["apply", "--config", str(config), str(findings)])


def _remediate_operator(tmp: Path, config: Path) -> int:
    return remediate_main(["pending", "--config", str(config)])


def _dashboards_push(tmp: Path, config: Path) -> int:
    return dashboards_main(["push", "--config", str(config), "--url", "http://127.0.0.1:9"])


def _agent_toml(tmp: Path, section: str, key: str, path: Path) -> str:
    base = (f'[agent]\nsources = []\nreporter_listen = ""\n'
            f'[sink]\nurl = "http://127.0.0.1:9"\nspool_dir = "{tmp}/spool"\n')  # fmt: skip
    if section == "sink":
        return base.replace("[sink]\n", f'[sink]\n{key} = "{path}"\n')
    return base.replace("[agent]\n", f'[agent]\n{key} = "{path}"\n')


CASES: list[tuple[str, Run, Callable[[Path, str, str, Path], str], str, str]] = [
    ("agent", _agent, _agent_toml, "agent", "remediation_token_file"),
    ("agent", _agent, _agent_toml, "agent", "remediation_hmac_secret_file"),
    ("agent", _agent, _agent_toml, "sink", "token_file"),
    ("agent", _agent, _agent_toml, "sink", "password_file"),
    ("analyze", _analyze,
     lambda t, s, k, p: f'[influxdb]\nurl = "http://127.0.0.1:9"\n[{s}]\n{k} = "{p}"\n',
     "findings", "token_file"),
    ("analyze", _analyze,
     lambda t, s, k, p: f'[influxdb]\nurl = "http://127.0.0.1:9"\n{k} = "{p}"\n',
     "influxdb", "password_file"),
    ("remediate", _remediate_apply,
     lambda t, s, k, p: f'[engine]\naudit_log = "{t}/audit.jsonl"\nnode_adapter = "kubernetes"\n'
                        f'[{s}]\n{k} = "{p}"\n',
     "kubernetes", "token_file"),
    ("remediate", _remediate_operator,
     lambda t, s, k, p: f'[engine]\nlisten = "127.0.0.1:9"\n{k} = "{p}"\n',
     "engine", "token_file"),
    ("dashboards", _dashboards_push,
     lambda t, s, k, p: f'[alerts]\n{k} = "{p}"\n', "alerts", "webhook_token_file"),
]  # fmt: skip


@pytest.mark.parametrize("problem", ["missing", "empty", "directory", "world-writable"])
@pytest.mark.parametrize(("command", "run", "toml", "section", "key"), CASES,
                         ids=[f"{c[0]}-{c[3]}.{c[4]}" for c in CASES])  # fmt: skip
def test_a_bad_secret_file_stops_the_command_at_start_naming_the_setting(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    run: Run,
    toml: Callable[[Path, str, str, Path], str],
    section: str,
    key: str,
    problem: str,
) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", "grafana-token")  # push's own token is not the case
    path = {
        "missing": lambda: tmp_path / "no-such-file",
        "empty": lambda: _secret(tmp_path, text="\n"),
        "directory": lambda: tmp_path,
        "world-writable": lambda: _secret(tmp_path, mode=0o666),
    }[problem]()
    config = tmp_path / f"{command}.toml"
    config.write_text(toml(tmp_path, section, key, path))
    assert run(tmp_path, config) == 2
    err = capsys.readouterr().err
    assert f"{section}.{key} = {path}: " in err, err
    why = {"missing": "No such file", "empty": "the file is empty",
           "directory": "not a regular file",
           "world-writable": "writable by every user"}  # fmt: skip
    assert why[problem] in err, err


def test_a_world_readable_secret_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Warned, not refused: Docker and Kubernetes mount secrets 0444/0644 in a container."""
    caplog.set_level(logging.WARNING, logger="gpuwarden.core.config")
    path = _secret(tmp_path, mode=0o644)
    assert read_secret(str(path), "sink.token_file") == SECRET
    (record,) = caplog.records
    assert "readable by every user" in record.getMessage() and "0644" in record.getMessage()
    assert SECRET not in record.getMessage()
    caplog.clear()
    assert read_secret(str(path), "sink.token_file") == SECRET  # read again: warned once
    assert read_secret(str(_secret(tmp_path, mode=0o640)), "x") == SECRET
    assert not caplog.records


def test_a_secret_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Reading a FIFO would wait forever for a writer: it is refused before it is opened."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_secret(str(fifo), "sink.token_file")


def test_check_report_says_at_once_that_it_cannot_report_and_the_verdict_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpuwarden check --report`` with a bad secret file: said before the probes run; the
    node's verdict is the probes' (a report that cannot be sent must not drain a node)."""
    from gpuwarden.collector.check import main as check_main

    config = tmp_path / "agent.toml"
    config.write_text(f'[sink]\ntoken_file = "{tmp_path}/missing"\n'
                      f'[check]\ndisk_paths = ["{tmp_path}"]\n')  # fmt: skip
    assert check_main(["--config", str(config), "--probes", "disk", "--report"]) == 0
    err = capsys.readouterr().err
    assert f"the results will not be reported: sink.token_file = {tmp_path}/missing" in err
