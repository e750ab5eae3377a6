"""A seccomp filter in classic BPF, built with ``ctypes`` (no libseccomp).

It closes what Landlock leaves open: debugging other processes (ptrace, process_vm_*,
pidfd_getfd), kernel attack surface (io_uring, bpf, perf_event_open, userfaultfd, keyrings,
modules, kexec), namespace and mount games (unshare, setns, clone with CLONE_NEW*, the mount
API), file handles that skip path checks (open_by_handle_at), x32 syscalls that would dodge
the numbers below, and socket families the caller does not need (a pathname unix socket such as
docker.sock is reachable despite Landlock). ``clone3`` passes its flags in memory, where BPF
cannot look, so it gets ENOSYS and libc falls back to ``clone``, which we can inspect.

!!! WARNING — ``SeccompFilter.install()`` filters the CALLING THREAD ONLY (and whatever it
later forks or execs). Install it in a single-threaded child; it refuses otherwise. !!!

Importing this module is safe on any OS; ``seccomp_available()`` says whether it can work.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from .namespaces import CLONE_NAMESPACE_FLAGS
from .syscalls import checked, libc, prctl, set_no_new_privs, thread_count

__all__ = ["SeccompFilter", "SeccompUnavailableError", "seccomp_available", "supported_arch"]

# prctl and seccomp constants (include/uapi/linux/{prctl,seccomp,audit}.h).
PR_GET_SECCOMP = 21
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_GET_ACTION_AVAIL = 2
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# Classic BPF opcodes (include/uapi/linux/filter.h).
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
BPF_ALU_AND_K = 0x04 | 0x50 | 0x00
BPF_JMP_JA = 0x05 | 0x00
BPF_JMP_JEQ_K = 0x05 | 0x10 | 0x00
BPF_JMP_JGE_K = 0x05 | 0x30 | 0x00
BPF_JMP_JSET_K = 0x05 | 0x40 | 0x00
BPF_RET_K = 0x06 | 0x00

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6] (little-endian: low word first).
OFFSET_NR = 0
OFFSET_ARCH = 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


TIOCSTI = 0x5412
TIOCLINUX = 0x541C
SOCK_TYPE_MASK = 0xF  # the rest of socket()'s type holds SOCK_NONBLOCK / SOCK_CLOEXEC
IPPROTO_TCP = 6
# A TCP connect made by the first send: it skips the connect() hook where Landlock checks
# the port (seen on Linux 6.18), so it is refused; programs then connect() as usual.
MSG_FASTOPEN = 0x20000000


@dataclass(frozen=True)
class _Arch:
    name: str
    audit_arch: int
    has_x32: bool
    syscalls: dict[str, int]


# Numbers checked against the kernel headers (asm/unistd_64.h, asm-generic/unistd.h).
_DENIED_NAMES = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
    "userfaultfd", "mount", "umount2", "unshare", "setns", "pivot_root", "chroot",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "keyctl", "add_key", "request_key", "open_by_handle_at", "name_to_handle_at",
    # Landlock does not check watches: they would report names and activity in folders the
    # child may not list.
    "inotify_add_watch", "fanotify_init", "fanotify_mark",
)
ARCHES: dict[str, _Arch] = {
    "x86_64": _Arch("x86_64", AUDIT_ARCH_X86_64, True, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
        "process_madvise": 440, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "mount": 165, "umount2": 166, "unshare": 272, "setns": 308, "pivot_root": 155,
        "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "keyctl": 250, "add_key": 248, "request_key": 249, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "clone": 56, "clone3": 435, "socket": 41, "socketpair": 53,
        "seccomp": 317, "ioctl": 16, "sendto": 44, "sendmsg": 46, "sendmmsg": 307,
        "inotify_add_watch": 254, "fanotify_init": 300, "fanotify_mark": 301,
    }),
    "aarch64": _Arch("aarch64", AUDIT_ARCH_AARCH64, False, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
        "process_madvise": 440, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "mount": 40, "umount2": 39, "unshare": 97, "setns": 268, "pivot_root": 41,
        "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "kexec_load": 104,
        "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "keyctl": 219, "add_key": 217, "request_key": 218, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "clone": 220, "clone3": 435, "socket": 198, "socketpair": 199,
        "seccomp": 277, "ioctl": 29, "sendto": 206, "sendmsg": 211, "sendmmsg": 269,
        "inotify_add_watch": 27, "fanotify_init": 262, "fanotify_mark": 263,
    }),
}
_MACHINE_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


class SeccompUnavailableError(RuntimeError):
    """seccomp filtering cannot be used here (OS, kernel or architecture)."""


def supported_arch() -> str | None:
    """The architecture name this module has syscall numbers for, or None."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    return _MACHINE_ALIASES.get(platform.machine().lower())


def _libc() -> ctypes.CDLL:
    lib = libc()
    if lib is None:
        raise SeccompUnavailableError("seccomp exists only on Linux")
    return lib


