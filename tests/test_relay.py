"""The agent's relay for training jobs, and the strict line-protocol reader behind it.

Lines here are written by hand or generated (hypothesis); the differential test writes them to
the real InfluxDB (Debian's influxd 1.6.7) to check that what the reader accepts, the
database reads the same way.
"""

from __future__ import annotations

import gzip
import http.client
import itertools
import json
import logging
import math
import time

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from gpuwarden.collector.relay import LOG_EVERY_S, MAX_BODY, ReporterRelay
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.errors import LineProtocolError
from gpuwarden.core.store.lineprotocol import Point, encode_point
from gpuwarden.core.store.lineprotocol.strict import PRECISIONS, parse_lines
from tests import strategies as hs

NOW = 1_700_000_000_123_456_789
_seq = itertools.count()


# -- the reader --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    measurement=hs.measurements,
    tags=st.dictionaries(hs.names, hs.names, max_size=3),
    fields=st.dictionaries(
        hs.names,
        st.one_of(hs.floats, hs.ints, st.booleans(), hs.string_values),
        min_size=1,
        max_size=4,
    ),
    time_ns=st.integers(-(2**62), 2**62),
)
def test_the_reader_reads_back_everything_the_encoder_writes(measurement, tags, fields, time_ns):
    point = Point(measurement, tags, fields, time_ns)
    try:
        line = encode_point(point)
    except LineProtocolError:
        assume(False)  # a name line protocol cannot carry; the encoder's own tests cover it
    assert line is not None
    (back,) = parse_lines(line + "\n", now_ns=0)
    assert back == point


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("job_step,job=a", "column 15: expected ' ' before the fields"),
        ("m v=3u", "unsigned integer 3u (write 3i"),
        ("m v=nan", "'nan' is not a number"),
        ("m v=inf", "'inf' is not a number"),
        ("m v=1i,v=2i", "column 8: field 'v' appears twice"),
        ("m v=1 17x", "timestamp '17x' is not an integer"),
        ('m v="open', "column 5: string value has no closing quote"),
        ("m,=x v=1", "column 3: empty tag key"),
        ("m,t= v=1", "column 5: empty tag value"),
        ("m v=1 5 extra", "unexpected 'e' after the timestamp"),
        ("m time=1", "field key 'time' is reserved"),
        ("m v=9223372036854775808i", "does not fit in 64 bits"),
        ("m v=1,w=", "field 'w': '' is not a number"),
        ("m v=1\nm w=1\nm x=y", "line 3, column 5: field 'x'"),
    ],
)
def test_the_reader_names_what_is_wrong_and_where(line, says):
    with pytest.raises(LineProtocolError, match=None) as caught:
        parse_lines(line, NOW)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("line", "says"),
    [  # the cases InfluxDB's own tests (models/points_test.go) hold, which the reader got wrong
        ("m v=1e400", "field 'v': 1e400 is out of a 64-bit float's range"),
        ("m v=-1e400", "out of a 64-bit float's range"),
        ("cpu,host=serverA,host=serverB value=1i 1000000000", "column 18: tag key 'host' appears"),
        ("cpu value=1 -9223372036854775808", "out of InfluxDB's range"),
        ("cpu value=1 -9223372036854775807", "out of InfluxDB's range"),
        ("cpu value=1 9223372036854775807", "out of InfluxDB's range"),
        ("m v=18446744073709551615u", "does not fit in a signed 64-bit integer"),
        ("m v=18446744073709551616u", "18446744073709551616u does not fit in 64 bits"),
    ],
)
def test_the_reader_refuses_what_influxdb_refuses(line, says):
    with pytest.raises(LineProtocolError) as caught:
        parse_lines(line, NOW)
    assert says in str(caught.value)
    assert "write 18446744073709551615i" not in str(caught.value)


@pytest.mark.parametrize(
    ("line", "point"),
    [
        (
            "cpu    value=1.0 1257894000000000000",
            Point("cpu", {}, {"value": 1.0}, 1257894000000000000),
        ),
        ("cpu \t\x00 value=1 \t 5", Point("cpu", {}, {"value": 1.0}, 5)),
        ("\x00cpu value=1 5", Point("cpu", {}, {"value": 1.0}, 5)),
        ("\x00\t cpu,a=b value=1 5", Point("cpu", {"a": "b"}, {"value": 1.0}, 5)),
        ("m v=1e-400 5", Point("m", {}, {"v": 0.0}, 5)),
        ("m v=1 -9223372036854775806", Point("m", {}, {"v": 1.0}, -(2**63) + 2)),
        ("m v=1 9223372036854775806", Point("m", {}, {"v": 1.0}, 2**63 - 2)),
    ],
)
def test_the_reader_reads_what_influxdb_reads(line, point):
    assert parse_lines(line, NOW) == [point]


