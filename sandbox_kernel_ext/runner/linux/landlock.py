"""Landlock filesystem, TCP-port and scoping rules through ``ctypes`` (no native dependency).

Landlock only *allows*: once a ruleset handles a right, every path or port not named by a
rule loses it. We handle every filesystem right the running Linux kernel knows, so anything not
listed is neither readable nor writable, by any syscall, in this process and in everything it
later ``exec``s.

!!! WARNING — ``LandlockRuleset.restrict_self()`` confines the CALLING THREAD ONLY. !!!
Threads that already exist stay unconfined and can undo nothing but can still read and write
everything. Call it in a single-threaded process (a child right after ``fork``, or a launcher
started by ``exec``) before any thread starts; it refuses when ``/proc/self/status`` shows more
than one thread unless you pass ``only_this_thread=True``. Never call it from ``preexec_fn`` of
a multi-threaded parent such as a Jupyter kernel.

Landlock does not stop ``chmod``/``chown``/``utime`` of readable files or ``connect()`` to a
pathname unix socket, and does not touch descriptors opened before the restriction: run the
child as an unprivileged uid, deny ``AF_UNIX`` with seccomp, and close inherited descriptors.

Importing this module is safe on any OS; on hosts without Landlock ``landlock_abi()`` is 0 and
building a ruleset raises ``LandlockUnavailableError``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
import sys

from .syscalls import checked, libc, set_no_new_privs, thread_count

__all__ = [
    "LandlockRuleset",
    "LandlockUnavailableError",
    "landlock_abi",
]

# Syscall numbers: Landlock came after the unified syscall table, so they are the same on
# x86_64 and aarch64 (and every other 64-bit architecture Linux supports).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446

LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RULE_NET_PORT = 2

# Filesystem rights (include/uapi/linux/landlock.h).
ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5

ACCESS_NET_BIND_TCP = 1 << 0  # ABI 4
ACCESS_NET_CONNECT_TCP = 1 << 1  # ABI 4

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

# All filesystem rights each ABI knows; handling them all is what makes "not listed" mean denied.
_FS_ABI1 = (1 << 13) - 1
FS_RIGHTS_BY_ABI: dict[int, int] = {
    1: _FS_ABI1,
    2: _FS_ABI1 | ACCESS_FS_REFER,
    3: _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    4: _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    5: _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV,
}
NET_ABI = 4
SCOPE_ABI = 6

# Rights that make sense on a regular file; Linux rejects directory-only rights
# (READ_DIR, REMOVE_*, MAKE_*, REFER) in a rule whose path is not a directory.
FS_FILE_RIGHTS = (
    ACCESS_FS_EXECUTE
    | ACCESS_FS_WRITE_FILE
    | ACCESS_FS_READ_FILE
    | ACCESS_FS_TRUNCATE
    | ACCESS_FS_IOCTL_DEV
)
# Read rules: read files, list directories, run programs (exec of an interpreter needs EXECUTE).
FS_READ_RIGHTS = ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR | ACCESS_FS_EXECUTE
# Write rules: read rights plus everything that changes content or the tree. REFER lets renames
# and links move entries *between* writable directories (both ends need it, so nothing can be
# renamed out of or linked into a writable root from elsewhere). MAKE_CHAR/MAKE_BLOCK are left out:
# a sandbox never needs to create device nodes. IOCTL_DEV is a write right: ioctl on a device
# the policy lets you write to (a tty) is expected, on a read-only one it is not.
FS_WRITE_RIGHTS = FS_READ_RIGHTS | (
    ACCESS_FS_WRITE_FILE
    | ACCESS_FS_REMOVE_DIR
    | ACCESS_FS_REMOVE_FILE
    | ACCESS_FS_MAKE_DIR
    | ACCESS_FS_MAKE_REG
    | ACCESS_FS_MAKE_SOCK
    | ACCESS_FS_MAKE_FIFO
    | ACCESS_FS_MAKE_SYM
    | ACCESS_FS_REFER
    | ACCESS_FS_TRUNCATE
    | ACCESS_FS_IOCTL_DEV
)
# Writing what is there, in place: a folder's files (and those below it) change, nothing is
# made, removed, renamed or linked in it. A folder Python imports from first gets these, its
# subfolders the full write rights (`child/bootstrap.py` `rules_for`).
FS_IN_PLACE_RIGHTS = FS_READ_RIGHTS | ACCESS_FS_WRITE_FILE | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV


class LandlockUnavailableError(RuntimeError):
    """The running Linux kernel (or OS) has no usable Landlock: confinement cannot be applied."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the Linux struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _syscall(number: int, *args: ctypes._SimpleCData | ctypes.c_void_p) -> int:
    """Call a raw syscall with explicitly typed arguments; raise OSError on -1."""
    lib = libc()
    if lib is None:
        raise OSError(errno.ENOSYS, "no libc syscall() on this platform")
    return checked(lib.syscall(ctypes.c_long(number), *args))


