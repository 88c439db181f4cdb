"""Read windows of telemetry out of InfluxDB into typed polars frames.

Queries are InfluxQL over the v1 ``/query`` endpoint (InfluxDB 1.x natively, 2.x/3.x through
their compatibility API) with ``chunked=true`` and ``Accept: application/csv``: the server
streams the result instead of building one huge JSON document (an unchunked export of 1M
points pushed InfluxDB 1.6.7 to 2.5 GB RSS; chunked CSV took 5.5 s).

CSV carries no types, so each column is cast by the metric catalogue (or by the types the
caller gives for a measurement outside it). Two things CSV cannot tell apart, documented here
because they are InfluxDB's, not ours: an empty string field reads back as null, and a tag
that is absent reads back as null.

Every name and value that reaches InfluxQL goes through :func:`quote_ident` or
:func:`quote_literal`, so a tag value cannot inject InfluxQL.
"""

from __future__ import annotations

import csv
import io
import threading
from collections.abc import Mapping, Sequence
from urllib.parse import urlencode

import polars as pl
import urllib3

from gpuwarden.core.catalogue import CATALOGUE, FieldType
from gpuwarden.core.errors import StoreError
from gpuwarden.core.store.transport import auth_headers

_ESCAPES = {"\\": "\\\\", "\n": "\\n"}


AGGREGATES = ("mean", "last", "first", "max", "min", "sum", "count", "median")
"""The InfluxQL aggregates :meth:`InfluxReader.aggregate` asks for."""


class QueryError(StoreError, RuntimeError):
    """InfluxDB refused or failed a query; the message is the server's."""


def _escape(text: str, quote: str) -> str:
    out = []
    for ch in text:
        if ch == quote:
            out.append("\\" + quote)
        else:
            out.append(_ESCAPES.get(ch, ch))
    return "".join(out)


def quote_ident(name: str) -> str:
    """A double-quoted InfluxQL identifier (measurement, tag or field key, database)."""
    return '"' + _escape(name, '"') + '"'


def quote_literal(value: str) -> str:
    """A single-quoted InfluxQL string literal (a tag value in a WHERE clause)."""
    return "'" + _escape(value, "'") + "'"


_POLARS_TYPES: Mapping[FieldType, pl.DataType] = {
    FieldType.FLOAT: pl.Float64(),
    FieldType.INTEGER: pl.Int64(),
    FieldType.STRING: pl.String(),
    FieldType.BOOLEAN: pl.Boolean(),
}


def build_where(
    start_ns: int | None = None,
    end_ns: int | None = None,
    where: Mapping[str, str | Sequence[str]] | None = None,
) -> str:
    """`` WHERE time range AND tag filters`` (empty when there is nothing to filter)."""
    conditions = []
    if start_ns is not None:
        conditions.append(f"time >= {int(start_ns)}")
    if end_ns is not None:
        conditions.append(f"time < {int(end_ns)}")
    for tag, wanted in (where or {}).items():
        values = [wanted] if isinstance(wanted, str) else list(wanted)
        if not values:
            raise ValueError(f"empty value list for tag {tag!r}")
        alternatives = " OR ".join(f"{quote_ident(tag)} = {quote_literal(v)}" for v in values)
        conditions.append(f"({alternatives})")
    return " WHERE " + " AND ".join(conditions) if conditions else ""


def build_select(
    measurement: str,
    fields: Sequence[str],
    tags: Sequence[str],
    start_ns: int | None = None,
    end_ns: int | None = None,
    where: Mapping[str, str | Sequence[str]] | None = None,
) -> str:
    """``SELECT fields, tags FROM m WHERE time range AND tag filters``; all names quoted."""
    if not fields:
        raise ValueError("select at least one field")
    columns = [f"{quote_ident(f)}::field" for f in fields]
    columns += [f"{quote_ident(t)}::tag" for t in tags]
    source = quote_ident(measurement)  # database and retention policy go as parameters
    return f"SELECT {', '.join(columns)} FROM {source}" + build_where(start_ns, end_ns, where)


