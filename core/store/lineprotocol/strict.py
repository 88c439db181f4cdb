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
It is stricter than InfluxDB where leniency would only hide a mistake: unsigned ``3u``
integers (a different InfluxDB type from ``3i``, so a type conflict waiting to happen), NaN
and infinity, a repeated field key, and ``time`` as a key are errors.
"""

from __future__ import annotations

import re

from core.errors import LineProtocolError
from core.store.lineprotocol.encode import INT64_MAX, INT64_MIN, FieldValue, Point

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
            return self.string()
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
            return float(token)
        self.i = start
        if re.fullmatch(r"\d+u", token):
            raise self.fail(
                f"field {key!r}: unsigned integer {token} (write {token[:-1]}i: InfluxDB keeps "
                "unsigned and signed integers apart, and the catalogue's are signed)"
            )
        raise self.fail(f"field {key!r}: {token!r} is not a number, boolean or quoted string")

    def point(self, now_ns: int, ns_per_unit: int) -> Point:
        measurement = self.name(", ", "measurement")
        tags: dict[str, str] = {}
        while self.at(","):
            self.i += 1
            key = self.name(",= ", "tag key")
            self.expect("=", f"after tag key {key!r}")
            tags[key] = self.name(",= ", "tag value")
        self.expect(" ", "before the fields")
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
        self.skip(" ")
        time_ns = now_ns
        if self.i < len(self.text) and not self.at("\r\n"):
            start = self.i
            stamp = self.token(" \r\n")
            if not _TIME.fullmatch(stamp):
                self.i = start
                raise self.fail(f"timestamp {stamp!r} is not an integer")
            time_ns = int(stamp) * ns_per_unit
            if not INT64_MIN <= time_ns <= INT64_MAX:
                self.i = start
                raise self.fail(f"timestamp {stamp} is out of InfluxDB's range at this precision")
        self.skip(" \r")
        if self.i < len(self.text) and self.text[self.i] != "\n":
            raise self.fail(f"unexpected {self.text[self.i]!r} after the timestamp")
        return Point(measurement, tags, fields, time_ns)


def parse_lines(text: str, now_ns: int, ns_per_unit: int = 1) -> list[Point]:
    """Every point in ``text`` (blank lines and ``#`` comments skipped; a line without a
    timestamp is stamped ``now_ns``). Raises :class:`LineProtocolError` at the first problem,
    naming its line and column: all or nothing."""
    s = _Scanner(text)
    points = []
    while s.i < len(text):
        end = text.find("\n", s.i)
        head = text[s.i : len(text) if end < 0 else end]
        if not head.strip() or head.lstrip(" \t").startswith("#"):
            s.i += len(head) + 1
            continue
        s.skip(" \t")  # InfluxDB skips them too
        points.append(s.point(now_ns, ns_per_unit))
        s.i += 1  # the line break
    return points
