"""A seccomp filter in classic BPF, built with ``ctypes`` (no libseccomp).

It closes what Landlock leaves open: debugging other processes (ptrace, process_vm_*,
pidfd_getfd), kernel attack surface (io_uring, bpf, perf_event_open, userfaultfd, keyrings,
modules, kexec), namespace and mount games (unshare, setns, clone with CLONE_NEW*, the mount
API), file handles that skip path checks (open_by_handle_at), x32 syscalls that would dodge
the numbers below, and socket families the caller does not need (a pathname unix socket such as
docker.sock is reachable despite Landlock).

Laid out in four parts, only the last of which touches the kernel:
(a) constants and the syscall number tables;
(b) the rules as data: ``build_rules(options)`` returns a tuple of ``Rule`` (syscall, action,
    argument conditions, and why the rule exists);
(c) ``compile_filter(rules, arch)``, a pure compiler from that table to BPF instructions;
(d) ``SeccompFilter.install()``, which loads the compiled program with prctl.

!!! WARNING — ``SeccompFilter.install()`` filters the CALLING THREAD ONLY (and whatever it
later forks or execs). Install it in a single-threaded child; it refuses otherwise. !!!

Importing this module is safe on any OS; ``seccomp_available()`` says whether it can work.
"""

from __future__ import annotations

import ctypes
import itertools
import errno
import platform
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .namespaces import CLONE_NAMESPACE_FLAGS
from .syscalls import checked, libc, prctl, set_no_new_privs, thread_count

__all__ = [
    "Action", "Rule", "SeccompFilter", "SeccompUnavailableError", "build_rules", "compile_filter",
    "seccomp_available", "supported_arch", "Notification", "receive_notification",
    "notification_valid", "place_descriptor", "answer", "action_available", "NOTIFY",
]

# -- (a) constants and syscall numbers ------------------------------------------------------------

# prctl and seccomp constants (include/uapi/linux/{prctl,seccomp,audit}.h).
PR_GET_SECCOMP = 21
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_GET_ACTION_AVAIL = 2
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_SET_MODE_FILTER = 1  # seccomp(2)'s operation (prctl's mode is SECCOMP_MODE_FILTER)
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# Classic BPF opcodes (include/uapi/linux/filter.h).
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
BPF_ALU_AND_K = 0x04 | 0x50 | 0x00
BPF_JMP_JEQ_K = 0x05 | 0x10 | 0x00
BPF_JMP_JGE_K = 0x05 | 0x30 | 0x00
BPF_JMP_JSET_K = 0x05 | 0x40 | 0x00
BPF_RET_K = 0x06 | 0x00

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6] (little-endian: low word first).
OFFSET_NR = 0
OFFSET_ARCH = 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


# Argument values the rules test, as Linux defines them (whatever OS builds the program).
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
SOCK_STREAM = 1
SOCK_TYPE_MASK = 0xF  # the rest of socket()'s type holds SOCK_NONBLOCK / SOCK_CLOEXEC
IPPROTO_TCP = 6
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
# btrfs subvolumes and snapshots: _IOW(0x94, n, 4096-byte args), n = 1, 14, 23, 24
BTRFS_NEW_SUBVOLUME = (0x50009401, 0x5000940E, 0x50009417, 0x50009418)
MSG_FASTOPEN = 0x20000000
S_ISUID = 0o4000
S_ISGID = 0o2000
S_IRUSR, S_IXUSR = 0o400, 0o100
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x1, 0x2


@dataclass(frozen=True)
class _Arch:
    name: str
    audit_arch: int
    has_x32: bool
    syscalls: dict[str, int]


