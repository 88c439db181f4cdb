"""The InfluxQL reader: typed frames by the catalogue, and no injection through names."""

from __future__ import annotations

import polars as pl
import pytest

from core.store.lineprotocol import Point
from core.store.reader import InfluxReader, QueryError, build_select, quote_ident, quote_literal
from core.store.sink import InfluxSink, SinkConfig

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
