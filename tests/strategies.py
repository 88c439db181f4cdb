"""Hypothesis strategies for hostile line-protocol input."""

from __future__ import annotations

from hypothesis import strategies as st

# Every character line protocol treats specially, plus unicode outside the BMP.
HOSTILE = ",= \"\\'\ttime#éß日本語🙂\u200b"
_hostile_text = st.text(
    alphabet=st.one_of(st.sampled_from(HOSTILE), st.characters(codec="utf-8")),
    min_size=1,
    max_size=12,
)


def representable(name: str) -> bool:
    """What line protocol can carry in a name (see core.store.lineprotocol.encode)."""
    return (
        bool(name)
        and "\n" not in name
        and "\r" not in name
        and not name.endswith("\\")
        and name != "time"
        and "\x00" not in name
    )


names = _hostile_text.filter(representable)
# the frame encoder refuses "*" and ^...$ (polars patterns; see core.store.lineprotocol.frame)
names = names.filter(lambda n: n != "*" and not (n.startswith("^") and n.endswith("$")))
measurements = names.filter(lambda n: not n.startswith(("#", "\t", "\x00")))
field_keys = names.filter(lambda n: not n.startswith(("\t", "\x00")))
string_values = st.text(
    alphabet=st.one_of(st.sampled_from(HOSTILE + "\n"), st.characters(codec="utf-8")),
    min_size=1,
    max_size=30,
).filter(lambda s: "\x00" not in s)
floats = st.floats(allow_nan=False, allow_infinity=False)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
