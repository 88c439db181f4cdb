"""Which hosts share a switch: a CSV the operator keeps (or the scenario writes).

Two layouts are read:

* ``node,switch`` (optionally ``pod,spine``): one row per host, ``switch`` is its ToR;
* the Alibaba Lingjun layout ``ip,DSW,PSW,ASW`` (spine, pod, ToR), as published in
  alibaba/alibaba-lingjun-dataset-2023: the ToR is the ASW *within its pod*, ``<PSW>-<ASW>``
  (ASW names start again under each PSW: the real file's 847 hosts hang from 119 ToRs named
  with 48 ASW names; read by name alone, hosts of different pods shared a "switch". Found by a
  review against the real file, 2026-11-28); the host column is ``ip``.

Column names are read with case and surrounding spaces ignored (``Node, Switch``), and lines
that start with ``#`` are comments.
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
        df = pl.read_csv(path, infer_schema=False, comment_prefix="#")
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise TopologyError(f"{path}: cannot read topology: {exc}") from None
    names = [c.strip().lower() for c in df.columns]
    if len(set(names)) < len(names):  # "Node" and "node": which one is meant?
        raise TopologyError(f"{path}: columns that differ only in case: {df.columns}")
    df = df.rename(dict(zip(df.columns, names, strict=True)))
    if {"node", "switch"} <= set(df.columns):
        host, tor = "node", pl.col("switch").str.strip_chars()
    elif {"ip", "asw"} <= set(df.columns):
        host, tor = "ip", pl.col("asw").str.strip_chars()
        if "psw" in df.columns:  # an ASW's name is unique within its pod only (a row
            # without a pod keeps the ASW's name: not dropped)
            pod = pl.col("psw").str.strip_chars()
            tor = (
                pl.when(pod.is_null() | (pod == ""))
                .then(tor)
                .otherwise(pl.concat_str(pod, pl.lit("-"), tor))
            )
    else:
        raise TopologyError(
            f"{path}: need columns node,switch (or Lingjun's ip,ASW); found {df.columns}"
        )
    df = df.select(pl.col(host).str.strip_chars(), tor.alias("switch")).drop_nulls()
    dup = df.filter(pl.col(host).is_duplicated())
    if dup.height:
        raise TopologyError(f"{path}: hosts listed twice: {sorted(set(dup[host]))[:5]}")
    return dict(zip(df[host].to_list(), df["switch"].to_list(), strict=True))


def write_topology(switch_of: dict[str, str], path: str | Path) -> None:
    pl.DataFrame({"node": list(switch_of), "switch": list(switch_of.values())}).write_csv(path)
