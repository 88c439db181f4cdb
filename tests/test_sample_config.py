"""The shipped sample config documents exactly the defaults."""

from __future__ import annotations

import tomllib
from pathlib import Path

from collector.sink import SinkConfig


def test_sink_sample_equals_defaults():
    sample = tomllib.loads((Path(__file__).parent.parent / "config/sink.sample.toml").read_text())
    assert SinkConfig.from_mapping(sample["sink"]) == SinkConfig()
