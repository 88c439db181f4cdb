"""Recorded traces: what the agent (or a scenario) would send, kept on disk, replayed later.

Format: a directory with one Parquet file per chunk and measurement, and a ``manifest.json``::

    trace/
      manifest.json                  # format, origin (simulated or recorded), time range,
                                     # per measurement: tags, fields, points
      000000-gpu.parquet             # chunk 0, measurement gpu: one row per point
      000000-ib_port.parquet
      000001-gpu.parquet ...

Parquet rather than line-protocol files: typed columns (an integer stays an integer), about
10x smaller than line protocol, and a chunk loads as a polars frame that goes straight into
:meth:`InfluxSink.write_frame`, the vectorised encoder. Chunks are written in time order, so
a reader streams them in order without sorting the whole trace. A null cell is a field the
point does not have (written as absent, never as 0).

:func:`replay` streams a trace's chunks (from a :class:`TraceReader`, or straight from a
scenario generator) through a sink, the same one the agent uses, with timestamps shifted as
asked, in real time, accelerated (``speed``), or as fast as the server takes it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from gpuwarden.core.errors import StoreError

FORMAT = "gpuwarden-trace/1"
NS = 1_000_000_000


class TraceError(StoreError):
    """A trace directory is missing, incomplete or not a gpuwarden trace."""


class FrameSink(Protocol):
    def write_frame(
        self,
        df: pl.DataFrame,
        measurement: str,
        *,
        tags: Sequence[str],
        time: str = "time",
        fields: Sequence[str] | None = None,
    ) -> None: ...


@dataclass
class MeasurementInfo:
    tags: list[str]
    fields: list[str]
    points: int = 0


@dataclass
class Manifest:
    origin: str  # "simulated: scenario <name> seed <n>" or "recorded: <host>"
    simulated: bool
    start_ns: int | None = None
    end_ns: int | None = None
    chunks: int = 0
    measurements: dict[str, MeasurementInfo] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "origin": self.origin,
                "simulated": self.simulated,
                "start_ns": self.start_ns,
                "end_ns": self.end_ns,
                "chunks": self.chunks,
                "measurements": {
                    m: {"tags": i.tags, "fields": i.fields, "points": i.points}
                    for m, i in sorted(self.measurements.items())
                },
                "extra": self.extra,
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            d = json.loads(text)
            if d.get("format") != FORMAT:
                raise TraceError(f"{where}: format {d.get('format')!r}, expected {FORMAT!r}")
            return cls(
                origin=d["origin"],
                simulated=bool(d["simulated"]),
                start_ns=d["start_ns"],
                end_ns=d["end_ns"],
                chunks=int(d["chunks"]),
                measurements={
                    m: MeasurementInfo(list(i["tags"]), list(i["fields"]), int(i["points"]))
                    for m, i in d["measurements"].items()
                },
                extra=dict(d.get("extra", {})),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"{where}: malformed manifest ({exc})") from None

    @property
    def points(self) -> int:
        return sum(i.points for i in self.measurements.values())

    @property
    def tags(self) -> dict[str, list[str]]:
        """Tag columns per measurement, as :func:`replay` wants them."""
        return {m: i.tags for m, i in self.measurements.items()}


class TraceWriter:
    """Writes a trace; has the sink's ``write_frame`` signature so the agent can record
    (``--record DIR``) exactly what it would have sent. Call :meth:`next_chunk` between
    time-ordered chunks and :meth:`close` at the end (the manifest is written last, so a
    trace without one is known to be incomplete)."""

    def __init__(self, directory: str | Path, origin: str, *, simulated: bool) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if (self.directory / "manifest.json").exists() or any(self.directory.glob("*.parquet")):
            raise TraceError(f"{self.directory} already holds a trace; choose an empty directory")
        self.manifest = Manifest(origin=origin, simulated=simulated)
        self._chunk = 0
        self._wrote_in_chunk = False

    def write_frame(
        self,
        df: pl.DataFrame,
        measurement: str,
        *,
        tags: Sequence[str],
        time: str = "time",
        fields: Sequence[str] | None = None,
    ) -> None:
        if df.height == 0:
            return
        if fields is None:
            fields = [c for c in df.columns if c not in tags and c != time]
        frame = df.select([*tags, *fields, pl.col(time).alias("time")])
        path = self.directory / f"{self._chunk:06d}-{measurement}.parquet"
        if path.exists():  # a second frame of the same measurement in this chunk
            frame = pl.concat([pl.read_parquet(path), frame], how="diagonal_relaxed")
        frame.write_parquet(path, compression="zstd")
        info = self.manifest.measurements.setdefault(
            measurement, MeasurementInfo(list(tags), list(fields))
        )
        info.fields = sorted(set(info.fields) | set(fields), key=list(frame.columns).index)
        info.points += df.height
        lo, hi = int(df[time].min()), int(df[time].max())  # type: ignore[arg-type]
        m = self.manifest
        m.start_ns = lo if m.start_ns is None else min(m.start_ns, lo)
        m.end_ns = hi if m.end_ns is None else max(m.end_ns, hi)
        self._wrote_in_chunk = True

    def next_chunk(self) -> None:
        if self._wrote_in_chunk:
            self._chunk += 1
            self._wrote_in_chunk = False

    def close(self, **extra: Any) -> Manifest:
        self.next_chunk()
        self.manifest.chunks = self._chunk
        self.manifest.extra.update(extra)
        tmp = self.directory / "manifest.json.tmp"
        tmp.write_text(self.manifest.to_json(), encoding="utf-8")
        tmp.replace(self.directory / "manifest.json")
        return self.manifest


class TraceReader:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        path = self.directory / "manifest.json"
        if not path.exists():
            raise TraceError(
                f"{self.directory}: no manifest.json (not a trace, or its writer did not finish)"
            )
        self.manifest = Manifest.from_json(path.read_text(encoding="utf-8"), str(path))

    def chunks(self) -> Iterator[dict[str, pl.DataFrame]]:
        for k in range(self.manifest.chunks):
            out = {}
            for m in self.manifest.measurements:
                p = self.directory / f"{k:06d}-{m}.parquet"
                if p.exists():
                    out[m] = pl.read_parquet(p)
            yield out


@dataclass
class ReplayStats:
    points: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.points.values())


def replay(
    chunks: Iterator[dict[str, pl.DataFrame]],
    tags: dict[str, list[str]],
    sink: FrameSink,
    *,
    shift_ns: int = 0,
    speed: float = 0.0,
    progress: Callable[[ReplayStats], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReplayStats:
    """Stream chunks into ``sink`` with timestamps moved by ``shift_ns``.

    ``speed`` 0 sends as fast as the sink takes it (the sink's backpressure paces it);
    1 is real time (one trace second per wall second); 60 is an hour a minute. Paced
    replays release each trace second's points when its time comes.
    """
    stats = ReplayStats()
    wall0 = clock()
    trace0: int | None = None
    for chunk in chunks:
        if not chunk:
            continue
        frames = {m: _shift(df, shift_ns) for m, df in chunk.items()}
        if speed <= 0:
            for m, df in frames.items():
                sink.write_frame(df, m, tags=_present(tags[m], df))
                stats.points[m] = stats.points.get(m, 0) + df.height
        else:
            lo = min(int(df["time"].min()) for df in frames.values())  # type: ignore[arg-type]
            hi = max(int(df["time"].max()) for df in frames.values())  # type: ignore[arg-type]
            if trace0 is None:
                trace0 = lo
            for sec in range(lo // NS, hi // NS + 1):
                due = wall0 + (sec * NS - trace0) / NS / speed
                if (wait := due - clock()) > 0:
                    sleep(wait)
                for m, df in frames.items():
                    part = df.filter(
                        (pl.col("time") >= sec * NS) & (pl.col("time") < (sec + 1) * NS)
                    )
                    if part.height:
                        sink.write_frame(part, m, tags=_present(tags[m], part))
                        stats.points[m] = stats.points.get(m, 0) + part.height
        stats.wall_s = clock() - wall0
        if progress is not None:
            progress(stats)
    stats.wall_s = clock() - wall0
    return stats


def _shift(df: pl.DataFrame, shift_ns: int) -> pl.DataFrame:
    return df.with_columns(pl.col("time") + shift_ns) if shift_ns else df


def _present(tags: Sequence[str], df: pl.DataFrame) -> list[str]:
    return [t for t in tags if t in df.columns]
