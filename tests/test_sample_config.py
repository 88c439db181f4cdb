"""The shipped sample config documents exactly the defaults."""

from __future__ import annotations

import tomllib
from pathlib import Path

from gpuwarden.core.store.sink import SinkConfig


def test_sink_sample_equals_defaults():
    sample = tomllib.loads((Path(__file__).parent.parent / "config/sink.sample.toml").read_text())
    assert SinkConfig.from_mapping(sample["sink"]) == SinkConfig()


def test_agent_sample_equals_defaults():
    from gpuwarden.collector.config import DEFAULTS, load_config

    path = Path(__file__).parent.parent / "config/agent.sample.toml"
    assert load_config(path, environ={}).sections == DEFAULTS
    assert set(tomllib.loads(path.read_text())) == set(DEFAULTS)
    for section, values in tomllib.loads(path.read_text()).items():
        assert set(values) == set(DEFAULTS[section]), section
