"""Egress where a child has no network namespace: the trusted side answers its every connect.

Inside a container whose seccomp profile refuses user namespaces (Docker's, containerd's) a
child shares the pod's network: Landlock's TCP rule checks ports, not addresses, so alone it
would let the child reach the proxy's port number on any host, the Jupyter server on loopback,
the cluster. The child's seccomp filter stops each `connect` and hands it here (seccomp user
notification). The call itself never runs: the address in the child's memory is read only to
decide, and could change after the check, so what the child gets is never what it asked for
but a connection this side made to the sandbox's proxy, put at the child's descriptor number
(`SECCOMP_IOCTL_NOTIF_ADDFD`). Any other address is refused.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import struct
import threading

from ..linux import seccomp

__all__ = ["ConnectBroker", "PROXY_ADDRESSES"]

# Where the child's HTTP(S)_PROXY points (`plan.PROXY_PORT` on these): the one place it may
# connect to, as it would in a network namespace of its own.
PROXY_ADDRESSES = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"),
                   ipaddress.ip_address("::ffff:127.0.0.1"))
_SOCKADDR_MAX = 128
O_NONBLOCK, O_CLOEXEC = 0o4000, 0o2000000


def requested_proxy(address: bytes, proxy_port: int) -> bool:
    """Whether a sockaddr (as read from the child) names the proxy's advertised address."""
    if len(address) < 2:
        return False
    family = struct.unpack_from("=H", address)[0]
    if family == socket.AF_INET and len(address) >= 8:
        port, = struct.unpack_from("!H", address, 2)
        host = ipaddress.ip_address(address[4:8])
    elif family == socket.AF_INET6 and len(address) >= 24:
        port, = struct.unpack_from("!H", address, 2)
        host = ipaddress.ip_address(address[8:24])
    else:
        return False
    return port == proxy_port and host in PROXY_ADDRESSES


class ConnectBroker:
    """Answers the connects of one run's process tree (the filter's `listener`, which it owns
    and closes) until the last process of the tree has ended."""

    def __init__(self, listener: int, proxy_port: int, connect_to: tuple[str, int]) -> None:
        self.listener = listener
        self.proxy_port = proxy_port  # what the child asks for
        self.connect_to = connect_to  # where this side's connections go: the proxy's listener
        threading.Thread(target=self._serve, name="sandbox-connect-broker", daemon=True).start()

    def _serve(self) -> None:
        """Until the tree has ended (POLLHUP). Nothing a child sends may end this loop early:
        with the listener closed, a child's connects fail with ENOSYS, and a filter of its
        own could let them run (seccomp refuses it one, and this loop does not stop)."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        try:
            while True:
                events = poller.poll()
                if any(event & (select.POLLHUP | select.POLLNVAL) for _, event in events):
                    return  # every process of the tree has ended
                if not any(event & select.POLLIN for _, event in events):
                    continue
                try:
                    notification = seccomp.receive_notification(self.listener)
                except OSError:
                    continue  # its process died between the poll and the receive
                try:
                    self._decide(notification)
                except Exception:  # noqa: BLE001 - a refusal, whatever went wrong
                    try:
                        self._refuse(notification, errno.EACCES)
                    except OSError:
                        pass  # its process is gone: nothing waits for the answer
        finally:
            os.close(self.listener)

    def _decide(self, notification: seccomp.Notification) -> None:
        """Read what the child asked for; give it a connection to the proxy, or refuse."""
        pid, fd = notification.pid, int(notification.args[0]) & 0xFFFFFFFF
        length = min(int(notification.args[2]) & 0xFFFFFFFF, _SOCKADDR_MAX)
        try:
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
                memory.seek(int(notification.args[1]))
                address = memory.read(length)
            flags = _descriptor_flags(pid, fd)
        except (OSError, ValueError, OverflowError):
            address, flags = b"", None
        # The pid read above was the caller's only if the call still waits now.
        if not seccomp.notification_valid(self.listener, notification.id):
            return
        if flags is None:
            self._refuse(notification, errno.EBADF)
            return
        if not requested_proxy(address, self.proxy_port):
            self._refuse(notification, errno.ECONNREFUSED)
            return
        try:
            ours = socket.create_connection(self.connect_to, timeout=10)
        except OSError:
            self._refuse(notification, errno.ECONNREFUSED)
            return
        with ours:
            ours.setblocking(not flags & O_NONBLOCK)
            try:
                seccomp.place_descriptor(self.listener, notification.id, ours.fileno(), fd,
                                         cloexec=bool(flags & O_CLOEXEC))
            except OSError as exc:  # its descriptor limit, say: the call must still end
                if exc.errno == errno.ENOENT:
                    return  # it died meanwhile
                self._refuse(notification, errno.EMFILE)
                return
        seccomp.answer(self.listener, notification.id, value=0)

    def _refuse(self, notification: seccomp.Notification, code: int) -> None:
        seccomp.answer(self.listener, notification.id, error=code)


def _descriptor_flags(pid: int, fd: int) -> int | None:
    """The open flags of a socket descriptor of `pid` (None: not a socket, or not there)."""
    if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
        return None
    with open(f"/proc/{pid}/fdinfo/{fd}") as info:
        for line in info:
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    return None
