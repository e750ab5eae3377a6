"""Egress from a real confined child: its one way out is the kernel's proxy.

Servers are started here on loopback; test names reach them only through the proxy's
resolver hook (a SandboxManager argument no policy file can set).
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _resolve(host: str, port: int) -> list[str]:
    """Test names all live on this machine's loopback."""
    return ["127.0.0.1"] if host.endswith(".test") else []


@pytest.fixture(scope="module")
def net_manager() -> Iterator[SandboxManager]:
    with SandboxManager(egress_resolver=_resolve) as manager:
        yield manager


def _policy(port: int, **extra: object) -> CapabilityDeclaration:
    rules = [
        {"domain": "allowed.test", "ports": [port], "private_networks": ["127.0.0.1/32"]},
        {"domain": "*.wild.test", "ports": [port], "private_networks": ["127.0.0.0/8"]},
        {"domain": "public.test", "ports": [port]},  # its address is private: refused
    ]
    rules += extra.pop("rules", [])  # type: ignore[arg-type]
    return CapabilityDeclaration.model_validate({"network_egress_rules": rules, **extra})


def _run(manager: SandboxManager, sid: str, code: str) -> dict:
    result = manager.run_python(sid, code, outputs=["out"], timeout=60)
    assert result.exit_code == 0, result.stderr
    return result.variables["out"] | {"_usage": result.resource_usage}


FETCH = """
import urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return [response.status, response.read().decode()]
    except urllib.error.HTTPError as exc:
        return [exc.code, exc.reason, exc.read().decode()]
    except OSError as exc:
        return ["error", str(exc)]
"""


def test_allowed_domain_answers_and_others_get_a_403_with_the_reason(net_manager, web) -> None:
    sid = net_manager.create_sandbox(_policy(web))
    out = _run(net_manager, sid, FETCH + f"""
import os
out = {{"proxy": os.environ["HTTP_PROXY"], "https": os.environ["https_proxy"],
        "ok": fetch("http://allowed.test:{web}/a"), "wild": fetch("http://api.wild.test:{web}/w"),
        "denied": fetch("http://evil.example:{web}/"),
        "apex": fetch("http://wild.test:{web}/")}}
""")
    assert out["proxy"] == out["https"] == "http://127.0.0.1:3128"
    assert out["ok"] == [200, "hello /a"]
    assert out["wild"] == [200, "hello /w"]
    status, reason, body = out["denied"]
    assert status == 403 and "evil.example is not in the allowlist" in reason
    assert "allowed.test" in body
    assert out["apex"][0] == 403  # *.wild.test is not wild.test itself
    usage = out["_usage"]
    assert (usage["egress_allowed"], usage["egress_denied"]) == (2, 2)
    log = net_manager.egress_log(sid)
    assert [(entry["host"], entry["allowed"]) for entry in log] == [
        ("allowed.test", True), ("api.wild.test", True), ("evil.example", False), ("wild.test", False)
    ]
    assert all(entry["sandbox_id"] == sid for entry in log)


def test_public_name_resolving_to_a_private_address_is_refused(net_manager, web) -> None:
    sid = net_manager.create_sandbox(_policy(web))
    out = _run(net_manager, sid, FETCH + f'out = {{"r": fetch("http://public.test:{web}/")}}')
    status, reason, _ = out["r"]
    assert status == 403 and "127.0.0.1" in reason and "private_networks" in reason


def test_rate_limit_trips_at_the_configured_count(net_manager, web) -> None:
    rule = {"domain": "limited.test", "ports": [web], "private_networks": ["127.0.0.1/32"],
            "rate_limit_per_min": 3}
    sid = net_manager.create_sandbox(_policy(web, rules=[rule]))
    out = _run(net_manager, sid, FETCH + f"""
out = {{"codes": [fetch("http://limited.test:{web}/")[0] for _ in range(5)]}}
""")
    assert out["codes"] == [200, 200, 200, 429, 429]
    assert out["_usage"]["egress_rate_limited"] == 2
    # The window belongs to the sandbox, not to the run: a new run is still limited.
    again = _run(net_manager, sid, FETCH + f'out = {{"r": fetch("http://limited.test:{web}/")}}')
    assert again["r"][0] == 429
    # Nor to the sandbox: found in review, a new sandbox (a cell with other options gets one)
    # came with a fresh allowance. The window belongs to the destination, per manager.
    other = net_manager.create_sandbox(_policy(web, rules=[rule], resource_limits={"max_cpu_seconds": 5}))
    fresh = _run(net_manager, other, FETCH + f'out = {{"r": fetch("http://limited.test:{web}/")}}')
    assert fresh["r"][0] == 429


