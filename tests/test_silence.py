"""A node whose agent reported, then stopped: ``node_silent``, found in the real influxd. A
silence most nodes share is the data path, and names no node. SIMULATED agent points."""

from __future__ import annotations

from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.emit import findings
from gpuwarden.analytics.runner import LocalExecutor, analyse
from gpuwarden.analytics.silence import silent_nodes
from gpuwarden.core.store.reader import InfluxReader

S = 10**9
END = 1_790_000_000 * S


def agent_points(node: str, until_s: int) -> list[str]:
    """An agent's own points every 10 s from 600 s before END until ``until_s`` before it."""
    return [
        f"agent,cluster=c,node={node},source=agent cycle_lag_s=0.0 {END - t * S}"
        for t in range(600, until_s, -10)
    ]


def test_a_node_that_stopped_reporting_is_silent(influxd, influx_db) -> None:
    influxd.write(
        influx_db, "\n".join(agent_points("a", 200) + agent_points("b", 0) + agent_points("c", 0))
    )
    reader = InfluxReader(influxd.url, influx_db)
    try:
        silent = silent_nodes(reader, END - 900 * S, END, after_s=60)
    finally:
        reader.close()
    assert [(s.node, s.silent_s) for s in silent] == [("a", 210.0)]
    cfg = with_overrides(
        load_config(None, environ={}),
        influxdb={"url": influxd.url, "database": influx_db},
        analysis={"silent_after_s": 60.0},
    )
    found = [f for f in findings(analyse(cfg, END - 900 * S, END, LocalExecutor()))
             if f.kind == "node_silent"]  # fmt: skip
    assert [(f.subject["node"], f.evidence["silent_s"]) for f in found] == [("a", 210.0)]


def test_most_nodes_silent_at_once_is_the_data_path(influxd, influx_db) -> None:
    influxd.write(
        influx_db, "\n".join(agent_points("a", 200) + agent_points("b", 200) + agent_points("c", 0))
    )
    reader = InfluxReader(influxd.url, influx_db)
    try:
        assert silent_nodes(reader, END - 900 * S, END, after_s=60) == []
    finally:
        reader.close()


def test_the_analyze_service_outlives_its_database(tmp_path) -> None:
    """``analyze run --every`` started while InfluxDB is down keeps trying, says so once, and
    analyses once the database is up; a one-shot run says what is wrong in one line."""
    import subprocess
    import sys
    from pathlib import Path

    from testbed.influxd import LocalInfluxd
    from tests.remediation_util import poll

    root = Path(__file__).resolve().parent.parent
    influxd = LocalInfluxd(tmp_path / "influxd")  # its port is chosen; it is not started
    config = tmp_path / "analytics.toml"
    config.write_text(f'[influxdb]\nurl = "{influxd.url}"\n[analysis]\nwindow_s = 60.0\n'
                      "write_back = false\n")  # fmt: skip
    once = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "analyze", "run", "--config", str(config), "--local"],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert once.returncode == 1
    assert once.stderr.strip().splitlines()[-1].startswith("gpuwarden analyze: InfluxDB at")
    out = tmp_path / "analyze.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "analyze", "run", "--config", str(config),
             "--local", "--every", "1s"],
            cwd=root, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        poll(lambda: out.read_text().count("analysis failed") >= 2, 60, "failed periods")
        assert proc.poll() is None  # still running
        assert out.read_text().count("trying again every") == 1  # said once
        influxd.start()
        influxd.create_database("gpuwarden")
        poll(lambda: "findings=" in out.read_text(), 60, "an analysis once InfluxDB is up")
        assert "analysis works again" in out.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        influxd.stop()


def test_the_service_names_a_silence_seen_twice_running() -> None:
    from gpuwarden.analytics.silence import Confirmed, Silence

    confirm = Confirmed()
    a, b = Silence("c", "a", 0, 30.0), Silence("c", "b", 0, 12.0)
    assert confirm([a, b]) == []  # seen once: maybe a spool still draining
    assert confirm([a]) == [a]  # a again: named; b caught up
    assert confirm([b]) == []  # b is new again