def seccomp_available() -> bool:
    """True when this host can install our filter: Linux, a known arch, filter mode built in."""
    arch_name = supported_arch()
    if arch_name is None:
        return False
    try:
        prctl(PR_GET_SECCOMP)  # EINVAL when the kernel has no CONFIG_SECCOMP
        action = ctypes.c_uint32(SECCOMP_RET_KILL_PROCESS)
        result = _libc().syscall(
            ctypes.c_long(ARCHES[arch_name].syscalls["seccomp"]),
            ctypes.c_uint(SECCOMP_GET_ACTION_AVAIL),
            ctypes.c_uint(0),
            ctypes.byref(action),
        )
        return result == 0
    except (OSError, SeccompUnavailableError):
        return False


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


# An instruction before label resolution: (code, k, jump-if-true, jump-if-false); jumps are label
# names or None for "the next instruction".
_Insn = tuple[int, int, "str | None", "str | None"]


class _Assembler:
    """Just enough of an assembler to write the filter with named jump targets."""

    def __init__(self) -> None:
        self.code: list[_Insn] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def load(self, offset: int) -> None:
        self.code.append((BPF_LD_W_ABS, offset, None, None))

    def and_(self, mask: int) -> None:
        self.code.append((BPF_ALU_AND_K, mask, None, None))

    def jeq(self, value: int, if_true: str | None, if_false: str | None = None) -> None:
        self.code.append((BPF_JMP_JEQ_K, value, if_true, if_false))

    def jge(self, value: int, if_true: str | None, if_false: str | None = None) -> None:
        self.code.append((BPF_JMP_JGE_K, value, if_true, if_false))

    def jset(self, mask: int, if_true: str | None, if_false: str | None = None) -> None:
        self.code.append((BPF_JMP_JSET_K, mask, if_true, if_false))

    def jump(self, target: str) -> None:
        self.code.append((BPF_JMP_JA, 0, target, None))

    def ret(self, value: int) -> None:
        self.code.append((BPF_RET_K, value, None, None))

    def resolve(self) -> list[tuple[int, int, int, int]]:
        program: list[tuple[int, int, int, int]] = []
        for index, (code, k, if_true, if_false) in enumerate(self.code):
            def offset(target: str | None) -> int:
                if target is None:
                    return 0
                distance = self.labels[target] - (index + 1)
                if not 0 <= distance <= 255:
                    raise ValueError(f"BPF jump to {target!r} out of range ({distance})")
                return distance

            if code == BPF_JMP_JA:  # unconditional jumps keep their offset in k
                assert if_true is not None
                program.append((code, 0, 0, self.labels[if_true] - (index + 1)))
            else:
                program.append((code, offset(if_true), offset(if_false), k))
        return program


def _errno(value: int) -> int:
    return SECCOMP_RET_ERRNO | (value & 0xFFFF)


