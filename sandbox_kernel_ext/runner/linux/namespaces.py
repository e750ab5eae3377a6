"""Namespaces, mounts, identity and capabilities through ``ctypes``: the bindings only.

Which namespaces a child enters and what it mounts is decided by `child/bootstrap.py`; this
module knows the flags and the calls. Importing it is safe on any OS.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from .syscalls import checked, libc, prctl

__all__ = [
    "CLONE_NEWNS", "CLONE_NEWCGROUP", "CLONE_NEWUTS", "CLONE_NEWIPC", "CLONE_NEWUSER",
    "CLONE_NEWPID", "CLONE_NEWNET", "CLONE_NAMESPACE_FLAGS", "unshare", "mount",
    "bind_mount", "detached_tmpfs", "sized_tmpfs", "clone_mount", "set_mount_readonly", "set_mount_readonly_at", "mount_setattr_available", "drop_bounding_set", "drop_capabilities", "idmapped_tree",
    "attach_tree", "mapping_user_namespace",
    "drop_identity",
    "enter_namespaces", "fresh_mounts", "shared_tmpfs_possible", "userns_usable",
]

# Namespace flags of clone(2) and unshare(2).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
    | CLONE_NEWNET
)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 0x1000, 0x4000, 1 << 18
# mount_setattr(2), Linux 5.12: the same number on x86_64 and aarch64.
SYS_MOUNT_SETATTR = 442
# open_tree and move_mount (Linux 5.2): the same numbers on x86_64 and aarch64.
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, 0o2000000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
MOUNT_ATTR_IDMAP = 0x100000
AT_EMPTY_PATH = 0x1000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


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


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def set_mount_readonly(path: str, readonly: bool, *, recursive: bool) -> None:
    """Make the mount at `path` (and every mount below it, with `recursive`) read-only, or
    writable again, in this mount namespace only."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else MOUNT_ATTR_RDONLY,
                      0, 0)
    lib = libc()
    if lib is None:
        raise OSError(errno.ENOSYS, "mount_setattr is not available on this platform")
    checked(lib.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD),
                        path.encode(), ctypes.c_uint(AT_RECURSIVE if recursive else 0),
                        ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))))


