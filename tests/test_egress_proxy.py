"""The parent's egress proxy against real servers on loopback, driven by real clients.

Names like `allowed.test` reach the loopback servers only through the proxy's test-only
resolver hook; the proxy itself resolves, checks and connects exactly as it would for a
sandbox. Every server and proxy here binds 127.0.0.1 and is stopped by its fixture.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandbox_kernel_ext.policy.egress import EgressFilter
from sandbox_kernel_ext.policy.models import NetworkEgressRule
from sandbox_kernel_ext.runner.trusted.egress_proxy import EgressProxy

LOOPBACK_ONLY = ["127.0.0.1/32"]
WAIT = 10.0  # liveness bound for every blocking read in these tests


# ----------------------------------------------------------------------- upstream servers
class UpstreamHandler(BaseHTTPRequestHandler):
    """GET /hello, GET /bytes/N (N bytes of a known pattern), POST /echo (the body back).
    Records each request's line and headers on the server."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _record(self) -> None:
        seen = self.server.seen  # type: ignore[attr-defined]
        seen.append((self.requestline, dict(self.headers)))

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._record()
        if self.path.startswith("/bytes/"):
            self._send(pattern(int(self.path.rsplit("/", 1)[1])))
        else:
            self._send(b"hello from upstream")

    def do_POST(self) -> None:
        self._record()
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while (size := int(self.rfile.readline().strip(), 16)) > 0:
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        self._send(body)


