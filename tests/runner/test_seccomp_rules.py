"""The seccomp rule table as data, and the compiler's agreement with it; nothing is installed.

`decide` below reads the table the way the module documents it (a syscall's rules in order, the
first whose conditions all hold decides, otherwise allow), independently of the compiler; the
classic-BPF interpreter runs the compiled program on synthetic `seccomp_data`. Agreement of the
two on many inputs is what ties the program the kernel loads to the table these tests read.
"""

from __future__ import annotations

import errno
import itertools
import re
import struct
from pathlib import Path

import pytest

from sandbox_kernel_ext.runner.linux import seccomp
from sandbox_kernel_ext.runner.linux.namespaces import (
    CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER,
    CLONE_NEWUTS,
)

# Linux's values, written out so that the tests do not share the module's constants.
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK = 1, 2, 10, 16, 17, 40
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, SOCK_SEQPACKET = 1, 2, 3, 5
SOCK_NONBLOCK, SOCK_CLOEXEC = 0o4000, 0o2000000
IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP, IPPROTO_MPTCP = 6, 17, 132, 262
MSG_DONTWAIT, MSG_NOSIGNAL, MSG_FASTOPEN = 0x40, 0x4000, 0x20000000
TIOCSTI, TIOCLINUX, TIOCGWINSZ, FIONREAD = 0x5412, 0x541C, 0x5413, 0x541B
SIGCHLD = 17
THREAD_FLAGS = 0x3D0F00  # what glibc's pthread_create passes to clone
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000

# The option sets the package uses (SeccompFilter() in tests, the child's two filters in
# runner/child/bootstrap.py) and a few more.
PLAIN = seccomp.build_rules()
CHILD = seccomp.build_rules((), allow_unix_pairs=True)
EGRESS = seccomp.build_rules((AF_INET, AF_INET6), inet_tcp_only=True, allow_unix_pairs=True)
UNIX_AND_INET = seccomp.build_rules((AF_UNIX, AF_INET))
ANY_INET = seccomp.build_rules((AF_INET, AF_INET6), inet_tcp_only=False)
TABLES = {
    "plain": PLAIN, "child": CHILD, "egress": EGRESS, "unix+inet": UNIX_AND_INET,
    "any inet": ANY_INET,
    "unix pairs, unix+inet+netlink": seccomp.build_rules(
        (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK), allow_unix_pairs=True),
}

ALLOWED = "allow"


def deciding_rule(
    rules: tuple[seccomp.Rule, ...], syscall: str, *args: int
) -> seccomp.Rule | None:
    """The first of the syscall's rules whose conditions all hold (None: no rule, so allow)."""
    words = [arg & 0xFFFFFFFF for arg in args] + [0] * (6 - len(args))
    for rule in rules:
        if rule.syscall == syscall and all(_holds(c, words) for c in rule.when):
            return rule
    return None


def decide(rules: tuple[seccomp.Rule, ...], syscall: str, *args: int) -> str | int:
    """The table's answer: "allow", an errno number, or "kill"."""
    rule = deciding_rule(rules, syscall, *args)
    if rule is None or rule.action.kind == "allow":
        return ALLOWED
    return rule.action.errno if rule.action.kind == "errno" else rule.action.kind


def _holds(condition: seccomp.ArgIn | seccomp.ArgHasBits, words: list[int]) -> bool:
    word = words[condition.index]
    if isinstance(condition, seccomp.ArgHasBits):
        return bool(word & condition.bits)
    return ((word & condition.mask) in condition.values) != condition.negate


# -- the table ------------------------------------------------------------------------------------

ALWAYS_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
    "userfaultfd", "mount", "umount2", "unshare", "setns", "pivot_root", "chroot", "open_tree",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "keyctl", "add_key",
    "request_key", "open_by_handle_at", "name_to_handle_at", "inotify_add_watch",
    "fanotify_init", "fanotify_mark",
)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_the_kernel_surface_is_denied_whatever_the_arguments(table: str) -> None:
    rules = TABLES[table]
    for name in ALWAYS_DENIED:
        for args in [(), (0, 0, 0), (CLONE_NEWUSER,), (1, 2, 3, 4, 5, 6)]:
            assert decide(rules, name, *args) == errno.EPERM, (name, args)
    assert [r.when for r in rules if r.syscall in ALWAYS_DENIED] == [()] * len(ALWAYS_DENIED)