class InfluxReader:
    """Construct, then query; the HTTP pool opens on first use."""

    def __init__(
        self,
        url: str,
        database: str,
        *,
        retention_policy: str | None = None,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout_s: float = 120.0,
        chunk_size: int = 10000,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"InfluxDB url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.database = database
        self.retention_policy = retention_policy
        self.chunk_size = chunk_size
        self.headers = {"Accept": "application/csv", **auth_headers(username, password, token)}
        self.timeout = urllib3.Timeout(connect=5.0, read=timeout_s)
        self._pool: urllib3.PoolManager | None = None
        self._pool_lock = threading.Lock()  # queries may come from several threads at once

    def query_csv(self, query: str) -> bytes:
        with self._pool_lock:
            if self._pool is None:
                self._pool = urllib3.PoolManager(num_pools=2, maxsize=4, retries=False)
        params = {
            "db": self.database,
            "q": query,
            "epoch": "ns",
            "chunked": "true",
            "chunk_size": str(self.chunk_size),
        }
        if self.retention_policy:
            params["rp"] = self.retention_policy
        try:
            resp = self._pool.request(
                "POST",
                f"{self.url}/query",
                body=urlencode(params),
                headers={**self.headers, "Content-Type": "application/x-www-form-urlencoded"},
                timeout=self.timeout,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise QueryError(f"InfluxDB at {self.url} unreachable: {exc}") from exc
        body = bytes(resp.data)
        if resp.status != 200:
            error = resp.headers.get("X-Influxdb-Error") or body.decode("utf-8", "replace")
            raise QueryError(f"query failed ({resp.status}): {error.strip()}")
        if body.startswith(b"error\n"):
            raise QueryError(body.decode("utf-8", "replace").split("\n", 1)[1].strip())
        return body

    def raw(self, query: str) -> pl.DataFrame:
        """The CSV result as strings, without the ``name`` and ``tags`` columns."""
        body = self.query_csv(query)
        frames = []
        for block in _blocks(body):
            header_line = block.split(b"\n", 1)[0].decode()
            header = next(csv.reader([header_line]))
            if header and header[0] == "error":
                raise QueryError(block.decode("utf-8", "replace"))
            # The first two columns are InfluxDB's own (series name and tags); name them so a
            # tag or field called "name" or "tags" cannot collide with them.
            columns = ["\0name", "\0tags", *header[2:]]
            df = pl.read_csv(
                io.BytesIO(block),
                has_header=False,
                skip_rows=1,
                new_columns=columns,
                infer_schema=False,
            )
            frames.append(df.drop("\0name", "\0tags"))
        if not frames:
            return pl.DataFrame()
        return pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]

    def read(
        self,
        measurement: str,
        start_ns: int | None = None,
        end_ns: int | None = None,
        *,
        fields: Mapping[str, FieldType] | Sequence[str] | None = None,
        tags: Sequence[str] | None = None,
        where: Mapping[str, str | Sequence[str]] | None = None,
    ) -> pl.DataFrame:
        """A typed frame: ``time`` (Datetime ns, UTC), the tag columns, the field columns.

        Types come from the catalogue; for a measurement outside it pass ``fields`` as a
        mapping of name to :class:`FieldType`.
        """
        types = _field_types(measurement, fields)
        tag_names = list(tags) if tags is not None else list(_catalogue_tags(measurement))
        query = build_select(measurement, list(types), tag_names, start_ns, end_ns, where)
        df = self.raw(query)
        schema: dict[str, pl.DataType] = {"time": pl.Datetime("ns", "UTC")}
        schema.update({t: pl.String() for t in tag_names})
        schema.update({name: _POLARS_TYPES[t] for name, t in types.items()})
        if df.is_empty():
            return pl.DataFrame(schema=schema)
        columns = []
        for name, dtype in schema.items():
            if name not in df.columns:
                columns.append(pl.lit(None, dtype=dtype).alias(name))
            elif name == "time":
                columns.append(pl.col("time").cast(pl.Int64).cast(dtype))
            elif dtype == pl.Boolean:
                columns.append((pl.col(name) == "true").alias(name))
            else:
                columns.append(pl.col(name).cast(dtype))
        return df.select(columns)

    def tag_values(
        self,
        measurement: str,
        tag: str,
        field: str,
        start_ns: int,
        end_ns: int,
        where: Mapping[str, str | Sequence[str]] | None = None,
    ) -> list[str]:
        """Values of ``tag`` that have points of ``field`` in the window (``SHOW TAG VALUES``
        cannot be limited to a time range on InfluxDB 1.x; a grouped count can)."""
        query = f"SELECT count({quote_ident(field)}) FROM {quote_ident(measurement)}"
        query += build_where(start_ns, end_ns, where)
        body = self.query_csv(f"{query} GROUP BY {quote_ident(tag)}")
        values: set[str] = set()
        for block in _blocks(body):
            rows = list(csv.reader(io.StringIO(block.decode("utf-8", "replace"))))
            for row in rows[1:]:
                if len(row) > 1 and row[1].startswith(f"{tag}="):
                    values.add(_unescape_tag(row[1][len(tag) + 1 :]))
        return sorted(v for v in values if v)

    def indexed_tag_values(
        self,
        measurement: str,
        tag: str,
        where: Mapping[str, str | Sequence[str]] | None = None,
    ) -> list[str]:
        """Values of ``tag`` in series matching ``where``, at any time: ``SHOW TAG VALUES``,
        answered from the series index without reading a point (so cheap at any fleet size,
        but a superset of :meth:`tag_values` for a window)."""
        query = f"SHOW TAG VALUES FROM {quote_ident(measurement)} WITH KEY = {quote_ident(tag)}"
        query += build_where(None, None, where)
        values: set[str] = set()
        for block in _blocks(self.query_csv(query)):
            rows = list(csv.reader(io.StringIO(block.decode("utf-8", "replace"))))
            if not rows or rows[0][-2:] != ["key", "value"]:
                continue
            values.update(row[-1] for row in rows[1:] if len(row) >= 2 and row[-2] == tag)
        return sorted(v for v in values if v)

    def aggregate(
        self,
        measurement: str,
        aggregates: Mapping[str, str],
        start_ns: int,
        end_ns: int,
        *,
        every_s: int | None,
        group_tags: Sequence[str],
        where: Mapping[str, str | Sequence[str]] | None = None,
        here: bool = False,
    ) -> pl.DataFrame:
        """``SELECT fn(field) AS alias ... GROUP BY time(every_s), tags fill(none)``, done by
        InfluxDB: ``aggregates`` maps an output column to ``"fn:field"`` (e.g.
        ``{"energy_j_total": "last:energy_j_total"}``). Columns come back as Float64 (InfluxQL
        aggregates of integers may be floats), tags as strings, ``time`` as Datetime.

        ``every_s=None``: one row per group over the whole range. A lone selector (``last``,
        ``first``, ``max``, ``min``) then carries the time of the point it picked (with two or
        more, InfluxDB answers time 0), which is how "when did each rank last report" is
        asked without reading its points.

        ``here=True`` (with ``every_s``): read the points and aggregate them in this process
        instead, to the same frame. InfluxDB 1.x's ``GROUP BY time`` costs it far more than
        the read when buckets hold few points: nine ``last()`` per 10 s bucket over the
        ``ib_port`` points of 32 nodes, one point per bucket, took influxd 10.3 s of CPU, the
        raw read of the same points 0.9 s (1.6.7; ``benchmarks/scale.py`` shows it at scale).
        The price is bytes on the wire: every point instead of one per bucket."""
        if not aggregates:
            raise ValueError("aggregate at least one field")
        selects = []
        for alias, spec in aggregates.items():
            fn, _, field = spec.partition(":")
            if fn not in AGGREGATES:
                raise ValueError(f"unsupported aggregate {fn!r}")
            selects.append(f"{fn}({quote_ident(field)}) AS {quote_ident(alias)}")
        if here:
            if every_s is None:
                raise ValueError("aggregating here needs buckets (every_s)")
            return self._aggregate_here(
                measurement, aggregates, start_ns, end_ns, every_s, group_tags, where
            )
        query = f"SELECT {', '.join(selects)} FROM {quote_ident(measurement)}"
        query += build_where(start_ns, end_ns, where)
        groups = [f"time({int(every_s)}s)"] if every_s is not None else []
        groups += [quote_ident(t) for t in group_tags]
        if groups:
            query += f" GROUP BY {', '.join(groups)}"
        if every_s is not None:
            query += " fill(none)"
        return self.aggregate_query(query, group_tags, list(aggregates))

    def aggregate_query(
        self, query: str, group_tags: Sequence[str], columns: Sequence[str]
    ) -> pl.DataFrame:
        """The answer to an aggregate ``query`` grouped by ``group_tags`` (one of
        :meth:`aggregate`'s, or a caller's own, e.g. with a condition on a field): ``time``,
        the tags as strings, ``columns`` as Float64."""
        body = self.query_csv(query)
        frames = []
        for block in _blocks(body):
            header = next(csv.reader([block.split(b"\n", 1)[0].decode()]))
            df = pl.read_csv(
                io.BytesIO(block),
                has_header=False,
                skip_rows=1,
                new_columns=["\0name", "\0tags", *header[2:]],
                infer_schema=False,
            )
            frames.append(df)
        schema: dict[str, pl.DataType] = {"time": pl.Datetime("ns", "UTC")}
        schema.update({t: pl.String() for t in group_tags})
        schema.update({a: pl.Float64() for a in columns})
        if not frames:
            return pl.DataFrame(schema=schema)
        df = pl.concat(frames, how="diagonal_relaxed")
        tag_exprs = [
            pl.col("\0tags")
            .str.extract(rf"(?:^|[^\\],){t}=((?:[^,\\]|\\.)*)", 1)
            .str.replace_all("\\,", ",", literal=True)
            .str.replace_all("\\=", "=", literal=True)
            .str.replace_all("\\ ", " ", literal=True)
            .alias(t)
            for t in group_tags
        ]
        return df.with_columns(tag_exprs).select(
            pl.col("time").cast(pl.Int64).cast(pl.Datetime("ns", "UTC")),
            *[pl.col(t) for t in group_tags],
            *[pl.col(a).cast(pl.Float64) for a in columns],
        )

    def _aggregate_here(
        self,
        measurement: str,
        aggregates: Mapping[str, str],
        start_ns: int,
        end_ns: int,
        every_s: int,
        group_tags: Sequence[str],
        where: Mapping[str, str | Sequence[str]] | None,
    ) -> pl.DataFrame:
        """:meth:`aggregate`'s answer, computed from the raw points: buckets aligned to the
        epoch as InfluxQL's are, each labelled by its start; each aggregate over the field's
        non-null values, null where the bucket has none (InfluxDB's ``count`` too); a bucket
        with no point left out (``fill(none)``)."""
        specs = {alias: spec.partition(":")[::2] for alias, spec in aggregates.items()}
        fields = sorted({f for _, f in specs.values()})
        types = {f: t for f, t in _field_types(measurement, fields).items()}
        df = self.read(measurement, start_ns, end_ns, fields=types, tags=list(group_tags),
                       where=where)  # fmt: skip
        every = int(every_s) * 10**9
        df = df.with_columns(
            pl.col(f).cast(pl.Float64) for f in fields if types[f] is not FieldType.STRING
        ).sort("time")
        bucket = (pl.col("time").dt.epoch("ns") // every * every).alias("\0bucket")
        exprs = []
        for alias, (fn, f) in specs.items():
            col = pl.col(f)
            expr = {
                "mean": col.mean(),
                "last": col.drop_nulls().last(),
                "first": col.drop_nulls().first(),
                "max": col.max(),
                "min": col.min(),
                "sum": pl.when(col.count() > 0).then(col.sum()),
                "count": pl.when(col.count() > 0).then(col.count()),
                "median": col.median(),
            }[fn]
            exprs.append(expr.cast(pl.Float64).alias(alias))
        keys = [*group_tags, "\0bucket"]
        out = df.with_columns(bucket).group_by(keys, maintain_order=True).agg(exprs)
        return out.select(
            pl.col("\0bucket").cast(pl.Datetime("ns", "UTC")).alias("time"),
            *[pl.col(t).cast(pl.String) for t in group_tags],
            *[pl.col(a) for a in aggregates],
        ).sort([*group_tags, "time"], nulls_last=False)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.clear()
            self._pool = None


def _unescape_tag(value: str) -> str:
    """InfluxDB's CSV ``tags`` column escapes commas, equals signs and spaces with a backslash."""
    return value.replace("\\,", ",").replace("\\=", "=").replace("\\ ", " ")


def _blocks(body: bytes) -> list[bytes]:
    """InfluxDB separates statements (and series with other columns) by a blank line and a
    new header; a header always starts with ``name,tags``."""
    parts = body.split(b"\n\nname,tags,")
    blocks = [parts[0]] + [b"name,tags," + p for p in parts[1:]]
    return [b for b in blocks if b.strip()]


def _catalogue_tags(measurement: str) -> tuple[str, ...]:
    m = CATALOGUE.get(measurement)
    return m.tags if m is not None else ()


def _field_types(
    measurement: str, fields: Mapping[str, FieldType] | Sequence[str] | None
) -> dict[str, FieldType]:
    if isinstance(fields, Mapping):
        return dict(fields)
    m = CATALOGUE.get(measurement)
    if m is None:
        raise ValueError(f"{measurement!r} is not in the catalogue: give fields with their types")
    names = list(fields) if fields is not None else list(m.fields)
    return {n: m.field(n).type for n in names}
