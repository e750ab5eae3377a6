"""A sandbox's home as a tmpfs of its own, sized by its disk quota (made in the launcher).

Where a sandbox has a disk quota, its home (also its TMPDIR) is a tmpfs that holds at most
the quota's bytes and one file or folder per KiB of it (`disk_quota.home_inodes`, decided on
the trusted side): a burst of writes or of empty files fails there with ENOSPC in Linux
itself, before any walk could see it. The
tmpfs is mounted nowhere on the host: the trusted side keeps its descriptor for the
sandbox's life (its `statvfs` is the home's usage), and each run attaches a copy of it on
the home's path in its own mount namespace, so every run and session of the sandbox sees the
same files. Closing the descriptor, once no run holds a copy, frees it.

Making a tmpfs needs CAP_SYS_ADMIN where the mount namespace was made, so a launcher that is
not root makes it in a throwaway fork in new user and mount namespaces (root there is the
launcher's uid, which then owns the tmpfs). A child may attach a copy of a detached mount
from Linux 6.15 on; the fork tries one copy, so an older Linux says so here and the home
stays on the host's disk, under the quota's walks.
"""

from __future__ import annotations

import errno
import os
import socket

from ..linux.namespaces import CLONE_NEWNS, clone_mount, enter_namespaces, sized_tmpfs

__all__ = ["make_sized_home"]

# How long the fork may take (a few milliseconds unless the host is starved).
MAKE_TIMEOUT = 10.0


def make_sized_home(size: int, inodes: int, *, uid: int | None) -> int:
    """A detached tmpfs of `size` bytes and `inodes` files, owned by `uid` (a root
    launcher's children's uid) or by the caller; OSError naming why it cannot be made."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the fork
        ours.close()
        _make_and_send(theirs, size, inodes, uid)
    theirs.close()
    try:
        ours.settimeout(MAKE_TIMEOUT)
        try:
            message, fds, _, _ = socket.recv_fds(ours, 4096, 1, socket.MSG_CMSG_CLOEXEC)
        except TimeoutError:
            os.kill(pid, 9)
            raise OSError(errno.ETIMEDOUT, "making the home's tmpfs took too long") from None
        if fds and message == b"home":
            return fds[0]
        for fd in fds:
            os.close(fd)
        raise OSError(errno.EPERM, message.decode(errors="replace") or "the fork ended")
    finally:
        ours.close()
        os.waitpid(pid, 0)


def _make_and_send(sock: socket.socket, size: int, inodes: int, uid: int | None) -> None:
    """The fork's part: make the tmpfs, try one copy of it, send it; never returns."""
    try:
        if os.geteuid() != 0:
            enter_namespaces(CLONE_NEWNS, use_userns=True, seen_uid=0)
        fd = sized_tmpfs(size, inodes, owner=uid)
        try:
            os.close(clone_mount(fd))
        except OSError as exc:
            raise OSError(exc.errno, "this Linux cannot attach a copy of a detached mount "
                                     f"(Linux 6.15 or later can): {exc.strerror}") from None
        socket.send_fds(sock, [b"home"], [fd])
    except BaseException as exc:  # noqa: BLE001 - the launcher reads why
        try:
            sock.send(f"{exc}".encode()[:4000] or type(exc).__name__.encode())
        except OSError:
            pass
    finally:
        os._exit(0)
