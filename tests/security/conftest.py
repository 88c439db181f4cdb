"""The identity tests' engine: the real ``gpuwarden remediate serve`` with identities
(:class:`tests.security.identity_engine.IdentityEngine`). A test file that defines its own
``engine`` fixture uses that one instead."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.identity_engine import IdentityEngine


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[IdentityEngine]:
    e = IdentityEngine(tmp_path)
    try:
        yield e
    finally:
        e.close()