def test_namespaces_cannot_be_made_through_clone_and_clone3_gets_enosys() -> None:
    for flag in (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
                 CLONE_NEWPID, CLONE_NEWNET):
        assert decide(PLAIN, "clone", flag | SIGCHLD) == errno.EPERM, hex(flag)
        assert decide(PLAIN, "clone", flag | THREAD_FLAGS) == errno.EPERM, hex(flag)
    assert decide(PLAIN, "clone", SIGCHLD) == ALLOWED  # fork
    assert decide(PLAIN, "clone", THREAD_FLAGS) == ALLOWED  # a thread
    # clone3's flags are in memory BPF cannot read: refused outright, so libc falls back to clone
    assert [r.when for r in PLAIN if r.syscall == "clone3"] == [()]
    assert decide(PLAIN, "clone3", 0, 88) == errno.ENOSYS


def test_the_plain_filter_refuses_every_socket_family() -> None:
    for family in (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK):
        assert decide(PLAIN, "socket", family, SOCK_STREAM, 0) == errno.EAFNOSUPPORT
        assert decide(PLAIN, "socketpair", family, SOCK_STREAM, 0) == errno.EAFNOSUPPORT


def test_the_egress_filter_allows_inet_tcp_sockets_only() -> None:
    for family in (AF_INET, AF_INET6):
        assert decide(EGRESS, "socket", family, SOCK_STREAM, 0) == ALLOWED
        assert decide(EGRESS, "socket", family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                      IPPROTO_TCP) == ALLOWED
        assert decide(EGRESS, "socket", family, SOCK_DGRAM, 0) == errno.EPERM  # UDP
        assert decide(EGRESS, "socket", family, SOCK_DGRAM, IPPROTO_UDP) == errno.EPERM
        assert decide(EGRESS, "socket", family, SOCK_RAW, 1) == errno.EPERM
        for protocol in (IPPROTO_MPTCP, IPPROTO_SCTP, IPPROTO_UDP, 1, 255):  # a stream, not TCP
            assert decide(EGRESS, "socket", family, SOCK_STREAM, protocol) == errno.EPERM
        assert decide(EGRESS, "socket", family, SOCK_SEQPACKET, IPPROTO_SCTP) == errno.EPERM
    for family in (AF_UNIX, AF_NETLINK, AF_PACKET, AF_VSOCK):
        assert decide(EGRESS, "socket", family, SOCK_STREAM, 0) == errno.EAFNOSUPPORT


def test_families_outside_the_inet_check_need_no_tcp() -> None:
    assert decide(UNIX_AND_INET, "socket", AF_UNIX, SOCK_DGRAM, 0) == ALLOWED
    assert decide(UNIX_AND_INET, "socket", AF_INET, SOCK_STREAM, 0) == ALLOWED
    assert decide(UNIX_AND_INET, "socket", AF_INET, SOCK_DGRAM, 0) == errno.EPERM
    assert decide(UNIX_AND_INET, "socket", AF_INET6, SOCK_STREAM, 0) == errno.EAFNOSUPPORT
    # inet_tcp_only=False: the family alone decides
    assert decide(ANY_INET, "socket", AF_INET, SOCK_DGRAM, IPPROTO_UDP) == ALLOWED
    assert decide(ANY_INET, "socket", AF_INET6, SOCK_RAW, 58) == ALLOWED
    assert decide(ANY_INET, "socket", AF_UNIX, SOCK_STREAM, 0) == errno.EAFNOSUPPORT


@pytest.mark.parametrize("table", sorted(TABLES))
def test_fast_open_is_refused_on_every_send(table: str) -> None:
    rules = TABLES[table]
    # sendto(fd, buf, len, flags, addr, addrlen); sendmmsg(fd, vec, vlen, flags);
    # sendmsg(fd, msg, flags)
    assert decide(rules, "sendto", 3, 0, 10, MSG_FASTOPEN, 0, 16) == errno.EPERM
    assert decide(rules, "sendmmsg", 3, 0, 2, MSG_FASTOPEN | MSG_NOSIGNAL) == errno.EPERM
    assert decide(rules, "sendmsg", 3, 0, MSG_FASTOPEN | MSG_DONTWAIT) == errno.EPERM
    assert decide(rules, "sendto", 3, 0, 10, MSG_NOSIGNAL | MSG_DONTWAIT, 0, 16) == ALLOWED
    assert decide(rules, "sendmmsg", 3, 0, 2, MSG_NOSIGNAL) == ALLOWED
    assert decide(rules, "sendmsg", 3, 0, MSG_NOSIGNAL) == ALLOWED
    # the flags argument, and only it, is read: a length with the bit set is just a length
    assert decide(rules, "sendto", 3, 0, MSG_FASTOPEN, 0) == ALLOWED
    assert decide(rules, "sendmsg", 3, 0, 0, MSG_FASTOPEN) == ALLOWED


