"""The confined child: runs in the launcher's forks, carrying out a `ChildPlan`.

Two forks per run. The first ("setup") drops root, enters new user, PID, mount, network, IPC
and UTS namespaces, and forks the second, which becomes PID 1 of its namespace: when it ends,
the kernel kills everything it left behind, `setsid` grandchildren included. The second mounts
a private `/proc`, applies rlimits, drops its capabilities, closes every inherited descriptor,
confines itself with Landlock and seccomp, and then execs the program or runs the cell.

Everything here runs in a single-threaded process (the launcher never starts a thread), which
is what makes Landlock and seccomp cover the whole child.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import signal
import socket
import struct
from dataclasses import dataclass, fields
from typing import Any

from . import landlock, seccomp
from .kernel_calls import checked, libc, prctl

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
PR_SET_DUMPABLE = 4
# A private /dev/shm per child (multiprocessing's semaphores live there); the host's is shared
# by every process on the machine, so it is never granted.
SHM_SIZE_MB = 64
PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Where the plumbing sits in the confined child.
CONTROL_FD = 3  # a socket to the parent: JSON-line frames both ways (control.py), fds back
PAYLOAD_FD = 4  # parent -> child: the cell and its pickled inputs (a memfd)
STATUS_FD = 5  # child -> launcher: setup errors; closed (on exec) once the child runs


@dataclass
class ChildPlan:
    kind: str  # "exec": run argv; "python": run cell code in the forked interpreter
    argv: list[str]
    env: dict[str, str]
    cwd: str
    read_paths: list[str]
    write_paths: list[str]
    rlimits: dict[str, list[int]]
    uid: int | None  # identity to drop to when the launcher runs as root
    gid: int | None
    # Where the egress proxy listens inside the child's network namespace (None: no network).
    proxy_port: int | None = None

    def to_json(self) -> dict[str, Any]:
        # Shallow: asdict() deep-copies the ~250 paths, a measurable part of a run's cost.
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildPlan:
        return cls(**data)


RLIMIT_NUMBERS = {name: getattr(resource, name) for name in (
    "RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE",
)}


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _call(name: str, *args: object) -> int:
    lib = libc()
    if lib is None:
        raise OSError(errno.ENOSYS, f"{name} is not available on this platform")
    return checked(getattr(lib, name)(*args))


def unshare(flags: int) -> None:
    _call("unshare", ctypes.c_int(flags))


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _call("mount", enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))


def drop_capabilities() -> None:
    """Empty every capability set and the bounding set (caps held inside the user namespace)."""
    for cap in range(64):
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError:
            break
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _call("capset", ctypes.byref(header), data)


def drop_identity(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    # A credential change makes us non-dumpable, which makes /proc/self/*_map root's to write.
    prctl(PR_SET_DUMPABLE, 1)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter_namespaces(use_userns: bool) -> None:
    """New namespaces; in a user namespace our own uid and gid map to themselves (no root)."""
    uid, gid = os.geteuid(), os.getegid()
    unshare(NAMESPACES | (CLONE_NEWUSER if use_userns else 0))
    if use_userns:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _report(status_fd: int, message: str) -> bool:
    try:
        os.write(status_fd, (message.replace("\n", " ") + "\n").encode())
        return True
    except OSError:
        return False


def prepare_rules(plan: ChildPlan) -> landlock.LandlockRuleset | None:
    """The plan's Landlock rules with every path already opened, in the launcher, so that a
    fork only adds them to a fresh ruleset (a syscall per rule, no path walks). None where
    Landlock is unavailable (the isolation report names that layer as missing)."""
    rules = landlock.LandlockRuleset()
    if rules.abi < 1:
        return None
    for path in plan.read_paths:
        rules.allow_read(path)
    for path in plan.write_paths:
        rules.allow_write(path)
    if plan.proxy_port is not None:
        rules.allow_tcp_connect(plan.proxy_port)  # the proxy is the one TCP port it may reach
    rules.scope_signals().scope_abstract_unix()
    rules.prepare()
    return rules


# One filter per kind of child; each program is assembled once, so a fork only loads it. A
# child with egress rules may open TCP sockets (its namespace has only loopback, and Landlock
# lets it connect to the proxy's port alone); UDP, raw and unix sockets stay refused.
SYSCALL_FILTER = (
    seccomp.SeccompFilter(allow_socket_families=(), allow_unix_pairs=True)
    if seccomp.supported_arch() else None
)
EGRESS_SYSCALL_FILTER = (
    seccomp.SeccompFilter(allow_socket_families=(socket.AF_INET, socket.AF_INET6),
                          inet_tcp_only=True, allow_unix_pairs=True)
    if seccomp.supported_arch() else None
)
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP, IFF_RUNNING = 0x1, 0x40


def open_proxy_listener(port: int) -> socket.socket:
    """Bring up the namespace's loopback and listen on 127.0.0.1:`port` (needs the namespace's
    CAP_NET_ADMIN, so it runs before the capabilities are dropped)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS,
                    struct.pack("16sH14x", b"lo", flags | IFF_UP | IFF_RUNNING))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


def _hand_over_listener(plan: ChildPlan, fds: dict[str, int]) -> None:
    """The parent serves the proxy on a listener made here, in our network namespace."""
    handoff = socket.socket(fileno=fds.pop("egress"))
    try:
        if plan.proxy_port is not None:
            with open_proxy_listener(plan.proxy_port) as listener:
                socket.send_fds(handoff, [b"listener"], [listener.fileno()])
    finally:
        handoff.close()