@pytest.mark.parametrize(
    ("precision", "unit_ns"),
    [("ns", 1), ("u", 10**3), ("ms", 10**6), ("s", 10**9), ("h", 3600 * 10**9)],
)
def test_a_line_without_a_timestamp_is_stamped_at_the_requests_precision(precision, unit_ns):
    (point,) = parse_lines("m v=1", NOW, PRECISIONS[precision])
    assert point.time_ns == NOW // unit_ns * unit_ns
    assert NOW - unit_ns < point.time_ns <= NOW


def test_blank_lines_comments_crlf_and_leading_spaces():
    text = '\n# a comment\n  m,t=a v=1i 5\r\n\n\tm s="two\nlines" 6\n'
    assert parse_lines(text, NOW) == [
        Point("m", {"t": "a"}, {"v": 1}, 5),
        Point("m", {}, {"s": "two\nlines"}, 6),
    ]


# -- the reader agrees with InfluxDB -------------------------------------------------------------

HAND_WRITTEN = [
    r'rl{n},host=a\ b,k\=x=v\,w f=1.5,i=-3i,b=T,s="q\"uo\\te" 1600000000000000001',
    "rl{n} f=-2e3,g=.25,h=7.,e=1e-3,E=1E+3 1600000000000000002",
    "rl{n} b1=true,b2=False,b3=f,b4=TRUE,b5=t 1600000000000000003",
    'rl{n},t=back\\slash s="multi\nline",u="a\\b" 1600000000000000004',
    r"rl{n}\ with\ space,k=v v=1i 1600000000000000005",
    "   rl{n} v=2i 1600000000000000006",
    "rl{n},z=1,a=2 v=-0.0,w=0 1600000000000000007",
]


@pytest.mark.influxdb
@pytest.mark.parametrize("template", HAND_WRITTEN)
def test_what_the_reader_accepts_influxdb_reads_the_same(influxd, influx_db, template):
    line = template.format(n=next(_seq))
    (point,) = parse_lines(line, NOW)
    conn = http.client.HTTPConnection("127.0.0.1", influxd.port, timeout=30)
    conn.request("POST", f"/write?db={influx_db}&precision=ns", line.encode())
    answer = conn.getresponse()
    assert answer.status == 204, answer.read()
    name = point.measurement.replace('"', '\\"')
    result = json.loads(influxd.query(f'SELECT * FROM "{name}"', influx_db))
    (series,) = result["results"][0]["series"]
    row = dict(zip(series["columns"], series["values"][0], strict=True))
    assert row.pop("time") == point.time_ns
    assert {k: row[k] for k in point.tags} == dict(point.tags)
    for key, value in point.fields.items():
        read = row[key]
        if isinstance(value, float):
            assert math.isclose(read, value) or (read == value == 0)
        else:
            assert read == value and type(read) is type(value), key


# Pieces of lines that InfluxDB's parser treats specially: blanks it skips, numbers at and past
# the edges of their types, reserved timestamps, repeated and reserved keys. A generated line
# joins them with the separators InfluxDB is picky about.
def _mostly(usual: list[str], odd: list[str]) -> st.SearchStrategy[str]:
    """One of ``odd`` about a quarter of the time, else one of ``usual``: a line with three
    or four pieces then reaches the database whole often enough to compare what it stored."""
    return st.one_of(st.sampled_from(usual), st.sampled_from(usual), st.sampled_from(usual),
                     st.sampled_from(odd))  # fmt: skip


