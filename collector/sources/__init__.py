"""Collector sources, found by name in one registry and imported on first use.

Every source is its own module behind :class:`~collector.sources.base.Source`; the agent asks
:func:`create` for the ones its configuration names. Adding a source is a module and a line here.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpuwarden.collector.sources.base import Source, SourceContext, SourceError

# name -> "module:factory"; each factory takes (context, settings) and opens nothing.
REGISTRY: dict[str, str] = {
    "nvml": "gpuwarden.collector.sources.nvml:NvmlSource",
    "xid": "gpuwarden.collector.sources.xid:KmsgXidSource",
    "infiniband": "gpuwarden.collector.sources.infiniband:InfinibandSource",
    "power": "gpuwarden.collector.sources.power:PowerSource",
    "thermal": "gpuwarden.collector.sources.thermal:ThermalSource",
    "host": "gpuwarden.collector.sources.host:HostSource",
}


def create(name: str, context: SourceContext, settings: dict[str, Any]) -> Source:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise SourceError(f"unknown source {name!r}; known: {sorted(REGISTRY)}") from None
    module, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    source: Source = factory(context, settings)
    return source


__all__ = ["REGISTRY", "Source", "SourceContext", "SourceError", "create"]
