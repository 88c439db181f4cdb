"""TLS for gpuwarden's HTTP endpoints and the senders that reach them (the standard ``ssl``).

Servers (the engine's endpoint, the agent's reporter relay): :func:`server_context` from a
certificate and key, and, for mutual TLS, a CA whose clients alone may connect;
:func:`http_server` serves a handler with it. The TLS handshake runs on the request's own
thread (after the handler set its timeout), never on the accepting thread, so a client that
connects and says nothing holds up no one else; a failed handshake (plain HTTP, an unknown
client certificate) costs that connection only and is logged at debug level.

Limits (issue 38): a server serves at most ``max_connections`` connections at once; one more
is answered ``503`` with ``Retry-After: 1`` (plain HTTP; over TLS it is closed) from the
accepting thread, so a flood of idle clients holds at most that many threads and descriptors.
One peer (an IP address; on a Unix socket, a user id) holds at most ``max_per_peer`` of them
(default a quarter), and is answered the same way past it, so one host's flood leaves room for
every other sender.
Each request, from its first byte (or the TLS handshake, or the wait for the next request on
a kept-alive connection) until its body has been read, has ``request_deadline_s`` in all:
a client that trickles a byte at a time, within every per-read timeout, is cut off at the
deadline (a reaper thread shuts the socket down). Handlers that read a body call
:meth:`GuardedHandler.done_reading` after it, so the time the handler then takes to answer
is not counted; one that never calls it has the deadline cover its answer too.

Senders (the findings poster, the operator commands, the job-side reporter): the server is
verified against ``ca_file`` (the system's CAs when it is empty) and its name; ``cert_file``
and ``key_file`` are the client's own certificate for an engine that requires one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import selectors
import socket
import socketserver
import ssl
import struct
import sys
import threading
import time
from collections.abc import Iterable
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


class _Limited(socketserver.ThreadingMixIn, socketserver.BaseServer):
    """The connection cap and the request deadline (see the module docstring), for a TCP or a
    Unix-socket server."""

    # socketserver listens with a backlog of 5: a burst of more clients connecting at once
    # overflowed it (connections reset, or a 1 s SYN retry; benchmarks/serving.py). The kernel
    # caps this at net.core.somaxconn.
    request_queue_size = 1024
    daemon_threads = True
    max_connections = 128
    max_per_peer = 0  # 0: a quarter of max_connections (at least 1)
    request_deadline_s = 15.0
    _BUSY = (
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 13\r\nConnection: close\r\n\r\nserver busy\r\n"
    )

    def server_activate(self) -> None:
        super().server_activate()
        self.refused_busy = 0  # connections turned away at the cap
        self.cut_slow = 0  # connections shut down at their request deadline
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._per_peer = per_peer_cap(self.max_connections, self.max_per_peer)
        self._peers: dict[object, int] = {}  # connections served per peer (only those > 0)
        self._armed: dict[socket.socket, float] = {}
        self._active = 0  # connections being served
        self._guard = threading.Lock()
        self._deadline_due = threading.Condition(self._guard)
        self._stopping = threading.Event()
        # serve_forever sleeps in select() until a client or shutdown() (this pipe) wakes it,
        # instead of waking every 0.5 s to look for a shutdown request (issue 37: idle cost)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._served = threading.Event()
        self._serving = False
        threading.Thread(target=self._reap, daemon=True, name="http-deadlines").start()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """socketserver's loop, but woken by :meth:`shutdown` instead of polling for it
        (``poll_interval`` is not used)."""
        self._serving = True
        try:
            with selectors.PollSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ)  # type: ignore[attr-defined]
                selector.register(self._wake_r, selectors.EVENT_READ)
                while True:
                    ready = selector.select()
                    if any(key.fd == self._wake_r for key, _ in ready):
                        return
                    # socketserver's own step (accept, then process_request): the one its
                    # serve_forever takes; not handle_request(), which would select() again
                    self._handle_request_noblock()  # type: ignore[attr-defined]
                    self.service_actions()
        finally:
            self._served.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait for it to return (at once when it never ran)."""
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):  # full: a wake is already pending
                os.write(self._wake_w, b"x")
        if self._serving:
            self._served.wait()

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = _peer(request, client_address)
        with self._guard:
            held = self._peers.get(peer, 0)
            room = held < self._per_peer and self._slots.acquire(blocking=False)
            if room:
                self._peers[peer] = held + 1
            else:
                self.refused_busy += 1
        if not room:
            if not isinstance(request, ssl.SSLSocket):
                try:
                    request.settimeout(0.5)
                    request.sendall(self._BUSY)
                except OSError:
                    pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(peer)
            raise

    def _release(self, peer: object) -> None:
        with self._guard:
            left = self._peers.pop(peer, 1) - 1
            if left > 0:
                self._peers[peer] = left
        self._slots.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        peer = _peer(request, client_address)
        self.arm(request)  # the TLS handshake and the first request
        with self._guard:
            self._active += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.disarm(request)
            with self._guard:
                self._active -= 1
            self._release(peer)

    def busy(self) -> bool:
        """More than three quarters of the places are taken."""
        with self._guard:
            return self._active * 4 > self.max_connections * 3

    def arm(self, sock: socket.socket) -> None:
        """The request on ``sock`` must be read within ``request_deadline_s`` from now."""
        with self._guard:
            if not self._armed:
                self._deadline_due.notify()  # the reaper sleeps until there is a deadline
            self._armed[sock] = time.monotonic() + self.request_deadline_s

    def disarm(self, sock: socket.socket) -> None:
        with self._guard:
            self._armed.pop(sock, None)

    def _reap(self) -> None:
        """Shut each connection whose request deadline passed; sleeps until the earliest
        deadline (or, with none armed, until one is)."""
        while True:
            with self._guard:
                if self._stopping.is_set():
                    return
                now = time.monotonic()
                late = [s for s, deadline in self._armed.items() if deadline < now]
                for s in late:
                    del self._armed[s]
                self.cut_slow += len(late)
                if not late:
                    earliest = min(self._armed.values(), default=None)
                    self._deadline_due.wait(None if earliest is None else earliest - now + 0.01)
                    continue
            for s in late:
                log.debug("request deadline %g s passed: connection shut", self.request_deadline_s)
                # the plain socket's shutdown, also under TLS: the blocked read returns
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(s, socket.SHUT_RDWR)

    def server_close(self) -> None:
        stopping = getattr(self, "_stopping", None)  # None: the bind failed, nothing started
        if stopping is not None:
            with self._guard:
                stopping.set()
                self._deadline_due.notify_all()
            if not self._serving or self._served.is_set():
                fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
                for fd in fds:  # (-1 after: a later shutdown() never writes to a reused fd)
                    if fd >= 0:
                        os.close(fd)
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client gone mid-request (cut at its deadline, a reset): its own business
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


