"""Outage on the real server (Debian's influxd): stop it mid-stream, restart the writer during
the outage, bring the server back on the same data directory. Nothing is lost; with a small
spool bound, the reported drop count is exactly what is missing. Points are generated."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpuwarden.core.store.reader import InfluxReader

pytestmark = [pytest.mark.influxdb, pytest.mark.slow]


def _writer(influxd, db, spool, *extra):
    cmd = [
        sys.executable,
        "-m",
        "tests.outage_writer",
        "--url",
        influxd.url,
        "--db",
        db,
        "--spool",
        str(spool),
        *map(str, extra),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["started"]
    return proc


def _result(proc, timeout=120):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def _stored_seqs(influxd, db):
    df = InfluxReader(influxd.url, db).raw('SELECT "seq" FROM "seq"')
    return [int(v) for v in df.get_column("seq").to_list()] if df.height else []


def _outage(influxd, db, tmp_path, *extra, outage_s=1.5):
    spool = tmp_path / "spool"
    first = _writer(influxd, db, spool, "--rate", 2000, *extra)
    time.sleep(1.0)
    influxd.stop()  # the outage starts while the writer streams
    time.sleep(outage_s / 2)
    first.terminate()  # the writer restarts during the outage
    stopped = _result(first)
    assert stopped["spooled"] > 0  # it had data it could not send
    second = _writer(
        influxd, db, spool, "--start", stopped["next"], "--count", 2000, "--rate", 2000, *extra
    )
    time.sleep(outage_s / 2)
    influxd.start()  # back on the same data directory
    done = _result(second)
    assert done["flushed"]
    return stopped["next"] + 2000, done


def test_outage_and_writer_restart_lose_nothing(influxd, influx_db, tmp_path):
    total, done = _outage(influxd, influx_db, tmp_path)
    assert done["dropped_total"] == 0
    seqs = _stored_seqs(influxd, influx_db)
    assert sorted(seqs) == list(range(total))  # every point, each exactly once


def test_small_spool_bound_reports_exactly_what_is_missing(influxd, influx_db, tmp_path):
    total, done = _outage(
        influxd, influx_db, tmp_path, "--spool-max-bytes", 48 * 1024, outage_s=3.0
    )
    stored = _stored_seqs(influxd, influx_db)
    missing = total - len(stored)
    assert len(set(stored)) == len(stored)
    assert missing > 0, "the bound was meant to be hit"
    assert done["dropped_total"] == missing
    # What was dropped is the oldest spooled data: a contiguous gap, not scattered points.
    gaps = sorted(set(range(total)) - set(stored))
    assert gaps == list(range(gaps[0], gaps[0] + len(gaps)))