def test_socketpair_is_allowed_only_for_unix_streams_when_pairs_are() -> None:
    for rules in (CHILD, EGRESS):
        assert decide(rules, "socketpair", AF_UNIX, SOCK_STREAM, 0) == ALLOWED
        assert decide(rules, "socketpair", AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0) == ALLOWED
        assert decide(rules, "socketpair", AF_UNIX, SOCK_DGRAM, 0) == errno.EAFNOSUPPORT
        assert decide(rules, "socketpair", AF_UNIX, SOCK_SEQPACKET, 0) == errno.EAFNOSUPPORT
        assert decide(rules, "socket", AF_UNIX, SOCK_STREAM, 0) == errno.EAFNOSUPPORT
    assert decide(PLAIN, "socketpair", AF_UNIX, SOCK_STREAM, 0) == errno.EAFNOSUPPORT
    # other pairs get what socket() would: the egress filter's TCP check, for instance
    assert decide(EGRESS, "socketpair", AF_INET, SOCK_DGRAM, 0) == errno.EPERM
    # a family the caller allows outright keeps its datagram pairs
    assert decide(UNIX_AND_INET, "socketpair", AF_UNIX, SOCK_DGRAM, 0) == ALLOWED


def test_keystrokes_cannot_be_pushed_into_a_terminal() -> None:
    for rules in TABLES.values():
        assert decide(rules, "ioctl", 0, TIOCSTI, 0) == errno.EPERM
        assert decide(rules, "ioctl", 0, TIOCLINUX, 0) == errno.EPERM
        assert decide(rules, "ioctl", 0, TIOCGWINSZ, 0) == ALLOWED
        assert decide(rules, "ioctl", 0, FIONREAD, 0) == ALLOWED


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_rule_names_a_known_syscall_and_says_why(table: str) -> None:
    for rule in TABLES[table]:
        for arch in ("x86_64", "aarch64"):
            known = seccomp.ARCHES[arch].syscalls
            assert rule.syscall in known or rule.syscall in seccomp.LEGACY_ONLY, (arch, rule)
        assert rule.syscall in seccomp.ARCHES["x86_64"].syscalls, rule
        assert len(rule.why) > 20, rule


def _conflicts(rules: tuple[seccomp.Rule, ...]) -> list[str]:
    """Rules that can never decide: after an unconditional rule for the same syscall, or with
    the same conditions as an earlier one."""
    problems = []
    seen: dict[str, list[seccomp.Rule]] = {}
    for rule in rules:
        earlier = seen.setdefault(rule.syscall, [])
        if any(not e.when for e in earlier) or any(e.when == rule.when for e in earlier):
            problems.append(f"{rule.syscall}: {rule!r}")
        earlier.append(rule)
    return problems


@pytest.mark.parametrize("table", sorted(TABLES))
def test_no_syscall_has_conflicting_rules(table: str) -> None:
    assert _conflicts(TABLES[table]) == []


def test_conflicting_rules_are_found_and_refused_by_the_compiler() -> None:
    clashing = (*PLAIN, seccomp.allow("ptrace", why="a clash for the test to find"))
    assert _conflicts(clashing) == [f"ptrace: {clashing[-1]!r}"]
    with pytest.raises(ValueError, match="unreachable"):
        seccomp.compile_filter(clashing, "x86_64")
    with pytest.raises(ValueError, match="tkill_everyone"):
        seccomp.compile_filter((seccomp.deny("tkill_everyone", why="-"),), "x86_64")
    with pytest.raises(ValueError):
        seccomp.one_of(0, [])  # an empty set would test nothing