class _Server(_Limited, ThreadingHTTPServer):
    pass


class _UnixServer(_Limited, socketserver.ThreadingUnixStreamServer):
    """HTTP over a Unix socket: the peer is a process of this host, whose credentials
    (``SO_PEERCRED``) the handler can ask for (:func:`peer_pid`)."""


class GuardedHandler(BaseHTTPRequestHandler):
    """A request handler under its server's request deadline (see the module docstring).

    A kept-alive connection holds a thread and one of the server's places while it waits for
    its next request, so that wait is short (``keepalive_s``), and when the server is more than
    three quarters full each connection is closed after its answer: under a storm, places go
    to new clients rather than to idle ones."""

    keepalive_s = 2.0
    _served = 0

    def handle_one_request(self) -> None:
        arm = getattr(self.server, "arm", None)
        if arm is not None:  # every request, and the wait for it, has the deadline anew
            arm(self.connection)
        if self._served:  # a kept-alive connection: its next request line must come soon
            self.connection.settimeout(self.keepalive_s)
        super().handle_one_request()
        self._served += 1
        if getattr(self.server, "busy", lambda: False)():
            self.close_connection = True

    def parse_request(self) -> bool:
        self.connection.settimeout(self.timeout)  # the request has begun: the usual read timeout
        return super().parse_request()

    def done_reading(self) -> None:
        """The request is read: what the handler does now is not the client's to stall."""
        disarm = getattr(self.server, "disarm", None)
        if disarm is not None:
            disarm(self.connection)


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


