"""The agent loop, its outputs (InfluxDB, --once, --record), the fast path and the reporter.

NVML answers come from CONSTRUCTED recordings (tests/golden/nvml-*/nvml.json; no GPU was
available) and the sysfs trees are CONSTRUCTED (testbed/sysfstree.py), except where a test
says it uses the real kernel log; InfluxDB is the real server.
"""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.error
import urllib.request
from contextlib import redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from gpuwarden.collector import cli as agent_cli
from gpuwarden.collector import sources
from gpuwarden.collector.agent import Agent, TraceRecorder
from gpuwarden.collector.config import ConfigError, load_config
from gpuwarden.collector.jobside.reporter import Reporter
from gpuwarden.collector.nvml.backend import NvmlError
from gpuwarden.collector.nvml.recorded import RecordedBackend, Recorder
from gpuwarden.collector.relay import ReporterRelay
from gpuwarden.collector.sources.base import SourceContext, SourceError
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.lineprotocol.strict import parse_lines
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.core.store.trace import TraceReader, replay
from testbed.sysfstree import build_node_tree

GOLDEN = Path(__file__).parent / "golden"
H100 = GOLDEN / "nvml-h100-8gpu" / "nvml.json"
REAL_KMSG = GOLDEN / "xid-kmsg-real" / "kmsg.log"


def write_config(tmp: Path, influx_url: str = "", db: str = "x", **agent: object) -> Path:
    sysfs = tmp / "sys"
    build_node_tree(sysfs)
    (tmp / "proc").mkdir(exist_ok=True)
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in agent.items())
    text = f"""
[agent]
cluster = "test"
node = "node-a"
interval_s = 0.05
sysfs = "{sysfs}"
procfs = "{tmp / "proc"}"
reporter_listen = ""
{extra}
[nvml]
backend = "recorded"
recording = "{H100}"
loop = true
events = "poll"
jobmap_dir = ""

[xid]
path = "{REAL_KMSG}"
lookback_s = 0.0

[sink]
url = "{influx_url or "http://127.0.0.1:9"}"
database = "{db}"
spool_dir = "{tmp / "spool"}"
flush_interval_s = 0.05
"""
    path = tmp / "agent.toml"
    path.write_text(text)
    return path


def influx_sink(influxd, db: str, tmp: Path) -> InfluxSink:
    config = SinkConfig(url=influxd.url, database=db, spool_dir=str(tmp / "spool"),
                        flush_interval_s=0.05)  # fmt: skip
    return InfluxSink(config)


def query(influxd, db: str, q: str) -> list:
    answer = json.loads(influxd.query(q, db))
    series: list = answer["results"][0].get("series", [])
    return series


def test_agent_streams_a_node_into_influxdb(influxd, influx_db, tmp_path):
    """Must-show 3: the recorded 8-GPU backend and a built 8-HCA sysfs tree, through the real
    sink into the real influxd, read back with InfluxQL."""
    config = load_config(write_config(tmp_path, influxd.url, influx_db), environ={})
    sink = InfluxSink(config.sink)
    agent, _ = agent_cli.build_agent(config, sink, lambda: sink.stats().fields())
    agent.run(threading.Event(), max_cycles=3)  # closes (flushes) the sink
    counts = {
        m: query(influxd, influx_db, f"SELECT count(*) FROM {m}")[0]["values"][0]
        for m in ("gpu", "gpu_nvlink", "ib_port", "host_power", "thermal", "agent", "sink")
    }
    columns = query(influxd, influx_db, "SELECT count(gpu_util_pct) FROM gpu GROUP BY gpu")
    assert len(columns) == 8 and all(s["values"][0][1] == 3 for s in columns)
    ib = query(
        influxd, influx_db, "SELECT count(port_xmit_data_bytes_total) FROM ib_port GROUP BY hca"
    )
    assert sorted(s["tags"]["hca"] for s in ib) == [f"mlx5_{h}" for h in range(8)]
    last = query(
        influxd,
        influx_db,
        "SELECT last(port_xmit_data_bytes_total) FROM ib_port WHERE hca = 'mlx5_3'",
    )
    assert last[0]["values"][0][1] == 4 * (10**9 + 3 * 10**7 + 19)  # 4-byte words -> bytes
    nvlinks = query(influxd, influx_db, "SELECT count(tx_bytes_total) FROM gpu_nvlink")
    assert nvlinks[0]["values"][0][1] == 3 * 8 * 18
    ok = query(
        influxd,
        influx_db,
        "SELECT count(collect_success_active) FROM agent "
        "WHERE collect_success_active = true GROUP BY source",
    )
    assert {s["tags"]["source"] for s in ok} == {
        *("nvml", "xid", "infiniband", "power", "thermal", "host")
    }
    events = query(influxd, influx_db, "SELECT xid_code, fatal_active FROM gpu_event")
    assert [row[1] for row in events[0]["values"]] == [119] * 5  # the real kernel log
    assert all(c for c in counts.values())


