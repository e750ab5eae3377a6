"""The parent's egress proxy: the only way out of a sandbox whose network namespace has
nothing but loopback.

The child's HTTP(S)_PROXY points at a listener it bound inside its namespace and passed to
the parent; the parent runs this proxy on it. Per request (plain HTTP in absolute form, or
CONNECT) it asks the policy's `EgressFilter` (domain, port, rate limit), resolves the name
itself, refuses loopback/private/link-local/... addresses that no rule names, and connects to
the very address it checked (no second lookup, so DNS rebinding cannot swap it). Every
decision is counted and reported through `on_decision`.

One thread per connection (at most `max_connections`), each waiting with `poll` on its own
sockets and on a wake-up pipe that `close()` makes readable, so a slow or silent client only
ever holds its own thread, and `close()` never waits for a timeout to run out.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import mmap
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...policy.egress import EgressDecision, EgressFilter, MalformedTargetError, parse_authority
from ...policy.models import NetworkEgressRule
from ..linux.syscalls import set_process_name
from ..linux.tasks import PROXY_THREAD_NAME

__all__ = ["EgressProxy", "address_refusal"]

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
# Chunk per relay direction: big downloads want large reads (1 MiB gave ~1.3x the speed of
# 256 KiB here); requests going up are usually small.
DOWNSTREAM_CHUNK_BYTES = 1024 * 1024
UPSTREAM_CHUNK_BYTES = 256 * 1024
REASON_PHRASE_CHARS = 200
# Bounds on the proxy's own small writes (error replies) and on reading what a refused
# client still sends, so the reply is not lost to a reset.
REPLY_TIMEOUT = 5.0
DRAIN_TIMEOUT = 1.0
DRAIN_BYTES = 256 * 1024
# How long close() waits for a thread stuck in a name lookup (getaddrinfo cannot be woken).
CLOSE_JOIN_TIMEOUT = 30.0

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_REQUEST_LINE = re.compile(rf"({_TOKEN}) ([\x21-\x7e]+) (HTTP/1\.[01])\Z")
_HEADER = re.compile(rf"({_TOKEN}):[ \t]*([^\x00\r\n]*?)[ \t]*\Z")
# Headers never forwarded as sent (hop-by-hop ones, and Host, rebuilt from the URL).
_NOT_FORWARDED = {"connection", "keep-alive", "te", "trailer", "upgrade", "host"}
_DIGITS = re.compile(r"[0-9]+")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_ADDRESS_CLASSES = (
    ("loopback", "is_loopback"),
    ("unspecified", "is_unspecified"),
    ("link-local", "is_link_local"),
    ("multicast", "is_multicast"),
    ("private", "is_private"),
    ("reserved", "is_reserved"),
)
# The proxy's own errors say what they are before the reason; refusals (403, 429) and
# upstream failures (502) carry the bare reason, as a client shows it to the user.
_STATUS_TEXT = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
                503: "Service Unavailable"}  # fmt: skip

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]


class _Closing(Exception):
    """The proxy is closing: the connection's thread stops where it is."""


