"""Which hosts share a switch: a CSV the operator keeps (or the scenario writes).

Two layouts are read:

* ``node,switch`` (optionally ``pod,spine``): one row per host, ``switch`` is its ToR;
* the Alibaba Lingjun layout ``ip,DSW,PSW,ASW`` (spine, pod, ToR), as published in
  alibaba/alibaba-lingjun-dataset-2023: the ASW is the ToR, the host column is ``ip``.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gpuwarden.analytics.errors import AnalyticsError


class TopologyError(AnalyticsError, ValueError):
    """The topology file is unreadable or has neither layout."""


def load_topology(path: str | Path) -> dict[str, str]:
    """Host name to ToR switch name."""
    try:
        df = pl.read_csv(path, infer_schema=False)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise TopologyError(f"{path}: cannot read topology: {exc}") from None
    if {"node", "switch"} <= set(df.columns):
        host, tor = "node", "switch"
    elif {"ip", "ASW"} <= set(df.columns):
        host, tor = "ip", "ASW"
    else:
        raise TopologyError(
            f"{path}: need columns node,switch (or Lingjun's ip,ASW); found {df.columns}"
        )
    df = df.select(pl.col(host).str.strip_chars(), pl.col(tor).str.strip_chars()).drop_nulls()
    dup = df.filter(pl.col(host).is_duplicated())
    if dup.height:
        raise TopologyError(f"{path}: hosts listed twice: {sorted(set(dup[host]))[:5]}")
    return dict(zip(df[host].to_list(), df[tor].to_list(), strict=True))


def write_topology(switch_of: dict[str, str], path: str | Path) -> None:
    pl.DataFrame({"node": list(switch_of), "switch": list(switch_of.values())}).write_csv(path)
