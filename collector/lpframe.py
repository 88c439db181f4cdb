"""Vectorised line-protocol encoding of a polars frame: one row is one point.

The same rules as :mod:`collector.lineprotocol`, built as polars expressions so a batch of a
million points encodes in about a second on one core instead of half a minute in a Python
loop. Two traps handled here:

* ``concat_str`` makes a whole line null when one input is null. A null field (the hardware
  does not support it) must only leave that field out, so each ``key=value`` piece is built
  null-or-text and joined with ``ignore_nulls=True``.
* a NaN or inf float is never written: the piece is nulled and counted; a row left without
  any field is dropped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from collector.catalogue import CATALOGUE, FieldType
from collector.errors import LineProtocolError
from collector.lineprotocol import (
    INT64_MAX,
    EncodeStats,
    Precision,
    escape_key,
    escape_measurement,
)

_STRING_DTYPES = (pl.String, pl.Categorical, pl.Enum)


def _field_type(dtype: pl.DataType, column: str) -> FieldType:
    if dtype.is_float():
        return FieldType.FLOAT
    if dtype.is_integer():
        return FieldType.INTEGER
    if dtype == pl.Boolean:
        return FieldType.BOOLEAN
    if isinstance(dtype, _STRING_DTYPES):
        return FieldType.STRING
    raise LineProtocolError(f"column {column!r} has dtype {dtype}, which is not a field type")


def _escape_key_expr(expr: pl.Expr) -> pl.Expr:
    return (
        expr.str.replace_all(",", r"\,", literal=True)
        .str.replace_all("=", r"\=", literal=True)
        .str.replace_all(" ", r"\ ", literal=True)
    )


def _check_tag_column(series: pl.Series, column: str) -> None:
    bad = series.filter(series.str.contains("[\n\r]") | series.str.ends_with("\\"))
    if len(bad):
        raise LineProtocolError(
            f"tag {column!r} value {bad[0]!r} cannot be written (line break or trailing '\\')"
        )


def encode_frame(
    df: pl.DataFrame,
    measurement: str,
    *,
    tags: Sequence[str],
    fields: Sequence[str] | None = None,
    time: str = "time",
    precision: Precision = Precision.NS,
    stats: EncodeStats | None = None,
) -> pl.Series:
    """Encode ``df`` into a String series of lines (no trailing newlines).

    ``time`` is an integer column of nanoseconds since the epoch, or a Datetime column.
    ``fields`` defaults to every column that is neither a tag nor the time. When the
    measurement is in the catalogue, each field's dtype must match its declared type.
    """
    if stats is None:
        stats = EncodeStats()
    if fields is None:
        fields = [c for c in df.columns if c not in tags and c != time]
    if not fields:
        raise LineProtocolError("a point needs at least one field column")
    declared = CATALOGUE.get(measurement)

    head: list[pl.Expr] = [pl.lit(escape_measurement(measurement))]
    for tag in sorted(tags):
        col = df.get_column(tag).cast(pl.String)
        _check_tag_column(col, tag)
        value = pl.col(tag).cast(pl.String)
        piece = pl.lit(f",{escape_key(tag, 'tag key')}=") + _escape_key_expr(value)
        head.append(pl.when(value != "").then(piece))

    pieces: list[pl.Expr] = []
    invalid: list[pl.Expr] = []
    for name in fields:
        dtype = df.schema[name]
        if dtype == pl.Null:  # all values absent: nothing to write for this field
            continue
        ftype = _field_type(dtype, name)
        if declared is not None:
            want = declared.field(name).type
            if want is not ftype:
                raise LineProtocolError(
                    f"{measurement}.{name}: declared {want}, column dtype {dtype} gives {ftype}"
                )
        key = pl.lit(f"{escape_key(name, 'field key')}=")
        col = pl.col(name)
        if ftype is FieldType.FLOAT:
            ok = col.is_finite()
            invalid.append(col.is_not_null() & ~ok)
            pieces.append(pl.when(ok).then(key + col.cast(pl.String)))
        elif ftype is FieldType.INTEGER:
            text = key + col.cast(pl.String) + pl.lit("i")
            if dtype == pl.UInt64:
                ok = col <= INT64_MAX
                invalid.append(col.is_not_null() & ~ok)
                pieces.append(pl.when(ok).then(text))
            else:
                pieces.append(text)
        elif ftype is FieldType.BOOLEAN:
            text = pl.when(col).then(pl.lit("true")).when(~col).then(pl.lit("false"))  # null stays
            pieces.append(key + text)
        else:
            escaped = (
                col.cast(pl.String)
                .str.replace_all("\\", "\\\\", literal=True)
                .str.replace_all('"', '\\"', literal=True)
            )
            pieces.append(key + pl.lit('"') + escaped + pl.lit('"'))

    time_col = df.schema[time]
    ts = pl.col(time)
    if isinstance(time_col, pl.Datetime):
        ts = ts.dt.cast_time_unit("ns").cast(pl.Int64)
    elif not time_col.is_integer():
        raise LineProtocolError(f"time column {time!r} must be integer ns or Datetime")
    if precision is not Precision.NS:
        ts = ts // precision.ns_per_unit

    joined = (
        pl.concat_str(pieces, separator=",", ignore_nulls=True) if pieces else pl.lit("")
    )
    out = df.select(
        pl.concat_str(head, separator="", ignore_nulls=True).alias("head"),
        joined.alias("fields"),
        ts.cast(pl.String).alias("ts"),
        *[pl.sum_horizontal(invalid).alias("invalid")] if invalid else [],
    )
    has_fields = out.get_column("fields") != ""
    n_in = df.height
    n_out = int(has_fields.sum())
    stats.points_in += n_in
    stats.points_out += n_out
    stats.points_dropped += n_in - n_out
    if invalid:
        n_invalid = int(out.get_column("invalid").sum())
        if n_invalid:
            stats.fields_dropped += n_invalid
            key = "nan, inf or int64 overflow"
            stats.reasons[key] = stats.reasons.get(key, 0) + n_invalid
    kept = out.filter(has_fields)
    return kept.select(
        pl.concat_str([pl.col("head"), pl.col("fields"), pl.col("ts")], separator=" ")
    ).to_series()
