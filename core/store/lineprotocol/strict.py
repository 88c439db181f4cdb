"""A strict reader of InfluxDB line protocol, for lines that come from outside the agent.

The agent's relay (:mod:`collector.relay`) accepts line protocol from training jobs. It reads
every line into a :class:`~core.store.lineprotocol.Point` with this module before anything is
spooled, and writes it out again with the agent's own encoder, so a line the database would
refuse is refused here, at once and with its line and column, instead of failing a batch that
also carries the node's telemetry (InfluxDB 2.x refuses a whole batch for one malformed line,
per its write documentation; 3.x too unless partial writes are configured).

It reads what :mod:`.encode` writes (a property test round-trips every point the encoder
can write), with InfluxDB 1.x's escaping: ``\\,`` and ``\\ `` in a measurement, also
``\\=`` in tag keys, tag values and field keys, ``\\"`` and ``\\\\`` in string values; any
other backslash is literal. Values: ``1.5`` / ``1`` / ``-2e3`` (float), ``3i`` (integer),
``t``/``true``/``f``/``false`` in InfluxDB's spellings (boolean), ``"..."`` (string).
It follows InfluxDB's own parser (``models/points.go`` in 1.x, checked against Debian's
1.6.7 by a differential test) where a difference would change what is stored:

* spaces, tabs and NULs are skipped at the start of a line, before the field set and before
  the timestamp (InfluxDB's ``skipWhitespace``), so ``cpu    v=1`` is one field ``v``;
* a tag key given twice is an error (InfluxDB: "duplicate tags"), not "the last one wins";
* a float out of a 64-bit float's range (``1e400``) is an error (InfluxDB: "invalid float"),
  not infinity; one too small to represent reads as 0, as Go's ``ParseFloat`` gives;
* a timestamp must lie in InfluxDB's range, ``-9223372036854775806`` to
  ``9223372036854775806`` ns after the precision is applied: the two extreme int64 values are
  reserved (InfluxDB: "time outside range");
* a line without a timestamp is stamped with the arrival time truncated to the request's
  precision, as InfluxDB stamps it.

It is stricter than InfluxDB where leniency would only hide a mistake: unsigned ``3u``
integers (a different InfluxDB type from ``3i``, so a type conflict waiting to happen), NaN
and infinity, a repeated field key, ``time`` as a key, and an empty field key are errors
(InfluxDB 1.6.7 stores ``m \t=1`` as a field with no name: its check for a missing key looks
for a space before the ``=``, and the tab it skipped is not one). It is more lenient in
one place: a line may end ``\r\n`` (InfluxDB 1.x reads the ``\r`` into the last value or
timestamp and refuses it); what is kept is written out again by the encoder, so nothing
lenient reaches the database.
"""

from __future__ import annotations

import math
import re

from gpuwarden.core.errors import LineProtocolError
from gpuwarden.core.store.lineprotocol.encode import INT64_MAX, INT64_MIN, FieldValue, Point