def test_every_field_the_agent_writes_is_in_the_catalogue(tmp_path):
    """Must-show 2: a full cycle of every source is checked point by point."""
    config = load_config(write_config(tmp_path), environ={})
    printed: list[Point] = []

    class Capture:
        def write_points(self, points):
            printed.extend(points)

        def close(self, timeout_s=10.0):
            return True

    agent, _ = agent_cli.build_agent(config, Capture(), lambda: {"spool_bytes": 0})
    agent.run(threading.Event(), max_cycles=2)
    measurements = {p.measurement for p in printed}
    assert {
        "gpu",
        "gpu_nvlink",
        "gpu_process",
        "gpu_event",
        "ib_port",
        "host_power",
        "thermal",
        "agent",
        "sink",
    } <= measurements
    problems = [msg for p in printed for msg in check_point(p.measurement, p.tags, p.fields)]
    assert problems == []
    # and the check does catch a field that is not declared
    bad = Point("gpu", {"gpu": "0"}, {"gpu_util_percent": 1.0}, 0)
    assert check_point(bad.measurement, bad.tags, bad.fields)


class Failing:
    name = "broken"

    def collect(self, now_ns):
        raise OSError("the hardware lied")

    def close(self):
        pass


class Slow:
    name = "slow"

    def __init__(self, seconds):
        self.seconds = seconds
        self.calls = 0

    def collect(self, now_ns):
        self.calls += 1
        time.sleep(self.seconds)
        return [Point("thermal", {"zone": "z"}, {"temp_c": 1.0}, now_ns)]

    def close(self):
        pass


class Hung(Slow):
    """Stays in its call until ``release`` is set (a D-state read), however slow the test."""

    def __init__(self):
        super().__init__(0.0)
        self.release = threading.Event()

    def collect(self, now_ns):
        self.calls += 1
        self.release.wait(60)
        return [Point("thermal", {"zone": "z"}, {"temp_c": 1.0}, now_ns)]


class Fine:
    name = "fine"

    def collect(self, now_ns):
        return [Point("thermal", {"zone": "ok"}, {"temp_c": 40.0}, now_ns)]

    def close(self):
        pass


class ListSink:
    def __init__(self):
        self.batches = []
        self.closed = False

    def write_points(self, points):
        self.batches.append(list(points))

    def close(self, timeout_s=10.0):
        self.closed = True
        return True


def self_metrics(batch, source):
    return [p.fields for p in batch if p.measurement == "agent" and p.tags.get("source") == source]


def test_a_failing_or_slow_source_never_stops_the_others():
    sink = ListSink()
    slow = Hung()  # a fixed 0.6 s sleep returned, and was called again, on a stalled machine
    agent = Agent(
        [Failing(), slow, Fine()],
        sink,
        cluster="c",
        node="n",
        interval_s=0.05,
        source_timeout_s=0.2,
    )
    try:
        agent.run(threading.Event(), max_cycles=3)
    finally:
        slow.release.set()
    assert sink.closed
    for batch in sink.batches:
        assert [p.tags["zone"] for p in batch if p.measurement == "thermal"] == ["ok"]
        assert self_metrics(batch, "broken")[0]["collect_success_active"] is False
        assert self_metrics(batch, "fine")[0]["collect_success_active"] is True
        assert self_metrics(batch, "slow")[0]["collect_success_active"] is False
    # the cycle abandoned inside the slow source is collected afresh, so "broken" ran 4 times
    assert self_metrics(sink.batches[-1], "broken")[0]["errors_total"] == 4
    assert len(sink.batches) == 3
    assert slow.calls == 1  # not started again while its late call was still going


