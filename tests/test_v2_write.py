"""The v2 write path (influxdb-client) against a real server that speaks /api/v2/write:
Debian's victoria-metrics. Production v2 targets are InfluxDB 2.x and 3.x; InfluxDB 1.6.7
has no /api/v2/write (it answers 404, which the sink treats as a configuration error)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.store.transport import Outcome, V2Transport


def _export(url: str, metric: str) -> list[dict]:
    q = urllib.parse.urlencode({"match[]": f'{{__name__="{metric}"}}'})
    with urllib.request.urlopen(f"{url}/api/v1/export?{q}") as resp:
        return [json.loads(line) for line in resp.read().decode().splitlines() if line]


def test_v2_write_reaches_a_real_server(victoria, tmp_path):
    cfg = SinkConfig(
        url=victoria,
        api="v2",
        org="gpuwarden",
        bucket="telemetry",
        token="t",
        spool_dir=str(tmp_path / "spool"),
        flush_interval_s=0.05,
        precision="ms",
    )
    sink = InfluxSink(cfg)
    t0 = 1_700_000_000_000_000_000
    sink.write_points(
        Point("gpu", {"node": "n1", "gpu": str(g)}, {"power_w": 100.0 + g}, t0 + i * 10**9)
        for g in range(8)
        for i in range(5)
    )
    assert sink.close(timeout_s=20)
    assert sink.stats().points_written == 40
    urllib.request.urlopen(f"{victoria}/internal/force_flush").read()
    series = _export(victoria, "gpu_power_w")
    assert len(series) == 8
    for s in series:
        g = int(s["metric"]["gpu"])
        assert s["values"] == [100.0 + g] * 5
        assert s["timestamps"] == [t0 // 10**6 + i * 1000 for i in range(5)]


def test_v2_against_influxdb_1x_is_a_configuration_error(influxd):
    result = V2Transport(influxd.url, org="o", bucket="b", token="t").send(b"m v=1 1", 1)
    assert result.outcome is Outcome.PARK and result.status == 404