_BLANKS = _mostly([""], ["\t", "\x00", "  ", " \t\x00"])
_TAG_KEYS = _mostly(["host", "a", "b", "h\\ st", "k\\=x"], ["host", "time", ""])
_TAG_VALUES = _mostly(["x", "serverA", "v\\,w", "1"], ["", "t\\"])
_FIELD_KEYS = _mostly(["v", "w", "x\\ y"], ["time", "v", ""])
_VALUES = _mostly(
    ["1", "-1", "1.5", ".5", "5.", "-0", "1e3", "1E+3", "1e-400", "4.9e-324",
     "1.7976931348623157e308", "1i", "-9223372036854775808i", "9223372036854775807i", "t",
     "FALSE", "True", '"s"', '"q\\"uote"'],
    ["1e400", "-1e400", "1.8e308", "9223372036854775808i", "3u", "18446744073709551616u",
     "nan", "inf", "1e", "1.2.3", "+1", "--1", "1x", ""],
)  # fmt: skip
_STAMPS = _mostly(
    ["", "0", "5", "-5", "1257894000000000000", "-9223372036854775806", "9223372036854775806"],
    ["-9223372036854775808", "-9223372036854775807", "9223372036854775807",
     "9223372036854775808", "12x", "-", "1 2"],
)  # fmt: skip
_SEPARATORS = _mostly([" "], ["  ", " \t", " \x00 ", "\t", ""])
_PRECISIONS = st.sampled_from(["ns", "u", "ms", "s"])
# Where the reader is stricter than InfluxDB on purpose (see core.store.lineprotocol.strict):
# InfluxDB 1.6.7 stores 'm v="s"\t0' as the string 's"\t', and takes "m \t=1" as a field with
# no name (its check for a missing key looks for a space before "=", and the tab it skipped is
# not one).
STRICTER = (
    "unsigned integer",
    "appears twice",
    "'time' is reserved",
    "'nan' is not a number",
    "'inf' is not a number",
    "empty field key",
    "after the closing quote",
)


@st.composite
def hostile_lines(draw: st.DrawFn) -> tuple[str, str]:
    tags = draw(st.lists(st.tuples(_TAG_KEYS, _TAG_VALUES), max_size=3))
    fields = draw(st.lists(st.tuples(_FIELD_KEYS, _VALUES), min_size=1, max_size=3))
    stamp = draw(_STAMPS)
    line = draw(_BLANKS) + "fz{n}" + "".join(f",{k}={v}" for k, v in tags)
    line += draw(_SEPARATORS) + ",".join(f"{k}={v}" for k, v in fields)
    if stamp:
        line += draw(_SEPARATORS) + stamp
    return line + draw(st.sampled_from(["", " ", "  "])), draw(_PRECISIONS)


@pytest.mark.influxdb
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # every example writes a measurement of its own to the one database
@given(case=hostile_lines())
def test_what_the_reader_accepts_influxdb_stores_the_same_and_it_refuses_nothing_else(
    influxd, influx_db, case
):
    """Differential fuzz against the real InfluxDB: a line the reader accepts, InfluxDB accepts
    and stores exactly as read; a line the reader refuses, InfluxDB refuses too, unless the
    reader says it is one of its deliberate strictnesses."""
    template, precision = case
    n = next(_seq)
    line = template.format(n=n)
    before = time.time_ns()
    try:
        points = parse_lines(line, before, PRECISIONS[precision])
        refusal = ""
    except LineProtocolError as e:
        points, refusal = [], str(e)
    conn = http.client.HTTPConnection("127.0.0.1", influxd.port, timeout=30)
    conn.request("POST", f"/write?db={influx_db}&precision={precision}", line.encode())
    answer = conn.getresponse()
    said = answer.read().decode()
    event(f"reader {'refuses' if refusal else 'accepts'}, InfluxDB answers {answer.status}")
    if refusal:
        assert answer.status == 400 or any(s in refusal for s in STRICTER), (refusal, said)
        return
    assert answer.status == 204, (line, said)
    (point,) = points
    result = json.loads(influxd.query(f'SELECT * FROM "{point.measurement}"', influx_db))
    (series,) = result["results"][0]["series"]
    (values,) = series["values"]
    row = dict(zip(series["columns"], values, strict=True))
    stored = row.pop("time")
    if stamp_given(line):
        assert stored == point.time_ns
    else:  # stamped on arrival by each: both truncated to the precision
        unit = PRECISIONS[precision]
        assert stored % unit == 0 and point.time_ns % unit == 0
    assert {k: row.pop(k) for k in point.tags} == dict(point.tags)
    fields = {k: v for k, v in row.items() if v is not None}
    assert set(fields) == set(point.fields), (line, row)
    for key, value in point.fields.items():
        read = fields[key]
        if isinstance(value, float):
            assert math.isclose(read, value) or (read == value == 0), (line, key)
        else:
            assert read == value and type(read) is type(value), (line, key)


def stamp_given(line: str) -> bool:
    """Whether the line ends in a timestamp (the generator's lines: a last token of digits)."""
    last = line.rstrip(" ").rsplit(" ", 1)
    return len(last) == 2 and last[1].lstrip("-").isdigit() and "=" not in last[1]