CONNECT = """
import socket
def connect(target, then=b""):
    with socket.create_connection(("127.0.0.1", 3128), timeout=20) as s:
        s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode() + then)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data.decode(errors="replace")
"""


def test_connect_tunnels_to_an_allowed_port_and_refuses_a_denied_one(net_manager, web) -> None:
    sid = net_manager.create_sandbox(_policy(web))
    request = "GET /tunnel HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n"
    out = _run(net_manager, sid, CONNECT + f"""
out = {{"ok": connect("allowed.test:{web}", b"{request}"), "port": connect("allowed.test:22")}}
""")
    assert out["ok"].startswith("HTTP/1.1 200") and out["ok"].endswith("hello /tunnel")
    assert out["port"].startswith("HTTP/1.1 403") and "port 22 not allowed" in out["port"]


def test_the_child_reaches_nothing_but_the_proxy(net_manager, web) -> None:
    sid = net_manager.create_sandbox(_policy(web))
    out = _run(net_manager, sid, f"""
import socket
out = {{}}
def attempt(name, fn):
    try:
        fn()
        out[name] = "reached"
    except OSError as exc:
        out[name] = type(exc).__name__
attempt("direct tcp", lambda: socket.create_connection(("127.0.0.1", {web}), timeout=5))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("dns", lambda: socket.getaddrinfo("allowed.test", {web}))
attempt("public ip", lambda: socket.create_connection(("1.1.1.1", 80), timeout=5))
attempt("bind", lambda: socket.socket().bind(("127.0.0.1", 8080)))
""")
    del out["_usage"]
    assert "reached" not in out.values(), out


def test_tcp_fast_open_does_not_slip_past_the_port_rule(net_manager, web) -> None:
    """Found in review: sendto(MSG_FASTOPEN) connects without the connect() hook Landlock
    checks, so it reached a port the rules refuse (here the child's own listener, the only
    other thing in its network namespace). Without a network namespace a child may not
    listen at all (its socket would be on the pod's network): then the server is ours."""
    sid = net_manager.create_sandbox(_policy(web))
    own_server = socket.create_server(("127.0.0.1", 0))
    try:
        out = _run(net_manager, sid, f"""
import socket
server = socket.socket()
try:
    server.listen()  # bound to a free port by the kernel
    port = server.getsockname()[1]
    out = {{}}
except PermissionError:
    port, out = {own_server.getsockname()[1]}, {{"listen": "refused"}}
for name, flags in (("sendto", "sendto"), ("sendmsg", "sendmsg")):
    client = socket.socket()
    try:
        if flags == "sendto":
            client.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", port))
        else:
            client.sendmsg([b"x"], [], socket.MSG_FASTOPEN, ("127.0.0.1", port))
        out[name] = "reached"
    except OSError as exc:
        out[name] = exc.errno
    client.close()
""")
    finally:
        own_server.close()
    del out["_usage"]
    listen = {"listen": "refused"} if "listen" in out else {}
    assert out == {**listen, "sendto": 1, "sendmsg": 1}, out  # EPERM


def test_a_finished_run_leaves_no_proxy_connection(web) -> None:
    """Found in review: tunnels to a destination that never hangs up outlived their run (up
    to the idle timeout), holding threads and the connection cap, so the sandbox's next run
    got 503s."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) and never closes
    manager = SandboxManager(egress_resolver=_resolve)
    try:
        port = silent.getsockname()[1]
        sid = manager.create_sandbox(_policy(web, rules=[
            {"domain": "silent.test", "ports": [port], "private_networks": ["127.0.0.1/32"]}]))
        out = _run(manager, sid, f"""
import socket
out = {{"replies": []}}
for _ in range(3):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT silent.test:{port} HTTP/1.1\\r\\n\\r\\n")
    out["replies"].append(s.recv(100).decode().split("\\r\\n")[0])