class SeccompFilter:
    """The sandbox's syscall filter; ``install()`` it in the single-threaded child.

    ``allow_socket_families``: the only domains ``socket``/``socketpair`` may use (default none:
    even AF_UNIX is denied, since pathname unix sockets slip past Landlock). Others fail with
    EAFNOSUPPORT, which programs treat as "this family is not here".
    ``inet_tcp_only``: AF_INET/AF_INET6 sockets must be plain TCP (SOCK_STREAM with protocol 0
    or IPPROTO_TCP); UDP, raw, SCTP and MPTCP get EPERM. Landlock's network rules cover only TCP,
    so this keeps every inet socket under them.
    ``allow_unix_pairs``: let ``socketpair(AF_UNIX, SOCK_STREAM)`` through whatever the families:
    a connected stream pair reaches no socket outside the process tree (``multiprocessing``
    needs it), while ``socket(AF_UNIX)`` could connect to a pathname socket such as docker.sock,
    and a datagram pair can still ``sendto`` one (/dev/log, systemd's notify socket).
    ``arch``: the architecture to build for (default: this machine); a mismatch with the running
    kernel's kills the process at its first syscall, which is what the check is for.
    """

    def __init__(
        self,
        allow_socket_families: Iterable[int] = (),
        *,
        inet_tcp_only: bool = True,
        allow_unix_pairs: bool = False,
        arch: str | None = None,
    ) -> None:
        arch_name = arch if arch is not None else supported_arch()
        if arch_name not in ARCHES:
            raise SeccompUnavailableError(
                f"no seccomp syscall table for {platform.system()} {platform.machine()} "
                f"(supported: {', '.join(ARCHES)} on Linux)"
            )
        self.arch = ARCHES[arch_name]
        self.allow_socket_families = frozenset(int(family) for family in allow_socket_families)
        self.inet_tcp_only = inet_tcp_only
        self.allow_unix_pairs = allow_unix_pairs
        self._program: list[tuple[int, int, int, int]] | None = None

    def instructions(self) -> list[tuple[int, int, int, int]]:
        """The program as (code, jt, jf, k) tuples, for inspection and tests."""
        arch, sc = self.arch, self.arch.syscalls
        asm = _Assembler()
        asm.load(OFFSET_ARCH)
        asm.jeq(arch.audit_arch, None, "kill")  # foreign ABIs use other numbers: never let them by
        asm.load(OFFSET_NR)
        if arch.has_x32:
            asm.jge(X32_SYSCALL_BIT, "eperm")
        for name in _DENIED_NAMES:
            asm.jeq(sc[name], "eperm")
        asm.jeq(sc["clone3"], "enosys")
        asm.jeq(sc["clone"], "clone")
        asm.jeq(sc["socket"], "socket")
        asm.jeq(sc["socketpair"], "socketpair" if self.allow_unix_pairs else "socket")
        asm.jeq(sc["ioctl"], "ioctl")
        asm.jeq(sc["sendto"], "flags_arg3")
        asm.jeq(sc["sendmmsg"], "flags_arg3")
        asm.jeq(sc["sendmsg"], "flags_arg2")
        asm.ret(SECCOMP_RET_ALLOW)

        asm.label("flags_arg3")
        asm.load(_arg_low(3))
        asm.jset(MSG_FASTOPEN, "eperm", "allow")
        asm.label("flags_arg2")
        asm.load(_arg_low(2))
        asm.jset(MSG_FASTOPEN, "eperm", "allow")

        # Pushing keystrokes into a terminal inherited from the parent runs commands in the
        # user's shell; Landlock's ioctl right does not cover descriptors opened before it.
        asm.label("ioctl")
        asm.load(_arg_low(1))  # request
        asm.jeq(TIOCSTI, "eperm")
        asm.jeq(TIOCLINUX, "eperm", "allow")

        asm.label("clone")
        asm.load(_arg_low(0))  # flags is argument 0 on both x86_64 and aarch64
        asm.jset(CLONE_NAMESPACE_FLAGS, "eperm", "allow")

        if self.allow_unix_pairs:
            asm.label("socketpair")
            asm.load(_arg_low(0))  # domain
            asm.jeq(socket.AF_UNIX, None, "socket")
            asm.load(_arg_low(1))  # type
            asm.and_(SOCK_TYPE_MASK)
            asm.jeq(socket.SOCK_STREAM, "allow", "socket")  # other pairs: as socket() would be

        asm.label("socket")
        asm.load(_arg_low(0))  # domain
        inet_families = {int(socket.AF_INET), int(getattr(socket, "AF_INET6", 10))}
        checked_inet = False
        for family in sorted(self.allow_socket_families):
            if self.inet_tcp_only and family in inet_families:
                asm.jeq(family, "inet_check")
                checked_inet = True
            else:
                asm.jeq(family, "allow")
        asm.jump("eafnosupport")
        if checked_inet:
            asm.label("inet_check")
            asm.load(_arg_low(1))  # type
            asm.and_(SOCK_TYPE_MASK)
            asm.jeq(socket.SOCK_STREAM, None, "eperm")
            asm.load(_arg_low(2))  # protocol
            asm.jeq(0, "allow")
            asm.jeq(IPPROTO_TCP, "allow", "eperm")

        asm.label("allow")
        asm.ret(SECCOMP_RET_ALLOW)
        asm.label("eperm")
        asm.ret(_errno(errno.EPERM))
        asm.label("enosys")
        asm.ret(_errno(errno.ENOSYS))
        asm.label("eafnosupport")
        asm.ret(_errno(errno.EAFNOSUPPORT))
        asm.label("kill")
        asm.ret(SECCOMP_RET_KILL_PROCESS)
        return asm.resolve()

    def install(self, *, only_this_thread: bool = False) -> None:
        """Set NO_NEW_PRIVS and load the filter for the CURRENT THREAD (inherited across fork/exec).

        Irreversible. Refuses in a multi-threaded process unless ``only_this_thread`` is set,
        because the other threads would stay unfiltered.
        """
        if supported_arch() is None:
            raise SeccompUnavailableError("seccomp filtering is not available on this platform")
        if not only_this_thread and thread_count() > 1:
            raise RuntimeError(
                "install() filters only the calling thread and this process has "
                f"{thread_count()} threads; call it in a single-threaded child after fork"
            )
        if self._program is None:
            self._program = self.instructions()
        program = self._program
        filters = (_SockFilter * len(program))(*(_SockFilter(*insn) for insn in program))
        fprog = _SockFprog(len(program), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
        set_no_new_privs()
        # PR_SET_SECCOMP takes the program pointer as its third argument.
        zero = ctypes.c_ulong(0)
        checked(_libc().prctl(
            ctypes.c_int(PR_SET_SECCOMP),
            ctypes.c_ulong(SECCOMP_MODE_FILTER),
            ctypes.byref(fprog),
            zero,
            zero,
        ))