def http_server(
    address: tuple[str, int],
    handler: type[BaseHTTPRequestHandler],
    context: ssl.SSLContext | None = None,
    *,
    max_connections: int = 128,
    max_per_peer: int = 0,
    request_deadline_s: float = 15.0,
) -> ThreadingHTTPServer:
    """A threading HTTP server for ``handler``; HTTPS when ``context`` is given; at most
    ``max_connections`` at once (``max_per_peer`` of them from one address; 0: a quarter),
    each request read within ``request_deadline_s``."""
    limits = _limits(max_connections, max_per_peer, request_deadline_s)
    cls = _Server if context is None else _TLSServer
    server: ThreadingHTTPServer = type(cls.__name__, (cls,), limits)(address, handler)
    if context is not None:
        server.context = context  # type: ignore[attr-defined]
    server.daemon_threads = True
    return server


def unix_http_server(
    path: str,
    handler: type[BaseHTTPRequestHandler],
    *,
    mode: int = 0o666,
    max_connections: int = 128,
    max_per_peer: int = 0,
    request_deadline_s: float = 15.0,
) -> socketserver.ThreadingUnixStreamServer:
    """An HTTP server on the Unix socket ``path`` (a stale socket file there is replaced; any
    other file is an error), with the same limits as :func:`http_server`. ``mode``: who may
    connect (by default any local process: the handler tells them apart by their
    credentials)."""
    if os.path.lexists(path):
        if not os.path.exists(path) or not _is_socket(path):
            raise OSError(f"{path} exists and is not a socket; not replacing it")
        os.unlink(path)
    limits = _limits(max_connections, max_per_peer, request_deadline_s)
    server: socketserver.ThreadingUnixStreamServer = type("_UnixServer", (_UnixServer,), limits)(
        path, handler
    )
    os.chmod(path, mode)
    return server


def per_peer_cap(max_connections: int, max_per_peer: int = 0) -> int:
    """The connections one peer may hold: ``max_per_peer``, or with 0 a quarter of
    ``max_connections`` (at least 1)."""
    return max_per_peer or max(1, max_connections // 4)


def _limits(max_connections: int, max_per_peer: int, deadline_s: float) -> dict[str, Any]:
    if max_connections < 1 or max_per_peer < 0 or deadline_s <= 0:
        raise ValueError("max_connections must be >= 1, max_per_peer >= 0 and "
                         "request_deadline_s > 0")  # fmt: skip
    return {"max_connections": max_connections, "max_per_peer": max_per_peer,
            "request_deadline_s": deadline_s}  # fmt: skip


def _peer(request: Any, client_address: Any) -> object:
    """Who is at the other end, for the per-peer cap: the IP address, or on a Unix socket the
    user id the kernel gives (``SO_PEERCRED``)."""
    if getattr(request, "family", None) == socket.AF_UNIX:
        try:
            creds = request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                       struct.calcsize("3i"))  # fmt: skip
        except OSError:
            return ("unix", -1)
        return ("unix", struct.unpack("3i", creds)[1])
    if isinstance(client_address, tuple) and client_address:
        return client_address[0]
    return client_address


