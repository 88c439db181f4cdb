"""A node whose agent reported, then stopped: ``node_silent``, found in the real influxd. A
silence most nodes share is the data path, and names no node. SIMULATED agent points."""

from __future__ import annotations

from analytics.config import load_config, with_overrides
from analytics.emit import findings
from analytics.runner import LocalExecutor, analyse
from analytics.silence import silent_nodes
from core.store.reader import InfluxReader

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
