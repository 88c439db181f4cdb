"""Nodes that fell silent: an agent that reported in the window, then stopped.

Every agent cycle writes the agent's own ``agent`` point (``source=agent``), whatever its
hardware does; so a node none has come from for ``silent_after_s`` (60 s: six cycles at the
default interval) while it reported earlier in the window has lost its agent, its network or
itself. That is a ``node_silent`` finding: a person should look (the shipped policy notifies);
the scheduler sees a dead node by itself, but not a dead agent, which leaves the node's GPUs
unwatched.

A silence most nodes share at once is the data path (InfluxDB, the network), not the nodes:
then no node is named, and the analysis says so. And when the data path comes back, the
agents' spools drain in order, so for a little while a node with more to send looks silent
while the others do not: the analyze service (``--every``) names a node only when it is
silent in two analyses running (:class:`Confirmed`), as an alert rule's ``for:`` would. That
holds only while an agent's sink sends again sooner than one analysis interval after the data
path is back: keep ``--every`` above the agents' ``[sink] backoff_max_s`` plus a flush (the
shipped 60 s against 30 s and 1 s; ``tests/test_live_silence.py`` replays the race).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpuwarden.core.store.reader import InfluxReader

log = logging.getLogger(__name__)
NS = 1_000_000_000


@dataclass(frozen=True)
class Silence:
    cluster: str
    node: str
    last_seen_ns: int
    silent_s: float


def silent_nodes(
    reader: InfluxReader,
    start_ns: int,
    end_ns: int,
    after_s: float,
    where: dict[str, str] | None = None,
) -> list[Silence]:
    """Nodes whose last ``agent`` point in the window is more than ``after_s`` before its end."""
    last = reader.aggregate(
        "agent",
        {"lag": "last:cycle_lag_s"},
        start_ns,
        end_ns,
        every_s=None,
        group_tags=["cluster", "node"],
        where=where,
    )
    if last.is_empty():
        return []
    out = []
    for cluster, node, seen in last.select("cluster", "node", "time").iter_rows():
        seen_ns = int(seen.timestamp() * NS)
        silent_s = (end_ns - seen_ns) / NS
        if silent_s > after_s:
            out.append(Silence(cluster or "", node, seen_ns, round(silent_s, 1)))
    if len(out) > last.height / 2:
        log.warning(
            "%d of %d nodes silent for more than %.0f s: the data path (InfluxDB, the network), "
            "not the nodes; none is named",
            len(out),
            last.height,
            after_s,
        )
        return []
    return out


class Confirmed:
    """Silences seen in this analysis and the one before (the service keeps one of these)."""

    def __init__(self) -> None:
        self._before: set[tuple[str, str]] = set()

    def __call__(self, silent: list[Silence]) -> list[Silence]:
        now = {(s.cluster, s.node) for s in silent}
        confirmed = [s for s in silent if (s.cluster, s.node) in self._before]
        self._before = now
        return confirmed
