"""Traces on disk and their replay through the sink into the real InfluxDB.

The week-of-faults trace is SIMULATED (scenario week-mixed); its fault process is the real
StepFun trace compressed 10x, its marginals the real AcmeTrace CDFs.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.store.trace import NS, TraceError, TraceReader, TraceWriter, replay
from gpuwarden.simulation.cli import generate_trace, main


def _count(influxd, db, measurement, field):
    body = json.loads(influxd.query(f'SELECT count("{field}") FROM "{measurement}"', db))
    series = body["results"][0].get("series")
    return 0 if not series else int(series[0]["values"][0][1])


def test_week_of_mixed_faults_lands_exactly_with_its_ground_truth(influxd, influx_db, tmp_path):
    """Must-show 1: 64 nodes, a week, replayed into the real server; every measurement's
    point count matches the trace exactly, and the ground truth is queryable beside it."""
    trace = generate_trace("week-mixed", seed=3, out=tmp_path / "week")
    m = trace.manifest
    assert m.simulated and "week-mixed" in m.origin
    assert m.measurements["gpu"].points > 400_000
    sink = InfluxSink(
        SinkConfig(
            url=influxd.url,
            database=influx_db,
            spool_dir=str(tmp_path / "spool"),
            batch_size=10_000,
            backpressure_bytes=16 * 2**20,
        )
    )
    assert m.start_ns is not None
    shift = 1_700_000_000 * NS - m.start_ns  # moved into a fixed past window
    stats = replay(trace.chunks(), m.tags, sink, shift_ns=shift)
    assert sink.close(timeout_s=300)
    assert sink.stats().points_rejected == 0 and sink.stats().points_dropped == 0
    assert stats.total == m.points
    # one field every point of the measurement carries
    always = {
        "gpu": "gpu_util_pct",
        "ib_port": "port_xmit_data_bytes_total",
        "job_step": "step_time_s",
        "gpu_event": "xid_code",
        "job_model": "params_count",
        "scenario_fault": "phase_code",
    }
    for meas, info in m.measurements.items():
        assert _count(influxd, influx_db, meas, always[meas]) == info.points, meas
    truth = json.loads(
        influxd.query(
            'SELECT "fault_id","phase_code","kind","node" FROM "scenario_fault" '
            'WHERE "phase_code" = 2',
            influx_db,
        )
    )["results"][0]["series"][0]
    cols = truth["columns"]
    onsets = [dict(zip(cols, v, strict=True)) for v in truth["values"]]
    assert {o["kind"] for o in onsets} >= {"slow_gpu", "tor_congestion"}
    assert all(o["time"] >= 1_700_000_000 * NS for o in onsets)
    # and the telemetry shows it: an XID onset in the truth has its gpu_event at that time
    xids = [o for o in onsets if o["kind"] == "xid79"]
    for o in xids:
        ev = json.loads(
            influxd.query(
                f'SELECT "xid_code" FROM "gpu_event" WHERE time = {o["time"]} '
                f"AND \"node\" = '{o['node']}'",
                influx_db,
            )
        )["results"][0]
        assert ev["series"][0]["values"][0][1] == 79


def test_trace_round_trip_keeps_types_and_absent_fields(tmp_path):
    w = TraceWriter(tmp_path / "t", "recorded: test", simulated=False)
    df = pl.DataFrame(
        {
            "time": [1 * NS, 2 * NS],
            "node": ["a", "b"],
            "v": [1.5, None],
            "n": [3, 4],
        }
    )
    w.write_frame(df, "m", tags=["node"])
    w.next_chunk()
    w.write_frame(df.with_columns(pl.col("time") + 10 * NS), "m", tags=["node"])
    man = w.close()
    r = TraceReader(tmp_path / "t")
    assert r.manifest.points == 4 == man.points and not r.manifest.simulated
    chunks = list(r.chunks())
    assert len(chunks) == 2
    assert chunks[0]["m"].equals(df.select("node", "v", "n", "time"))
    assert chunks[0]["m"]["v"][1] is None  # absent stays absent


def test_trace_errors_are_clear(tmp_path):
    with pytest.raises(TraceError, match="no manifest"):
        TraceReader(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "other"}')
    with pytest.raises(TraceError, match="format"):
        TraceReader(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(TraceError, match="malformed"):
        TraceReader(tmp_path)
    with pytest.raises(TraceError, match="already holds"):
        TraceWriter(tmp_path, "x", simulated=True)


class _Collect:
    def __init__(self):
        self.frames = []

    def write_frame(self, df, measurement, *, tags, time="time", fields=None):
        self.frames.append((measurement, df))


def test_paced_replay_follows_trace_time_at_the_asked_speed():
    df = pl.DataFrame({"time": [k * NS for k in range(10)], "node": ["a"] * 10, "v": [1.0] * 10})
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    sink = _Collect()
    stats = replay(
        iter([{"m": df}]),
        {"m": ["node"]},
        sink,
        speed=2.0,
        shift_ns=5 * NS,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert stats.total == 10
    assert now[0] == pytest.approx(4.5)  # 9 trace seconds at 2x
    times = pl.concat([f for _, f in sink.frames])["time"].to_list()
    assert times == [(k + 5) * NS for k in range(10)]


def test_cli_generate_and_truth(tmp_path, capsys):
    assert main(["generate", "xid79-mid-run", "--seed", "1", "--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "gpu_event" in out
    assert main(["truth", str(tmp_path / "x")]) == 0
    assert "xid79" in capsys.readouterr().out
    assert main(["replay", str(tmp_path / "nope")]) == 2
    assert "no manifest" in capsys.readouterr().err