class Flaky:
    """Fails with the messages it is given, one per cycle ("" = works)."""

    name = "flaky"

    def __init__(self, script):
        self.script = list(script)

    def collect(self, now_ns):
        message = self.script.pop(0) if self.script else ""
        if message:
            raise RuntimeError(message)
        return [Point("thermal", {"zone": "f"}, {"temp_c": 1.0}, now_ns)]

    def close(self):
        pass


def test_a_source_that_keeps_failing_is_logged_once_per_streak_and_error(caplog):
    script = ["no driver"] * 5 + ["driver too old"] * 3 + [""] * 2 + ["no driver"]
    agent = Agent([Flaky(script)], ListSink(), cluster="c", node="n")
    caplog.set_level("DEBUG", logger="gpuwarden.collector.agent")
    batches = [agent.collect(i) for i in range(len(script))]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    again = "(logged again when the error changes or it recovers)"
    assert warnings == [
        f"source flaky failed: no driver {again}",
        f"source flaky failed: driver too old {again}",
        "source flaky works again after 8 failed cycle(s)",
        f"source flaky failed: no driver {again}",
    ]
    # every failed cycle is still in the self-metrics, and in the debug log
    success = [self_metrics(b, "flaky")[0]["collect_success_active"] for b in batches]
    assert success == [not message for message in script]
    assert self_metrics(batches[-1], "flaky")[0]["errors_total"] == 9
    assert sum("failed again" in r.getMessage() for r in caplog.records) == 6


class NoDriver(RecordedBackend):
    def __init__(self, code):
        super().__init__(H100)
        self.code = code

    def init(self):
        raise NvmlError(self.code, "nvmlInit")


@pytest.mark.parametrize(
    ("code", "says"),
    [(12, "LIBRARY_NOT_FOUND (libnvidia-ml.so.1 was not found"),
     (18, "LIB_RM_VERSION_MISMATCH (libnvidia-ml and the loaded kernel module"),
     (999, "nvmlInit: NVML_ERROR_UNKNOWN")],
)  # fmt: skip
def test_nvml_that_cannot_start_says_what_to_check(tmp_path, code, says):
    ctx = SourceContext("c", "n", sysfs=tmp_path, procfs=tmp_path)
    source = sources.create("nvml", ctx, {"backend_instance": NoDriver(code), "events": "poll"})
    with pytest.raises(SourceError, match="NVML did not initialise") as failed:
        source.collect(0)
    assert says in str(failed.value)


class SlowOnce(Slow):
    """Hangs on its first call only (a D-state read that ends)."""

    def collect(self, now_ns):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.seconds)
        return [Point("thermal", {"zone": "z"}, {"temp_c": 1.0}, now_ns)]


def test_a_source_that_hung_and_returned_is_said_to_work_again(caplog):
    caplog.set_level("WARNING", logger="gpuwarden.collector.agent")
    sink = ListSink()
    slow = SlowOnce(0.5)
    agent = Agent([slow, Fine()], sink, cluster="c", node="n", interval_s=0.05,
                  source_timeout_s=0.1)  # fmt: skip
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        for _ in range(400):  # until it has returned and run once more
            if slow.calls >= 2 and any("works again" in r.getMessage() for r in caplog.records):
                break
            time.sleep(0.02)
    finally:
        stop.set()
        runner.join(10)
    said = [r.getMessage() for r in caplog.records]
    assert any("source slow made no progress" in m for m in said)
    assert any(m.startswith("source slow works again after") for m in said)