def set_mount_readonly_at(fd: int, readonly: bool, *, recursive: bool) -> None:
    """`set_mount_readonly` for the mount a descriptor (O_PATH) is on."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else MOUNT_ATTR_RDONLY,
                      0, 0)
    _syscall(SYS_MOUNT_SETATTR, ctypes.c_int(fd), b"",
             ctypes.c_uint(AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)),
             ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))


SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT = 430, 431, 432  # Linux 5.2, every architecture
FSOPEN_CLOEXEC = FSMOUNT_CLOEXEC = 1
FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE = 1, 6
MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 0x4, 0x8


def detached_tmpfs() -> int:
    """A descriptor of a new small tmpfs mounted nowhere (nosuid, nodev, noexec): files made
    in it can be bound onto paths, and no path names the tmpfs itself."""
    return _new_tmpfs({}, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)


def sized_tmpfs(size: int, inodes: int, *, owner: int | None = None, mode: int = 0o700) -> int:
    """A descriptor of a new tmpfs mounted nowhere (nosuid, nodev), that holds at most `size`
    bytes and `inodes` files and folders: past either, a write fails with ENOSPC in Linux
    itself. Its root belongs to `owner` (uid and gid), else to the caller. `clone_mount`
    makes copies of it to attach, each showing the same files."""
    options = {"size": str(size), "nr_inodes": str(inodes), "mode": f"{mode:o}"}
    if owner is not None:
        options.update(uid=str(owner), gid=str(owner))
    return _new_tmpfs(options, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)


def _new_tmpfs(options: dict[str, str], attributes: int) -> int:
    fs = _syscall(SYS_FSOPEN, b"tmpfs", ctypes.c_uint(FSOPEN_CLOEXEC))
    try:
        for key, value in options.items():
            _syscall(SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(FSCONFIG_SET_STRING),
                     key.encode(), value.encode(), ctypes.c_int(0))
        _syscall(SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(FSCONFIG_CMD_CREATE), None, None,
                 ctypes.c_int(0))
        return _syscall(SYS_FSMOUNT, ctypes.c_int(fs), ctypes.c_uint(FSMOUNT_CLOEXEC),
                        ctypes.c_uint(attributes))
    finally:
        os.close(fs)


def clone_mount(mount_fd: int) -> int:
    """A new detached copy of the mount `mount_fd` is (the same files), to attach with
    `attach_tree`. A mount made by `sized_tmpfs` and never attached can be copied this way
    from Linux 6.15 on, by a process that may mount (EINVAL before: `clone_mount` fails)."""
    return _syscall(SYS_OPEN_TREE, ctypes.c_int(mount_fd), b"",
                    ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH))


def _syscall(number: int, *args: object) -> int:
    lib = libc()
    if lib is None:
        raise OSError(errno.ENOSYS, "this platform has no syscall()")
    return checked(lib.syscall(ctypes.c_long(number), *args))


def idmapped_tree(path: str, userns_fd: int) -> int:
    """A detached copy of the mounts at and below `path` whose owners are seen through
    `userns_fd`'s mapping (an idmapped mount): with `0 N 1`, root's files show as uid N's
    and what uid N creates is stored as root's. Needs real root (CAP_SYS_ADMIN
    where the filesystem was mounted) and a filesystem that supports it (ext4, xfs, btrfs,
    tmpfs from 6.3, ...). `attach_tree` puts it in place, in another mount namespace too."""
    # The folder as the plan resolved it, never through a symlink planted since: a tree of
    # whatever a link points at would show its owner's files as the child's
    where = open_without_links(path)
    try:
        tree = _syscall(SYS_OPEN_TREE, ctypes.c_int(where), b"",
                        ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE
                                      | AT_EMPTY_PATH))
    finally:
        os.close(where)
    try:
        # nosuid besides no_new_privs: other users keep their ids through the map, so a
        # set-user-ID file of theirs must never run as them
        attr = _MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID, 0, 0, userns_fd)
        _syscall(SYS_MOUNT_SETATTR, ctypes.c_int(tree), b"",
                 ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE), ctypes.byref(attr),
                 ctypes.c_size_t(ctypes.sizeof(attr)))
    except BaseException:
        os.close(tree)
        raise
    return tree


def attach_tree(tree: int, path: str) -> None:
    """Mount a detached tree (`idmapped_tree`) on `path`, reached without a symlink (ELOOP
    otherwise: a link planted there since the plan was made gets no tree)."""
    where = open_without_links(path)
    try:
        _syscall(SYS_MOVE_MOUNT, ctypes.c_int(tree), b"", ctypes.c_int(where), b"",
                 ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH))
    finally:
        os.close(where)


def open_without_links(path: str) -> int:
    """An O_PATH descriptor of the absolute `path`, opened one component at a time without
    following a symlink anywhere (OSError ELOOP if one is met)."""
    fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        for part in [part for part in path.split("/") if part]:
            step = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = step
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.ELOOP, f"{path} goes through a symlink")
    except BaseException:
        os.close(fd)
        raise
    return fd


def mapping_user_namespace(inside: int, outside: int) -> int:
    """A descriptor of a new user namespace whose id `inside` is `outside` on the host and
    every other id itself (but `outside`, which has no id of its own there): the mapping an
    idmapped mount applies. Other users' files then keep their owners, so their modes
    decide as on the host (a 0666 file of uid 1000 stays writable; an unmapped owner would
    make every change EOVERFLOW). Made in a throwaway fork; the caller needs CAP_SETUID and
    CAP_SETGID (root)."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(done_w)  # so that the parent's close is our end of file
            unshare(CLONE_NEWUSER)
            os.write(ready_w, b"1")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(errno.EPERM, "could not make a user namespace for an idmapped mount")
        mapping = _everyone_else_as_themselves(inside, outside)
        _write(f"/proc/{pid}/uid_map", mapping)
        _write(f"/proc/{pid}/setgroups", "deny")
        _write(f"/proc/{pid}/gid_map", mapping)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(done_w)
        os.waitpid(pid, 0)


_LAST_ID = 4294967294  # (uid_t)-1 is no id


def _everyone_else_as_themselves(inside: int, outside: int) -> str:
    """uid_map lines: `inside` as `outside`, the ids neither of them is as themselves."""
    lines = [(inside, outside, 1)]
    taken = sorted({inside, outside})
    start = 0
    for end in [*taken, _LAST_ID + 1]:
        if end > start:
            lines.append((start, start, end - start))
        start = end + 1
    return "".join(f"{a} {b} {n}\n" for a, b, n in lines)


def mount_setattr_available() -> bool:
    """Whether this Linux has mount_setattr (5.12 and later): asked with arguments it must
    refuse (EBADF or EINVAL means it is there, ENOSYS that it is not)."""
    lib = libc()
    if lib is None:
        return False
    result = lib.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(-1), b"",
                         ctypes.c_uint(0), None, ctypes.c_size_t(0))
    return result == 0 or ctypes.get_errno() != errno.ENOSYS


def bind_mount(path: str) -> None:
    """Mount `path` on itself (with what is mounted below it): a mount of its own, whose
    flags can then differ from the mount that holds it."""
    mount(path, path, None, MS_BIND | MS_REC)


CAP_SETPCAP = 8


