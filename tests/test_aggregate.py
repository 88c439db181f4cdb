"""Issue 28, item 2: the agent collects at 1 Hz and writes once per window.

The agent reads the CONSTRUCTED 8x H100 recording and a built 8-HCA sysfs tree; the same 30
cycles (stamped 1 s apart) go raw into one database of a REAL influxd and through the
aggregating sink (10 s windows) into another. The points drop tenfold, the dashboards' query
(``mean(...) GROUP BY time(10s)``) reads the same values from both, and a spike between two
writes is kept in ``<field>_max``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gpuwarden.analytics.config import load_config as load_analytics_config
from gpuwarden.analytics.config import with_overrides
from gpuwarden.analytics.tasks import read_port_rates
from gpuwarden.collector import cli as agent_cli
from gpuwarden.collector.aggregate import AggregatingSink
from gpuwarden.collector.config import ConfigError, load_config
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.reader import InfluxReader
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from testbed.sysfstree import advance
from tests.test_agent import write_config

S = 1_000_000_000
T0 = 1_790_000_000 * S  # a multiple of 10 s: windows and GROUP BY time(10s) buckets align


class Collect:
    def __init__(self) -> None:
        self.points: list[Point] = []
        self.closed = False

    def write_points(self, points) -> None:
        self.points += list(points)

    def close(self, timeout_s: float = 10.0) -> bool:
        self.closed = True
        return True


def _gpu(t: int, power: float, mem: int, energy: float) -> Point:
    return Point("gpu", {"cluster": "c", "node": "n", "gpu": "0"},
                 {"power_w": power, "mem_used_bytes": mem, "energy_j_total": energy,
                  "fabric_registered_active": True}, T0 + t * S)  # fmt: skip


def test_gauges_become_mean_min_max_the_rest_last_and_events_pass_at_once() -> None:
    out = Collect()
    sink = AggregatingSink(out, 10)
    for t in range(25):
        power = 900.0 if t == 13 else 400.0  # a spike between two writes
        sink.write_points([_gpu(t, power, 1000 + t, 10.0 * t)])
        if t == 14:
            event = Point("gpu_event", {"cluster": "c", "node": "n", "event": "xid"},
                          {"xid_code": 79}, T0 + t * S)  # fmt: skip
            sink.write_points([event])
            assert out.points[-1] is event  # not held for the window
    written = [p for p in out.points if p.measurement == "gpu"]
    assert [p.time_ns for p in written] == [T0 + 9 * S, T0 + 19 * S]
    first, second = written[0].fields, written[1].fields
    assert first["power_w"] == 400.0 and first["power_w_max"] == 400.0
    assert second["power_w"] == pytest.approx(450.0) and second["power_w_max"] == 900.0
    assert second["power_w_min"] == 400.0
    assert first["mem_used_bytes"] == 1004 and isinstance(first["mem_used_bytes"], int)  # 1004.5
    assert first["energy_j_total"] == 90.0 and first["fabric_registered_active"] is True  # last
    assert sink.close() and out.closed  # what is held is written at stop: nothing is lost
    assert [p.time_ns for p in out.points if p.measurement == "gpu"][-1] == T0 + 24 * S
    for p in out.points:
        assert check_point(p.measurement, p.tags, p.fields) == [], p
    with pytest.raises(ValueError):
        AggregatingSink(out, 0)


def _query(influxd, db: str, q: str) -> list:
    series: list = json.loads(influxd.query(q, db))["results"][0].get("series", [])
    return series


def _record(influxd, tmp_path: Path, dbs: dict[str, str]) -> AggregatingSink:
    """30 agent cycles 1 s apart, raw into ``dbs["raw"]`` and per 10 s into the other."""
    config = load_config(write_config(tmp_path, influxd.url, "unused"), environ={})
    for db in dbs.values():
        influxd.create_database(db)

    def sink(db: str) -> InfluxSink:
        return InfluxSink(SinkConfig(url=influxd.url, database=db,
                                     spool_dir=str(tmp_path / f"spool-{db}")))  # fmt: skip

    raw, aggregated = sink(dbs["raw"]), AggregatingSink(sink(dbs["aggregated"]), 10)
    agent, _ = agent_cli.build_agent(config, raw)
    for cycle in range(30):
        advance(tmp_path / "sys", cycle)  # the InfiniBand counters move, as traffic would
        points = agent.collect(T0 + cycle * S)
        raw.write_points(points)
        aggregated.write_points(points)
    assert raw.close(30) and aggregated.close(30)
    return aggregated


def test_aggregated_and_raw_read_the_same_through_the_dashboards_query(
    influxd, tmp_path: Path
) -> None:
    dbs = {"raw": "agg_raw", "aggregated": "agg_10s"}
    aggregated = _record(influxd, tmp_path, dbs)
    counts = {
        kind: _query(influxd, db, "SELECT count(power_w) FROM gpu")[0]["values"][0][1]
        for kind, db in dbs.items()
    }
    assert counts == {"raw": 240, "aggregated": 24}  # 8 GPUs x 30 readings, x 3 windows
    # every hardware series 10x fewer; the agent's own health points (one per source per cycle)
    # and its events are never held, so the whole stream drops about 5x here
    assert aggregated.points_out * 4 < aggregated.points_in

    def dashboard(db: str) -> list:
        q = ("SELECT mean(power_w), mean(gpu_util_pct), last(ecc_sbe_volatile_total) FROM gpu "
             "WHERE gpu = '3' GROUP BY time(10s) fill(none)")  # fmt: skip
        values: list = _query(influxd, db, q)[0]["values"]
        return values

    got, want = dashboard(dbs["aggregated"]), dashboard(dbs["raw"])
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0] and g[1:3] == pytest.approx(w[1:3]) and g[3] == w[3]
    spikes = _query(influxd, dbs["aggregated"], "SELECT max(power_w_max) FROM gpu")
    peak = _query(influxd, dbs["raw"], "SELECT max(power_w) FROM gpu")
    assert spikes[0]["values"][0][1] == peak[0]["values"][0][1]


def test_analytics_reads_aggregated_as_it_reads_raw(influxd, tmp_path: Path) -> None:
    """The analysis's own reads of agent telemetry (per-port rates from ``last()`` per
    ``ib_bucket_s``; per-GPU power and energy per ``gpu_bucket_s``) give the same answer from
    aggregated data as from the 1 Hz points (REAL influxd; CONSTRUCTED recording)."""
    dbs = {"raw": "an_raw", "aggregated": "an_10s"}
    _record(influxd, tmp_path, dbs)
    out = {}
    for kind, db in dbs.items():
        cfg = with_overrides(load_analytics_config(environ={}),
                             influxdb={"url": influxd.url, "database": db})  # fmt: skip
        reader = InfluxReader(**cfg.reader_kwargs())
        rates = read_port_rates(reader, cfg, ["node-a"], T0, T0 + 30 * S)
        wanted = {"power_w": "mean:power_w", "energy_j_total": "last:energy_j_total"}
        power = reader.aggregate("gpu", wanted, T0, T0 + 30 * S, every_s=60,
                                 group_tags=["node", "gpu"])  # fmt: skip
        reader.close()
        out[kind] = (rates.sort("hca", "port", "time"), power.sort("gpu"))
    (raw_rates, raw_power), (agg_rates, agg_power) = out["raw"], out["aggregated"]
    assert raw_rates.height >= 8 and raw_power.height == 8  # every port and every GPU
    assert (raw_rates["xmit_util_ratio"] > 0).all()  # the counters moved: rates are not zero
    assert raw_rates.select("hca", "port", "time").equals(agg_rates.select("hca", "port", "time"))
    for col in ("xmit_util_ratio", "rcv_util_ratio", "score_ratio"):
        assert agg_rates[col].to_list() == pytest.approx(raw_rates[col].to_list(), nan_ok=True)
    assert agg_power["power_w"].to_list() == pytest.approx(raw_power["power_w"].to_list())
    assert agg_power["energy_j_total"].equals(raw_power["energy_j_total"])


def test_write_every_below_the_interval_is_refused(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, write_every_s=0.01), environ={})
    with pytest.raises(ConfigError, match="write_every_s"):
        agent_cli.build_agent(config, Collect())
    ok = load_config(write_config(tmp_path, write_every_s=1.0), environ={})
    agent, _ = agent_cli.build_agent(ok, Collect())
    assert isinstance(agent.sink, AggregatingSink)
    agent.run(threading.Event(), max_cycles=2)  # stop writes what was held
    assert agent.sink.sink.closed and agent.sink.sink.points
