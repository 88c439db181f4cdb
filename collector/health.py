"""When a node is healthy again: the agent's ``node_healthy`` finding.

Remediation takes nodes out on fatal events and predicted failures; someone has to say when a
node may go back. The agent is the one that sees the node after its repair, so it says so: a
``node_healthy`` finding, which the engine's ``healthy-again`` policy turns into an
``uncordon`` proposal (approval required by default, and only for nodes gpuwarden itself
took out).

Healthy means, for ``healthy_after_s`` without a break: no critical finding from this node (a
fatal XID on either path, a lost GPU, a GPU left out of the NVLink fabric), no GPU in a state
that waits for a repair (:data:`UNHEALTHY_STATES`: not registered with the fabric, a row remap
or page retirement pending a reset, a failed row remap) and, when ``expected_gpus`` is set, at
least that many GPUs reporting every cycle (a GPU that fell off the bus is not a critical
event, it is just missing). The stretch starts when the agent starts, so a node that was
drained, repaired and rebooted is announced ``healthy_after_s`` after its agent comes back.
Each healthy stretch is announced once (with ``reannounce_s``, again every ``reannounce_s``
while it lasts, each time after a fresh check: a node the engine holds out on a prediction then
comes back by itself at the first announcement after the hold, where nothing else runs a check,
e.g. on Kubernetes; :mod:`remediation.holds`); a critical event, a GPU waiting for a repair or
a missing GPU starts a new one, and so does a finding of a kind in ``restart_on`` (by default
``link_flap``): a warning a site's policy may take the node out for, which then comes back on
its own once the port has been quiet for ``healthy_after_s`` and the check passes (a flap that
heals is not a node kept out until someone clears it). With ``link_flap`` in it, every
link-down of a port (its ``link_downed_total`` grows, or it leaves ACTIVE) starts the stretch
again too: a port that keeps flapping within one episode raises one finding, and must not be
called healed while it flaps. A healthy fleet therefore says it once per agent start (and
once per ``reannounce_s``), which the engine answers with ``not_ours`` and nothing else.

Quiet is not proof. With ``[health] check_probes`` set (the default: gpu_count, infiniband,
disk), the node is announced only after it passes the active node check
(:mod:`collector.check`), run on a thread of its own when the stretch is long enough: the
``node_healthy`` finding then carries ``check = "pass"`` and ``checked_ns``, which the engine
requires before it returns a node it took out. A failed check is a critical
``node_check_failed`` finding instead, and the stretch starts again.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from gpuwarden.core.finding import MAX_BUCKET_S, Finding, Severity
from gpuwarden.core.store.lineprotocol import Point

NS = 1_000_000_000
# GPU fields whose value (field -> the value that is bad) keeps a node from being called healthy
UNHEALTHY_STATES = {
    "fabric_registered_active": False,
    "remapped_rows_pending_active": True,
    "remapped_rows_failure_active": True,
    "retired_pages_pending_active": True,
}


class Stretch:
    """How long a condition has held without a break, said once per stretch (the node healthy,
    a GPU left out of the fabric), and, with ``again_ns``, again every ``again_ns`` while it
    holds. Not thread-safe: the owner locks where it needs to."""

    def __init__(self, after_ns: int, again_ns: int = 0) -> None:
        self.after_ns = after_ns
        self.again_ns = again_ns
        self.since_ns: int | None = None
        self.said = False
        self.said_ns = 0

    def end(self) -> bool:
        """The condition broke; whether this stretch had been said."""
        said, self.since_ns, self.said = self.said, None, False
        return said

    def due(self, now_ns: int) -> int | None:
        """The condition holds at ``now_ns``: the stretch's length (ns) the first time it
        reaches ``after_ns``, else None."""
        if self.since_ns is None:
            self.since_ns = now_ns
        length = now_ns - self.since_ns
        if length < self.after_ns:
            return None
        if self.said and not (self.again_ns and now_ns - self.said_ns >= self.again_ns):
            return None
        self.said, self.said_ns = True, now_ns
        return length


class HealthGate:
    def __init__(
        self,
        cluster: str,
        node: str,
        emit: Callable[[Finding], None],
        *,
        healthy_after_s: float = 1800.0,
        expected_gpus: int = 0,
        check: Callable[[int], Finding] | None = None,
        restart_on: Sequence[str] = ("link_flap",),
        reannounce_s: float = 0.0,
    ) -> None:
        if healthy_after_s <= 0 or expected_gpus < 0:
            raise ValueError("healthy_after_s must be positive and expected_gpus at least 0")
        if reannounce_s and reannounce_s < healthy_after_s:
            raise ValueError("reannounce_s must be 0 (once per stretch) or >= healthy_after_s")
        self.cluster, self.node, self.emit = cluster, node, emit
        self.expected_gpus = expected_gpus
        self.restart_on = frozenset(restart_on)
        self.check = check
        """Runs the node check at a time (ns); its finding (node_healthy or
        node_check_failed)."""
        self.checks: list[threading.Thread] = []
        # two announcements are at least healthy_after_s apart (each needs a whole stretch), so
        # buckets that wide give each its own finding id; the default 300 s bucket would make a
        # second one within five minutes a "duplicate" the engine drops (a short healthy_after_s)
        self.bucket_s = min(MAX_BUCKET_S, max(1, int(healthy_after_s)))
        self._healthy = Stretch(int(healthy_after_s * NS), int(reannounce_s * NS))
        self._ports: dict[tuple[str, str], tuple[object, object]] = {}  # (downs, state) last seen
        self._lock = threading.Lock()  # observe() runs on the sources' event threads too

    def observe(self, finding: Finding) -> None:
        """Every finding the node's sources raise passes here; a critical one (or one of a
        kind in ``restart_on``) breaks the stretch, which starts again with the next cycle (not
        at the event's own time: a kernel log read back at start carries old times)."""
        if finding.kind == "node_healthy":
            return
        if finding.severity is Severity.CRITICAL or finding.kind in self.restart_on:
            with self._lock:
                self._healthy.end()

    def cycle(self, now_ns: int, points: Sequence[Point]) -> None:
        """After each collection cycle: announce the node once it has been healthy long enough."""
        gpu_points = [p for p in points if p.measurement == "gpu"]
        gpus = len({p.tags.get("gpu") for p in gpu_points})
        waiting = any(
            p.fields.get(name) is bad for p in gpu_points for name, bad in UNHEALTHY_STATES.items()
        )
        went_down = "link_flap" in self.restart_on and self._link_downs(points)
        with self._lock:
            if gpus < self.expected_gpus or waiting or went_down:
                self._healthy.end()
                return
            healthy_for = self._healthy.due(now_ns)
        if healthy_for is None:
            return
        if self.check is not None:
            t = threading.Thread(target=self._checked, args=(now_ns,), daemon=True,
                                 name="node-check")  # fmt: skip
            self.checks = [c for c in self.checks if c.is_alive()] + [t]
            t.start()
            return
        seen = f", {gpus} GPUs reporting" if self.expected_gpus else ""
        self.emit(
            Finding(
                kind="node_healthy",
                subject={"cluster": self.cluster, "node": self.node},
                severity=Severity.INFO,
                time_ns=now_ns,
                evidence={"healthy_for_s": healthy_for // NS, "gpus": gpus},
                confidence=1.0,
                summary=f"{self.node}: no critical event for {healthy_for // NS} s{seen}",
                source="agent",
                bucket_s=self.bucket_s,
            )
        )

    def _link_downs(self, points: Sequence[Point]) -> bool:
        """Whether a port went down since the last cycle: its ``link_downed_total`` grew (a
        counter reset is not a flap), or it was ACTIVE (4) and is not now."""
        down = False
        for p in points:
            if p.measurement != "ib_port":
                continue
            key = (p.tags.get("hca", ""), p.tags.get("port", ""))
            downs, state = p.fields.get("link_downed_total"), p.fields.get("state_code")
            before = self._ports.get(key)
            if before is not None:
                was_downs, was_state = before
                if isinstance(downs, int) and isinstance(was_downs, int) and downs > was_downs:
                    down = True
                if was_state == 4 and state is not None and state != 4:
                    down = True
            self._ports[key] = (downs, state)
        return down

    def _checked(self, now_ns: int) -> None:
        """The stretch is long enough: run the node check; say what it found (a failure is
        critical, and :meth:`observe` starts the stretch again)."""
        assert self.check is not None
        finding = dataclasses.replace(self.check(now_ns), source="agent")
        if finding.kind == "node_healthy":
            finding = dataclasses.replace(finding, bucket_s=self.bucket_s)
        self.emit(finding)
