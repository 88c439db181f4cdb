"""Signed HTTP: one helper for every sender and every receiver.

**Requests to the engine** (the agent's fast path and the analyze service through
:mod:`core.poster`, the operator commands, the benchmarks) are signed with
:func:`sign_request` and checked with :func:`verify_request`. A signed request carries::

    X-Gpuwarden-Identity: <identity name>           (absent in the legacy shared-secret mode)
    X-Gpuwarden-Signature: t=<unix seconds>,n=<nonce>,v2=<hex HMAC-SHA256(key, canonical)>

where the canonical text is, one per line: ``gpuwarden-v2``, the method, the path, the query
(without ``?``), ``t``, the nonce, the identity and the SHA-256 of the body. So a signature is
good for one method on one path with one query and one body, from one identity: a signed
``POST /v1/undo/gpu01`` replayed on ``/v1/undo/gpu02`` does not verify (issue 38). The nonce
makes every try of a sender a signature of its own, so the receiver can refuse any signature
it has seen (a replay) without refusing a sender's honest retry. Timestamps more than
``tolerance_s`` off are refused.

**Notifications from the engine** (the webhook adapter, to receivers outside gpuwarden) keep
the simpler scheme receivers already verify: ``t=<t>,v1=<HMAC(secret, "<t>.<body>")>``
(:func:`sign`, :func:`verify_signature`).

:func:`agent_key` derives a node's own key from a master key, so an engine can hold one secret
for a whole fleet of agents and still tell each node from the others.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from urllib.parse import urlsplit

SIGNATURE_HEADER = "X-Gpuwarden-Signature"
IDENTITY_HEADER = "X-Gpuwarden-Identity"
_HEADER_RE = re.compile(r"t=([0-9]{1,12}),n=([0-9a-f]{1,64}),v2=([0-9a-f]{64})")


def sign(secret: bytes, body: bytes, t: int | None = None) -> str:
    """The webhook adapter's signature header for ``body`` at ``t`` (now when not given)."""
    t = int(time.time()) if t is None else t
    mac = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_signature(
    secret: bytes, header: str, body: bytes, *, tolerance_s: float = 300.0, now: float | None = None
) -> int:
    """Check a webhook signature header; the signed timestamp, or ValueError saying why not."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        raise ValueError(f"malformed {SIGNATURE_HEADER} header") from None
    expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given):
        raise ValueError("signature does not match the body")
    _fresh(t, tolerance_s, now)
    return t


def _canonical(method: str, target: str, t: int, nonce: str, identity: str, body: bytes) -> bytes:
    path, _, query = target.partition("?")
    lines = ["gpuwarden-v2", method.upper(), path, query, str(t), nonce, identity]
    return "\n".join(lines).encode() + b"\n" + hashlib.sha256(body).hexdigest().encode()


def request_target(url: str) -> str:
    """The path and query of ``url`` as a signature covers them (``/v1/findings?x=1``)."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def sign_request(
    key: bytes,
    method: str,
    target: str,
    body: bytes,
    identity: str = "",
    *,
    t: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The headers that sign ``method target`` with ``body`` as ``identity`` (a path with its
    query, ``/v1/undo/gpu01``; :func:`request_target` makes one from a URL)."""
    t = int(time.time()) if t is None else t
    nonce = secrets.token_hex(8) if nonce is None else nonce
    mac = hmac.new(key, _canonical(method, target, t, nonce, identity, body), hashlib.sha256)
    headers = {SIGNATURE_HEADER: f"t={t},n={nonce},v2={mac.hexdigest()}"}
    if identity:
        headers[IDENTITY_HEADER] = identity
    return headers


def signed_time(header: str) -> int:
    """The timestamp a request signature header claims (unchecked), or ValueError."""
    return int(_parts(header)[0])


def signature_mac(header: str) -> str:
    """The MAC of a well-formed signature header (what the replay memory keys on)."""
    return _parts(header)[2]


def _parts(header: str) -> tuple[str, str, str]:
    """``(t, nonce, mac)`` of a header in exactly the form :func:`sign_request` writes it.
    Anything else is refused: a header with extra text would verify with the same MAC and yet
    differ as a string, and so slip past the replay memory."""
    m = _HEADER_RE.fullmatch(header)
    if m is None:
        raise ValueError(
            f"malformed {SIGNATURE_HEADER} header (t=<unix seconds>,n=<hex nonce>,v2=<hex HMAC>)"
        )
    return m.group(1), m.group(2), m.group(3)


def verify_request(
    key: bytes,
    header: str,
    method: str,
    target: str,
    body: bytes,
    identity: str = "",
    *,
    tolerance_s: float = 300.0,
    now: float | None = None,
) -> int:
    """Check a request's signature header; the signed timestamp, or ValueError saying why
    not (malformed, signed for another method, path, query, identity or body, or stale)."""
    t, nonce, given = _parts(header)
    expected = hmac.new(
        key, _canonical(method, target, int(t), nonce, identity, body), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace")):
        raise ValueError(
            "signature does not match the request (method, path, query, identity and body)"
        )
    _fresh(int(t), tolerance_s, now)
    return int(t)


def agent_key(master: bytes, node: str) -> bytes:
    """Node ``node``'s own key, derived from ``master`` (what its agent's key file holds)."""
    return (
        hmac.new(master, b"gpuwarden agent key\n" + node.encode(), hashlib.sha256)
        .hexdigest()
        .encode()
    )


def _fresh(t: int, tolerance_s: float, now: float | None) -> None:
    age = (time.time() if now is None else now) - t
    if abs(age) > tolerance_s:
        raise ValueError(f"signature timestamp is {age:.0f} s off (tolerance {tolerance_s:.0f} s)")