def landlock_abi() -> int:
    """The Landlock ABI version of the running Linux kernel, 0 when there is no usable Landlock."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return 0
    try:
        return _syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            ctypes.c_void_p(None),
            ctypes.c_size_t(0),
            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
        )
    except OSError:  # ENOSYS (not built), EOPNOTSUPP (built but disabled at boot)
        return 0


class LandlockRuleset:
    """Builder for a Landlock domain: collect rules, then ``restrict_self()`` in the child.

    Rules are plain data until ``build()`` (so a builder is cheap to make and to fork);
    ``build()`` opens each path with ``O_PATH|O_CLOEXEC``, adds the rule and closes it again.
    A path that does not exist is skipped and reported, not fatal: a policy may name optional
    roots. ``abi`` pins a lower ABI than Linux's (never a higher one: rights Linux
    does not know cannot be enforced, and ``unenforced()`` names them).
    """

    def __init__(self, abi: int | None = None) -> None:
        kernel_abi = landlock_abi()
        self.kernel_abi = kernel_abi
        self.abi = kernel_abi if abi is None else max(0, min(abi, kernel_abi))
        self._read_paths: list[str] = []
        self._write_paths: list[str] = []
        self._in_place_paths: list[str] = []
        self._list_paths: list[str] = []
        self._tcp_connect_ports: list[int] = []
        self._tcp_bind_ports: list[int] = []
        self._scoped = 0
        self._requested_scopes: set[str] = set()
        self._ruleset_fd: int | None = None
        self.skipped: list[str] = []

    # -- what is handled (and therefore denied unless allowed) --------------------------------
    @property
    def handled_access_fs(self) -> int:
        return FS_RIGHTS_BY_ABI[min(self.abi, 5)] if self.abi >= 1 else 0

    @property
    def handled_access_net(self) -> int:
        """Both TCP rights are always handled from ABI 4: no port is reachable unless allowed."""
        return ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP if self.abi >= NET_ABI else 0

    @property
    def scoped(self) -> int:
        return self._scoped if self.abi >= SCOPE_ABI else 0

    def unenforced(self) -> list[str]:
        """Protections this builder cannot give on this Linux kernel, for warnings and strict mode."""
        missing: list[str] = []
        if self.abi < 1:
            return ["landlock"]
        if self.abi < 3:
            missing.append("truncate")  # truncate() of any file stays possible before ABI 3
        if self.abi < NET_ABI:
            missing.append("tcp")  # TCP bind/connect are not restricted at all
        if self.abi < 5:
            missing.append("ioctl_dev")
        if self.abi < SCOPE_ABI:
            missing.extend(sorted(self._requested_scopes))
        return missing

    # -- rules ---------------------------------------------------------------------------------
    def allow_read(self, path: str | os.PathLike[str]) -> LandlockRuleset:
        """Read files, list directories and execute programs beneath ``path``."""
        self._read_paths.append(os.fspath(path))
        return self

    def allow_list(self, path: str | os.PathLike[str]) -> LandlockRuleset:
        """List directories beneath ``path`` (names only: no file is read through this)."""
        self._list_paths.append(os.fspath(path))
        return self

    def allow_write(self, path: str | os.PathLike[str]) -> LandlockRuleset:
        """Everything ``allow_read`` gives plus create, write, truncate, remove, rename, link."""
        self._write_paths.append(os.fspath(path))
        return self

    def allow_write_in_place(self, path: str | os.PathLike[str]) -> LandlockRuleset:
        """Everything ``allow_read`` gives plus writing and truncating files beneath ``path``:
        no name is made, removed or moved there (a subfolder's own rule may allow it)."""
        self._in_place_paths.append(os.fspath(path))
        return self

    def allow_tcp_connect(self, port: int) -> LandlockRuleset:
        """Allow TCP ``connect()`` to ``port`` on any host (Landlock sees ports, not addresses)."""
        self._tcp_connect_ports.append(_check_port(port))
        return self

    def allow_tcp_bind(self, port: int) -> LandlockRuleset:
        """Allow TCP ``bind()`` to ``port`` (0 means "let Linux pick")."""
        self._tcp_bind_ports.append(_check_port(port))
        return self

    def scope_signals(self) -> LandlockRuleset:
        """Deny signals to processes outside this domain (the Jupyter kernel, the launcher, anything)."""
        self._scoped |= SCOPE_SIGNAL
        self._requested_scopes.add("scope_signals")
        return self

    def scope_abstract_unix(self) -> LandlockRuleset:
        """Deny connecting to abstract unix sockets created outside this domain."""
        self._scoped |= SCOPE_ABSTRACT_UNIX_SOCKET
        self._requested_scopes.add("scope_abstract_unix")
        return self

    # -- Landlock objects --------------------------------------------------------------------------
    def build(self) -> list[str]:
        """Create the ruleset and add every rule; return the paths skipped as missing."""
        if self.abi < 1:
            raise LandlockUnavailableError("Landlock is not available on this Linux kernel")
        self.close()
        attr = _RulesetAttr(self.handled_access_fs, self.handled_access_net, self.scoped)
        # Pass only the fields this ABI knows, so older Linux kernels do not reject the size.
        attr_size = 8 if self.abi < NET_ABI else 16 if self.abi < SCOPE_ABI else 24
        ruleset_fd = _syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            ctypes.byref(attr),
            ctypes.c_size_t(attr_size),
            ctypes.c_uint32(0),
        )
        self._ruleset_fd = ruleset_fd
        self.skipped = []
        try:
            handled = self.handled_access_fs
            for path in self._read_paths:
                self._add_path_rule(ruleset_fd, path, FS_READ_RIGHTS & handled)
            for path in self._write_paths:
                self._add_path_rule(ruleset_fd, path, FS_WRITE_RIGHTS & handled)
            for path in self._in_place_paths:
                self._add_path_rule(ruleset_fd, path, FS_IN_PLACE_RIGHTS & handled)
            for path in self._list_paths:
                self._add_path_rule(ruleset_fd, path, ACCESS_FS_READ_DIR & handled)
            if self.abi >= NET_ABI:
                for port in self._tcp_connect_ports:
                    self._add_port_rule(ruleset_fd, port, ACCESS_NET_CONNECT_TCP)
                for port in self._tcp_bind_ports:
                    self._add_port_rule(ruleset_fd, port, ACCESS_NET_BIND_TCP)
        except BaseException:
            self.close()
            raise
        return list(self.skipped)

    def _open_rule(self, path: str, rights: int) -> tuple[int, int] | None:
        """An O_PATH descriptor for `path` and the rights it can carry (None: skipped)."""
        try:
            path_fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            self.skipped.append(path)
            return None
        # What the descriptor really names, asked of Linux: a path whose folders were
        # swapped for symlinks since it was resolved (by a sandbox that could write there)
        # must not grant the link's target. Such a rule is skipped: access fails closed.
        try:
            named = os.readlink(f"/proc/self/fd/{path_fd}")
        except OSError:
            named = path
        if named != os.path.normpath(path):
            os.close(path_fd)
            self.skipped.append(path)
            return None
        # fstat on the descriptor we add, so the kind cannot change between check and use.
        if not stat.S_ISDIR(os.fstat(path_fd).st_mode):
            rights &= FS_FILE_RIGHTS
        return path_fd, rights

    @staticmethod
    def _add_fd_rule(ruleset_fd: int, path_fd: int, rights: int) -> None:
        rule = _PathBeneathAttr(rights, path_fd)
        _syscall(
            SYS_LANDLOCK_ADD_RULE,
            ctypes.c_int(ruleset_fd),
            ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
            ctypes.byref(rule),
            ctypes.c_uint32(0),
        )

    def _add_path_rule(self, ruleset_fd: int, path: str, rights: int) -> None:
        opened = self._open_rule(path, rights)
        if opened is not None:
            try:
                self._add_fd_rule(ruleset_fd, *opened)
            finally:
                os.close(opened[0])

    @staticmethod
    def _add_port_rule(ruleset_fd: int, port: int, rights: int) -> None:
        rule = _NetPortAttr(rights, port)
        _syscall(
            SYS_LANDLOCK_ADD_RULE,
            ctypes.c_int(ruleset_fd),
            ctypes.c_int(LANDLOCK_RULE_NET_PORT),
            ctypes.byref(rule),
            ctypes.c_uint32(0),
        )

    def restrict_self(self, *, only_this_thread: bool = False) -> list[str]:
        """Set NO_NEW_PRIVS and enforce the ruleset on the CURRENT THREAD; return skipped paths.

        Irreversible. Meant for a single-threaded child right after ``fork`` (or a process that
        will ``exec`` the confined program). Other threads that already exist are NOT confined,
        so this refuses to run in a multi-threaded process unless ``only_this_thread`` is set.
        """
        if self.abi < 1:
            raise LandlockUnavailableError("Landlock is not available on this Linux kernel")
        if not only_this_thread and thread_count() > 1:
            raise RuntimeError(
                "restrict_self() confines only the calling thread and this process has "
                f"{thread_count()} threads; call it in a single-threaded child after fork"
            )
        if self._ruleset_fd is None:
            self.build()
        assert self._ruleset_fd is not None
        try:
            set_no_new_privs()
            _syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(self._ruleset_fd), ctypes.c_uint32(0))
        finally:
            self.close()
        return list(self.skipped)

    def fileno(self) -> int | None:
        """The built ruleset's descriptor (None before `build()`)."""
        return self._ruleset_fd

    def move_descriptor(self, lowest: int) -> None:
        """Give the built ruleset a descriptor number of `lowest` or more (a child that
        builds it early puts its own descriptors on fixed low numbers later)."""
        if self._ruleset_fd is not None and self._ruleset_fd < lowest:
            moved = fcntl.fcntl(self._ruleset_fd, fcntl.F_DUPFD_CLOEXEC, lowest)
            os.close(self._ruleset_fd)
            self._ruleset_fd = moved

    def close(self) -> None:
        """Close the ruleset descriptor (a confined child must not keep it)."""
        if self._ruleset_fd is not None:
            fd, self._ruleset_fd = self._ruleset_fd, None
            os.close(fd)

    def __enter__(self) -> LandlockRuleset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _check_port(port: int) -> int:
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"not a TCP port: {port!r}")
    return port
