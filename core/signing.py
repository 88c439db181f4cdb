"""Signed HTTP: one helper for every sender and every receiver.

A signed request carries::

    X-Gpuwarden-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>

The receiver recomputes the HMAC over the timestamp and the raw body, compares in constant time
and refuses timestamps more than a few minutes off (:func:`verify_signature` does all of it);
binding the timestamp into the MAC is what makes a captured request useless later, and the
engine also refuses a signature it has seen before (a replay inside the window).

Who signs: the webhook adapter (so receivers can trust gpuwarden's notifications), and every
sender to the engine when the engine has a secret (the agent's fast path and the analyze
service through :mod:`core.poster`, and the operator commands).
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Gpuwarden-Signature"


def sign(secret: bytes, body: bytes, t: int | None = None) -> str:
    """The signature header's value for ``body`` at ``t`` (now when not given)."""
    t = int(time.time()) if t is None else t
    mac = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_signature(
    secret: bytes, header: str, body: bytes, *, tolerance_s: float = 300.0, now: float | None = None
) -> int:
    """Check a signature header; the signed timestamp, or ValueError saying what is wrong."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        raise ValueError(f"malformed {SIGNATURE_HEADER} header") from None
    expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given):
        raise ValueError("signature does not match the body")
    age = (time.time() if now is None else now) - t
    if abs(age) > tolerance_s:
        raise ValueError(f"signature timestamp is {age:.0f} s off (tolerance {tolerance_s:.0f} s)")
    return t
