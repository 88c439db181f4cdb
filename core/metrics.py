"""``/metrics`` for gpuwarden's services, in Prometheus' text format (``prometheus_client``).

Each service hands over a function that returns its numbers as they are now (a list of
:class:`Metric`); the exposition renders them at scrape time, so nothing is counted twice and
a scrape sees the state of that moment. Names follow Prometheus' conventions:
``gpuwarden_<service>_<what>[_<unit>]``, counters ending ``_total``.

The agent and the analyze service serve it on a listener of their own (:func:`serve_metrics`,
off unless ``metrics_listen`` is set; no authentication, like node-exporter and
dcgm-exporter: bind it to an address only the Prometheus server reaches); the engine serves it
on its own endpoint, behind its bearer token (Prometheus' ``authorization`` scrape setting).
``prometheus_client`` is imported on first use, so a process that never serves metrics never
loads it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any, Literal

from gpuwarden.core.tls import GuardedHandler, http_server

log = logging.getLogger(__name__)

#: the text format every Prometheus 2.x and 3.x reads (prometheus_client 0.26 announces 1.0.0,
#: newer than Debian bookworm's Prometheus 2.42; our names need no escaping in either)
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Metric:
    """One metric family: ``samples`` are ``(labels, value)``; a sample missing a label of
    the family's gets it empty (Prometheus reads an empty label as no label)."""

    name: str
    help: str
    kind: Literal["gauge", "counter"] = "gauge"
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)

    @classmethod
    def one(cls, name: str, help: str, value: float, kind: Literal["gauge", "counter"] = "gauge",
            **labels: str) -> Metric:  # fmt: skip
        return cls(name, help, kind, [(labels, float(value))])


def render(metrics: Iterable[Metric]) -> tuple[bytes, str]:
    """``(body, content type)`` of the text exposition format."""
    from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import generate_latest

    families: list[Any] = []
    for m in metrics:
        labels = sorted({k for lab, _ in m.samples for k in lab})
        family: Any
        if m.kind == "counter":
            family = CounterMetricFamily(m.name.removesuffix("_total"), m.help, labels=labels)
        else:
            family = GaugeMetricFamily(m.name, m.help, labels=labels)
        for lab, value in m.samples:
            family.add_metric([str(lab.get(k, "")) for k in labels], float(value))
        families.append(family)

    class _Now:
        def collect(self) -> Iterator[Any]:
            yield from families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Now())
    return generate_latest(registry), TEXT_0_0_4


class _Handler(GuardedHandler):
    produce: Callable[[], list[Metric]]
    timeout = 10
    server_version = "gpuwarden metrics"

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics here")
            return
        try:
            body, content_type = render(type(self).produce())
        except Exception:  # a broken number costs the scrape, never the service
            log.exception("rendering /metrics failed")
            self.send_error(500, "metrics could not be rendered")
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def serve_metrics(listen: str, produce: Callable[[], list[Metric]]) -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` on ``listen`` (``host:port``) from a daemon thread; the caller
    shuts it down (``server.shutdown()``)."""
    host, _, port = listen.rpartition(":")
    handler = type("MetricsHandler", (_Handler,), {"produce": staticmethod(produce)})
    server = http_server((host or "127.0.0.1", int(port)), handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server