# -- the relay -------------------------------------------------------------------------------


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_lines(self, lines: list[str]) -> None:
        self.lines += lines


@pytest.fixture
def relay():
    sink = Lines()
    relay = ReporterRelay("127.0.0.1:0", sink)
    relay.start()
    yield relay, sink
    relay.close()


def post(relay, body: bytes, path: str = "/write", **headers: str) -> tuple[int, str]:
    host, port = relay.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.putrequest("POST", path)
    if "Content-Length" not in headers and "Transfer-Encoding" not in headers:
        headers["Content-Length"] = str(len(body))
    for key, value in headers.items():
        conn.putheader(key, value)
    conn.endheaders()
    conn.send(body)
    answer = conn.getresponse()
    text = answer.read().decode()
    conn.close()
    return answer.status, text


STEP = "job_step,job=j1,rank=0 step_index=7i,step_time_s=1.25,tokens_count=4096i"


def test_lines_are_checked_encoded_again_and_stamped(relay):
    r, sink = relay
    t_s = int(time.time()) - 60
    assert post(r, f"{STEP} {t_s}\n".encode(), "/write?db=x&precision=s")[0] == 204
    assert sink.lines == [
        f"job_step,job=j1,rank=0 step_index=7i,step_time_s=1.25,tokens_count=4096i {t_s}000000000"
    ]
    assert post(r, STEP.encode())[0] == 204  # no timestamp: stamped on arrival, in ns
    stamp = int(sink.lines[1].rsplit(" ", 1)[1])
    assert stamp > 1_700_000_000 * 10**9
    assert r.accepted == 2


@pytest.mark.parametrize(
    ("body", "path", "headers", "status", "says"),
    [
        (b"cpu,host=a v=1 1", "/write", {}, 400, "measurement 'cpu' is not accepted"),
        (b"job_step,job=j tokens_count=4096", "/write", {}, 400, "declared integer, written"),
        (b"job_step,job=j,gpu=0 step_index=1i", "/write", {}, 400, "tag 'gpu' is not declared"),
        (STEP.encode(), "/write?precision=fortnight", {}, 400, "precision 'fortnight'"),
        (STEP.encode() + b"\njob_step v=", "/write", {}, 400, "line 2, column 12"),
        (b"\xff\xfe", "/write", {}, 400, "not UTF-8"),
        (STEP.encode(), "/query", {}, 404, "POST /write"),
        (STEP.encode(), "/write", {"Content-Length": "12abc"}, 400, "is not a number"),
        (STEP.encode(), "/write", {"Content-Length": "-5"}, 400, "is not a number"),
        (STEP.encode(), "/write", {"Content-Encoding": "br"}, 415, "only gzip"),
        (b"not gzip at all", "/write", {"Content-Encoding": "gzip"}, 400, "gzip body is broken"),
        (gzip.compress(STEP.encode())[:-9], "/write", {"Content-Encoding": "gzip"}, 400, "short"),
    ],
)
def test_bad_requests_get_a_clear_answer_and_keep_nothing(relay, body, path, headers, status, says):
    r, sink = relay
    got, text = post(r, body, path, **headers)
    assert (got, sink.lines) == (status, [])
    assert says in text
    assert post(r, STEP.encode())[0] == 204  # and the relay still serves


def test_one_bad_line_refuses_the_whole_request(relay):
    r, sink = relay
    body = "\n".join([STEP, STEP, "job_step,job=j1 step_index=1.5"])
    status, text = post(r, body.encode())
    assert (status, sink.lines, r.refused) == (400, [], 1)
    assert "point 3: job_step.step_index: declared integer" in text


@pytest.mark.parametrize(
    ("line", "says"),
    [
        # 12,000 series in 12,000 distinct weeks from 1970 to 2200 made InfluxDB create a
        # shard per week (issue 38, point 5); any time outside the last week is refused
        (f"{STEP} 1", "s from now"),
        (f"{STEP} 7258118400000000000", "s from now"),  # 2200
        (f"{STEP} {time.time_ns() - 8 * 86400 * 10**9}", "from the last 7 days"),
        (f"{STEP} {time.time_ns() + 3600 * 10**9}", "at most 300 s ahead"),
        # a 70 KB tag was accepted, past InfluxDB's 64 KiB series key
        ("job_step,job=" + "j" * 70_000 + " step_index=1i", "over 320 characters"),
    ],
)
def test_times_and_tags_out_of_bounds_are_refused(relay, line, says):
    r, sink = relay
    status, text = post(r, line.encode())
    assert (status, sink.lines) == (400, [])
    assert says in text


