"""The InfluxQL reader: typed frames by the catalogue, and no injection through names."""

from __future__ import annotations

import polars as pl
import pytest

from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.reader import (
    InfluxReader,
    QueryError,
    build_select,
    quote_ident,
    quote_literal,
)
from gpuwarden.core.store.sink import InfluxSink, SinkConfig

pytestmark = pytest.mark.influxdb


def test_quoting():
    assert quote_ident('we"ird\\name') == '"we\\"ird\\\\name"'
    assert quote_literal("it's\nx") == "'it\\'s\\nx'"
    q = build_select("gpu", ["power_w"], ["node"], 1, 2, {"node": ["a", "b'c"]})
    assert q == (
        'SELECT "power_w"::field, "node"::tag FROM "gpu" WHERE time >= 1 AND time < 2 '
        "AND (\"node\" = 'a' OR \"node\" = 'b\\'c')"
    )


@pytest.fixture
def loaded(influxd, influx_db, tmp_path):
    sink = InfluxSink(
        SinkConfig(url=influxd.url, database=influx_db, spool_dir=str(tmp_path / "s"))
    )
    sink.write_points(
        Point(
            "gpu",
            {"node": node, "gpu": str(g), "cluster": "c"},
            {
                "power_w": 200.0 + g,
                "ecc_dbe_volatile_total": g,
                "clock_event_hw_slowdown_active": g == 1,
            },
            10**18 + t * 10**9,
        )
        for node in ("n1", "n2", "x' OR '1'='1")
        for g in range(2)
        for t in range(3)
    )
    assert sink.close()
    return InfluxReader(influxd.url, influx_db)


def test_typed_read_by_catalogue(loaded):
    df = loaded.read(
        "gpu", fields=["power_w", "ecc_dbe_volatile_total", "clock_event_hw_slowdown_active"]
    )
    assert df.height == 18
    assert df.schema["power_w"] == pl.Float64
    assert df.schema["ecc_dbe_volatile_total"] == pl.Int64
    assert df.schema["clock_event_hw_slowdown_active"] == pl.Boolean
    assert df.schema["time"] == pl.Datetime("ns", "UTC")
    assert df.get_column("gpu_uuid").null_count() == 18  # declared tag never written: null
    assert df.filter(pl.col("gpu") == "1").get_column("clock_event_hw_slowdown_active").all()


def test_time_range_and_tag_filter(loaded):
    df = loaded.read(
        "gpu", 10**18 + 10**9, 10**18 + 3 * 10**9, fields=["power_w"], where={"node": "n2"}
    )
    assert df.height == 4 and set(df.get_column("node")) == {"n2"}


def test_tag_value_cannot_inject(loaded):
    hostile = "x' OR '1'='1"
    df = loaded.read("gpu", fields=["power_w"], where={"node": hostile})
    assert df.height == 6 and set(df.get_column("node")) == {hostile}
    assert loaded.read("gpu", fields=["power_w"], where={"node": "n1' OR node='n2"}).height == 0


def test_bad_query_is_a_clear_error(loaded):
    with pytest.raises(QueryError, match="error parsing query"):
        loaded.raw("SELEC nonsense")


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(QueryError, match="unreachable"):
        InfluxReader("http://127.0.0.1:9", "db").raw("SELECT * FROM x")


@pytest.mark.parametrize("every_s", [2, 3, 60])
def test_aggregating_here_answers_what_influxdb_answers(influxd, influx_db, tmp_path, every_s):
    """``aggregate(here=True)`` reads the points and buckets them in polars; the frame must be
    the one InfluxDB's own ``GROUP BY time`` gives, nulls, gaps and unaligned points included
    (REAL influxd; CONSTRUCTED points)."""
    sink = InfluxSink(
        SinkConfig(url=influxd.url, database=influx_db, spool_dir=str(tmp_path / "s"))
    )
    points = []
    for node in ("n1", "n2"):
        for port in ("1", "2"):
            for t in (0, 1, 2, 4, 5, 11, 12, 30, 61, 62):  # gaps, unaligned, several per bucket
                fields: dict[str, float | int] = {"port_xmit_wait_total": t * 7 + int(port)}
                if t % 4:  # a field missing from some points: last() takes the last it has
                    fields["rate_gbps"] = 100.0 + t + (node == "n2")
                when = 10**18 + t * 10**9 + (int(port) * 10**8)
                points.append(Point("ib_port", {"node": node, "hca": "mlx5_0", "port": port},
                                    fields, when))  # fmt: skip
    sink.write_points(points)
    assert sink.close()
    reader = InfluxReader(influxd.url, influx_db)
    aggregates = {
        "wait": "last:port_xmit_wait_total",
        "rate_last": "last:rate_gbps",
        "rate_first": "first:rate_gbps",
        "rate_mean": "mean:rate_gbps",
        "rate_max": "max:rate_gbps",
        "rate_min": "min:rate_gbps",
        "rate_sum": "sum:rate_gbps",
        "rate_n": "count:rate_gbps",
        "wait_median": "median:port_xmit_wait_total",
    }
    args = ("ib_port", aggregates, 10**18, 10**18 + 100 * 10**9)
    kw = {"every_s": every_s, "group_tags": ["node", "port"], "where": {"hca": "mlx5_0"}}
    server = reader.aggregate(*args, **kw).sort("node", "port", "time")
    here = reader.aggregate(*args, **kw, here=True)
    assert server.height >= 8  # at least two buckets for each of the 4 ports
    assert (server["rate_n"].null_count() > 0) == (every_s == 2)  # t=12 alone lacks rate_gbps
    assert here.schema == server.schema
    assert here.to_dicts() == server.to_dicts()


def test_aggregating_here_needs_buckets(loaded):
    with pytest.raises(ValueError, match="needs buckets"):
        loaded.aggregate("gpu", {"p": "last:power_w"}, 0, 1, every_s=None, group_tags=[],
                         here=True)  # fmt: skip