# precision query parameter (InfluxDB 1.x and 2.x spellings) -> nanoseconds per unit
PRECISIONS = {
    "": 1,
    "n": 1,
    "ns": 1,
    "u": 10**3,
    "us": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_BOOLS = {
    **dict.fromkeys(("t", "T", "true", "True", "TRUE"), True),
    **dict.fromkeys(("f", "F", "false", "False", "FALSE"), False),
}
_FLOAT = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INT = re.compile(r"-?\d+i")
_TIME = re.compile(r"-?\d+")
#: InfluxDB's time range (``models.MinNanoTime``/``MaxNanoTime``): the int64 extremes are
#: reserved, the smallest two and the largest one
TIME_MIN_NS, TIME_MAX_NS = INT64_MIN + 2, INT64_MAX - 1
UINT64_MAX = 2**64 - 1
#: what InfluxDB's ``skipWhitespace`` skips: at line start, before the fields and the timestamp
_BLANK = " \t\x00"


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def fail(self, message: str) -> LineProtocolError:
        line = self.text.count("\n", 0, self.i) + 1
        column = self.i - self.text.rfind("\n", 0, self.i)
        return LineProtocolError(f"line {line}, column {column}: {message}")

    def at(self, chars: str) -> bool:
        return self.i < len(self.text) and self.text[self.i] in chars

    def name(self, stops: str, what: str) -> str:
        """Up to the first unescaped character of ``stops`` or line break (not consumed); a
        backslash escapes any character of ``stops``, else it is literal."""
        text, out, start = self.text, [], self.i
        while self.i < len(text):
            c = text[self.i]
            if c == "\\" and self.i + 1 < len(text) and text[self.i + 1] in stops:
                out.append(text[self.i + 1])
                self.i += 2
                continue
            if c in stops or c in "\r\n":
                break
            out.append(c)
            self.i += 1
        name = "".join(out)
        if not name:
            self.i = start
            raise self.fail(f"empty {what}")
        if name == "time" and what != "tag value":
            raise self.fail(f"{what} 'time' is reserved by InfluxDB")
        return name

    def expect(self, char: str, what: str) -> None:
        if not self.at(char):
            found = repr(self.text[self.i]) if self.i < len(self.text) else "the end"
            raise self.fail(f"expected {char!r} {what}, found {found}")
        self.i += 1

    def string(self) -> str:
        """A quoted string value; line breaks inside it belong to it."""
        text, out, start = self.text, [], self.i
        self.i += 1  # the opening quote
        while self.i < len(text):
            c = text[self.i]
            if c == "\\" and self.i + 1 < len(text) and text[self.i + 1] in '"\\':
                out.append(text[self.i + 1])
                self.i += 2
                continue
            if c == '"':
                self.i += 1
                return "".join(out)
            out.append(c)
            self.i += 1
        self.i = start
        raise self.fail("string value has no closing quote")

    def skip(self, chars: str) -> None:
        while self.at(chars):
            self.i += 1

    def token(self, stops: str) -> str:
        start = self.i
        while self.i < len(self.text) and self.text[self.i] not in stops:
            self.i += 1
        return self.text[start : self.i]

    def value(self, key: str) -> FieldValue:
        if self.at('"'):
            text = self.string()
            if self.i < len(self.text) and not self.at(", \r\n"):
                raise self.fail(
                    f"field {key!r}: {self.text[self.i]!r} after the closing quote (a value ends "
                    "at ',' or ' '; InfluxDB 1.x stores such a string mangled)"
                )
            return text
        start = self.i
        token = self.token(", \r\n")
        if token in _BOOLS:
            return _BOOLS[token]
        if _INT.fullmatch(token):
            number = int(token[:-1])
            if INT64_MIN <= number <= INT64_MAX:
                return number
            self.i = start
            raise self.fail(f"field {key!r}: integer {token} does not fit in 64 bits")
        if _FLOAT.fullmatch(token):
            real = float(token)
            if math.isinf(real):
                self.i = start
                raise self.fail(f"field {key!r}: {token} is out of a 64-bit float's range")
            return real
        self.i = start
        if re.fullmatch(r"\d+u", token):
            raise self.fail(f"field {key!r}: {_unsigned_advice(int(token[:-1]))}")
        raise self.fail(f"field {key!r}: {token!r} is not a number, boolean or quoted string")

    def point(self, now_ns: int, ns_per_unit: int) -> Point:
        measurement = self.name(", ", "measurement")
        tags: dict[str, str] = {}
        while self.at(","):
            self.i += 1
            start = self.i
            key = self.name(",= ", "tag key")
            if key in tags:
                self.i = start
                raise self.fail(f"tag key {key!r} appears twice")
            self.expect("=", f"after tag key {key!r}")
            tags[key] = self.name(",= ", "tag value")
        self.expect(" ", "before the fields")
        self.skip(_BLANK)
        fields: dict[str, FieldValue] = {}
        while True:
            start = self.i
            key = self.name(",= ", "field key")
            if key in fields:
                self.i = start
                raise self.fail(f"field {key!r} appears twice")
            self.expect("=", f"after field key {key!r}")
            fields[key] = self.value(key)
            if not self.at(","):
                break
            self.i += 1
        if self.at(" "):  # the fields end at a space; blanks after it are skipped
            self.skip(_BLANK)
        time_ns = now_ns - now_ns % ns_per_unit  # arrival time, truncated as InfluxDB does
        if self.i < len(self.text) and not self.at("\r\n"):
            start = self.i
            stamp = self.token(" \r\n")
            if not _TIME.fullmatch(stamp):
                self.i = start
                raise self.fail(f"timestamp {stamp!r} is not an integer")
            time_ns = int(stamp) * ns_per_unit
            if not TIME_MIN_NS <= time_ns <= TIME_MAX_NS:
                self.i = start
                raise self.fail(
                    f"timestamp {stamp} is out of InfluxDB's range at this precision "
                    f"({TIME_MIN_NS} to {TIME_MAX_NS} ns; the int64 extremes are reserved)"
                )
        self.skip(" \r")
        if self.i < len(self.text) and self.text[self.i] != "\n":
            raise self.fail(f"unexpected {self.text[self.i]!r} after the timestamp")
        return Point(measurement, tags, fields, time_ns)


def _unsigned_advice(value: int) -> str:
    """What to write instead of ``<value>u``: the catalogue's integers are signed."""
    if value > UINT64_MAX:
        return f"unsigned integer {value}u does not fit in 64 bits"
    if value > INT64_MAX:
        return (
            f"unsigned integer {value}u (the catalogue's integers are signed, and {value} does "
            f"not fit in a signed 64-bit integer, whose largest is {INT64_MAX})"
        )
    return (
        f"unsigned integer {value}u (write {value}i: InfluxDB keeps unsigned and signed "
        "integers apart, and the catalogue's are signed)"
    )


def parse_lines(text: str, now_ns: int, ns_per_unit: int = 1) -> list[Point]:
    """Every point in ``text`` (blank lines and ``#`` comments skipped; a line without a
    timestamp is stamped ``now_ns``). Raises :class:`LineProtocolError` at the first problem,
    naming its line and column: all or nothing."""
    s = _Scanner(text)
    points = []
    while s.i < len(text):
        end = text.find("\n", s.i)
        head = text[s.i : len(text) if end < 0 else end]
        if not head.strip(_BLANK + "\r") or head.lstrip(_BLANK).startswith("#"):
            s.i += len(head) + 1
            continue
        s.skip(_BLANK)  # InfluxDB skips them too
        points.append(s.point(now_ns, ns_per_unit))
        s.i += 1  # the line break
    return points