@pytest.mark.parametrize(("arch", "header"), [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    ("aarch64", "/usr/include/asm-generic/unistd.h"),
])
def test_syscall_numbers_match_the_kernel_headers(arch: str, header: str) -> None:
    path = Path(header)
    if not path.exists():
        pytest.skip(f"no {header} here")
    found = re.findall(r"^#define __NR_(\w+)\s+(\d+)\s*$", path.read_text(), re.MULTILINE)
    numbers = {name: int(number) for name, number in found}
    table = seccomp.ARCHES[arch].syscalls
    # Newer than Debian 12's headers (Linux 6.1's): the same number on both, from Linux's table
    newer = {"fchmodat2": 452, "setxattrat": 463}  # Linux 6.6, 6.13
    assert {name: numbers.get(name) for name in table if name in numbers or name not in newer} \
        == {name: number for name, number in table.items() if name in numbers or name not in newer}
    assert all(table[name] == number for name, number in newer.items())


# -- the compiled program agrees with the table ---------------------------------------------------

def run_bpf(program: list[tuple[int, int, int, int]], data: bytes) -> int:
    """A classic-BPF interpreter for what a seccomp filter may use here; anything else fails."""
    assert 0 < len(program) <= 4096
    accumulator, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        pc += 1
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            assert k % 4 == 0 and k + 4 <= len(data), k
            (accumulator,) = struct.unpack_from("<I", data, k)
        elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            accumulator &= k
        elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += jt if accumulator == k else jf
        elif code == 0x35:  # BPF_JMP | BPF_JGE | BPF_K
            pc += jt if accumulator >= k else jf
        elif code == 0x45:  # BPF_JMP | BPF_JSET | BPF_K
            pc += jt if accumulator & k else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"opcode {code:#x} at {pc - 1}")
        assert pc < len(program), "ran off the end of the program"


def seccomp_data(nr: int, arch: int, *args: int) -> bytes:
    """struct seccomp_data { int nr; u32 arch; u64 instruction_pointer; u64 args[6]; }"""
    padded = list(args) + [0] * (6 - len(args))
    return struct.pack("<iIQ6Q", nr, arch, 0x7F00DEADBEEF, *padded)


def as_ret(answer: str | int) -> int:
    if answer == ALLOWED:
        return RET_ALLOW
    assert isinstance(answer, int)
    return RET_ERRNO | answer


HIGH_JUNK = 0xDEADBEEF << 32  # the rules read low words only; the kernel ignores these bits


def _arguments(rules: tuple[seccomp.Rule, ...], syscall: str) -> list[tuple[int, ...]]:
    """Inputs for one syscall: every value its conditions name, near misses, and junk."""
    per_index: dict[int, set[int]] = {i: {0} for i in range(4)}
    for rule in rules:
        if rule.syscall != syscall:
            continue
        for condition in rule.when:
            values = per_index[condition.index]
            if isinstance(condition, seccomp.ArgHasBits):
                low_bit = condition.bits & -condition.bits
                values |= {condition.bits, low_bit, low_bit | HIGH_JUNK, ~condition.bits & 0xFF}
            else:
                for value in condition.values:
                    values |= {value, value + 1, value | SOCK_CLOEXEC, value | HIGH_JUNK}
    return list(itertools.product(*(sorted(per_index[i]) for i in range(4))))


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
@pytest.mark.parametrize("table", sorted(TABLES))
def test_the_compiled_program_decides_what_the_table_says(arch: str, table: str) -> None:
    numbers = seccomp.ARCHES[arch].syscalls
    program = seccomp.compile_filter(TABLES[table], arch)
    # the old path calls aarch64 never had are left out there
    rules = tuple(rule for rule in TABLES[table] if rule.syscall in numbers)
    audit = AUDIT_ARCH[arch]
    decided: set[tuple[str, int | None]] = set()  # (syscall, index of the deciding rule)
    for syscall in dict.fromkeys(rule.syscall for rule in rules):
        for args in _arguments(rules, syscall):
            got = run_bpf(program, seccomp_data(numbers[syscall], audit, *args))
            assert got == as_ret(decide(rules, syscall, *args)), (syscall, [hex(a) for a in args])
            rule = deciding_rule(rules, syscall, *args)
            decided.add((syscall, None if rule is None else rules.index(rule)))
    # the inputs reached every rule, and the fall-through of every syscall that has one
    assert {index for _, index in decided} >= set(range(len(rules)))
    last_rules = {rule.syscall: rule for rule in rules}
    can_fall_through = {name for name, rule in last_rules.items() if rule.when}
    assert {name for name, index in decided if index is None} == can_fall_through
    # syscalls no rule names run (getpid, openat: numbers from the kernel headers)
    getpid, openat = {"x86_64": (39, 257), "aarch64": (172, 56)}[arch]
    for nr in (getpid, openat):
        assert run_bpf(program, seccomp_data(nr, audit, TIOCSTI, MSG_FASTOPEN)) == RET_ALLOW
    # another ABI's numbers mean other syscalls: the process is killed
    foreign = AUDIT_ARCH["aarch64" if arch == "x86_64" else "x86_64"]
    assert run_bpf(program, seccomp_data(getpid, foreign)) == RET_KILL_PROCESS
    assert run_bpf(program, seccomp_data(numbers["ptrace"], 0x40000003)) == RET_KILL_PROCESS
    if arch == "x86_64":  # x32 numbers would dodge every rule above
        x32_ptrace = 0x40000000 | numbers["ptrace"]
        assert run_bpf(program, seccomp_data(x32_ptrace, audit)) == RET_ERRNO | errno.EPERM
        assert run_bpf(program, seccomp_data(0x40000000 | getpid, audit)) == RET_ERRNO | errno.EPERM