def pattern(size: int) -> bytes:
    block = bytes(range(256)) * 4096
    return (block * (size // len(block) + 1))[:size]


@dataclass
class HttpUpstream:
    port: int
    seen: list[tuple[str, dict[str, str]]]


@pytest.fixture
def http_upstream() -> Iterator[HttpUpstream]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), UpstreamHandler)
    server.daemon_threads = True
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield HttpUpstream(server.server_address[1], server.seen)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class EchoServer:
    """A raw TCP server that sends back what it receives, until the client's EOF."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._threads: list[threading.Thread] = []
        self._live: set[socket.socket] = set()
        self._lock = threading.Condition()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            with self._lock:
                self._live.add(conn)
                thread.start()
                self._threads.append(thread)
                self.accepted += 1
                self._lock.notify_all()

    def _echo(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(1 << 16):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            with self._lock:
                self._live.discard(conn)
            conn.close()

    def join_connections(self, expected: int) -> None:
        """Wait until `expected` connections were accepted and all have ended (each ends at
        its client's EOF). A client may be connected before the server has accepted."""
        with self._lock:
            assert self._lock.wait_for(lambda: self.accepted >= expected, WAIT)
        for thread in list(self._threads):
            thread.join(WAIT)
            assert not thread.is_alive(), "an echo connection did not end"

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._acceptor.join()
        with self._lock:
            live = list(self._live)
        for conn in live:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join()


@pytest.fixture
def echo_upstream() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


# ----------------------------------------------------------------------------- the proxy
@dataclass
class FakeDNS:
    """The resolver hook: fixed answers, and a record of every question."""

    answers: dict[str, list[str]]
    asked: list[str] = field(default_factory=list)

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


@dataclass
class Proxy:
    proxy: EgressProxy
    port: int
    log: list[dict]
    dns: FakeDNS
    listener: socket.socket

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def opener(self) -> urllib.request.OpenerDirector:
        return urllib.request.build_opener(urllib.request.ProxyHandler({"http": self.url}))

    def get(self, url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict]:
        """Status, body and headers of a GET through the proxy (errors included)."""
        request = urllib.request.Request(url, headers=headers or {})
        try:
            with self.opener().open(request, timeout=WAIT) as response:
                return response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read(), dict(exc.headers) | {"_reason": exc.reason}

    def raw(self, data: bytes, *, half_close: bool = False) -> bytes:
        """Send raw bytes on a fresh connection (then EOF if `half_close`); everything the
        proxy answers until it closes."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=WAIT) as sock:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def read_until_dropped(sock: socket.socket) -> bytes:
    """What arrives before the proxy closes the connection; a reset counts as closed (a
    socket closed with unread input resets)."""
    try:
        return read_all(sock)
    except ConnectionResetError:
        return b""


def status_line(response: bytes) -> str:
    return response.split(b"\r\n", 1)[0].decode("latin-1")


ProxyFactory = Callable[..., Proxy]


@pytest.fixture
def make_proxy() -> Iterator[ProxyFactory]:
    made: list[EgressProxy] = []

    def make(
        rules: list[NetworkEgressRule], answers: dict[str, list[str]] | None = None, **kwargs
    ) -> Proxy:
        log: list[dict] = []
        dns = FakeDNS(answers or {})
        proxy = EgressProxy(
            EgressFilter(rules), sandbox_id="sbx-test", on_decision=log.append, resolver=dns,
            **kwargs,
        )  # fmt: skip
        made.append(proxy)
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        proxy.serve(listener)
        return Proxy(proxy, port, log, dns, listener)

    try:
        yield make
    finally:
        for proxy in made:
            proxy.close()


def allowed_rule(port: int | None = None, **kwargs) -> NetworkEgressRule:
    ports = [port] if port else []
    return NetworkEgressRule(
        domain="allowed.test", ports=ports, private_networks=LOOPBACK_ONLY, **kwargs
    )


ALLOWED_DNS = {"allowed.test": ["127.0.0.1"]}


# ------------------------------------------------------------------------------- tests
def test_allowed_domain_answers_and_the_request_is_rewritten(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream
) -> None:
    p = make_proxy([allowed_rule(http_upstream.port)], ALLOWED_DNS)
    url = f"http://allowed.test:{http_upstream.port}/hello?x=1"
    status, body, _ = p.get(url, {"Proxy-Authorization": "Basic c2VjcmV0", "X-Kept": "yes"})
    assert (status, body) == (200, b"hello from upstream")
    requestline, headers = http_upstream.seen[-1]
    assert requestline == "GET /hello?x=1 HTTP/1.1"
    assert headers["Host"] == f"allowed.test:{http_upstream.port}"
    assert headers["Connection"] == "close"
    assert headers["X-Kept"] == "yes"
    assert not [name for name in headers if name.lower().startswith("proxy-")]
    assert p.dns.asked == ["allowed.test"]  # resolved once, by the proxy
    [entry] = p.log
    assert entry["allowed"] is True and entry["address"] == "127.0.0.1"
    assert (entry["method"], entry["host"]) == ("GET", "allowed.test")
    assert entry["port"] == http_upstream.port
    assert p.proxy.counts == {"allowed": 1, "denied": 0, "rate_limited": 0}


def test_the_url_authority_wins_over_a_forged_host_header(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream
) -> None:
    p = make_proxy([allowed_rule(http_upstream.port)], ALLOWED_DNS)
    answer = p.raw(
        f"GET http://user:pw@allowed.test:{http_upstream.port}/hello HTTP/1.1\r\n"
        "Host: evil.test\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n"
        "Keep-Alive: 5\r\nUpgrade: h2c\r\n\r\n".encode()
    )
    assert status_line(answer) == "HTTP/1.1 200 OK"
    _, headers = http_upstream.seen[-1]
    assert headers["Host"] == f"allowed.test:{http_upstream.port}"
    for hop_by_hop in ("X-Secret", "Keep-Alive", "Upgrade"):
        assert hop_by_hop not in headers


@pytest.mark.parametrize("chunked", [False, True])
def test_request_bodies_are_relayed(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream, chunked: bool
) -> None:
    p = make_proxy([allowed_rule(http_upstream.port)], ALLOWED_DNS)
    body = pattern(3 << 20)
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=WAIT)
    try:
        url = f"http://allowed.test:{http_upstream.port}/echo"
        if chunked:
            pieces = (body[i : i + 100_000] for i in range(0, len(body), 100_000))
            conn.request("POST", url, body=pieces, encode_chunked=True)
        else:
            conn.request("POST", url, body=body)
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, body)
    finally:
        conn.close()


def test_large_download_arrives_intact(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream
) -> None:
    p = make_proxy([allowed_rule(http_upstream.port)], ALLOWED_DNS)
    size = 20 << 20
    status, body, _ = p.get(f"http://allowed.test:{http_upstream.port}/bytes/{size}")
    assert status == 200 and len(body) == size and body == pattern(size)


def test_denied_domain_gets_403_with_the_reason(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream
) -> None:
    p = make_proxy([allowed_rule(http_upstream.port)], {"evil.test": ["127.0.0.1"]})
    status, body, headers = p.get(f"http://evil.test:{http_upstream.port}/hello")
    reason = "domain evil.test is not in the allowlist (allowed: allowed.test:"
    assert status == 403
    assert headers["_reason"].startswith(reason)
    assert body.decode().startswith(reason)
    assert headers["X-Sandbox-Egress"] == "denied"
    assert http_upstream.seen == [] and p.dns.asked == []  # denied before any lookup
    [entry] = p.log
    assert entry["allowed"] is False and entry["rate_limited"] is False
    assert entry["reason"].startswith(reason) and entry["address"] is None


def test_denied_tunnel_shows_the_reason_in_the_client_error(
    make_proxy: ProxyFactory, echo_upstream: EchoServer
) -> None:
    p = make_proxy([allowed_rule(echo_upstream.port)], ALLOWED_DNS)
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=WAIT)
    conn.set_tunnel("evil.test", 443)
    try:
        with pytest.raises(OSError, match="Tunnel connection failed: 403 domain evil.test is not"):
            conn.request("GET", "/")
    finally:
        conn.close()


def test_long_reasons_are_cut_in_the_status_line_and_whole_in_the_body(
    make_proxy: ProxyFactory,
) -> None:
    rules = [NetworkEgressRule(domain=f"host-number-{i}.example.org") for i in range(20)]
    p = make_proxy(rules)
    answer = p.raw(b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
    line = status_line(answer)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert line.startswith("HTTP/1.1 403 domain evil.test is not in the allowlist")
    assert line.endswith("...") and len(line) <= len("HTTP/1.1 403 ") + 200
    assert body.decode().rstrip("\n") == p.log[0]["reason"]
    assert "host-number-19.example.org" in body.decode()


def test_wildcard_rule_matches_subdomains_only(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream
) -> None:
    rule = NetworkEgressRule(domain="*.wild.test", private_networks=LOOPBACK_ONLY)
    dns = {name: ["127.0.0.1"] for name in ("a.wild.test", "b.c.wild.test", "wild.test")}
    p = make_proxy([rule], dns)
    port = http_upstream.port
    assert p.get(f"http://a.wild.test:{port}/hello")[0] == 200
    assert p.get(f"http://B.C.Wild.Test.:{port}/hello")[0] == 200
    status, body, _ = p.get(f"http://wild.test:{port}/hello")
    assert status == 403 and b"domain wild.test is not in the allowlist" in body
    assert [e["allowed"] for e in p.log] == [True, True, False]
    assert p.log[1]["host"] == "b.c.wild.test"


def test_rate_limit_trips_exactly_at_the_configured_count(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream, echo_upstream: EchoServer
) -> None:
    rule = NetworkEgressRule(
        domain="allowed.test", rate_limit_per_min=3, private_networks=LOOPBACK_ONLY
    )
    p = make_proxy([rule], ALLOWED_DNS)
    url = f"http://allowed.test:{http_upstream.port}/hello"
    assert [p.get(url)[0] for _ in range(2)] == [200, 200]
    # A tunnel counts against the same rule.
    answer = p.raw(
        f"CONNECT allowed.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode(), half_close=True
    )
    assert status_line(answer) == "HTTP/1.1 200 Connection established"
    status, body, headers = p.get(url)
    assert status == 429
    assert headers["_reason"] == "rate limit 3/min for allowed.test reached"
    assert 1 <= int(headers["Retry-After"]) <= 60
    assert headers["X-Sandbox-Egress"] == "denied"
    assert len(http_upstream.seen) == 2
    assert p.log[-1]["rate_limited"] is True and p.log[-1]["allowed"] is False
    assert p.proxy.counts == {"allowed": 3, "denied": 0, "rate_limited": 1}


def test_connect_relays_both_ways(make_proxy: ProxyFactory, echo_upstream: EchoServer) -> None:
    p = make_proxy([allowed_rule(echo_upstream.port)], ALLOWED_DNS)
    with socket.create_connection(("127.0.0.1", p.port), timeout=WAIT) as sock:
        # Bytes sent right behind the head (a TLS hello would be) must not be lost.
        sock.sendall(f"CONNECT allowed.test:{echo_upstream.port} HTTP/1.1\r\n\r\nfirst".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(1024)
        head, _, echoed = reply.partition(b"\r\n\r\n")
        assert head == b"HTTP/1.1 200 Connection established"
        payload = os.urandom(8 << 20)
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        while len(echoed) < 5 + len(payload):
            chunk = sock.recv(1 << 20)
            assert chunk, "tunnel closed early"
            echoed += chunk
        sender.join()
        assert echoed == b"first" + payload
        sock.shutdown(socket.SHUT_WR)  # the echo server ends, so does the tunnel
        assert read_all(sock) == b""


def test_connect_to_a_denied_port_fails(
    make_proxy: ProxyFactory, echo_upstream: EchoServer
) -> None:
    p = make_proxy([allowed_rule(echo_upstream.port)], ALLOWED_DNS)
    other = echo_upstream.port + 1 if echo_upstream.port < 65535 else echo_upstream.port - 1
    answer = p.raw(f"CONNECT allowed.test:{other} HTTP/1.1\r\n\r\n".encode())
    assert status_line(answer) == (
        f"HTTP/1.1 403 port {other} not allowed for allowed.test (allowed: {echo_upstream.port})"
    )
    assert echo_upstream.accepted == 0
    assert p.log[0]["method"] == "CONNECT" and p.log[0]["port"] == other


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("192.168.0.1", "a private address"),
        ("169.254.169.254", "a link-local address"),
        ("0.0.0.0", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("100.64.0.1", "not a globally routable address"),
        ("::1", "a loopback address"),
        ("fe80::1", "a link-local address"),
        ("fd00::1", "a private address"),
        ("::ffff:127.0.0.1", "a loopback address, as IPv4 127.0.0.1"),
        ("::ffff:10.0.0.1", "a private address, as IPv4 10.0.0.1"),
        ("64:ff9b::7f00:1", "a loopback address, as IPv4 127.0.0.1"),
        ("2002:7f00:1::", "a loopback address, as IPv4 127.0.0.1"),
    ],
)
def test_public_name_resolving_to_a_private_address_is_refused(
    make_proxy: ProxyFactory, echo_upstream: EchoServer, address: str, kind: str
) -> None:
    rule = NetworkEgressRule(domain="public.test", ports=[echo_upstream.port])
    p = make_proxy([rule], {"public.test": [address]})
    answer = p.raw(f"CONNECT public.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode())
    line = status_line(answer)
    assert line == (
        f"HTTP/1.1 403 public.test resolves to {address} ({kind}); "
        "to allow that, name it in the rule's private_networks"
    )
    assert echo_upstream.accepted == 0
    [entry] = p.log
    assert entry["address"] == address and entry["allowed"] is False


def test_a_rule_naming_the_address_allows_it(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream
) -> None:
    port = http_upstream.port
    p = make_proxy([NetworkEgressRule(domain="127.0.0.1", ports=[port])])
    # The rule's domain is the literal itself; any spelling of it counts.
    assert p.get(f"http://127.0.0.1:{port}/hello")[0] == 200
    assert p.get(f"http://2130706433:{port}/hello")[0] == 200
    assert p.dns.asked == []
    assert [e["address"] for e in p.log] == ["127.0.0.1", "127.0.0.1"]


def test_private_networks_allow_only_the_ranges_named(
    make_proxy: ProxyFactory, echo_upstream: EchoServer
) -> None:
    rule = NetworkEgressRule(domain="internal.test", private_networks=["127.0.0.1/32"])
    p = make_proxy([rule], {"internal.test": ["10.0.0.7", "127.0.0.2", "127.0.0.1"]})
    connect = f"CONNECT internal.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode()
    assert p.raw(connect + b"ping", half_close=True) == (
        b"HTTP/1.1 200 Connection established\r\n\r\nping"
    )
    assert p.log[0]["address"] == "127.0.0.1"  # the refused ones were skipped, not tried
    p.dns.answers["internal.test"] = ["127.0.0.2", "10.0.0.7"]
    line = status_line(p.raw(connect))
    assert line == (
        "HTTP/1.1 403 internal.test resolves to 127.0.0.2 (a loopback address), 10.0.0.7 "
        "(a private address); to allow that, name it in the rule's private_networks"
    )
    assert echo_upstream.accepted == 1


def ipv6_works() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_works(), reason="this host has no IPv6 (needed to reach ::ffff:*)")
def test_ipv4_mapped_address_is_allowed_by_its_ipv4_network(
    make_proxy: ProxyFactory, echo_upstream: EchoServer
) -> None:
    rule = NetworkEgressRule(domain="mapped.test", private_networks=["127.0.0.0/8"])
    p = make_proxy([rule], {"mapped.test": ["::ffff:127.0.0.1"]})
    connect = f"CONNECT mapped.test:{echo_upstream.port} HTTP/1.1\r\n\r\nping".encode()
    assert p.raw(connect, half_close=True) == b"HTTP/1.1 200 Connection established\r\n\r\nping"
    assert p.log[0]["address"] == "::ffff:127.0.0.1"


def test_upstream_refusing_gives_502(make_proxy: ProxyFactory) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    p = make_proxy([allowed_rule(port)], ALLOWED_DNS)
    answer = p.raw(f"CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert status_line(answer).startswith(f"HTTP/1.1 502 cannot connect to allowed.test:{port}")
    assert b"Connection refused" in answer
    assert b"X-Sandbox-Egress: error" in answer


def test_unresolvable_name_gives_502(make_proxy: ProxyFactory) -> None:
    p = make_proxy([NetworkEgressRule(domain="nowhere.test")], {})
    answer = p.raw(b"GET http://nowhere.test/ HTTP/1.1\r\n\r\n")
    assert status_line(answer).startswith("HTTP/1.1 502 cannot resolve nowhere.test")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /relative HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        b"GET https://allowed.test/ HTTP/1.1\r\n\r\n",
        b"GET ftp://allowed.test/ HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test/ HTTP/2.0\r\n\r\n",
        b"GET http://allowed.test/  HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test:99999/ HTTP/1.1\r\n\r\n",
        b"GET http://allowed\x00.test/ HTTP/1.1\r\n\r\n",
        b"GET http://b\xc3\xbccher.test/ HTTP/1.1\r\n\r\n",
        b"GET http:///path HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test HTTP/1.1\r\n\r\n",
        b"CONNECT user@allowed.test:443 HTTP/1.1\r\n\r\n",
        b"CONNECT http://allowed.test:443/ HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nNo-Colon\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nBad Name: 1\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nX-A: 1\nX-B: 2\r\n\r\n",
        b"POST http://allowed.test/ HTTP/1.1\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        b"POST http://allowed.test/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"POST http://allowed.test/ HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello, no line end at all
    ],
)
def test_malformed_requests_get_400(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream, request_bytes: bytes
) -> None:
    p = make_proxy([NetworkEgressRule(domain="allowed.test", private_networks=LOOPBACK_ONLY)],
                   ALLOWED_DNS)  # fmt: skip
    answer = p.raw(request_bytes)
    assert status_line(answer).startswith("HTTP/1.1 400 Bad Request: ")
    assert b"X-Sandbox-Egress: error" in answer
    assert http_upstream.seen == [] and p.dns.asked == []
    [entry] = p.log
    assert entry["allowed"] is False
    assert p.proxy.counts["denied"] == 1


def test_oversized_head_is_refused(make_proxy: ProxyFactory, http_upstream: HttpUpstream) -> None:
    p = make_proxy([allowed_rule(http_upstream.port)], ALLOWED_DNS)
    filler = "".join(f"X-Filler-{i}: {'a' * 1000}\r\n" for i in range(70))
    answer = p.raw(
        f"GET http://allowed.test:{http_upstream.port}/ HTTP/1.1\r\n{filler}\r\n".encode()
    )
    assert status_line(answer) == (
        "HTTP/1.1 431 Request Header Fields Too Large: request head larger than 64 KiB"
    )
    assert http_upstream.seen == []
    # Right at the limit is still fine.
    head = f"GET http://allowed.test:{http_upstream.port}/hello HTTP/1.1\r\n"
    pad = 64 * 1024 - len(head) - len("X-Pad: \r\n")
    answer = p.raw(f"{head}X-Pad: {'a' * pad}\r\n\r\n".encode())
    assert status_line(answer) == "HTTP/1.1 200 OK"


def test_incomplete_head_times_out_with_408(make_proxy: ProxyFactory) -> None:
    p = make_proxy([allowed_rule()], ALLOWED_DNS, head_timeout=0.3)
    answer = p.raw(b"GET http://allowed.test/ HTTP/1.1\r\nX-Never: ends")
    assert status_line(answer).startswith("HTTP/1.1 408 Request Timeout")


def test_silent_client_is_dropped_without_a_log_entry(make_proxy: ProxyFactory) -> None:
    p = make_proxy([allowed_rule()], ALLOWED_DNS, head_timeout=0.3)
    with socket.create_connection(("127.0.0.1", p.port), timeout=WAIT) as sock:
        assert read_all(sock) == b""
    assert p.log == [] and p.proxy.counts == {"allowed": 0, "denied": 0, "rate_limited": 0}


def test_slow_clients_do_not_block_others(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream, echo_upstream: EchoServer
) -> None:
    rule = NetworkEgressRule(domain="allowed.test", private_networks=LOOPBACK_ONLY)
    p = make_proxy([rule], ALLOWED_DNS)
    silent = socket.create_connection(("127.0.0.1", p.port), timeout=WAIT)
    trickling = socket.create_connection(("127.0.0.1", p.port), timeout=WAIT)
    trickling.sendall(b"GET http://allowed.te")
    # A tunnel whose client does not read while the upstream sends a lot.
    stalled = socket.create_connection(("127.0.0.1", p.port), timeout=WAIT)
    try:
        stalled.sendall(f"CONNECT allowed.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode())
        assert stalled.recv(1024).startswith(b"HTTP/1.1 200")
        stalled.setblocking(False)
        sent = 0
        try:
            while sent < 64 << 20:  # until every buffer on the way is full
                sent += stalled.send(b"x" * (1 << 16))
        except BlockingIOError:
            pass
        for _ in range(3):
            assert p.get(f"http://allowed.test:{http_upstream.port}/hello")[0] == 200
    finally:
        for sock in (silent, trickling, stalled):
            sock.close()


def test_too_many_connections_get_503(make_proxy: ProxyFactory, echo_upstream: EchoServer) -> None:
    p = make_proxy([allowed_rule(echo_upstream.port)], ALLOWED_DNS, max_connections=2)
    tunnels = []
    try:
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", p.port), timeout=WAIT)
            tunnels.append(sock)
            sock.sendall(f"CONNECT allowed.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode())
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        answer = p.raw(f"CONNECT allowed.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode())
        assert status_line(answer).startswith("HTTP/1.1 503 Service Unavailable: too many")
    finally:
        for sock in tunnels:
            sock.close()
    assert p.proxy.counts == {"allowed": 2, "denied": 1, "rate_limited": 0}


def test_idle_tunnel_is_closed(make_proxy: ProxyFactory, echo_upstream: EchoServer) -> None:
    p = make_proxy([allowed_rule(echo_upstream.port)], ALLOWED_DNS, idle_timeout=0.3)
    with socket.create_connection(("127.0.0.1", p.port), timeout=WAIT) as sock:
        sock.sendall(f"CONNECT allowed.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode())
        assert read_all(sock) == b"HTTP/1.1 200 Connection established\r\n\r\n"


def test_decision_entries_and_counts(
    make_proxy: ProxyFactory, http_upstream: HttpUpstream
) -> None:
    rule = NetworkEgressRule(
        domain="allowed.test", rate_limit_per_min=1, private_networks=LOOPBACK_ONLY
    )
    p = make_proxy([rule], ALLOWED_DNS)
    port = http_upstream.port
    p.get(f"http://allowed.test:{port}/hello")
    p.get(f"http://allowed.test:{port}/hello")
    p.raw(b"CONNECT denied.test:443 HTTP/1.1\r\n\r\n")
    assert p.proxy.counts == {"allowed": 1, "denied": 1, "rate_limited": 1}
    keys = {"time", "sandbox_id", "method", "host", "port", "address", "allowed",
            "rate_limited", "reason", "status"}  # fmt: skip
    assert all(set(entry) == keys for entry in p.log)
    assert all(entry["sandbox_id"] == "sbx-test" for entry in p.log)
    assert [(e["method"], e["host"], e["port"], e["allowed"], e["rate_limited"], e["status"])
            for e in p.log] == [
        ("GET", "allowed.test", port, True, False, 200),
        ("GET", "allowed.test", port, False, True, 429),
        ("CONNECT", "denied.test", 443, False, False, 403),
    ]  # fmt: skip
    assert p.log[0]["reason"] == "allowed by rule allowed.test"
    assert p.log[0]["time"] <= p.log[1]["time"] <= p.log[2]["time"]
    json.dumps(p.log)  # plain data, ready for a log file or a widget


def test_failing_on_decision_is_logged_not_raised(
    http_upstream: HttpUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(entry: dict) -> None:
        raise RuntimeError("callback broke")

    proxy = EgressProxy(
        EgressFilter([allowed_rule(http_upstream.port)]), on_decision=broken,
        resolver=FakeDNS(ALLOWED_DNS),
    )  # fmt: skip
    try:
        listener = socket.create_server(("127.0.0.1", 0))
        proxy.serve(listener)
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{listener.getsockname()[1]}"})
        )
        with caplog.at_level(logging.ERROR, "sandbox_kernel_ext.runner.trusted.egress_proxy"):
            with opener.open(f"http://allowed.test:{http_upstream.port}/hello", timeout=WAIT) as r:
                assert r.read() == b"hello from upstream"
        assert "on_decision failed" in caplog.text and "callback broke" in caplog.text
        assert proxy.counts["allowed"] == 1
    finally:
        proxy.close()


def open_fds() -> dict[str, str]:
    """This process's descriptors and what they point at (minus the one listing them)."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[name] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            pass
    return fds


def proxy_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("sandbox-egress-")}


