"""The agent's health endpoint, for liveness and readiness probes (``[agent] health_listen``).

Two questions, two paths, each answered ``200`` or ``503`` with a small JSON body
(``{"status": "ok" | "fail", "reasons": [...]}``):

``GET /livez``   Is the loop alive? It fails when no cycle has finished (sources read, points
                 handed to the sink) for :func:`stale_after_s`: three intervals plus one
                 ``source_timeout_s`` per source, the longest a healthy cycle can take while the
                 supervisor gives up on hung sources. A restart is the cure for that, so
                 Kubernetes' liveness probe points here. A failing source or a parked sink do
                 not fail it: a restart fixes neither (no GPU driver, a wrong token).
``GET /readyz``  Does the agent do its job? It fails before the first cycle, while any source has
                 failed ``[agent] health_fail_cycles`` cycles in a row, while the sink is parked
                 (InfluxDB answered 401, 403, 404 or 413: it keeps the data and waits for the
                 operator), and whenever ``/livez`` fails. A DaemonSet has no Service to take the
                 pod out of, but a pod that is not ready stalls a rolling update and shows in
                 ``kubectl get ds``, which is what a broken agent version or node should do.

The reasons name sources and states, never their error messages (the endpoint may be bound to
the pod network; the log has the messages). No authentication and no data: nothing here moves
a node. Off unless ``health_listen`` is set; ``127.0.0.1:9467`` on a host (systemd), the pod's
address in Kubernetes, where the kubelet probes the pod IP.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuwarden.collector.agent import Agent
from gpuwarden.collector.errors import CollectorError
from gpuwarden.core.tls import http_server

log = logging.getLogger(__name__)

LIVE = "/livez"
READY = "/readyz"
PATHS = (LIVE, READY)


@dataclass(frozen=True)
class Verdict:
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons


def stale_after_s(agent: Agent) -> float:
    """How long without a finished cycle means the loop is stuck."""
    return 3 * agent.interval_s + agent.source_timeout_s * max(1, len(agent.sources))


def liveness(agent: Agent, now: float) -> Verdict:
    since = agent.last_cycle_at if agent.last_cycle_at is not None else agent.started_at
    limit = stale_after_s(agent)
    if now - since > limit:
        return Verdict([f"no cycle finished for {now - since:.0f} s (limit {limit:.0f} s)"])
    return Verdict()


def readiness(agent: Agent, now: float, fail_cycles: int, parked: str) -> Verdict:
    reasons = list(liveness(agent, now).reasons)
    if agent.cycles == 0:
        reasons.append("no cycle yet")
    for name, health in sorted(agent.health.items()):
        if health.failed_cycles >= fail_cycles:
            reasons.append(f"source {name} failed {health.failed_cycles} cycles in a row")
    if parked:
        reasons.append(f"sink parked ({parked}); the data waits in the spool")
    return Verdict(reasons)


def serve_probes(
    listen: str, agent: Agent, fail_cycles: int, parked: Callable[[], str]
) -> ThreadingHTTPServer:
    """Serve :data:`PATHS` on ``listen`` (``host:port``) from a daemon thread; the caller
    shuts it down. A port that cannot be bound is a :class:`CollectorError` (exit 2)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = 10
        server_version = "gpuwarden probes"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            now = agent.monotonic()
            if path == LIVE:
                verdict = liveness(agent, now)
            elif path == READY:
                verdict = readiness(agent, now, fail_cycles, parked())
            else:
                self.send_error(404, f"only {', '.join(PATHS)} here")
                return
            body = json.dumps(
                {"status": "ok" if verdict.ok else "fail", "reasons": verdict.reasons}
            ).encode()
            self.send_response(200 if verdict.ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    host, _, port = listen.rpartition(":")
    try:
        server = http_server((host or "127.0.0.1", int(port)), Handler)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CollectorError(f"[agent] health_listen {listen}: {why}") from None
    threading.Thread(target=server.serve_forever, daemon=True, name="probes").start()
    return server