def test_the_loop_keeps_its_schedule_and_skips_missed_ticks():
    sink = ListSink()
    agent = Agent([Slow(0.26)], sink, cluster="c", node="n", interval_s=0.1, source_timeout_s=1)
    agent.run(threading.Event(), max_cycles=2)
    assert agent.skipped_ticks >= 1  # a 0.26 s cycle at 0.1 s intervals misses ticks
    lags = [p.fields["cycle_lag_s"] for b in sink.batches for p in b if "cycle_lag_s" in p.fields]
    assert len(lags) == 2


def test_once_prints_one_cycle_of_line_protocol(tmp_path):
    out = io.StringIO()
    with redirect_stdout(out):
        assert agent_cli.main(["--config", str(write_config(tmp_path)), "--once"]) == 0
    lines = out.getvalue().splitlines()
    assert sum(1 for ln in lines if ln.startswith("gpu,")) == 8
    assert sum(1 for ln in lines if ln.startswith("ib_port,")) == 8
    measurements = {p.measurement for p in parse_lines("\n".join(lines), 0)}
    assert measurements >= {"gpu", "host_power", "thermal", "agent"}


def test_once_fails_when_a_source_fails_and_says_which(tmp_path, capsys):
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(str(H100), str(tmp_path / "missing.json")))
    assert agent_cli.main(["--config", str(config), "--once"]) == 1
    out, err = capsys.readouterr()
    assert "failed in this cycle: nvml (see the log)" in err
    summary = dict(line.split(None, 1) for line in err.splitlines() if line.startswith("  "))
    assert summary["nvml"].startswith("FAILED") and "missing.json" in summary["nvml"]
    assert summary["infiniband"].split() == ["ok", "8", "points"]  # one per port
    assert sum(1 for ln in out.splitlines() if ln.startswith("ib_port,")) == 8  # the rest ran


def test_record_then_replay_into_influxdb(influxd, influx_db, tmp_path):
    """Issue 4: the agent records what it would send; the replayer sends it later, exactly."""
    trace = tmp_path / "trace"
    cfg = write_config(tmp_path)
    assert agent_cli.main(["--config", str(cfg), "--record", str(trace), "--cycles", "2"]) == 0
    reader = TraceReader(trace)
    assert reader.manifest.simulated  # a recorded NVML backend is not a real GPU
    sink = influx_sink(influxd, influx_db, tmp_path)
    with sink:
        stats = replay(reader.chunks(), reader.manifest.tags, sink)
    assert stats.total == reader.manifest.points
    got = query(influxd, influx_db, "SELECT count(gpu_util_pct) FROM gpu")[0]["values"][0][1]
    assert got == reader.manifest.measurements["gpu"].points == 16


def test_recorder_round_trip(tmp_path):
    """The recorder's file answers exactly what the recorded backend answered."""
    ctx = SourceContext("c", "n", procfs=tmp_path)
    recorder = Recorder(RecordedBackend(H100), note="round trip of a constructed recording")
    live = sources.create("nvml", ctx, {"backend_instance": recorder, "events": "poll"})
    first = [live.collect(10**18 + i) for i in range(2)]
    live.close()
    recorder.save(tmp_path / "rec.json")
    replayed = sources.create(
        "nvml",
        ctx,
        {
            "backend": "recorded",
            "recording": str(tmp_path / "rec.json"),
            "events": "poll",
        },
    )
    second = [replayed.collect(10**18 + i) for i in range(2)]
    assert [[(p.tags, p.fields) for p in c] for c in first] == [
        [(p.tags, p.fields) for p in c] for c in second
    ]
    # re-recording a constructed file keeps it labelled constructed
    assert json.loads((tmp_path / "rec.json").read_text())["provenance"] == "constructed"