def _has_effective(cap: int) -> bool:
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _call("capget", ctypes.byref(header), data)
    return bool(data[cap // 32].effective & (1 << (cap % 32)))


def _last_capability() -> int:
    """The highest capability this Linux kernel knows (read once: a child then makes no
    call past it); 63 where /proc cannot tell, the loop below stops at the first unknown."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as known:
            return int(known.read())
    except (OSError, ValueError):
        return 63


_LAST_CAP = _last_capability()
_bounding_set_empty = False  # in this process, by `drop_bounding_set`


def drop_bounding_set() -> None:
    """Empty the bounding set, so no later exec can grant a capability. It needs CAP_SETPCAP,
    so it runs before any change of uid; holding it, a capability that stays raises. Without
    it (an unprivileged process with no user namespace) nothing can be dropped, and
    `no_new_privs` is what keeps an exec from granting anything."""
    global _bounding_set_empty
    if _bounding_set_empty or not _has_effective(CAP_SETPCAP):
        return
    for cap in range(_LAST_CAP + 1):
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError:
            try:
                still_held = prctl(PR_CAPBSET_READ, cap)
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # past the last capability this kernel knows
                    break
                raise
            if still_held:
                raise
    _bounding_set_empty = True  # a set once emptied stays so: no second pass


def drop_capabilities() -> None:
    """Empty every capability set and the bounding set (caps held inside the user namespace)."""
    drop_bounding_set()
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


def enter_namespaces(flags: int, use_userns: bool, seen_uid: int | None = None) -> None:
    """Unshare `flags`; in a new user namespace our uid and gid show as `seen_uid` (as
    themselves by default), and nothing else is mapped (no root inside it)."""
    global _bounding_set_empty
    uid, gid = os.geteuid(), os.getegid()
    unshare(flags | (CLONE_NEWUSER if use_userns else 0))
    if use_userns:
        _bounding_set_empty = False  # a new user namespace comes with a full one
        seen = uid if seen_uid is None else seen_uid
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{seen} {uid} 1")
        _write("/proc/self/gid_map", f"{seen} {gid} 1")


def fresh_mounts(use_userns: bool) -> dict[str, bool]:
    """Whether a child in new user (`use_userns`), PID and mount namespaces may mount a fresh
    /proc and a tmpfs on /dev/shm, tried in throwaway forks as a child does it. A container
    runtime's masked /proc paths make Linux refuse the first one to an unprivileged user
    (a new proc mount may not reveal what those mounts hide); no namespaces, neither."""
    pid = os.fork()
    if pid == 0:
        found = 0  # what was mounted, as bits: the exit status of each fork
        try:
            enter_namespaces(CLONE_NEWNS | CLONE_NEWPID, use_userns)
            inner = os.fork()  # a proc mount shows the PID namespace the caller is in
            if inner == 0:
                mount(None, "/", None, MS_REC | MS_PRIVATE)
                for bit, (source, target, fstype) in enumerate(
                        (("proc", "/proc", "proc"), ("tmpfs", "/dev/shm", "tmpfs"))):
                    try:
                        mount(source, target, fstype, MS_NOSUID | MS_NODEV | MS_NOEXEC)
                        found |= 1 << bit
                    except OSError:
                        pass
            else:
                found = os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1])
        except BaseException:  # noqa: BLE001 - no namespaces: nothing can be mounted
            pass
        finally:
            os._exit(max(found, 0) & 3)
    bits = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return {"proc": bool(bits & 1), "dev_shm": bool(bits & 2)}


def shared_tmpfs_possible(use_userns: bool) -> bool:
    """Whether a tmpfs made where this process may make one (new user and mount namespaces
    unless it is root) can be attached by a child in mount namespaces of its own, as a copy
    (`sized_tmpfs`, `clone_mount`, `attach_tree`: a container profile may refuse any of
    them; Linux before 6.15 refuses the copy). Tried in throwaway forks, as it is done."""
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            if os.geteuid() != 0:
                enter_namespaces(CLONE_NEWNS, use_userns=True, seen_uid=0)
            made = sized_tmpfs(4096, 16)
            inner = os.fork()
            if inner == 0:
                attached = False
                try:
                    enter_namespaces(CLONE_NEWNS, use_userns)
                    mount(None, "/", None, MS_REC | MS_PRIVATE)
                    attach_tree(clone_mount(made), "/tmp")
                    attached = True
                finally:
                    os._exit(0 if attached else 1)
            ok = os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1]) == 0
        except BaseException:  # noqa: BLE001 - not possible here
            pass
        finally:
            os._exit(0 if ok else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def userns_usable() -> bool:
    """Whether this process may create a user namespace (refused by some AppArmor setups and
    container profiles); probed in a throwaway fork."""
    pid = os.fork()
    if pid == 0:
        try:
            unshare(CLONE_NEWUSER)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