def spawn(
    plan: ChildPlan, fds: dict[str, int], *, use_userns: bool,
    rules: landlock.LandlockRuleset | None,
) -> tuple[int, str | None]:
    """Fork the confined child; return (its host pid, or 0, and the setup error if any).

    `fds` holds "stdin", "stdout", "stderr" and for Python runs "control" and "payload";
    `rules` is `prepare_rules(plan)`, possibly cached. Called by the launcher, which reaps
    both forks (it is a child subreaper).
    """
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    setup_pid = os.fork()
    if setup_pid == 0:
        try:
            os.close(status_r)
            _setup_and_fork(plan, fds, status_w, use_userns, rules)
        except BaseException as exc:  # noqa: BLE001 - reported to the launcher, then exit
            _report(status_w, f"error setup: {type(exc).__name__}: {exc}")
        os._exit(0)
    os.close(status_w)
    status = read_to_end(status_r)
    os.waitpid(setup_pid, 0)  # it exits right after forking; its child is now ours to reap
    pid, error = 0, None
    for line in status.decode(errors="replace").splitlines():
        if line.startswith("pid "):
            pid = int(line.split()[1])
        elif line.startswith("error "):
            error = error or line[6:]
    return pid, error


def _setup_and_fork(
    plan: ChildPlan, fds: dict[str, int], status_w: int, use_userns: bool,
    rules: landlock.LandlockRuleset | None,
) -> None:
    root_without_userns = os.geteuid() == 0 and not use_userns
    if os.geteuid() == 0 and use_userns and plan.uid is not None:
        drop_identity(plan.uid, plan.gid if plan.gid is not None else plan.uid)
    if use_userns or os.geteuid() == 0:
        enter_namespaces(use_userns)
    # else: no user namespaces for an unprivileged kernel, so no namespaces at all; the
    # isolation report names the missing layer, strict mode refuses, and the manager kills
    # the child's tree by sweeping it.
    pid = os.fork()  # the first child after CLONE_NEWPID is PID 1 of the new namespace
    if pid == 0:
        try:
            _confine_and_run(plan, fds, status_w, rules, drop_root=root_without_userns)
        except BaseException as exc:  # noqa: BLE001
            # The status pipe sits at STATUS_FD once the descriptors are installed.
            message = f"error confine: {type(exc).__name__}: {exc}"
            if not _report(STATUS_FD, message) and not _report(status_w, message):
                _report(2, f"[sandbox] the child failed after confinement: {message[15:]}")
        os._exit(127)
    _report(status_w, f"pid {pid}")


def _install_fds(fds: dict[str, int], status_w: int, ruleset_fd: int | None) -> int:
    """Move the child's descriptors to fixed numbers and close everything else."""
    wanted = {0: fds["stdin"], 1: fds["stdout"], 2: fds["stderr"]}
    if "control" in fds:
        wanted[CONTROL_FD] = fds["control"]
        wanted[PAYLOAD_FD] = fds["payload"]
    high = {target: os.dup(source) for target, source in wanted.items()}
    status_high = os.dup(status_w)
    keep = set(wanted) | ({ruleset_fd} if ruleset_fd is not None else set())
    for target, source in high.items():
        os.dup2(source, target, inheritable=True)
    os.dup2(status_high, STATUS_FD, inheritable=False)
    keep.add(STATUS_FD)
    # close_range() between the kept numbers: one syscall, however many the launcher held.
    edges = sorted(keep)
    for low, high in zip([-1, *edges], [*edges, _MAX_FD]):
        if high > low + 1:  # never an empty range: closerange(n, n) would close everything
            os.closerange(low + 1, high)
    return STATUS_FD


def read_to_end(fd: int) -> bytes:
    """Everything until end of file, then close `fd` (pipes and memfds of the plumbing)."""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


_MAX_FD = 1 << 30  # closerange() clamps to the real table size


def _confine_and_run(
    plan: ChildPlan, fds: dict[str, int], status_w: int, rules: landlock.LandlockRuleset | None,
    *, drop_root: bool,
) -> None:
    private_shm = False
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              f"size={SHM_SIZE_MB}m,mode=1777")
        private_shm = True
    except OSError:
        pass  # the host's /proc stays (the isolation report says so), and no /dev/shm
    if drop_root and plan.uid is not None:
        drop_identity(plan.uid, plan.gid if plan.gid is not None else plan.uid)
    os.setsid()
    if "env" in fds:  # the environment came on a memfd, never through the launcher's memory
        plan.env = json.loads(read_to_end(fds.pop("env")))
    if "egress" in fds:
        _hand_over_listener(plan, fds)
    ruleset_fd = None
    if rules is not None:
        # Built here, after our private /proc is mounted, so the /proc rule names it.
        rules.allow_read("/proc")
        if private_shm:
            rules.allow_write("/dev/shm")
        rules.build()
        ruleset_fd = rules.fileno()
    status_w = _install_fds(fds, status_w, ruleset_fd)
    os.chdir(plan.cwd)
    for name, (soft, hard) in plan.rlimits.items():
        resource.setrlimit(RLIMIT_NUMBERS[name], (soft, hard))
    drop_capabilities()
    if rules is not None:
        rules.restrict_self()
    syscall_filter = EGRESS_SYSCALL_FILTER if plan.proxy_port is not None else SYSCALL_FILTER
    if syscall_filter is not None:
        syscall_filter.install()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    if plan.kind == "exec":
        try:
            os.execve(plan.argv[0], plan.argv, plan.env)
        except OSError as exc:
            _report(status_w, f"error exec: cannot run {plan.argv[0]}: {exc.strerror}")
            os._exit(127)
    os.close(status_w)
    from .cell import run_cell

    os._exit(run_cell(plan))


__all__ = ["spawn", "drop_capabilities", "enter_namespaces", "CONTROL_FD", "PAYLOAD_FD"]