def test_gzip_bodies_and_their_limits(relay):
    r, sink = relay
    assert post(r, gzip.compress(STEP.encode()), **{"Content-Encoding": "gzip"})[0] == 204
    assert len(sink.lines) == 1
    bomb = gzip.compress(b"#" * (MAX_BODY + 10))  # a kilobyte that inflates past the limit
    status, text = post(r, bomb, **{"Content-Encoding": "gzip"})
    assert status == 413 and "once inflated" in text
    status, _ = post(r, b"x" * (MAX_BODY + 1))
    assert status == 413
    assert len(sink.lines) == 1


def test_chunked_bodies_are_refused_not_waited_for(relay):
    r, sink = relay
    chunk = STEP.encode()
    body = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n"
    status, text = post(r, body, **{"Transfer-Encoding": "chunked"})
    assert status == 411 and "Content-Length" in text
    assert sink.lines == []


def test_everything_the_reporter_sends_is_accepted(relay):
    """The training-side reporter, every option used, a NaN loss (a diverging run) and its
    heartbeat included: nothing it sends is refused (the NaN field is left out by its
    encoder, the step kept)."""
    from gpuwarden.collector.jobside.reporter import Reporter

    r, sink = relay
    rep = Reporter("j1", 3, url=f"http://{r.address[0]}:{r.address[1]}", flush_interval_s=0.01)
    rep.model(params=8 * 10**9, layers=32, hidden_size=4096, heads=32, seq_len=8192,
              world_size=64, dtype="bf16", recompute=True, gpu_model="NVIDIA H100 80GB HBM3",
              tensor_parallel=8, pipeline_parallel=2)  # fmt: skip
    rep.step(1, 1.5, tokens=8192, samples=1, loss=2.25)
    rep.step(2, 1.5, tokens=8192, samples=1, loss=math.nan)
    assert rep.flush(timeout_s=10)
    rep.close()
    # model, two steps and the heartbeat its sender thread sends as it starts
    assert (r.accepted, r.refused, rep.dropped) == (4, 0, 0)
    steps = [ln for ln in sink.lines if ln.startswith("job_step,")]
    assert "loss_ratio" not in steps[1] and "step_index=2i" in steps[1]
    (beat,) = [ln for ln in sink.lines if ln.startswith("job_heartbeat,")]
    assert "in_step_active=false" in beat and "rank=3" in beat


def test_refusals_are_counted_in_self_metrics_and_logged_sparingly(relay, caplog):
    r, _ = relay
    with caplog.at_level(logging.WARNING, logger="gpuwarden.collector.relay"):
        for _ in range(5):
            assert post(r, b"cpu v=1")[0] == 400
        assert post(r, STEP.encode())[0] == 204
    said = [rec.getMessage() for rec in caplog.records]
    assert len(said) == 1  # the first; the next four wait for the minute to pass
    assert "refused 1 request(s)" in said[0] and "127.0.0.1: 400 point 1: measurement" in said[0]
    own = r.stats_point("c", "n", 7)
    assert own.tags["source"] == "relay" and own.time_ns == 7
    assert own.fields == {"points_count": 1, "errors_total": 5}
    assert check_point(own.measurement, own.tags, own.fields) == []
    assert r.stats_point("c", "n", 8).fields["points_count"] == 0  # per cycle, not a total
    r._said_at -= LOG_EVERY_S
    with caplog.at_level(logging.WARNING, logger="gpuwarden.collector.relay"):
        assert post(r, b"cpu v=1")[0] == 400
    assert "refused 5 request(s)" in caplog.records[-1].getMessage()


def test_an_idle_connection_is_dropped_not_held(relay) -> None:
    """Found in review: over plain HTTP the relay set no socket timeout, so a connection
    that sends nothing held a thread and a descriptor for ever (a local user could open
    enough to starve the agent). It is closed after the handler's timeout (10 s)."""
    import socket

    r, _ = relay
    idle = socket.create_connection(r.address, timeout=60)
    idle.sendall(b"POST /write HTTP/1.1\r\nHost: x\r\n")  # a request that never ends
    try:
        got = idle.recv(1024)  # b"" once the relay closes it; a timeout (60 s) if it never does
    except TimeoutError:
        got = None
    finally:
        idle.close()
    assert got is not None, "the relay held an idle connection for 60 s"