""")
        assert out["replies"] == ["HTTP/1.1 200 Connection established"] * 3
        proxy = manager._get(sid).proxy
        assert proxy is not None
        assert not [t for t in threading.enumerate() if t.name == "sandbox-egress-conn"]
        again = _run(manager, sid, FETCH + f'out = {{"r": fetch("http://allowed.test:{web}/")}}')
        assert again["r"][0] == 200
    finally:
        manager.close()
        silent.close()


def test_a_narrowed_sandbox_shares_the_session_rules_rate_window(web) -> None:
    """Found in review: a narrowed destination had a window of its own, a fresh allowance
    for every cell that named a host."""
    from sandbox_kernel_ext.policy.narrowing import Narrowing, narrow

    ceiling = CapabilityDeclaration.model_validate({"network_egress_rules": [
        {"domain": "*.wild.test", "ports": [web], "rate_limit_per_min": 2,
         "private_networks": ["127.0.0.0/8"]}]})
    cell = narrow(ceiling, Narrowing(allow_net=(f"y.wild.test:{web}",)))
    with SandboxManager(egress_resolver=_resolve) as manager:
        session, narrowed = manager.create_sandbox(ceiling), manager.create_sandbox(cell)
        first = _run(manager, session, FETCH + f"""
out = {{"r": [fetch("http://x.wild.test:{web}/")[0] for _ in range(2)]}}""")
        later = _run(manager, narrowed, FETCH + f'out = {{"r": fetch("http://y.wild.test:{web}/")}}')
    assert first["r"] == [200, 200]
    assert later["r"][0] == 429 and "rate limit 2/min for *.wild.test" in later["r"][1]


def test_no_rules_means_no_listener_and_no_proxy_variables(net_manager) -> None:
    sid = net_manager.create_sandbox(CapabilityDeclaration())
    result = net_manager.run_python(sid, """
import os, socket
names = sorted(n for n in os.environ if "proxy" in n.lower())
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=5)
    reach = "reached"
except OSError as exc:
    reach = type(exc).__name__
""", outputs=["names", "reach"], env={"HTTP_PROXY": "http://10.0.0.1:8080"})
    assert result.variables == {"names": [], "reach": "OSError"}  # EAFNOSUPPORT: no inet at all


def test_a_caller_cannot_point_the_child_at_another_proxy(net_manager, web) -> None:
    sid = net_manager.create_sandbox(_policy(web))
    result = net_manager.run_python(
        sid, "import os\nvalue = os.environ['HTTPS_PROXY']\nno = os.environ.get('NO_PROXY')",
        outputs=["value", "no"], env={"HTTPS_PROXY": "http://10.0.0.1:1", "NO_PROXY": "*"},
    )
    assert result.variables == {"value": "http://127.0.0.1:3128", "no": None}


def test_egress_log_entries_are_json_ready(net_manager, web) -> None:
    sid = net_manager.create_sandbox(_policy(web))
    _run(net_manager, sid, FETCH + f'out = {{"r": fetch("http://allowed.test:{web}/")}}')
    entry = net_manager.egress_log(sid)[-1]
    assert json.loads(json.dumps(entry))["address"] == "127.0.0.1"
    assert {"time", "method", "host", "port", "allowed", "reason"} <= set(entry)


def _settled_descriptor_count() -> int:
    """This process's descriptor count once it has held still for ten samples."""
    counts: list[int] = []
    for _ in range(400):
        counts.append(len(os.listdir("/proc/self/fd")))
        if len(counts) >= 10 and len(set(counts[-10:])) == 1:
            break
        time.sleep(0.05)
    return counts[-1]


def test_destroy_stops_the_proxy_and_leaves_no_descriptor(web) -> None:
    before_threads = {t.name for t in threading.enumerate()}
    manager = SandboxManager(egress_resolver=_resolve)
    try:
        sid = manager.create_sandbox(_policy(web))
        manager.run_python(sid, FETCH + f'fetch("http://allowed.test:{web}/")')
        fds = _settled_descriptor_count()
        for _ in range(3):
            manager.run_python(sid, FETCH + f'fetch("http://allowed.test:{web}/")')
        # nothing per run: three more runs leave no more descriptors than one did (the
        # proxy closes a finished connection on its own thread, so both counts wait for
        # the count to stop moving rather than read it once)
        assert _settled_descriptor_count() <= fds
        manager.destroy(sid)
    finally:
        manager.close()
    leftover = {t.name for t in threading.enumerate()} - before_threads
    assert not any("egress" in name for name in leftover), leftover
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", 3128), timeout=2)  # never on the host