def test_close_leaves_no_thread_and_no_fd(echo_upstream: EchoServer) -> None:
    fds_before = open_fds()
    threads_before = proxy_threads()
    rule = NetworkEgressRule(domain="allowed.test", private_networks=LOOPBACK_ONLY)
    proxy = EgressProxy(EgressFilter([rule]), resolver=FakeDNS(ALLOWED_DNS))
    ports = []
    for _ in range(2):  # one listener per run of the sandbox
        listener = socket.create_server(("127.0.0.1", 0))
        ports.append(listener.getsockname()[1])
        proxy.serve(listener)
    clients = []
    try:
        for port in ports:
            tunnel = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
            clients.append(tunnel)
            tunnel.sendall(f"CONNECT allowed.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode())
            assert tunnel.recv(1024).startswith(b"HTTP/1.1 200")
        clients.append(socket.create_connection(("127.0.0.1", ports[0]), timeout=WAIT))
        clients[-1].sendall(b"GET http://allowed")  # a slow client, mid-head
        assert len(proxy_threads() - threads_before) >= 2
        proxy.close()
        proxy.close()  # idempotent
        for client in clients:  # every connection was dropped
            assert read_until_dropped(client) == b""
    finally:
        for client in clients:
            client.close()
    echo_upstream.join_connections(len(ports))
    assert proxy_threads() - threads_before == set()
    assert open_fds() == fds_before
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()
    with pytest.raises(RuntimeError, match="closed"):
        proxy.serve(socket.create_server(("127.0.0.1", 0)))
    assert open_fds() == fds_before  # serve() after close still closed the listener


def test_stop_serving_closes_one_listener_and_drops_only_its_connections(
    make_proxy: ProxyFactory, echo_upstream: EchoServer
) -> None:
    p = make_proxy([allowed_rule(echo_upstream.port)], ALLOWED_DNS)
    other = socket.create_server(("127.0.0.1", 0))
    other_port = other.getsockname()[1]
    p.proxy.serve(other)
    connect = f"CONNECT allowed.test:{echo_upstream.port} HTTP/1.1\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", p.port), timeout=WAIT) as tunnel, \
            socket.create_connection(("127.0.0.1", other_port), timeout=WAIT) as kept:
        for client in (tunnel, kept):
            client.sendall(connect)
            assert client.recv(1024).startswith(b"HTTP/1.1 200")
        p.proxy.stop_serving(p.listener)
        p.proxy.stop_serving(p.listener)  # idempotent
        assert p.listener.fileno() == -1
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", p.port), timeout=WAIT).close()
        assert tunnel.recv(1024) == b""  # its run is over: dropped, upstream side too
        assert [t for t in threading.enumerate() if t.name == "sandbox-egress-conn"] != []
        kept.sendall(b"still here")
        assert kept.recv(1024) == b"still here"
    p.proxy.stop_serving(other)
    assert [t for t in threading.enumerate() if t.name == "sandbox-egress-conn"] == []


@pytest.mark.parametrize(
    "make_socket",
    [
        lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),  # not listening
        lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
        lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
    ],
    ids=["unbound-tcp", "udp", "unix"],
)
def test_serve_refuses_and_closes_what_is_not_a_tcp_listener(
    make_socket: Callable[[], socket.socket],
) -> None:
    """The listener comes from the sandboxed child, so anything else is refused, and the
    proxy still owns (closes) it."""
    fds_before = open_fds()
    proxy = EgressProxy(EgressFilter([]))
    sock = make_socket()
    try:
        with pytest.raises(ValueError, match="needs a listening TCP socket"):
            proxy.serve(sock)
        assert sock.fileno() == -1
    finally:
        sock.close()
        proxy.close()
    assert open_fds() == fds_before
