"""The line-protocol encoders: exact escaping, typed values, NaN/inf never written."""

from __future__ import annotations

import math
import re

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.core.catalogue import CATALOGUE
from gpuwarden.core.errors import LineProtocolError
from gpuwarden.core.store.lineprotocol import (
    EncodeStats,
    Point,
    Precision,
    encode_point,
    encode_points,
)
from gpuwarden.core.store.lineprotocol.frame import encode_frame, plan_fields
from tests import strategies as hs


def test_escaping_of_every_special_character():
    p = Point(
        "gpu metrics,x",
        {"no de": "a,b=c d", "k=ey": "back\\slash"},
        {"f,i eld": 1.5, "s": 'say "hi" \\ and\nnewline', "n": -3, "b": False},
        1_700_000_000_123_456_789,
    )
    assert encode_point(p) == (
        r"gpu\ metrics\,x,k\=ey=back\slash,no\ de=a\,b\=c\ d "
        'f\\,i\\ eld=1.5,s="say \\"hi\\" \\\\ and\nnewline",n=-3i,b=false '
        "1700000000123456789"
    )


def test_precision_truncates_to_the_unit():
    p = Point("m", {}, {"v": 1}, 1_700_000_000_999_999_999)
    assert encode_point(p, Precision.S) == "m v=1i 1700000000"
    assert encode_point(p, Precision.MS) == "m v=1i 1700000000999"
    assert encode_point(p, Precision.NS) == "m v=1i 1700000000999999999"


def test_non_finite_fields_are_dropped_and_counted():
    stats = EncodeStats()
    lines = encode_points(
        [
            Point("m", {"t": "a"}, {"ok": 1.0, "bad": math.nan, "worse": math.inf}, 1),
            Point("m", {"t": "b"}, {"only": -math.inf}, 2),
            Point("m", {"t": "c"}, {"big": 2**63}, 3),
        ],
        stats=stats,
    )
    assert lines == ["m,t=a ok=1.0 1"]
    assert (stats.points_in, stats.points_out, stats.points_dropped) == (3, 1, 2)
    assert stats.fields_dropped == 4
    assert stats.reasons == {"nan": 1, "inf": 2, "int64 overflow": 1}


def test_empty_tag_value_means_no_tag():
    assert encode_point(Point("m", {"a": "", "b": "x"}, {"v": True}, 5)) == "m,b=x v=true 5"


@pytest.mark.parametrize(
    "point",
    [
        Point("", {}, {"v": 1}, 0),
        Point("#comment", {}, {"v": 1}, 0),
        Point("\tleading_tab", {}, {"v": 1}, 0),  # found by the round trip: InfluxDB skips it
        Point("\x00leading_nul", {}, {"v": 1}, 0),
        Point("m", {"t": "line\nbreak"}, {"v": 1}, 0),
        Point("m", {"t": "trailing\\"}, {"v": 1}, 0),
        Point("m", {"time": "x"}, {"v": 1}, 0),
        Point("m", {}, {"time": 1}, 0),
        Point("m", {}, {"": 1}, 0),
        Point("m", {}, {"\t": 0.0}, 0),  # found by the round trip: InfluxDB stores key ""
        Point("m", {}, {"a": 1, "\tb": 2}, 0),  # refused wherever it stands: one rule
    ],
)
def test_unrepresentable_names_raise(point):
    with pytest.raises(LineProtocolError):
        encode_point(point)


def test_frame_rejects_unrepresentable_tag_values():
    df = pl.DataFrame({"t": ["ok", "bad\\"], "v": [1.0, 2.0], "time": [1, 2]})
    with pytest.raises(LineProtocolError, match="bad"):
        encode_frame(df, "m", tags=["t"])