class _Refusal(Exception):
    """A request the proxy answers itself, with an HTTP status and a reason."""

    def __init__(self, status: int, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


@dataclass
class _Request:
    """What is known of one request so far (a refusal logs whatever was parsed)."""

    method: str = ""  # stays "" when no complete request arrived
    host: str | None = None
    port: int | None = None
    address: str | None = None  # the address connected to, or the one refused
    head: bytes = b""  # what goes to the upstream first (plain HTTP only)
    rest: bytes = b""  # bytes the client sent after its head


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses of `host` for TCP, in the system's preferred order, without repeats."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped or NAT64), if any."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_refusal(ip: IPAddress) -> str | None:
    """Why a connection to `ip` needs a rule that names it ("loopback", ...), or None.

    An IPv4-mapped or NAT64 address is judged by the IPv4 address inside it (the IPv6
    block around it counts as reserved); a 6to4 address by its IPv4 address and itself.
    """
    embedded = _embedded_ipv4(ip)
    candidates: list[IPAddress] = [embedded] if embedded is not None else [ip]
    if isinstance(ip, ipaddress.IPv6Address) and ip.sixtofour is not None:
        candidates.insert(0, ip.sixtofour)
    for candidate in candidates:
        inside = "" if candidate is ip else f", as IPv4 {candidate}"
        for label, attribute in _ADDRESS_CLASSES:
            if getattr(candidate, attribute):
                article = "an" if label[0] in "aeiou" else "a"
                return f"{article} {label} address{inside}"
        if not candidate.is_global:
            return f"not a globally routable address{inside}"
    return None


def _rule_names(rule: NetworkEgressRule, ip: IPAddress) -> bool:
    """Whether `rule` explicitly allows the non-public address `ip`."""
    unscoped = ipaddress.ip_address(str(ip).partition("%")[0])
    same = [unscoped] + ([v4] if (v4 := _embedded_ipv4(unscoped)) is not None else [])
    try:
        if ipaddress.ip_address(rule.domain) in same:
            return True
    except ValueError:
        pass
    for text in rule.private_networks:
        network = ipaddress.ip_network(text, strict=False)
        if any(address.version == network.version and address in network for address in same):
            return True
    return False


def _sanitize_phrase(reason: str) -> str:
    """A reason fit for a status line: printable ASCII, one line, at most ~200 chars."""
    text = "".join(char if " " <= char <= "~" else "?" for char in reason)
    if len(text) > REASON_PHRASE_CHARS:
        text = text[: REASON_PHRASE_CHARS - 3] + "..."
    return text or "refused"


def _shown(host: str | None, port: int | None) -> str:
    shown = f"[{host}]" if host and ":" in host else (host or "?")
    return f"{shown}:{port}" if port is not None else shown


class EgressProxy:
    """HTTP and CONNECT proxy enforcing an `EgressFilter`, for one sandbox.

    `resolver(host, port)` returns IP address strings; it replaces the system lookup in
    tests only (a constructor argument, which no policy file reaches). `on_decision` gets
    one dict per request the proxy answered or forwarded.
    """

    def __init__(
        self,
        egress_filter: EgressFilter,
        *,
        sandbox_id: str = "",
        on_decision: Callable[[dict], None] | None = None,
        resolver: Resolver | None = None,
        max_connections: int = 64,
        connect_timeout: float = 10.0,
        idle_timeout: float = 300.0,
        head_timeout: float = 10.0,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self._filter = egress_filter
        self._sandbox_id = sandbox_id
        self._on_decision = on_decision
        self._resolver = resolver or system_resolver
        self._max_connections = max_connections
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._head_timeout = head_timeout
        self._lock = threading.Lock()
        self._closed = False
        self._counts = {"allowed": 0, "denied": 0, "rate_limited": 0}
        self._wake: tuple[int, int] | None = None  # (read, write): readable once closing
        self._acceptors: dict[socket.socket, threading.Thread] = {}
        self._workers: dict[threading.Thread, socket.socket] = {}  # -> the listener it serves
        self._sockets: dict[socket.socket, threading.Thread] = {}  # -> the worker that owns it
        self._dropped: set[threading.Thread] = set()  # workers whose listener has stopped

    # ------------------------------------------------------------------ public API
    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def serve(self, listener: socket.socket) -> None:
        """Accept connections on `listener` (a listening TCP socket) from a background
        thread. The proxy owns it from now on: `stop_serving` or `close()` closes it, and
        so does a refusal here (the socket comes from the untrusted child)."""
        try:
            listening = listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        except OSError:
            listening = 0
        if (
            listener.family not in (socket.AF_INET, socket.AF_INET6)
            or listener.type != socket.SOCK_STREAM
            or not listening
        ):
            shown = repr(listener)
            listener.close()
            raise ValueError(f"the egress proxy needs a listening TCP socket, not {shown}")
        with self._lock:
            if self._closed:
                listener.close()
                raise RuntimeError("the egress proxy is closed")
            if self._wake is None:
                self._wake = os.pipe()
            listener.setblocking(False)
            thread = threading.Thread(
                target=self._accept_loop,
                args=(listener,),
                # Python 3.14 names the OS thread after it (15 bytes: the count's prefix)
                name=f"{PROXY_THREAD_NAME.decode()}-accept-{self._sandbox_id or listener.fileno()}",
                daemon=True,
            )
            self._acceptors[listener] = thread
            thread.start()

    def stop_serving(self, listener: socket.socket) -> None:
        """Stop accepting on one listener, close it and drop the connections it accepted
        (its run has ended: nobody is left to read them, and a destination that never hangs
        up would otherwise hold them, and the connection cap, until the idle timeout).
        Idempotent; other listeners' connections carry on."""
        with self._lock:
            thread = self._acceptors.get(listener)
            if thread is not None:  # else already stopped (its thread closes it)
                _shutdown(listener)
            workers = {worker for worker, served in self._workers.items() if served is listener}
            self._dropped |= workers
            for sock, owner in self._sockets.items():
                if owner in workers:
                    _shutdown(sock)
        if thread is not None:
            thread.join()
        deadline = time.monotonic() + CLOSE_JOIN_TIMEOUT
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Stop accepting, drop every connection and wait for every thread. Idempotent."""
        with self._lock:
            already = self._closed
            self._closed = True
            wake = self._wake
            if not already:
                if wake is not None:
                    os.write(wake[1], b"x")
                # Under the lock: a socket still in these sets has not been closed (its
                # owner takes it out first), so its descriptor cannot have been reused.
                for sock in [*self._sockets, *self._acceptors]:
                    _shutdown(sock)
        if already:
            return
        deadline = time.monotonic() + CLOSE_JOIN_TIMEOUT
        with self._lock:
            acceptors = list(self._acceptors.values())
        for thread in acceptors:
            thread.join()
        with self._lock:
            workers = list(self._workers)
        for thread in workers:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("egress proxy: %s still busy after close (a name lookup?)", thread.name)
        if wake is not None and not any(thread.is_alive() for thread in workers):
            for fd in wake:
                os.close(fd)
            self._wake = None

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ accepting
    def _accept_loop(self, listener: socket.socket) -> None:
        assert self._wake is not None
        _name_this_thread()  # first: the connections' threads are born with its name
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._wake[0] in ready or ready.get(listener.fileno(), 0) & (
                    select.POLLHUP | select.POLLERR | select.POLLNVAL
                ):
                    return
                try:
                    client, _ = listener.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        log.warning("egress proxy: cannot accept: %s", exc)
                        time.sleep(0.1)
                        continue
                    return  # shut down (EINVAL) or closed
                self._start_worker(client, listener)
        finally:
            with self._lock:
                del self._acceptors[listener]
            listener.close()

    def _start_worker(self, client: socket.socket, listener: socket.socket) -> None:
        client.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._closed:
                client.close()
                return
            busy = len(self._workers) >= self._max_connections
            if not busy:
                thread = threading.Thread(
                    target=self._serve_client, args=(client,),
                    name=f"{PROXY_THREAD_NAME.decode()}-conn", daemon=True,
                )
                self._sockets[client] = thread
                self._workers[thread] = listener
                thread.start()  # under the lock, so close() never joins an unstarted thread
        if busy:
            reason = (
                f"too many connections through the egress proxy (at most {self._max_connections})"
            )
            self._record("", None, None, None, 503, reason)
            try:
                client.send(_reply(503, reason), socket.MSG_DONTWAIT)
                client.shutdown(socket.SHUT_WR)
                while client.recv(65536, socket.MSG_DONTWAIT):  # what has arrived: no reset
                    pass
            except OSError:
                pass
            client.close()

    # ------------------------------------------------------------------ one connection
    def _serve_client(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        request = _Request()
        try:
            try:
                received = self._read_head(client)
                if received is None:  # closed or silent before a full head: no request
                    return
                _parse_head(*received, request)
                upstream = self._open_upstream(request)
            except _Refusal as refusal:
                self._refuse(client, request, refusal)
                return
            if request.method == "CONNECT":
                self._send_all(client, b"HTTP/1.1 200 Connection established\r\n\r\n")
                if request.rest:
                    self._send_all(upstream, request.rest)
            else:
                self._send_all(upstream, request.head + request.rest)
            self._relay(client, upstream)
        except _Closing:
            pass
        except OSError as exc:
            log.debug("egress proxy connection ended: %s", exc)
        except Exception:
            log.exception("egress proxy: unexpected error on a connection")
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._sockets.pop(sock, None)
                    sock.close()
            with self._lock:
                self._workers.pop(threading.current_thread(), None)
                self._dropped.discard(threading.current_thread())

    def _read_head(self, client: socket.socket) -> tuple[bytes, bytes] | None:
        """The request head and the bytes after it, or None if the client sent nothing
        before closing or going silent, or closed mid-head."""
        buffer = bytearray()
        deadline = time.monotonic() + self._head_timeout
        line_checked = False
        searched = 0  # where the blank line may start, so a trickling client costs O(n)
        while (end := buffer.find(b"\r\n\r\n", searched)) < 0:
            searched = max(0, len(buffer) - 3)
            if len(buffer) >= MAX_HEAD_BYTES:
                raise _Refusal(431, f"request head larger than {MAX_HEAD_BYTES // 1024} KiB")
            if buffer and not line_checked:
                line_checked = _check_request_start(buffer)
            if not self._wait(client, select.POLLIN, deadline):
                if not buffer:
                    return None
                raise _Refusal(408, f"request head not complete within {self._head_timeout:g} s")
            try:
                chunk = client.recv(MAX_HEAD_BYTES + 4 - len(buffer))
            except (BlockingIOError, InterruptedError):
                continue
            if not chunk:
                return None
            buffer += chunk
        if end > MAX_HEAD_BYTES:
            raise _Refusal(431, f"request head larger than {MAX_HEAD_BYTES // 1024} KiB")
        return bytes(buffer[:end]), bytes(buffer[end + 4 :])

    def _open_upstream(self, request: _Request) -> socket.socket:
        """Decide, resolve, check the addresses and connect: the upstream socket."""
        assert request.host is not None and request.port is not None
        decision = self._filter.acquire_authority(request.host, request.port)
        request.host = decision.host or request.host
        if not decision.allowed:
            if decision.retry_after is not None:
                raise _Refusal(429, decision.reason, retry_after=decision.retry_after)
            raise _Refusal(403, decision.reason)
        assert decision.rule is not None
        addresses = self._addresses(decision)
        permitted: list[str] = []
        refusals: list[str] = []
        for text, ip in addresses:
            why = address_refusal(ip)
            if why is None or _rule_names(decision.rule, ip):
                permitted.append(text)
            else:
                refusals.append(f"{text} ({why})")
        if not permitted:
            request.address = addresses[0][0]
            raise _Refusal(
                403,
                f"{request.host} resolves to {', '.join(refusals)}; to allow that, name it in "
                "the rule's private_networks",
            )
        failures: list[str] = []
        for text in permitted:
            try:
                upstream = self._connect(text, request.port)
            except OSError as exc:
                failures.append(f"{_shown(text, request.port)}: {exc.strerror or exc}")
                continue
            self._record(request.method, request.host, request.port, text, 200, decision.reason)
            return upstream
        request.address = permitted[0]
        raise _Refusal(
            502, f"cannot connect to {_shown(request.host, request.port)} ({'; '.join(failures)})"
        )

    def _addresses(self, decision: EgressDecision) -> list[tuple[str, IPAddress]]:
        host, port = decision.host, decision.port
        assert host is not None and port is not None
        try:
            return [(host, ipaddress.ip_address(host))]
        except ValueError:
            pass
        try:
            texts = self._resolver(host, port)
        except Exception as exc:  # gaierror, or anything a resolver hook raises
            raise _Refusal(502, f"cannot resolve {host}: {exc}") from None
        addresses = []
        for text in texts:
            try:
                addresses.append((str(text), ipaddress.ip_address(text)))
            except ValueError:
                raise _Refusal(502, f"resolving {host} gave {text!r}, not an address") from None
        if not addresses:
            raise _Refusal(502, f"{host} has no address")
        return addresses

    def _connect(self, address: str, port: int) -> socket.socket:
        """A connection to exactly `address` (numeric: no lookup happens here)."""
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            address, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )[0]
        sock = socket.socket(family, kind, proto)
        if not self._track(sock):
            sock.close()
            raise _Closing
        try:
            sock.setblocking(False)
            err = sock.connect_ex(sockaddr)
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, os.strerror(err))
            deadline = time.monotonic() + self._connect_timeout
            if err and not self._wait(sock, select.POLLOUT, deadline):
                raise OSError(errno.ETIMEDOUT, f"no answer within {self._connect_timeout:g} s")
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, os.strerror(err))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            with self._lock:
                self._sockets.pop(sock, None)
            sock.close()
            raise
        return sock

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Copy bytes both ways until the upstream's side has ended and been delivered, or
        either side fails, or nothing moves for `idle_timeout`.

        Each direction holds at most one chunk and reads only when that chunk has gone
        out, so a side that stops reading stalls its own direction and nothing else.
        """
        assert self._wake is not None
        wake = self._wake[0]
        directions = (
            _Direction(client, upstream, UPSTREAM_CHUNK_BYTES),
            _Direction(upstream, client, DOWNSTREAM_CHUNK_BYTES),
        )
        downstream = directions[1]
        poller = select.poll()
        poller.register(wake, select.POLLIN)
        registered: dict[int, int] = {}
        deadline = time.monotonic() + self._idle_timeout
        while not (downstream.ended and not downstream.pending):
            wanted = dict.fromkeys((client.fileno(), upstream.fileno()), 0)
            for direction in directions:
                if direction.pending:
                    wanted[direction.dst.fileno()] |= select.POLLOUT
                elif not direction.ended:
                    wanted[direction.src.fileno()] |= select.POLLIN
            for fd, events in wanted.items():
                # A socket nobody waits on stays out of the poll: a hung-up peer would
                # otherwise report POLLHUP on every round and spin this loop.
                if events and registered.get(fd) != events:
                    poller.register(fd, events)
                    registered[fd] = events
                elif not events and fd in registered:
                    poller.unregister(fd)
                    del registered[fd]
            timeout = deadline - time.monotonic()
            ready = poller.poll(math.ceil(timeout * 1000)) if timeout > 0 else []
            if any(fd == wake for fd, _ in ready):
                raise _Closing
            if not ready:
                return  # idle for idle_timeout
            moved = False
            ready_fds = {fd for fd, _ in ready}
            for direction in directions:
                watched = direction.dst if direction.pending else direction.src
                if watched.fileno() in ready_fds:
                    moved |= direction.step()
            if moved:
                deadline = time.monotonic() + self._idle_timeout

    # ------------------------------------------------------------------ helpers
    def _track(self, sock: socket.socket) -> bool:
        """Register a worker's new socket, so close() and stop_serving() can shut it down;
        False once they have (the worker then gives up)."""
        worker = threading.current_thread()
        with self._lock:
            if self._closed or worker in self._dropped:
                return False
            self._sockets[sock] = worker
            return True

    def _wait(self, sock: socket.socket, events: int, deadline: float) -> bool:
        """Wait until `sock` is ready for `events`: False on timeout, _Closing on close."""
        assert self._wake is not None
        poller = select.poll()
        poller.register(sock, events)
        poller.register(self._wake[0], select.POLLIN)
        while True:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return False
            ready = dict(poller.poll(math.ceil(timeout * 1000)))
            if self._wake[0] in ready:
                raise _Closing
            if ready:
                return True

    def _send_all(self, sock: socket.socket, data: bytes, timeout: float | None = None) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + (self._connect_timeout if timeout is None else timeout)
        while view:
            try:
                view = view[sock.send(view) :]
                continue
            except (BlockingIOError, InterruptedError):
                pass
            if not self._wait(sock, select.POLLOUT, deadline):
                raise OSError(errno.ETIMEDOUT, "peer does not read")

    def _refuse(self, client: socket.socket, request: _Request, refusal: _Refusal) -> None:
        self._record(request.method, request.host, request.port, request.address,
                     refusal.status, refusal.reason)  # fmt: skip
        try:
            self._send_all(client, _reply(refusal.status, refusal.reason, refusal.retry_after),
                           REPLY_TIMEOUT)  # fmt: skip
            client.shutdown(socket.SHUT_WR)
            # Read what the client still sends (a body), so closing does not reset the
            # connection before the client has read the reply.
            deadline, drained = time.monotonic() + DRAIN_TIMEOUT, 0
            while drained < DRAIN_BYTES and self._wait(client, select.POLLIN, deadline):
                try:
                    chunk = client.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass

    def _record(
        self,
        method: str,
        host: str | None,
        port: int | None,
        address: str | None,
        status: int,
        reason: str,
    ) -> None:
        allowed = status not in (400, 403, 408, 429, 431, 503)
        key = "allowed" if allowed else ("rate_limited" if status == 429 else "denied")
        with self._lock:
            self._counts[key] += 1
        if self._on_decision is None:
            return
        entry = {
            "time": time.time(),
            "sandbox_id": self._sandbox_id,
            "method": method,
            "host": host,
            "port": port,
            "address": address,
            "allowed": allowed,
            "rate_limited": status == 429,
            "reason": reason,
            "status": status,
        }
        try:
            self._on_decision(entry)
        except Exception:
            log.exception("egress proxy: on_decision failed for %s", _shown(host, port))


class _Direction:
    """One direction of a relay: bytes read from `src` waiting to go out on `dst`."""

    __slots__ = ("src", "dst", "buffer", "view", "start", "stop", "ended")

    def __init__(self, src: socket.socket, dst: socket.socket, chunk: int) -> None:
        self.src, self.dst = src, dst
        self.buffer = mmap.mmap(-1, chunk)  # anonymous: a page costs memory once written
        self.view = memoryview(self.buffer)
        self.start = self.stop = 0
        self.ended = False

    @property
    def pending(self) -> bool:
        return self.start < self.stop

    def step(self) -> bool:
        """Send what is waiting, then read and send more until one side would block:
        whether any byte moved. Raises OSError when either side fails."""
        moved = False
        while True:
            if self.pending:
                try:
                    self.start += self.dst.send(self.view[self.start : self.stop])
                except (BlockingIOError, InterruptedError):
                    return moved
                moved = True
                if self.pending:
                    return True  # the receiver's buffer is full: wait until it drains
            if self.ended:
                return moved
            try:
                count = self.src.recv_into(self.view)
            except (BlockingIOError, InterruptedError):
                return moved
            if count == 0:
                self.ended = True
                try:
                    self.dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return True
            self.start, self.stop, moved = 0, count, True


def _name_this_thread() -> None:
    """Name the calling thread as the proxy's, so the count of the uid's tasks outside every
    sandbox leaves it out (`runner/linux/tasks.py`); where it cannot be named, it is counted."""
    try:
        set_process_name(PROXY_THREAD_NAME)
    except (OSError, AttributeError):  # no prctl (not Linux)
        pass


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


_EARLY_METHOD = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}( |\Z)")


def _check_request_start(buffer: bytearray) -> bool:
    """Refuse at once what cannot become an HTTP request (e.g. a TLS hello sent to the
    proxy directly); True once the request line has been checked."""
    if not _EARLY_METHOD.match(bytes(buffer[:33])):
        raise _Refusal(400, "not an HTTP request (is the proxy URL http://, not https://?)")
    line_end = buffer.find(b"\r\n")
    if line_end < 0:
        return False
    _parse_request_line(bytes(buffer[:line_end]).decode("latin-1"))
    return True


def _parse_request_line(line: str) -> tuple[str, str, str]:
    match = _REQUEST_LINE.match(line)
    if not match:
        raise _Refusal(400, f"malformed request line {line[:100]!r}")
    return match.group(1), match.group(2), match.group(3)


def _parse_head(head: bytes, rest: bytes, request: _Request) -> None:
    """Fill `request` from a head (without its blank line); _Refusal(400) if malformed."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = _parse_request_line(lines[0])
    request.method, request.rest = method, rest
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        match = _HEADER.match(line)
        if not match:
            raise _Refusal(400, f"malformed header line {line[:100]!r}")
        headers.append((match.group(1), match.group(2)))
    names = {name.lower() for name, _ in headers}
    lengths = {value for name, value in headers if name.lower() == "content-length"}
    if "transfer-encoding" in names and lengths:
        raise _Refusal(400, "both Transfer-Encoding and Content-Length")
    if len(lengths) > 1 or any(not _DIGITS.fullmatch(value) for value in lengths):
        raise _Refusal(400, "malformed or conflicting Content-Length")
    try:
        if method == "CONNECT":
            if "@" in target or "/" in target:
                raise MalformedTargetError("expected host:port")
            request.host, request.port = parse_authority(target)
            if request.port is None:
                raise MalformedTargetError("no port")
            return
        scheme, sep, remainder = target.partition("://")
        if not sep or scheme.lower() != "http":
            hint = " (use CONNECT for https)" if scheme.lower() == "https" else ""
            raise MalformedTargetError(f"expected an absolute http:// URL{hint}")
        cut = min((i for i in map(remainder.find, "/?#") if i >= 0), default=len(remainder))
        authority, path = remainder[:cut], remainder[cut:].partition("#")[0]
        request.host, port = parse_authority(authority)
        request.port = 80 if port is None else port
    except MalformedTargetError as exc:
        raise _Refusal(400, f"malformed target {target[:100]!r}: {exc}") from None
    request.head = _upstream_head(method, path, version, request.host, request.port, headers)


def _upstream_head(
    method: str, path: str, version: str, host: str, port: int, headers: list[tuple[str, str]]
) -> bytes:
    """The request as the origin server gets it: origin-form target, Host from the URL
    (a client's own Host header could name another site on the same server), no
    hop-by-hop or Proxy-* headers, and one request per connection."""
    connection_tokens = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == "connection"
        for token in value.split(",")
    }
    drop = _NOT_FORWARDED | connection_tokens
    shown = f"[{host}]" if ":" in host else host
    lines = [
        f"{method} {path if path.startswith('/') else '/' + path} {version}",
        f"Host: {shown if port == 80 else f'{shown}:{port}'}",
    ]
    lines += [
        f"{name}: {value}"
        for name, value in headers
        if name.lower() not in drop and not name.lower().startswith("proxy-")
    ]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _reply(status: int, reason: str, retry_after: float | None = None) -> bytes:
    """The proxy's own answer: the reason in the status line (where urllib shows it for a
    failed tunnel) and in full in a text body."""
    body = (reason + "\n").encode("utf-8", "replace")
    generic = _STATUS_TEXT.get(status)
    phrase = _sanitize_phrase(f"{generic}: {reason}" if generic else reason)
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        f"X-Sandbox-Egress: {'denied' if status in (403, 429) else 'error'}",
    ]
    if retry_after is not None:
        lines.append(f"Retry-After: {max(1, math.ceil(retry_after))}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body
