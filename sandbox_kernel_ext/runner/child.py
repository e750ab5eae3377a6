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
import os
import signal

from . import landlock, seccomp
from .kernel_calls import checked, libc, prctl
from .plan import RLIMIT_NUMBERS, ChildPlan

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Where the plumbing sits in the confined child.
CONTROL_FD = 3  # child -> parent frames (JSON lines): output variables
PAYLOAD_FD = 4  # parent -> child: the cell and its pickled inputs (a memfd)


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


def mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _call("mount", enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), None)


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


def _report(status_fd: int, message: str) -> None:
    try:
        os.write(status_fd, (message.replace("\n", " ") + "\n").encode())
    except OSError:
        pass


def spawn(plan: ChildPlan, fds: dict[str, int], *, use_userns: bool) -> tuple[int, str | None]:
    """Fork the confined child; return (its host pid, or 0, and the setup error if any).

    `fds` holds "stdin", "stdout", "stderr" and for Python runs "control" and "payload".
    Called by the launcher, which reaps both forks (it is a child subreaper).
    """
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    setup_pid = os.fork()
    if setup_pid == 0:
        try:
            os.close(status_r)
            _setup_and_fork(plan, fds, status_w, use_userns)
        except BaseException as exc:  # noqa: BLE001 - reported to the launcher, then exit
            _report(status_w, f"error setup: {type(exc).__name__}: {exc}")
        os._exit(0)
    os.close(status_w)
    chunks = []
    while True:
        chunk = os.read(status_r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(status_r)
    os.waitpid(setup_pid, 0)  # it exits right after forking; its child is now ours to reap
    pid, error = 0, None
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        if line.startswith("pid "):
            pid = int(line.split()[1])
        elif line.startswith("error "):
            error = error or line[6:]
    return pid, error


def _setup_and_fork(plan: ChildPlan, fds: dict[str, int], status_w: int, use_userns: bool) -> None:
    root_without_userns = os.geteuid() == 0 and not use_userns
    if os.geteuid() == 0 and use_userns and plan.uid is not None:
        drop_identity(plan.uid, plan.gid if plan.gid is not None else plan.uid)
    enter_namespaces(use_userns)
    pid = os.fork()  # the first child after CLONE_NEWPID is PID 1 of the new namespace
    if pid == 0:
        try:
            _confine_and_run(plan, fds, status_w, drop_root=root_without_userns)
        except BaseException as exc:  # noqa: BLE001
            _report(status_w, f"error confine: {type(exc).__name__}: {exc}")
        os._exit(127)
    _report(status_w, f"pid {pid}")


def _install_fds(fds: dict[str, int], status_w: int) -> int:
    """Move the child's descriptors to fixed numbers and close everything else."""
    wanted = {0: fds["stdin"], 1: fds["stdout"], 2: fds["stderr"]}
    if "control" in fds:
        wanted[CONTROL_FD] = fds["control"]
        wanted[PAYLOAD_FD] = fds["payload"]
    high = {target: os.dup(source) for target, source in wanted.items()}
    status_high = os.dup(status_w)
    keep = set(wanted)
    for target, source in high.items():
        os.dup2(source, target, inheritable=True)
    os.dup2(status_high, 5, inheritable=False)
    keep.add(5)
    for fd in _open_fds():
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    return 5


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024))


def _confine_and_run(
    plan: ChildPlan, fds: dict[str, int], status_w: int, *, drop_root: bool
) -> None:
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass  # the host's /proc stays; the isolation report says so
    if drop_root and plan.uid is not None:
        drop_identity(plan.uid, plan.gid if plan.gid is not None else plan.uid)
    os.setsid()
    status_w = _install_fds(fds, status_w)
    os.chdir(plan.cwd)
    import resource

    for name, (soft, hard) in plan.rlimits.items():
        resource.setrlimit(RLIMIT_NUMBERS[name], (soft, hard))
    drop_capabilities()
    ruleset = landlock.LandlockRuleset()
    if ruleset.abi >= 1:
        for path in plan.read_paths:
            ruleset.allow_read(path)
        for path in plan.write_paths:
            ruleset.allow_write(path)
        ruleset.scope_signals().scope_abstract_unix()
        ruleset.restrict_self()
    if seccomp.supported_arch() is not None:
        seccomp.SeccompFilter(allow_socket_families=()).install()
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