# Numbers checked against the kernel headers (asm/unistd_64.h, asm-generic/unistd.h).
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
        "connect": 42, "listen": 50,
        "seccomp": 317, "ioctl": 16, "sendto": 44, "sendmsg": 46, "sendmmsg": 307,
        "inotify_add_watch": 254, "fanotify_init": 300, "fanotify_mark": 301,
        "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "shmat": 30, "msgget": 68,
        "semget": 64, "vmsplice": 278, "chmod": 90, "fchmod": 91, "fchmodat": 268,
        "fchmodat2": 452, "creat": 85, "open": 2, "openat": 257, "openat2": 437, "mkdir": 83,
        "mkdirat": 258, "mknod": 133, "mknodat": 259, "umask": 95, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "setxattrat": 463, "fallocate": 285,
        "prlimit64": 302, "setpriority": 141, "sched_setparam": 142,
        "sched_setscheduler": 144, "sched_setaffinity": 203, "ioprio_set": 251,
        "sched_setattr": 314, "prctl": 157,
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
        "connect": 203, "listen": 201,
        "seccomp": 277, "ioctl": 29, "sendto": 206, "sendmsg": 211, "sendmmsg": 269,
        "inotify_add_watch": 27, "fanotify_init": 262, "fanotify_mark": 263,
        "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "shmat": 196, "msgget": 186,
        "semget": 190, "vmsplice": 75, "fchmod": 52, "fchmodat": 53, "fchmodat2": 452,
        "openat": 56, "openat2": 437, "mkdirat": 34, "mknodat": 33, "umask": 166,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "setxattrat": 463, "fallocate": 47,
        "prlimit64": 261, "setpriority": 140, "sched_setparam": 118,
        "sched_setscheduler": 119, "sched_setaffinity": 122, "ioprio_set": 30,
        "sched_setattr": 274, "prctl": 167,
    }),
}
# The old path calls that aarch64 never had (its libc uses the *at forms): a rule naming one
# is left out there.
LEGACY_ONLY = frozenset({"chmod", "creat", "open", "mkdir", "mknod"})
_MACHINE_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}

# -- (b) the rules as data ------------------------------------------------------------------------

_WORD = 0xFFFFFFFF


@dataclass(frozen=True)
class Action:
    """What the filter answers: run the call, fail it with ``errno``, kill the process, or
    stop the call and ask the filter's listener (``notify``), which answers in its place."""

    kind: Literal["allow", "errno", "kill", "notify"]
    errno: int = 0

    @property
    def ret(self) -> int:
        """The SECCOMP_RET_* word the BPF program returns."""
        if self.kind == "errno":
            return SECCOMP_RET_ERRNO | (self.errno & 0xFFFF)
        return {"allow": SECCOMP_RET_ALLOW, "kill": SECCOMP_RET_KILL_PROCESS,
                "notify": SECCOMP_RET_USER_NOTIF}[self.kind]


ALLOW = Action("allow")
KILL = Action("kill")
NOTIFY = Action("notify")


def fail_with(code: int) -> Action:
    return Action("errno", code)


# Every condition looks at the LOW 32 BITS of one argument: the kernel reads each argument the
# rules test as a 32-bit int (socket's domain/type/protocol, ioctl's request, the send flags),
# except clone's flags, an unsigned long whose CLONE_NEW* bits all sit in the low word.
@dataclass(frozen=True)
class ArgIn:
    """Argument ``index`` (after ``& mask``) is one of ``values``; with ``negate``, none of them."""

    index: int
    values: tuple[int, ...]
    mask: int = _WORD
    negate: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.index < 6 or not self.values:
            raise ValueError(f"bad argument condition {self!r}")
        if not all(0 <= v <= _WORD for v in (*self.values, self.mask)):
            raise ValueError(f"{self!r}: BPF compares 32-bit words only")


@dataclass(frozen=True)
class ArgHasBits:
    """Argument ``index`` has at least one of ``bits`` set."""

    index: int
    bits: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < 6 or not 0 < self.bits <= _WORD:
            raise ValueError(f"bad argument condition {self!r}")


Condition = ArgIn | ArgHasBits


def one_of(index: int, values: Iterable[int], *, mask: int = _WORD) -> ArgIn:
    return ArgIn(index, tuple(values), mask)


