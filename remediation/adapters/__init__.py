"""Adapters by name. Each module is imported on first use, so a Slurm site never loads the
Kubernetes client and an engine with only webhooks starts in milliseconds."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from gpuwarden.remediation.errors import RemediationError
from gpuwarden.remediation.model import Adapter

ADAPTERS: dict[str, str] = {
    "slurm": "gpuwarden.remediation.adapters.slurm:SlurmAdapter",
    "kubernetes": "gpuwarden.remediation.adapters.kubernetes:KubernetesAdapter",
    "elastic": "gpuwarden.remediation.adapters.elastic:ElasticAdapter",
    "webhook": "gpuwarden.remediation.adapters.webhook:WebhookAdapter",
}


class UnknownAdapterError(RemediationError, KeyError):
    pass


def create(name: str, settings: Mapping[str, Any]) -> Adapter:
    """Build the adapter registered as ``name`` from its configuration section."""
    try:
        module_name, _, cls_name = ADAPTERS[name].partition(":")
    except KeyError:
        raise UnknownAdapterError(f"unknown adapter {name!r}; known: {sorted(ADAPTERS)}") from None
    cls = getattr(importlib.import_module(module_name), cls_name)
    adapter: Adapter = cls(**settings)
    return adapter