def _is_socket(path: str) -> bool:
    import stat

    return stat.S_ISSOCK(os.lstat(path).st_mode)


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket (``SO_PEERCRED``: the kernel's
    word, not the client's), or None for any other socket."""
    if sock.family != socket.AF_UNIX:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return pid if pid > 0 else None


def loopback_peer_pids(
    sock: socket.socket,
    procfs: str = "/proc",
    likely: Iterable[int] = (),
    budget_s: float = 0.5,
) -> list[int] | None:
    """The processes holding the other end of a TCP connection from this host, found the way
    identd finds them, from the kernel's word: the peer's socket (local address the peer's,
    remote address ``sock``'s own) gives its inode and its owner's uid, and the processes of
    that uid holding ``socket:[<inode>]`` in ``<procfs>/<pid>/fd`` are the peer (``likely``
    first: a relay's recent callers). Returns None only for a peer on another host (its
    address is none of this host's: a loopback address, or one bound here); ``[]`` for a
    local peer that cannot be told: its socket gone (reset, closed) before the lookup, no
    process of its owner holding it, the descriptors not ours to read (refuse it); else the
    first holder found. :class:`TimeoutError` past ``budget_s`` (answer "retry": a node whose
    owner's processes hold very many descriptors). A socket passed to a process of the same
    owner counts as that process's: the owner's own jobs (in Kubernetes, root's: every pod
    running as root is one owner).

    The socket is asked of the kernel by sock_diag (one socket, directly), or read from
    ``<procfs>/net/tcp`` (``tcp6``): the table of the reading process's network namespace,
    the one a local peer shares with the listener. The descriptors of the owner's processes
    are looked at, within the budget: call it once per connection, not per request."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        peer, here = sock.getpeername(), sock.getsockname()
    except OSError:
        return []  # reset or gone before it could be looked up: nobody can say whose it was
    peer_ip, here_ip = _unmapped(peer[0]), _unmapped(here[0])
    if not (peer_ip.is_loopback or _is_local(peer_ip)):
        return None
    if peer_ip.version != here_ip.version:
        return []
    # the peer's socket as the kernel holds it (local = the peer, remote = our end), in the
    # table of its family: an IPv4 pair in tcp, or as IPv4-mapped IPv6 in tcp6 for a peer
    # that connected from an AF_INET6 socket
    forms = []
    if peer_ip.version == 4:
        forms.append(("tcp", peer_ip.packed, here_ip.packed))
        mapped = b"\0" * 10 + b"\xff\xff"
        forms.append(("tcp6", mapped + peer_ip.packed, mapped + here_ip.packed))
    else:
        forms.append(("tcp6", peer_ip.packed, here_ip.packed))
    owned: set[tuple[bytes, int]] = set()  # (inode, owner's uid)
    if procfs == "/proc":  # the kernel's own lookup of that one socket, where it answers
        for table, peer_packed, here_packed in forms:
            found = _diag_inode(table, peer_packed, peer[1], here_packed, here[1])
            if found:
                owned.add((str(found[0]).encode(), found[1]))
                break
    for table, peer_packed, here_packed in forms if not owned else ():
        try:
            with open(f"{procfs}/net/{table}", "rb") as f:
                text = f.read()
        except OSError:
            continue
        # rows are "  sl: local remote st ... uid timeout inode ...": the pair is searched for
        # as bytes (a table holds a row per socket of the namespace, TIME_WAIT included)
        pair = f": {_proc_address(peer_packed, peer[1])} {_proc_address(here_packed, here[1])} "
        key = pair.encode()
        at = text.find(key)
        while at >= 0:
            end = text.find(b"\n", at)
            cols = text[text.rfind(b"\n", 0, at) + 1 : end if end >= 0 else None].split()
            if len(cols) > 9 and cols[9] != b"0" and cols[7].isdigit():  # 0: TIME_WAIT
                owned.add((cols[9], int(cols[7])))
            at = text.find(key, at + 1)
        if owned:
            break
    if len(owned) != 1:
        return []
    ((inode, uid),) = owned
    links = {f"socket:[{inode.decode()}]"}
    deadline = time.monotonic() + budget_s
    try:
        tasks = [e.name for e in os.scandir(procfs) if e.name.isdigit()]
    except OSError:
        return []
    for pid in dict.fromkeys([*map(str, likely), *tasks]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no holder of {links.pop()} found within {budget_s:g} s")
        try:
            if os.stat(f"{procfs}/{pid}").st_uid != uid:
                continue  # only the socket's owner's processes (a socket passed to another
                # user's process is not theirs to speak with)
        except OSError:
            continue
        if _holds(f"{procfs}/{pid}/fd", links):
            return [int(pid)]
    return []


class _LocalAddresses:
    """This host's addresses, read again at most once a second."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = -1e9
        self._known: frozenset[str] = frozenset()

    def __contains__(self, address: str) -> bool:
        with self._lock:
            if time.monotonic() - self._at > 1.0:
                self._known = frozenset(_local_addresses())
                self._at = time.monotonic()
            return address in self._known


_LOCAL = _LocalAddresses()


def _is_local(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``ip`` is one of this host's addresses (in this network namespace), from the
    kernel's own lists: ``/proc/net/fib_trie``'s ``host LOCAL`` entries (IPv4) and
    ``/proc/net/if_inet6`` (IPv6). (Binding a socket to it, the first way, says yes to every
    address on a host with ``ip_nonlocal_bind`` set.)"""
    return ip.compressed in _LOCAL


def _local_addresses(procfs: str = "/proc") -> set[str]:
    found: set[str] = set()
    with (
        contextlib.suppress(OSError),
        open(f"{procfs}/net/fib_trie", encoding="ascii", errors="replace") as f,
    ):
        last = ""
        for line in f:
            words = line.split()
            if words[:1] == ["|--"] and len(words) == 2:
                last = words[1]
            elif "host" in words and "LOCAL" in words and last:
                found.add(last)
    with (
        contextlib.suppress(OSError),
        open(f"{procfs}/net/if_inet6", encoding="ascii", errors="replace") as f,
    ):
        for line in f:
            words = line.split()
            if words and len(words[0]) == 32:
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.IPv6Address(bytes.fromhex(words[0])).compressed)
    return found


#: netlink's socket diagnostics (linux/sock_diag.h, linux/inet_diag.h)
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLMSG_ERROR = 4, 20, 2
_NO_COOKIE = 0xFFFFFFFF
_TCP_LISTEN = 10


def _diag_inode(
    table: str, src: bytes, sport: int, dst: bytes, dport: int
) -> tuple[int, int] | None:
    """The inode and owner's uid of the TCP socket whose local end is ``src:sport`` and remote
    ``dst:dport`` (``table`` "tcp": IPv4, "tcp6": IPv6), asked of the kernel by an exact
    sock_diag lookup (what ``ss`` uses; no privilege needed): one socket found directly, where
    reading ``/proc/net/tcp`` makes the kernel print every socket of the namespace. The
    answer must be that very connection: the lookup falls back to a listener on the port,
    which is refused, as is any answer whose addresses differ. None where it does not answer
    (no such socket, no netlink): the caller reads the table instead."""
    family = socket.AF_INET if table == "tcp" else socket.AF_INET6
    wanted = struct.pack("!HH16s16s", sport, dport, src.ljust(16, b"\0"), dst.ljust(16, b"\0"))
    sockid = wanted + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, 1, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(header + request)
            reply = nl.recv(8192)
    except OSError:
        return None
    if len(reply) < 16:
        return None
    length, kind = struct.unpack_from("=IH", reply)
    # inet_diag_msg: family, state, timer, retrans (4 bytes), the socket id (48), expires,
    # rqueue, wqueue, uid, then the inode
    if kind != _SOCK_DIAG_BY_FAMILY or length < 16 + 72 or len(reply) < 16 + 72:
        return None  # NLMSG_ERROR: no such socket (-ENOENT), or a kernel without the lookup
    got_family, state = reply[16], reply[17]
    if got_family != family or state == _TCP_LISTEN or reply[20 : 20 + len(wanted)] != wanted:
        return None
    uid, inode = struct.unpack_from("=II", reply, 16 + 64)
    return (inode, uid) if inode else None


def _holds(fd_dir: str, links: set[str]) -> bool:
    """Whether one of the descriptors in ``fd_dir`` is one of ``links`` (False where the
    process is gone or its descriptors are not ours to read)."""
    try:
        with os.scandir(fd_dir) as fds:
            for fd in fds:
                with contextlib.suppress(OSError):  # closed since the listing
                    if os.readlink(fd.path) in links:
                        return True
    except OSError:
        pass
    return False


def _unmapped(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(host.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _proc_address(packed: bytes, port: int) -> str:
    """An address and port as ``/proc/net/tcp`` prints them: each 32-bit word of the address
    as the machine holds it, in hex, then the port."""
    words = (int.from_bytes(packed[i : i + 4], sys.byteorder) for i in range(0, len(packed), 4))
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"
