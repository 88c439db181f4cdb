"""TLS for gpuwarden's HTTP endpoints and the senders that reach them (the standard ``ssl``).

Servers (the engine's endpoint, the agent's reporter relay): :func:`server_context` from a
certificate and key, and, for mutual TLS, a CA whose clients alone may connect;
:func:`http_server` serves a handler with it. The TLS handshake runs on the request's own
thread (after the handler set its timeout), never on the accepting thread, so a client that
connects and says nothing holds up no one else; a failed handshake (plain HTTP, an unknown
client certificate) costs that connection only and is logged at debug level.

Senders (the findings poster, the operator commands, the job-side reporter): the server is
verified against ``ca_file`` (the system's CAs when it is empty) and its name; ``cert_file``
and ``key_file`` are the client's own certificate for an engine that requires one.
"""

from __future__ import annotations

import logging
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


def server_context(cert_file: str, key_file: str, client_ca_file: str = "") -> ssl.SSLContext:
    """TLS 1.2 or newer with ``cert_file``/``key_file``; with ``client_ca_file``, every client
    must present a certificate that CA signed (mutual TLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file or None)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """Verifies the server against ``ca_file`` (the system's CAs if empty) and its host name;
    presents ``cert_file`` when given (mutual TLS)."""
    ctx = ssl.create_default_context(cafile=ca_file or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: a burst of more clients connecting at once
    # overflowed it (connections reset, or a 1 s SYN retry; benchmarks/serving.py). The kernel
    # caps this at net.core.somaxconn.
    request_queue_size = 1024
    daemon_threads = True


class _TLSServer(_Server):
    context: ssl.SSLContext

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(getattr(self.RequestHandlerClass, "timeout", None) or 10)
            request.do_handshake()
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", client_address, exc)
            return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def http_server(
    address: tuple[str, int],
    handler: type[BaseHTTPRequestHandler],
    context: ssl.SSLContext | None = None,
) -> ThreadingHTTPServer:
    """A threading HTTP server for ``handler``; HTTPS when ``context`` is given."""
    server: ThreadingHTTPServer
    if context is None:
        server = _Server(address, handler)
    else:
        server = _TLSServer(address, handler)
        server.context = context
    server.daemon_threads = True
    return server
