"""Ways around the egress proxy, with and without a network namespace of the child's own.

With one (a plain host, Podman's profile) the child's namespace holds only loopback and the
proxy's listener. Without one (Docker's profile: no user namespaces) the child is on the pod's
network, and every connect it makes is answered by the trusted side (`connect_broker.py`),
which never lets the child's own call run. Each attack here must fail either way; through
`tests/containers/test_profiles.py` they run under each container profile too.
"""

from __future__ import annotations

import socket
import sys
import threading

import pytest

from sandbox_kernel_ext import CapabilityDeclaration
from sandbox_kernel_ext.runner.trusted.manager import SandboxManager
from sandbox_kernel_ext.runner.trusted.plan import PROXY_PORT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
MARK = b"REACHED-DIRECTLY"


class _Service:
    """A TCP service of the host (the pod's, in a container) that answers MARK to whoever
    connects: the child reading MARK got past the proxy."""

    def __init__(self, host: str, port: int) -> None:
        self.server = socket.create_server((host, port), reuse_port=False)
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            with connection:
                try:
                    connection.sendall(MARK)
                except OSError:
                    pass

    def close(self) -> None:
        """Stop listening for real: a close alone leaves the thread's accept() holding it."""
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()
        self._thread.join(timeout=10)


def _egress_policy(port: int) -> CapabilityDeclaration:
    return CapabilityDeclaration(network_egress_rules=[
        {"domain": "allowed.test", "ports": [port], "private_networks": ["127.0.0.1/32"]}])


@pytest.fixture()
def manager() -> SandboxManager:
    with SandboxManager(egress_resolver=lambda host, port: ["127.0.0.1"]) as manager:
        yield manager


def test_a_service_on_the_proxys_port_number_is_not_reached(manager: SandboxManager) -> None:
    """The pod's own service listening where the child's proxy is said to be (its port, on
    every address): the child gets the proxy, or nothing, at each address it tries."""
    try:
        service = _Service("0.0.0.0", PROXY_PORT)
    except OSError as exc:
        pytest.skip(f"port {PROXY_PORT} is taken on this host: {exc}")
    try:
        sid = manager.create_sandbox(_egress_policy(service.port))
        result = manager.run_python(sid, f"""
import socket
out = {{}}
for host in ("127.0.0.1", "127.0.0.2", "127.1.2.3", "0.0.0.0", "::1", "::ffff:127.0.0.1"):
    try:
        with socket.create_connection((host, {PROXY_PORT}), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
            s.settimeout(5)
            out[host] = s.recv(200).decode("latin-1")
    except OSError as exc:
        out[host] = type(exc).__name__
""", outputs=["out"], timeout=120)
    finally:
        service.close()
    assert result.exit_code == 0, result.stderr
    seen = result.variables["out"]
    assert not any(MARK.decode() in str(reply) for reply in seen.values()), seen
    assert service.accepted == 0, seen


def test_an_address_changed_after_the_check_reaches_nothing(manager: SandboxManager) -> None:
    """A process flips the address in memory it shares with the child between the proxy's
    and a service's while the child connects: whatever the trusted side read, the connection is never the
    child's own call to where the memory pointed last."""
    service = _Service("127.0.0.1", 0)
    try:
        sid = manager.create_sandbox(_egress_policy(service.port))
        result = manager.run_python(sid, f"""
import ctypes, mmap, os, signal, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
proxy = struct.pack("=H", socket.AF_INET) + struct.pack("!H", {PROXY_PORT}) + bytes([127, 0, 0, 1]) + bytes(8)
service = struct.pack("=H", socket.AF_INET) + struct.pack("!H", {service.port}) + bytes([127, 0, 0, 1]) + bytes(8)
shared = mmap.mmap(-1, 16)  # shared with the flipping process: no lock slows it down
shared[:] = proxy
address = ctypes.addressof(ctypes.c_char.from_buffer(shared))
flipper = os.fork()
if flipper == 0:
    while True:
        shared[:] = service
        shared[:] = proxy
out = {{"connected": 0, "reached": 0, "refused": 0}}
for _ in range(200):
    s = socket.socket()
    if libc.connect(s.fileno(), ctypes.c_void_p(address), 16) == 0:
        out["connected"] += 1
        s.settimeout(2)
        try:
            s.sendall(b"GET http://denied.test/ HTTP/1.0\\r\\n\\r\\n")  # the proxy answers at once
            if b"{MARK.decode()}" in s.recv(64):
                out["reached"] += 1
        except OSError:
            pass
    else:
        out["refused"] += 1
    s.close()
os.kill(flipper, signal.SIGKILL)
os.waitpid(flipper, 0)
""", outputs=["out"], timeout=300)
    finally:
        service.close()
    assert result.exit_code == 0, result.stderr
    out = result.variables["out"]
    assert out["reached"] == 0 and service.accepted == 0, out


def test_no_listening_socket_takes_connections_from_outside(manager: SandboxManager) -> None:
    """A child's listener is in its own namespace (nobody outside can reach it), or, on the
    pod's network, refused."""
    sid = manager.create_sandbox(_egress_policy(9))
    result = manager.run_python(sid, """
import socket
s = socket.socket()
try:
    s.listen()
    out = s.getsockname()[1]
except OSError as exc:
    out = type(exc).__name__
""", outputs=["out"], timeout=60)
    assert result.exit_code == 0, result.stderr
    port = result.variables["out"]
    if isinstance(port, int):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    else:
        assert port == "PermissionError"


def test_the_child_cannot_take_a_listener_of_its_own(manager: SandboxManager) -> None:
    """Found in review: had the trusted side's listener ever closed, the child's connects
    would fail with ENOSYS, and a filter of its own whose listener it held could let them run
    (SECCOMP_USER_NOTIF_FLAG_CONTINUE), to the proxy's port on any host."""
    sid = manager.create_sandbox(_egress_policy(9))
    result = manager.run_python(sid, """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
SECCOMP = {"x86_64": 317, "aarch64": 277}[platform.machine()]
class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
allow = (Filter * 1)(Filter(0x06, 0, 0, 0x7FFF0000))  # ret ALLOW
program = Program(1, allow)
result = libc.syscall(SECCOMP, 1, 1 << 3, ctypes.byref(program))  # SET_MODE_FILTER, NEW_LISTENER
out = ctypes.get_errno() if result < 0 else "listener"
""", outputs=["out"], timeout=60)
    assert result.exit_code == 0, result.stderr
    assert result.variables["out"] == 1, result.variables  # EPERM


def test_a_connect_whose_descriptor_cannot_be_replaced_still_ends(manager: SandboxManager) -> None:
    """Found in review: with its descriptor limit below the socket's number, the trusted
    side could not put its connection there and left the call waiting for ever."""
    sid = manager.create_sandbox(_egress_policy(9))
    result = manager.run_python(sid, f"""
import resource, socket
s = socket.socket()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (s.fileno(), hard))  # its own number is past it
try:
    s.connect(("127.0.0.1", {PROXY_PORT}))
    out = "connected"
except OSError as exc:
    out = exc.errno
""", outputs=["out"], timeout=60)
    assert result.killed is None and result.exit_code == 0, result
    assert result.variables["out"] in ("connected", 24), result.variables  # EMFILE