def test_the_filter_object_loads_what_the_compiler_builds() -> None:
    for arch in ("x86_64", "aarch64"):
        made = seccomp.SeccompFilter((AF_INET, AF_INET6), inet_tcp_only=True,
                                     allow_unix_pairs=True, arch=arch)
        assert made.rules == EGRESS
        assert made.instructions() == seccomp.compile_filter(EGRESS, arch)
        assert seccomp.SeccompFilter(arch=arch).instructions() == seccomp.compile_filter(
            PLAIN, arch)


MODE_ARGUMENT = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1, "open": 2,
                 "openat": 3, "mkdir": 1, "mkdirat": 2, "mknod": 1, "mknodat": 2}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_no_call_sets_a_setuid_or_setgid_mode(table: str) -> None:
    """Every call that takes a mode refuses the two bits and nothing else; openat2, whose
    mode is in memory, answers "not here" so programs fall back to openat."""
    rules = TABLES[table]
    for name, index in MODE_ARGUMENT.items():
        for mode, expected in ((0o4755, errno.EPERM), (0o2755, errno.EPERM), (0o6000, errno.EPERM),
                               (0o755, ALLOWED), (0o1777, ALLOWED), (0o100644, ALLOWED)):
            args = [0] * 6
            args[index] = mode
            assert decide(rules, name, *args) == expected, (name, oct(mode))
    assert decide(rules, "openat2", 0, 0, 0, 0) == errno.ENOSYS


@pytest.mark.parametrize("table", sorted(TABLES))
def test_no_program_its_owner_can_run_but_not_read(table: str) -> None:
    """exec of such a program makes the process non-dumpable, and Linux then stops the perf
    clock that counts the tree's CPU: chmod, creat, umask and ACLs cannot make one."""
    rules = TABLES[table]
    for name, index in MODE_ARGUMENT.items():
        if name.startswith("mkdir"):
            continue  # a folder's x bit is search
        for mode, expected in ((0o111, errno.EPERM), (0o311, errno.EPERM), (0o100, errno.EPERM),
                               (0o511, ALLOWED), (0o755, ALLOWED), (0o600, ALLOWED),
                               (0o000, ALLOWED)):
            args = [0] * 6
            args[index] = mode
            assert decide(rules, name, *args) == expected, (name, oct(mode))
    assert decide(rules, "mkdir", 0, 0o311) == ALLOWED
    assert decide(rules, "umask", 0o477) == errno.EPERM
    assert decide(rules, "umask", 0o077) == ALLOWED
    for name in ("setxattr", "lsetxattr", "fsetxattr", "setxattrat"):
        assert decide(rules, name, 0, 0, 0, 0, 0) == errno.EOPNOTSUPP


@pytest.mark.parametrize("table", sorted(TABLES))
def test_fallocate_keeps_no_blocks_beyond_the_size(table: str) -> None:
    rules = TABLES[table]
    assert decide(rules, "fallocate", 3, 0x1, 0, 1 << 40) == errno.EOPNOTSUPP  # KEEP_SIZE
    assert decide(rules, "fallocate", 3, 0x11, 0, 1 << 40) == errno.EOPNOTSUPP  # ZERO_RANGE too
    assert decide(rules, "fallocate", 3, 0x3, 0, 4096) == ALLOWED  # punching a hole frees
    assert decide(rules, "fallocate", 3, 0x0, 0, 4096) == ALLOWED  # grows the size: RLIMIT_FSIZE
