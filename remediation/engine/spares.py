"""Hot spares: ``spares`` idle nodes held out of the scheduler's general pool, so that a job
requeued off a bad node starts again at once instead of waiting in the queue for a node to
free up.

The pool is the node adapter's (:class:`remediation.model.SparePool`; Slurm: a spare is a
node drained with the reason ``gpuwarden: hot spare``, so the pool survives an engine restart
and an operator sees it in ``sinfo -R``; Kubernetes: cordoned, tainted and labelled
``gpuwarden.io/state=spare``). The engine

* **refills** the pool on every tick from the idle nodes, last in the scheduler's order
  first (Slurm allocates the first ones), never one gpuwarden or anyone else took out;
* **releases** a spare just before it requeues a job off a node (the fatal and predicted
  ladders: drain, then requeue), so the requeued job finds a free node at once;
* does not count spares as nodes *out* for the blast-radius limit: they are held, not broken.

A node that comes back from repair (``uncordon``) rejoins the general pool; the next refill
may take it, or another idle node, as a spare. Every hold and release is audited
(``event: spare``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from gpuwarden.remediation.audit import AuditLog, Memory
from gpuwarden.remediation.clock import Clock
from gpuwarden.remediation.engine.decide import EngineSettings
from gpuwarden.remediation.model import Adapter, AdapterError, SparePool

log = logging.getLogger("gpuwarden.remediation")


class Spares:
    def __init__(
        self,
        settings: EngineSettings,
        adapters: Mapping[str, Adapter],
        memory: Memory,
        audit: AuditLog,
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.adapters = adapters
        self.memory = memory
        self.audit = audit
        self.clock = clock

    def pool(self) -> SparePool | None:
        adapter = self.adapters.get(self.settings.node_adapter)
        if self.settings.spares < 1 or not isinstance(adapter, SparePool):
            return None
        return adapter

    def refill(self) -> list[str]:
        """Hold idle nodes until the pool has ``spares``; the nodes taken (none in dry run)."""
        pool = self.pool()
        if pool is None or self.settings.dry_run:
            return []
        try:
            inv = pool.inventory()
        except AdapterError as exc:
            log.error("spares: no inventory (%s); the pool is not refilled", exc)
            return []
        short = self.settings.spares - len(inv.spares)
        idle = [n for n in inv.idle if n not in self.memory.taken_out]  # idle: never out
        taken = []
        for node in sorted(idle, reverse=True)[: max(0, short)]:
            self._do("hold", node, pool.hold_spare)
            taken.append(node)
        return taken

    def release_for(self, node: str) -> str:
        """Put one spare back in service before the jobs on ``node`` are requeued; the spare
        released, or "" (no pool, none held, or a dry run)."""
        pool = self.pool()
        if pool is None or self.settings.dry_run:
            return ""
        try:
            spares = sorted(pool.inventory().spares - {node})
        except AdapterError as exc:
            log.error("spares: no inventory (%s); the requeue waits in the queue", exc)
            return ""
        if not spares:
            return ""
        self._do("release", spares[0], pool.release_spare, for_node=node)
        return spares[0]

    def _do(self, op: str, node: str, call: Callable[[str], object], **extra: str) -> None:
        try:
            call(node)
            outcome, message = "ok", ""
        except AdapterError as exc:
            outcome, message = "failed", str(exc)
            log.error("spares: %s %s failed: %s", op, node, exc)
        self.audit.append(
            "spare", self.clock.wall(), op=op, node=node, outcome=outcome, message=message, **extra
        )