class Collect(BaseHTTPRequestHandler):
    received: ClassVar[list] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Collect.received.append((self.headers.get("Authorization"), json.loads(body)))
        self.send_response(202)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_fatal_events_take_the_fast_path(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/findings"
    cfg = write_config(
        tmp_path, remediation_url=url, remediation_token_file=str(token), sources=["nvml", "xid"]
    )
    text = cfg.read_text().replace(str(H100), str(GOLDEN / "nvml-gpu-lost" / "nvml.json"))
    cfg.write_text(text)
    config = load_config(cfg, environ={})
    sink = ListSink()
    agent, poster = agent_cli.build_agent(config, sink)
    agent.run(threading.Event(), max_cycles=3)
    assert poster is not None
    poster.close()
    server.shutdown()
    kinds = sorted({f["kind"] for _, f in Collect.received})
    assert kinds == ["gpu_lost", "gpu_xid"]
    assert {auth for auth, _ in Collect.received} == {"Bearer s3cret"}
    lost = [f for _, f in Collect.received if f["kind"] == "gpu_lost"]
    assert lost[0]["subject"] == {"cluster": "test", "node": "node-a", "gpu": "1"}
    findings = [p for b in sink.batches for p in b if p.measurement == "finding"]
    assert {p.tags["kind"] for p in findings} == {"gpu_lost", "gpu_xid"}  # slow path too


def test_reporter_through_the_agent_relay_into_influxdb(influxd, influx_db, tmp_path):
    sink = influx_sink(influxd, influx_db, tmp_path)
    relay = ReporterRelay("127.0.0.1:0", sink)
    relay.start()
    url = f"http://{relay.address[0]}:{relay.address[1]}"
    rep = Reporter("job-7", 3, url=url, cluster="test", node="node-a")
    rep.model(
        params=7 * 10**9,
        layers=32,
        hidden_size=4096,
        heads=32,
        seq_len=4096,
        world_size=64,
        dtype="bf16",
        gpu_model="NVIDIA H100 80GB HBM3",
    )
    for step in range(5):
        with rep.timed_step(step, tokens=4 * 4096, samples=4):
            pass
    assert rep.close()
    # a foreign measurement is refused with a message, not silently taken
    req = urllib.request.Request(f"{url}/write", b"gpu,node=x gpu_util_pct=1 1\n", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req)
    assert refused.value.code == 400 and b"not accepted" in refused.value.read()
    relay.close()
    sink.close()
    steps = query(influxd, influx_db, "SELECT step_index, tokens_count FROM job_step")
    assert [r[1] for r in steps[0]["values"]] == [0, 1, 2, 3, 4]
    model = query(influxd, influx_db, "SELECT params_count FROM job_model WHERE job = 'job-7'")
    assert model[0]["values"][0][1] == 7 * 10**9


def test_reporter_straight_to_influxdb(influxd, influx_db):
    rep = Reporter("job-8", 0, url=influxd.url, database=influx_db, cluster="test", node="n")
    rep.step(41, 1.25, tokens=8192, samples=2, loss=2.5)
    assert rep.close()
    rows = query(influxd, influx_db, "SELECT step_time_s, loss_ratio FROM job_step")
    assert rows[0]["values"][0][1:] == [1.25, 2.5]


def test_reporter_never_blocks_and_counts_what_it_drops():
    rep = Reporter("j", 0, url="http://127.0.0.1:9", max_queue=10)  # nothing listens there
    t0 = time.perf_counter()
    for step in range(100):
        rep.step(step, 0.1, 1, 1)
    assert time.perf_counter() - t0 < 5  # generous: it never waits for the network
    assert not rep.close(timeout_s=0.2)
    # (counted once the batch in flight is answered: lines a full queue pushed out of it are
    # dropped only if its send fails, tests/test_reporter_sending.py)
    assert rep.dropped >= 90


def test_an_environment_variable_naming_no_setting_is_said(caplog):
    """A typo in a DaemonSet's or a unit's variable left the default in force without a word
    (GPUWARDEN_HEALTH_EXPECTED_GPU: expected_gpus stayed 0, and a node missing a GPU passed).
    It is a warning, not a refusal: scripts keep switches of their own under the prefix."""
    with caplog.at_level("WARNING", logger="gpuwarden.core.config"):
        config = load_config(None, environ={"GPUWARDEN_HEALTH_EXPECTED_GPU": "8",
                                            "GPUWARDEN_BIN": "/opt/x"})  # fmt: skip
    assert config["health"]["expected_gpus"] == 0
    said = [r.getMessage() for r in caplog.records]
    assert any("GPUWARDEN_HEALTH_EXPECTED_GPU names no setting" in m for m in said), said
    assert not any("GPUWARDEN_BIN" in m for m in said)  # no [bin] section: not ours


def test_config_environment_overrides_and_errors(tmp_path):
    config = load_config(
        None,
        environ={
            "GPUWARDEN_AGENT_INTERVAL_S": "2.5",
            "GPUWARDEN_SINK_URL": "http://influx:8086",
            "GPUWARDEN_XID_EXTRA_FATAL_XIDS": "31, 43",
            "GPUWARDEN_NVML_GPM": "false",
        },
    )
    assert config["agent"]["interval_s"] == 2.5
    assert config.sink.url == "http://influx:8086"
    assert config["xid"]["extra_fatal_xids"] == [31, 43]
    assert config["nvml"]["gpm"] is False
    assert config.source_settings("nvml")["extra_fatal_xids"] == [31, 43]
    with pytest.raises(ConfigError, match="interval_s must be a number"):
        load_config(None, environ={"GPUWARDEN_AGENT_INTERVAL_S": "soon"})
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\nintervall_s = 3\n")
    with pytest.raises(ConfigError, match=r"unknown setting agent\.intervall_s"):
        load_config(bad, environ={})
    bad.write_text('[nvml]\nbackend = "magic"\n')
    config = load_config(bad, environ={})
    with pytest.raises(Exception, match="pynvml' or 'recorded'"):
        sources.create("nvml", SourceContext("c", "n"), config.source_settings("nvml")).collect(0)


def test_absent_hardware_is_no_data(tmp_path):
    ctx = SourceContext("c", "n", sysfs=tmp_path / "empty")
    for name in ("infiniband", "power", "thermal"):
        assert sources.create(name, ctx, {}).collect(0) == []


def test_trace_recorder_keeps_mixed_tag_sets(tmp_path):
    rec = TraceRecorder(str(tmp_path / "t"), "test", simulated=True)
    rec.write_points(
        [
            Point("gpu_event", {"node": "a", "gpu": "1"}, {"xid_code": 79}, 1),
            Point("gpu_event", {"node": "a"}, {"xid_code": 119}, 2),
        ]
    )
    rec.close()
    assert TraceReader(tmp_path / "t").manifest.points == 2


def test_slurm_prolog_and_epilog_maintain_the_job_map(tmp_path):
    import os
    import subprocess

    from gpuwarden.collector.attribution import JobResolver

    deploy = Path(__file__).parent.parent / "deploy" / "slurm"
    env = {
        **os.environ,
        "GPUWARDEN_JOBMAP_DIR": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_GPUS": "0,3",
    }
    subprocess.run(["sh", str(deploy / "prolog.sh")], env=env, check=True)
    resolver = JobResolver(tmp_path, str(tmp_path))
    assert [resolver.for_gpu(i).job for i in range(4)] == ["4242", "", "", "4242"]
    (tmp_path / "3").write_text("5000\n")  # GPU 3 already went to a later job
    subprocess.run(["sh", str(deploy / "epilog.sh")], env=env, check=True)
    assert [resolver.for_gpu(i).job for i in range(4)] == ["", "", "", "5000"]


def test_record_nvml_writes_a_recording_that_keeps_its_provenance(tmp_path):
    """On a GPU machine ``--record-nvml`` captures real answers; here it re-records the
    CONSTRUCTED recording, and must not relabel it as recorded."""
    out = tmp_path / "nvml.json"
    cfg = write_config(tmp_path)
    with redirect_stdout(io.StringIO()):
        assert agent_cli.main(["--config", str(cfg), "--once", "--record-nvml", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["provenance"] == "constructed"
    assert len(doc["ticks"]) == 1
    backend = RecordedBackend(out)
    backend.init()
    backend.begin_cycle()
    assert backend.call(None, "nvmlDeviceGetCount") == 8