def test_frame_checks_catalogue_types():
    df = pl.DataFrame({"node": ["a"], "power_w": [300], "time": [1]})  # int, declared float
    with pytest.raises(LineProtocolError, match="power_w"):
        encode_frame(df, "gpu", tags=["node"])
    undeclared = pl.DataFrame({"node": ["a"], "made_up_w": [1.0], "time": [1]})
    with pytest.raises(LineProtocolError, match="made_up_w"):  # found by hypothesis: a KeyError
        encode_frame(undeclared, "gpu", tags=["node"])


def test_frame_nulls_leave_out_only_that_field():
    """The concat_str trap: one null input must not null the whole line."""
    df = pl.DataFrame(
        {
            "node": ["n1", None, "n3", "n4"],
            "power_w": [250.5, None, math.nan, None],
            "gpu_util_pct": [None, 50.0, 1.0, None],
            "time": [1, 2, 3, 4],
        }
    )
    stats = EncodeStats()
    lines = encode_frame(df, "gpu", tags=["node"], stats=stats).to_list()
    assert lines == [
        "gpu,node=n1 power_w=250.5 1",
        "gpu gpu_util_pct=50.0 2",
        "gpu,node=n3 gpu_util_pct=1.0 3",
    ]
    assert (stats.points_in, stats.points_out, stats.points_dropped) == (4, 3, 1)
    assert stats.fields_dropped == 1


_FLOAT_TOKEN = re.compile(r"(?<==)(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(?=[, ]|$)")


def _floats_normalised(line: str) -> str:
    return _FLOAT_TOKEN.sub(lambda m: repr(float(m.group(1))), line)


_column_values = st.one_of(
    st.lists(st.one_of(st.none(), st.floats()), min_size=4, max_size=4),
    st.lists(st.one_of(st.none(), hs.ints), min_size=4, max_size=4),
    st.lists(st.one_of(st.none(), st.booleans()), min_size=4, max_size=4),
    st.lists(st.one_of(st.none(), hs.string_values), min_size=4, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(
    # not a catalogued name: the vectorised path also checks fields against the catalogue
    measurement=hs.measurements.filter(lambda m: m not in CATALOGUE),
    tag_keys=st.lists(hs.names, max_size=3, unique=True),
    tag_values=st.lists(st.one_of(st.none(), hs.names), min_size=12, max_size=12),
    field_keys=st.lists(hs.field_keys, min_size=1, max_size=3, unique=True),
    columns=st.lists(_column_values, min_size=3, max_size=3),
    times=st.lists(st.integers(0, 2**62), min_size=4, max_size=4),
)
def test_vectorised_encoder_equals_scalar(
    measurement, tag_keys, tag_values, field_keys, columns, times
):
    """The polars path writes exactly what the reference per-point encoder writes."""
    field_keys = [k for k in field_keys if k not in tag_keys] or ["f_default"]
    data: dict[str, list[object]] = {}
    for i, key in enumerate(tag_keys):
        data[key] = tag_values[i * 4 : i * 4 + 4]
    for key, values in zip(field_keys, columns, strict=False):
        data[key] = values
    data["\x00time"] = times
    df = pl.DataFrame(data, strict=False)
    got_stats, want_stats = EncodeStats(), EncodeStats()
    got = encode_frame(df, measurement, tags=tag_keys, time="\x00time", stats=got_stats).to_list()
    points = []
    order = plan_fields(df, [k for k in data if k not in tag_keys and k != "\x00time"])
    for row in df.iter_rows(named=True):
        tags = {k: row[k] for k in tag_keys if row[k] is not None}
        fields = {k: row[k] for k in order if row[k] is not None}
        points.append(Point(measurement, tags, fields, row["\x00time"]))
    want = encode_points(points, stats=want_stats)
    # Both write each float's shortest round-trip digits, but pick scientific notation at
    # different magnitudes (6.103515625e-05 vs 0.00006103515625): compare float values.
    assert [_floats_normalised(x) for x in got] == [_floats_normalised(x) for x in want]
    assert (got_stats.points_out, got_stats.points_dropped, got_stats.fields_dropped) == (
        want_stats.points_out,
        want_stats.points_dropped,
        want_stats.fields_dropped,
    )