def none_of(index: int, values: Iterable[int], *, mask: int = _WORD) -> ArgIn:
    return ArgIn(index, tuple(values), mask, negate=True)


@dataclass(frozen=True)
class Rule:
    """``action`` for ``syscall`` when every condition in ``when`` holds (always, if empty).

    A syscall's rules are tried in table order and the first that matches decides; a syscall
    that no rule matches is allowed.
    """

    syscall: str
    action: Action
    when: tuple[Condition, ...] = ()
    why: str = ""


def deny(syscall: str, *when: Condition, code: int = errno.EPERM, why: str) -> Rule:
    """Fail ``syscall`` with ``code`` (always, or when every condition holds)."""
    return Rule(syscall, fail_with(code), when, why)


def allow(syscall: str, *when: Condition, why: str) -> Rule:
    """Let ``syscall`` run when every condition holds, before the rules after it are tried."""
    return Rule(syscall, ALLOW, when, why)


_DENIED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("debugs another process or reads, writes or steals from its memory and descriptors", (
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise")),
    ("kernel attack surface; io_uring also opens, sends and connects without the syscalls "
     "these rules inspect", (
        "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
        "userfaultfd")),
    ("namespace and mount games: they rearrange the filesystem the other layers describe", (
        "mount", "umount2", "unshare", "setns", "pivot_root", "chroot", "open_tree",
        "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr")),
    ("loads code into the kernel", (
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module")),
    ("keyrings: kernel attack surface, and keys shared with the user's other processes", (
        "keyctl", "add_key", "request_key")),
    ("file handles open files by number, skipping the path checks Landlock makes", (
        "open_by_handle_at", "name_to_handle_at")),
    ("Landlock does not check watches: they would report names and activity in folders the "
     "child may not list", ("inotify_add_watch", "fanotify_init", "fanotify_mark")),
)

# Memory that lives in no process's resident set, so neither the monitor nor RLIMIT_AS sees it:
# a cell could hold gigabytes under a small limit. ENOSYS reads as "not on this system", and
# programs that can do without (most use a temporary file or POSIX shared memory, which lives
# in the child's private, size-capped /dev/shm) fall back.
_MEMORY_OUTSIDE_THE_BUDGET = (
    ("memfd_create", "an anonymous tmpfs file: its pages count against no budget"),
    ("memfd_secret", "secret memory, outside the resident set as well"),
    ("shmget", "System V shared memory outlives every mapping of it"),
    ("shmat", "attaching System V shared memory (the host's too, without an IPC namespace)"),
    ("msgget", "a System V message queue holds kernel memory until it is removed"),
    ("semget", "System V semaphore sets: gigabytes of kernel memory in one namespace "
               "(multiprocessing's semaphores are POSIX ones, in the private /dev/shm)"),
    ("vmsplice", "a page spliced into a pipe keeps its whole page (a 2 MB huge page too) "
                 "alive after munmap, in no resident set; programs fall back to write"),
)

# Where each call that sets a file's mode takes it. A set-user-ID or set-group-ID bit is the
# one mode a child must never set: a program it leaves in a writable root with that bit runs
# with the child's uid for whoever starts it on the host, and a root kernel's child is root.
_MODE_ARGUMENT = (
    ("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2), ("creat", 1), ("open", 2),
    ("openat", 3), ("mkdir", 1), ("mkdirat", 2), ("mknod", 1), ("mknodat", 2),
)


# Calls that give a file its mode (not mkdir's: a folder's x bit is search, not exec).
_FILE_MODE_ARGUMENT = tuple(entry for entry in _MODE_ARGUMENT if not entry[0].startswith("mkdir"))
_NOT_DUMPABLE = ("a program its owner may run but not read makes whoever execs it non-dumpable, "
                 "and Linux then stops the perf clock that counts the tree's CPU")


PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
PR_SET_CHILD_SUBREAPER = 36
_OTHER_PROCESS = ("the scheduling of another process (pid 0 is the caller): without a PID "
                  "namespace the kernel's threads are in reach, and a nice of 19, one CPU or "
                  "an idle class would slow every later cell's watch; a program setting its "
                  "own threads' affinity by thread id gets EPERM")


def _socket_rules(
    syscall: str, families: frozenset[int], inet_tcp_only: bool
) -> tuple[Rule, ...]:
    """What ``socket`` (and ``socketpair``, which takes the same domain, type, protocol) may make.

    Families outside ``families`` get EAFNOSUPPORT, which programs treat as "not here". With
    ``inet_tcp_only``, AF_INET/AF_INET6 must be plain TCP: Landlock's network rules cover TCP
    only, so UDP, raw, SCTP and MPTCP sockets (EPERM) would escape them.
    """
    checked_inet = families & {AF_INET, AF_INET6} if inet_tcp_only else frozenset()
    unchecked = families - checked_inet
    unknown_family = "a family not allowed (a pathname unix socket slips past Landlock)"
    if not families:
        return (deny(syscall, code=errno.EAFNOSUPPORT, why=unknown_family),)
    if not checked_inet:
        return (deny(syscall, none_of(0, sorted(families)), code=errno.EAFNOSUPPORT,
                     why=unknown_family),)
    rules = []
    if unchecked:
        rules.append(allow(syscall, one_of(0, sorted(unchecked)),
                           why="an allowed family that needs no further check"))
    return (*rules,
            deny(syscall, none_of(0, sorted(checked_inet)), code=errno.EAFNOSUPPORT,
                 why=unknown_family),
            deny(syscall, none_of(1, [SOCK_STREAM], mask=SOCK_TYPE_MASK),
                 why="an inet socket other than a stream escapes Landlock's TCP rules"),
            deny(syscall, none_of(2, [0, IPPROTO_TCP]),
                 why="a stream protocol other than TCP (SCTP, MPTCP) escapes Landlock's TCP rules"))


def build_rules(
    allow_socket_families: Iterable[int] = (),
    *,
    inet_tcp_only: bool = True,
    allow_unix_pairs: bool = False,
    notify_connect: bool = False,
) -> tuple[Rule, ...]:
    """The filter's rules for these options (see ``SeccompFilter``), in dispatch order."""
    families = frozenset(int(family) for family in allow_socket_families)
    socket_rules = _socket_rules("socket", families, inet_tcp_only)
    pair_rules = _socket_rules("socketpair", families, inet_tcp_only)
    if allow_unix_pairs:
        pair_rules = (allow(
            "socketpair", one_of(0, [AF_UNIX]), one_of(1, [SOCK_STREAM], mask=SOCK_TYPE_MASK),
            why="a connected unix stream pair reaches no socket outside the process tree "
                "(multiprocessing needs it); a datagram pair could still sendto /dev/log"),
            *pair_rules)
    fastopen = ("a TCP connect made by the first send skips the connect() hook where Landlock "
                "checks the port (seen on Linux 6.18); programs then connect() as usual")
    return (
        *(deny(name, why=why) for why, names in _DENIED for name in names),
        *(deny(name, code=errno.ENOSYS, why=why) for name, why in _MEMORY_OUTSIDE_THE_BUDGET),
        *(deny(name, ArgHasBits(index, S_ISUID | S_ISGID),
               why="a set-user-ID or set-group-ID program left on the host runs as the child's "
                   "uid (root, under a root kernel) for whoever starts it")
          for name, index in _MODE_ARGUMENT),
        *(deny(name, ArgIn(index, (S_IXUSR,), mask=S_IRUSR | S_IXUSR), why=_NOT_DUMPABLE)
          for name, index in _FILE_MODE_ARGUMENT),
        deny("umask", ArgHasBits(0, S_IRUSR), why=_NOT_DUMPABLE + " (a umask can take the read "
                                                             "bit from every file made after)"),
        *(deny(name, code=errno.EOPNOTSUPP,
               why="an ACL can take its owner's read bit from a program, as chmod could; "
                   "extended attributes read as not supported, which copying tools expect")
          for name in ("setxattr", "lsetxattr", "fsetxattr", "setxattrat")),
        deny("fallocate", ArgIn(1, (FALLOC_FL_KEEP_SIZE,),
                                mask=FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE),
             code=errno.EOPNOTSUPP,
             why="blocks kept beyond a file's size escape RLIMIT_FSIZE: one call could fill the "
                 "disk; callers fall back to writing"),
        deny("prlimit64", none_of(0, [0]),
             why="another process's limits (pid 0 is the caller): without a PID namespace the "
                 "kernel's process is in reach, and lowering its RLIMIT_NOFILE or raising its "
                 "RLIMIT_CORE with a low RLIMIT_CPU would break it or dump its memory to disk; "
                 "getrlimit and setrlimit pass pid 0"),
        *(deny(name, none_of(0, [0]), why=_OTHER_PROCESS)
          for name in ("sched_setparam", "sched_setscheduler", "sched_setaffinity",
                       "sched_setattr")),
        # setpriority and ioprio_set take (which, who): only "this process" (PRIO_PROCESS /
        # IOPRIO_WHO_PROCESS, who 0); a group or a user (the kernel's uid) is other processes.
        deny("setpriority", none_of(0, [PRIO_PROCESS]), why=_OTHER_PROCESS),
        deny("setpriority", none_of(1, [0]), why=_OTHER_PROCESS),
        deny("ioprio_set", none_of(0, [IOPRIO_WHO_PROCESS]), why=_OTHER_PROCESS),
        deny("ioprio_set", none_of(1, [0]), why=_OTHER_PROCESS),
        deny("prctl", one_of(0, [PR_SET_CHILD_SUBREAPER]),
             why="the run's first process adopts what the run double-forks, so it stays in the "
                 "tree the budgets measure; turned off (or taken by a descendant), an orphan "
                 "would go to the launcher, outside every budget"),
        deny("openat2", code=errno.ENOSYS,
             why="openat2 passes its mode in memory, where BPF cannot look; on ENOSYS programs "
                 "fall back to openat, whose mode the rule above inspects"),
        deny("clone3", code=errno.ENOSYS,
             why="clone3 passes its flags in memory, where BPF cannot look; on ENOSYS libc "
                 "falls back to clone, whose flags the next rule inspects"),
        deny("clone", ArgHasBits(0, CLONE_NAMESPACE_FLAGS),
             why="a new namespace, like unshare (flags is argument 0 on x86_64 and aarch64)"),
        *socket_rules,
        *pair_rules,
        deny("ioctl", one_of(1, BTRFS_NEW_SUBVOLUME),
             why="a btrfs subvolume or snapshot made in a writable folder is another "
                 "filesystem (its own device number): the disk quota's walk does not enter it, "
                 "so what is written there would count against no quota"),
        deny("ioctl", one_of(1, [TIOCSTI, TIOCLINUX]),
             why="pushing keystrokes into a terminal inherited from the parent runs commands in "
                 "the user's shell; Landlock's ioctl right does not cover descriptors opened "
                 "before it"),
        deny("sendto", ArgHasBits(3, MSG_FASTOPEN), why=fastopen),
        deny("sendmmsg", ArgHasBits(3, MSG_FASTOPEN), why=fastopen),
        deny("sendmsg", ArgHasBits(2, MSG_FASTOPEN), why=fastopen),
        deny("seccomp", ArgHasBits(1, SECCOMP_FILTER_FLAG_NEW_LISTENER),
             why="a filter whose listener the child holds answers its own calls: with the "
                 "trusted side's listener gone it would let its connects run"),
        *((Rule("connect", NOTIFY, (), why=(
            "without a network namespace every connect is the trusted side's to answer: it "
            "never runs the child's call (its address could change after a check), it either "
            "puts its own connection to the proxy at the child's descriptor or refuses")),
           deny("listen", why="without a network namespace a listening socket (bound by "
                              "listen itself, past Landlock's bind rule) would take "
                              "connections from the pod's network"))
          if notify_connect else ()),
    )


# -- (c) the compiler: rules -> classic BPF -------------------------------------------------------

# Checked before any rule. Foreign ABIs number syscalls differently, so they are never let by;
# x32 calls (x86_64 numbers with bit 30 set) would dodge every number in the table.
ON_FOREIGN_ARCH = KILL
ON_X32 = fail_with(errno.EPERM)

# An instruction before label resolution: (code, k, jump-if-true, jump-if-false); jumps are label
# names or None for "the next instruction".
_Insn = tuple[int, int, "str | None", "str | None"]
# A rule with its syscall left out: a syscall's rules as a tuple of these say what its code does.
_Step = tuple[Action, tuple[Condition, ...]]


class _Assembler:
    """Just enough of an assembler to write the filter with named, forward-only jump targets."""

    def __init__(self) -> None:
        self.code: list[_Insn] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        assert name not in self.labels, name
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

            program.append((code, offset(if_true), offset(if_false), k))
        return program


def _chains(rules: Sequence[Rule], arch: _Arch) -> dict[str, tuple[_Step, ...]]:
    """Each syscall's rules in table order, checked: a known name, no rule after an unconditional
    one (it could never match)."""
    chains: dict[str, tuple[_Step, ...]] = {}
    for rule in rules:
        if rule.syscall not in arch.syscalls:
            if rule.syscall in LEGACY_ONLY:
                continue
            raise ValueError(f"no {arch.name} syscall number for {rule.syscall!r}")
        earlier = chains.get(rule.syscall, ())
        if earlier and not earlier[-1][1]:
            raise ValueError(f"unreachable rule after an unconditional one: {rule!r}")
        chains[rule.syscall] = (*earlier, (rule.action, rule.when))
    return chains


def compile_filter(rules: Sequence[Rule], arch: str) -> list[tuple[int, int, int, int]]:
    """The BPF program for ``rules`` on ``arch``, as (code, jt, jf, k) tuples.

    Layout: the arch (and x32) checks, one ``jeq nr`` per syscall in table order (an
    unconditional rule jumps straight to its return), ``ret ALLOW``, then each syscall's
    conditional rules, then one ``ret`` per action used. Syscalls with the same rules share
    their code, and so does a syscall whose rules are the tail of another's.
    """
    if arch not in ARCHES:
        raise ValueError(f"no syscall table for {arch!r}")
    table = ARCHES[arch]
    chains = _chains(rules, table)
    asm = _Assembler()
    returns: set[Action] = set()
    entries: dict[tuple[_Step, ...], str] = {}  # where the code for a tail of rules starts
    fresh = itertools.count()

    def ret_label(action: Action) -> str:
        returns.add(action)
        return f"ret {action.kind} {action.errno}"

    def entry(steps: tuple[_Step, ...]) -> str:
        """Where checking ``steps`` starts: a return, when the first step is unconditional."""
        if not steps:
            return ret_label(ALLOW)
        if not steps[0][1]:
            return ret_label(steps[0][0])
        return entries.setdefault(steps, f"rules {len(entries)}")

    asm.load(OFFSET_ARCH)
    asm.jeq(table.audit_arch, None, ret_label(ON_FOREIGN_ARCH))
    asm.load(OFFSET_NR)
    if table.has_x32:
        asm.jge(X32_SYSCALL_BIT, ret_label(ON_X32))
    for name, steps in chains.items():
        asm.jeq(table.syscalls[name], entry(steps))
    asm.ret(ALLOW.ret)

    def emit_condition(condition: Condition, success: str | None, failure: str) -> None:
        """Test the loaded word; ``success`` None means "go on with the next instruction"."""
        if isinstance(condition, ArgHasBits):
            asm.jset(condition.bits, success, failure)
            return
        *rest, last = condition.values
        if condition.negate:
            for value in rest:
                asm.jeq(value, failure)
            asm.jeq(last, failure, success)
            return
        after = success if success is not None else f"after {next(fresh)}"
        for value in rest:
            asm.jeq(value, after)
        asm.jeq(last, success, failure)
        if success is None:
            asm.label(after)

    def emit_rule(step: _Step, failure: str) -> None:
        action, conditions = step
        loaded: tuple[int, int] | None = None
        for position, condition in enumerate(conditions):
            mask = condition.mask if isinstance(condition, ArgIn) else _WORD
            if loaded != (condition.index, mask):
                asm.load(_arg_low(condition.index))
                if mask != _WORD:
                    asm.and_(mask)
                loaded = (condition.index, mask)
            last = position == len(conditions) - 1
            emit_condition(condition, ret_label(action) if last else None, failure)

    placed: set[tuple[_Step, ...]] = set()
    all_steps = list(chains.values())
    for steps in all_steps:
        if steps in placed or not steps[0][1]:
            continue
        if any(len(other) > len(steps) and other[-len(steps):] == steps for other in all_steps):
            continue  # emitted as the tail of that longer list, where a jump can reach it
        # One label per conditional rule; a tail already placed elsewhere is emitted again
        # (BPF jumps only forward), under a label of its own.
        labels: list[str] = []
        for start in range(len(steps)):
            tail = steps[start:]
            if not tail[0][1]:
                break
            if tail in placed:
                labels.append(f"copy {next(fresh)}")
            else:
                placed.add(tail)
                labels.append(entry(tail))
        for position, label in enumerate(labels):
            asm.label(label)
            following = labels[position + 1] if position + 1 < len(labels) else None
            emit_rule(steps[position], following or entry(steps[position + 1:]))

    order = {"allow": 0, "errno": 1, "kill": 2, "notify": 3}
    for action in sorted(returns, key=lambda a: (order[a.kind], a.errno)):
        asm.label(ret_label(action))
        asm.ret(action.ret)
    return asm.resolve()


# -- (d) the host, and install --------------------------------------------------------------------

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


def action_available(action: Action) -> bool:
    """Whether this kernel knows `action`'s return (user notification came with Linux 5.0)."""
    arch_name = supported_arch()
    if arch_name is None:
        return False
    word = ctypes.c_uint32(action.ret & 0xFFFF0000)
    result = _libc().syscall(ctypes.c_long(ARCHES[arch_name].syscalls["seccomp"]),
                             ctypes.c_uint(SECCOMP_GET_ACTION_AVAIL), ctypes.c_uint(0),
                             ctypes.byref(word))
    return result == 0


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
    ``notify_connect``: every ``connect`` waits for the filter's listener, which ``install()``
    returns (seccomp user notification): for egress where there is no network namespace.
    ``arch``: the architecture to build for (default: this machine); a mismatch with the running
    kernel's kills the process at its first syscall, which is what the check is for.

    The program is compiled here, once, so a forked child only loads it.
    """

    def __init__(
        self,
        allow_socket_families: Iterable[int] = (),
        *,
        inet_tcp_only: bool = True,
        allow_unix_pairs: bool = False,
        notify_connect: bool = False,
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
        self.notify_connect = notify_connect
        self.rules = build_rules(self.allow_socket_families, inet_tcp_only=inet_tcp_only,
                                 allow_unix_pairs=allow_unix_pairs, notify_connect=notify_connect)
        self._program = compile_filter(self.rules, arch_name)
        # The program as the kernel reads it, made once: a fork that installs it only loads it.
        self._filters = (_SockFilter * len(self._program))(
            *(_SockFilter(*insn) for insn in self._program))

    def instructions(self) -> list[tuple[int, int, int, int]]:
        """The program as (code, jt, jf, k) tuples, for inspection and tests."""
        return list(self._program)

    def install(self, *, only_this_thread: bool = False) -> int | None:
        """Set NO_NEW_PRIVS and load the filter for the CURRENT THREAD (inherited across fork/exec).

        Irreversible. Refuses in a multi-threaded process unless ``only_this_thread`` is set,
        because the other threads would stay unfiltered. With ``notify_connect``, returns the
        filter's listener: whoever holds it answers the process's connects, so it must leave
        the process at once (a confined process holding it would answer its own).
        """
        if supported_arch() is None:
            raise SeccompUnavailableError("seccomp filtering is not available on this platform")
        if not only_this_thread and thread_count() > 1:
            raise RuntimeError(
                "install() filters only the calling thread and this process has "
                f"{thread_count()} threads; call it in a single-threaded child after fork"
            )
        fprog = _SockFprog(len(self._program),
                           ctypes.cast(self._filters, ctypes.POINTER(_SockFilter)))
        set_no_new_privs()
        if self.notify_connect:
            return checked(_libc().syscall(
                ctypes.c_long(self.arch.syscalls["seccomp"]),
                ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                ctypes.c_uint(SECCOMP_FILTER_FLAG_NEW_LISTENER),
                ctypes.byref(fprog)))
        # PR_SET_SECCOMP takes the program pointer as its third argument.
        zero = ctypes.c_ulong(0)
        checked(_libc().prctl(
            ctypes.c_int(PR_SET_SECCOMP),
            ctypes.c_ulong(SECCOMP_MODE_FILTER),
            ctypes.byref(fprog),
            zero,
            zero,
        ))
        return None


# -- (e) the listener's side: seccomp user notification (include/uapi/linux/seccomp.h) -------------

SECCOMP_IOCTL_NOTIF_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif), 80 bytes
SECCOMP_IOCTL_NOTIF_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp), 24 bytes
SECCOMP_IOCTL_NOTIF_ID_VALID = 0x40082102  # _IOW('!', 2, __u64)
SECCOMP_IOCTL_NOTIF_ADDFD = 0x40182103  # _IOW('!', 3, struct seccomp_notif_addfd), 24 bytes
SECCOMP_ADDFD_FLAG_SETFD = 1


class Notification(ctypes.Structure):
    """struct seccomp_notif: a stopped call (its pid as the listener's namespace sees it)."""

    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("nr", ctypes.c_int32), ("arch", ctypes.c_uint32),
                ("instruction_pointer", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6)]


class _Response(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]


class _AddFd(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("srcfd", ctypes.c_uint32),
                ("newfd", ctypes.c_uint32), ("newfd_flags", ctypes.c_uint32)]


def _ioctl(fd: int, request: int, argument: object) -> int:
    return checked(_libc().ioctl(ctypes.c_int(fd), ctypes.c_ulong(request), argument))


def receive_notification(listener: int) -> Notification:
    """The next stopped call (blocks; poll the listener first). ENOENT: its process is gone."""
    notification = Notification()
    _ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, ctypes.byref(notification))
    return notification


def notification_valid(listener: int, notification_id: int) -> bool:
    """Whether the call still waits (its process has not died, its pid not been reused)."""
    try:
        _ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, ctypes.byref(ctypes.c_uint64(notification_id)))
    except OSError:
        return False
    return True


def place_descriptor(listener: int, notification_id: int, source: int, target: int,
                     cloexec: bool) -> None:
    """Put a copy of our descriptor `source` at number `target` in the stopped process (in
    place of what was there, as dup2 does). Linux 5.9 and later."""
    addfd = _AddFd(notification_id, SECCOMP_ADDFD_FLAG_SETFD, source, target,
                   0o2000000 if cloexec else 0)
    _ioctl(listener, SECCOMP_IOCTL_NOTIF_ADDFD, ctypes.byref(addfd))


def answer(listener: int, notification_id: int, *, error: int = 0, value: int = 0) -> None:
    """Finish the stopped call: it returns `value`, or fails with `error` (an errno)."""
    _ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND,
           ctypes.byref(_Response(notification_id, value, -error if error else 0, 0)))
