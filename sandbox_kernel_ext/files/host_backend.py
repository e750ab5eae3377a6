"""A backend on a host directory that cannot be tricked out of it.

Every path is resolved by the Linux kernel relative to one directory descriptor of the root,
never as a path string: a symlink swapped into the tree after the toolset's checks can
at worst make an operation fail, never reach outside the root.
"""

from __future__ import annotations

import ctypes
import operator
import errno
import os
import secrets
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO, Literal

from ..policy.paths import is_within
from ..policy.write_protected import WriteGuard
from .backend import (
    CHECK_EVERY,
    EntryInfo,
    EntryKind,
    EscapeRefused,
    FileBackend,
    Rel,
    WriteRefused,
    kind_of_mode,
    refuse_replacing,
    validate_rel,
    walk_tree,
)

_O_PATH = getattr(os, "O_PATH", 0)
_DIR_LOOKUP = (_O_PATH or os.O_RDONLY) | os.O_DIRECTORY  # only ever used as a dir_fd
_DIR_READ = os.O_RDONLY | os.O_DIRECTORY  # listing, and fsync after a rename
# O_NONBLOCK: a FIFO planted in the root must not hang a read; cleared once it is a file.
_FILE_READ = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK
_TEMP_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

TEMP_SUFFIX = ".sbx-tmp"
"""Temporary files of unfinished writes end with this (they start with a dot)."""

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RENAME_NOREPLACE = 1
_EAGAIN_RETRIES = 64  # openat2 says EAGAIN when a rename raced a `..` step; just retry
# openat2 has the same number on every architecture with the generic syscall table.
_OPENAT2_NR = (
    437
    if sys.platform.startswith("linux")
    and os.uname().machine
    in {"x86_64", "aarch64", "arm64", "riscv64", "ppc64le", "ppc64", "s390x", "i686", "i386", "armv7l"}
    else None
)

REASON_OUTSIDE = "a symlink leads outside the root"
REASON_HIDDEN = "it is a credential store (or inside one) that no sandbox reads"
REASON_NO_SYMLINKS = "symlinks are not allowed here"
REASON_UNSAFE_SYMLINK = "a symlink loops or leads to something that cannot be followed safely"
REASON_NO_OPENAT2 = "symlinks are not followed here (this system cannot resolve them safely)"
REASON_UNSTABLE = "the folders kept changing while the path was resolved; try again"


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        renameat2.restype = ctypes.c_int
    return libc


_libc = _load_libc()
_renameat2 = getattr(_libc, "renameat2", None) if _libc is not None else None


def _openat2(dir_fd: int, path: bytes, flags: int, resolve: int) -> int:
    """Raw openat2(2); raises OSError with Linux's errno."""
    if _OPENAT2_NR is None or _libc is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    while True:
        fd = _libc.syscall(
            ctypes.c_long(_OPENAT2_NR),
            ctypes.c_long(dir_fd),
            ctypes.c_char_p(path),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))


def _openat2_works(dir_fd: int) -> bool:
    try:
        os.close(_openat2(dir_fd, b".", _DIR_LOOKUP, RESOLVE_BENEATH))
    except OSError as exc:
        # ENOSYS: old Linux kernel; EPERM: a seccomp profile that predates the call.
        if exc.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG):
            return False
        raise
    return True


def _entry_info(st: os.stat_result) -> EntryInfo:
    return EntryInfo(
        kind_of_mode(st.st_mode),
        st.st_size,
        st.st_mtime_ns,
        (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns),
    )


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _is_symlink_at(dir_fd: int, name: str) -> bool:
    st = _lstat_at(dir_fd, name)
    return st is not None and stat.S_ISLNK(st.st_mode)


_KIND_ONLY: dict[EntryKind, EntryInfo] = {
    kind: EntryInfo(kind, -1, 0, ()) for kind in ("file", "dir", "symlink", "other")
}


def _kind_only(entry: os.DirEntry[str]) -> EntryInfo:
    """The entry's kind from readdir's d_type (lstat only where the filesystem does not
    report it), without size or identity."""
    if entry.is_file(follow_symlinks=False):
        return _KIND_ONLY["file"]
    if entry.is_dir(follow_symlinks=False):
        return _KIND_ONLY["dir"]
    return _KIND_ONLY["symlink" if entry.is_symlink() else "other"]


def _list_dir(
    dir_fd: int, check: Callable[[], None] | None = None, detail: bool = True
) -> list[tuple[str, EntryInfo]]:
    """One directory's entries from an fd (os.scandir dups it and rewinds, so the fd
    stays usable); entries that vanish between readdir and stat are skipped."""
    entries = []
    with os.scandir(dir_fd) as listing:
        for count, entry in enumerate(listing, start=1):
            if check is not None and count % CHECK_EVERY == 0:
                check()
            try:
                info = _entry_info(entry.stat(follow_symlinks=False)) if detail else _kind_only(entry)
            except FileNotFoundError:
                continue
            entries.append((entry.name, info))
    entries.sort(key=_by_name)
    return entries


_by_name = operator.itemgetter(0)


def _open_child_dir(dir_fd: int, name: str) -> int | None:
    """A subdirectory for the walk, by one component and never through a symlink; None
    when it vanished, was swapped for something else, or cannot be read."""
    try:
        return os.open(name, _DIR_READ | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise


def _rename_noreplace(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """Atomic no-overwrite rename (renameat2 RENAME_NOREPLACE). On a filesystem without
    it, falls back to checking under the directory fd first: a concurrent creator in the
    same root can then be overwritten, but nothing outside can be reached."""
    if _renameat2 is not None:
        if _renameat2(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), dst)
    if _lstat_at(dst_fd, dst) is not None:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _create_temp(dir_fd: int, name: str, replacing: os.stat_result | None) -> tuple[str, int]:
    """A fresh temp file beside the target: 0o644 minus umask when new, the old file's
    permission bits (setuid/setgid/sticky dropped) and owner when replacing."""
    mode = 0o644 if replacing is None else 0o600
    for _ in range(100):
        temp_name = f".{name[:32]}.{secrets.token_hex(6)}{TEMP_SUFFIX}"
        try:
            fd = os.open(temp_name, _TEMP_CREATE, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", name)
    if replacing is None:
        return temp_name, fd
    try:
        if os.geteuid() == 0:  # else only the owner could be kept anyway
            try:
                os.fchown(fd, replacing.st_uid, replacing.st_gid)
            except PermissionError:  # root of a user namespace without that id mapped
                pass
        os.fchmod(fd, stat.S_IMODE(replacing.st_mode) & 0o777)
    except BaseException:
        os.close(fd)
        _unlink_quietly(dir_fd, temp_name)
        raise
    return temp_name, fd


def _real_path(fd: int) -> str | None:
    """Where an opened descriptor really is (None if this host cannot say)."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return real if real.startswith("/") and not real.endswith(" (deleted)") else None


def open_root(path: str) -> int:
    """A directory descriptor of the real folder `path`, opened one component at a time
    without following a symlink: a folder on the way swapped for a link since the policy
    was read (by a sandbox that may write its parent) is refused, not followed."""
    fd = os.open("/", _DIR_LOOKUP | os.O_CLOEXEC)
    try:
        for part in [part for part in path.split("/") if part]:
            try:
                step = os.open(part, _DIR_LOOKUP | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink_at(fd, part):
                    raise EscapeRefused("a folder of the root was replaced by a symlink "
                                        "since the policy was read") from None
                raise
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _rel_text(rel: Rel) -> str:
    return "/".join(rel) or "."


class HostBackend(FileBackend):
    """Storage in a host directory, opened once and used only through its descriptor.

    Resolution (`resolution`):
    - "openat2": Linux resolves each path under RESOLVE_BENEATH |
      RESOLVE_NO_MAGICLINKS, so symlinks that stay inside the root are followed and
      anything leading out (absolute targets, `..` past the root) is refused atomically;
      with `deny_symlinks`, RESOLVE_NO_SYMLINKS refuses every symlink.
    - "component-walk" (no openat2: Linux < 5.6, a seccomp filter, not Linux): one
      O_NOFOLLOW open per component. Without Linux's help an in-root symlink cannot
      be followed safely, so ALL symlinks are refused.

    Operations on a final name (info, delete, rename, replace) open its parent and act
    on the name with `*at()` calls, so a final symlink is never followed.
    """

    _root_fd = -1  # so __del__ is safe when __init__ failed

    def __init__(self, root: str | os.PathLike[str] | int, *, deny_symlinks: bool = False,
                 hidden: Iterable[str] = (), write_guard: WriteGuard | None = None) -> None:
        """`root` is a folder's path, or a directory fd the backend takes ownership of.
        `hidden`: real host paths beneath the root that no operation reaches, however it is
        spelled or linked to (`policy.credential_stores.never_read_inside`); they are left
        out of listings, and the object each operation ends on is judged by its real path.
        `write_guard`: judges each change by the real folder it happens in."""
        self.deny_symlinks = deny_symlinks
        self.hidden = tuple(hidden)
        self.write_guard = write_guard
        self._lock = threading.Lock()
        self._users = 0
        self._closed = False
        self._root_fd = root if isinstance(root, int) else os.open(root, _DIR_LOOKUP | os.O_CLOEXEC)
        try:
            use_openat2 = _openat2_works(self._root_fd)
        except BaseException:
            self._close_root()
            raise
        self.resolution: Literal["openat2", "component-walk"] = (
            "openat2" if use_openat2 else "component-walk"
        )
        self._resolve_flags = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
        if deny_symlinks:
            self._resolve_flags |= RESOLVE_NO_SYMLINKS
        self._resolve: Callable[[int, Rel, int], int] = (
            self._resolve_openat2 if use_openat2 else self._resolve_components
        )

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the root fd, or leave it to the last operation still using it: an fd
        number closed under a running operation could be reused for another directory."""
        with self._lock:
            self._closed = True
            if self._users == 0:
                self._close_root()

    def _close_root(self) -> None:
        fd, self._root_fd = self._root_fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self._close_root()
        except OSError:
            pass

    def _hold_root(self) -> int:
        with self._lock:
            if self._closed:
                raise ValueError("the backend is closed")
            self._users += 1
            return self._root_fd

    def _release_root(self) -> None:
        with self._lock:
            self._users -= 1
            if self._closed and self._users == 0:
                self._close_root()

    # ----------------------------------------------------------- resolution
    def _open(self, rel: Rel, flags: int) -> int:
        """An fd for `rel` (a final symlink followed only if allowed and in-root)."""
        root_fd = self._hold_root()
        try:
            fd = self._resolve(root_fd, rel, flags)
        finally:
            self._release_root()
        if self.hidden:
            try:
                self._refuse_hidden(_real_path(fd))
            except BaseException:
                os.close(fd)
                raise
        return fd

    def _refuse_hidden(self, real: str | None) -> None:
        """EscapeRefused when `real` (None: unknown) is or lies in a hidden path."""
        if real is None or any(is_within(real, hidden) for hidden in self.hidden):
            raise EscapeRefused(REASON_HIDDEN)

    def _refuse_hidden_name(self, parent_fd: int, name: str) -> None:
        """The same for a final name in an opened folder (never followed)."""
        if self.hidden:
            real = _real_path(parent_fd)
            self._refuse_hidden(None if real is None else os.path.join(real, name))

    def _refuse_change(self, parent_fd: int, name: str, *, creates: bool,
                       is_folder: bool = False) -> None:
        """WriteRefused when the write guard refuses changing `name` in this folder."""
        if self.write_guard is None:
            return
        real = _real_path(parent_fd)
        reason = ("the folder's place on this machine cannot be told" if real is None else
                  self.write_guard.refusal(real, name, creates=creates, is_folder=is_folder))
        if reason:
            raise WriteRefused(reason)

    def _visible(self, dir_fd: int, entries: list[tuple[str, EntryInfo]]) -> list[tuple[str, EntryInfo]]:
        """A listing without the hidden entries."""
        if not self.hidden:
            return entries
        real = _real_path(dir_fd)
        if real is None:
            return []
        return [(name, info) for name, info in entries
                if not any(is_within(os.path.join(real, name), hidden) for hidden in self.hidden)]

    def _resolve_openat2(self, root_fd: int, rel: Rel, flags: int) -> int:
        path = os.fsencode(_rel_text(rel))
        for _ in range(_EAGAIN_RETRIES):
            try:
                return _openat2(root_fd, path, flags, self._resolve_flags)
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise EscapeRefused(REASON_OUTSIDE) from None
                if exc.errno == errno.ELOOP:
                    raise EscapeRefused(
                        REASON_NO_SYMLINKS if self.deny_symlinks else REASON_UNSAFE_SYMLINK
                    ) from None
                if exc.errno != errno.EAGAIN:
                    raise OSError(exc.errno, exc.strerror, _rel_text(rel)) from None
        raise EscapeRefused(REASON_UNSTABLE)

    def _resolve_components(self, root_fd: int, rel: Rel, flags: int) -> int:
        if not rel:
            return os.open(".", flags | os.O_CLOEXEC, dir_fd=root_fd)
        fd = root_fd
        try:
            for depth, part in enumerate(rel, 1):
                step = (flags if depth == len(rel) else _DIR_LOOKUP) | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    next_fd = os.open(part, step, dir_fd=fd)
                except OSError as exc:
                    # ELOOP: O_NOFOLLOW met a final symlink; ENOTDIR: maybe a symlink
                    # where O_DIRECTORY wanted a folder (O_PATH opens do not say ELOOP).
                    if exc.errno == errno.ELOOP or (
                        exc.errno == errno.ENOTDIR and _is_symlink_at(fd, part)
                    ):
                        raise EscapeRefused(
                            REASON_NO_SYMLINKS if self.deny_symlinks else REASON_NO_OPENAT2
                        ) from None
                    raise
                if fd != root_fd:
                    os.close(fd)
                fd = next_fd
        except BaseException:
            if fd != root_fd:
                os.close(fd)
            raise
        return fd

    @contextmanager
    def _parent_dir(self, rel: Rel, flags: int = _DIR_LOOKUP, *, create: bool = False) -> Iterator[int]:
        """An fd of `rel`'s parent, closed afterwards; `create` makes missing folders."""
        parent = rel[:-1]
        try:
            fd = self._open(parent, flags)
        except FileNotFoundError:
            if not create:
                raise
            self.mkdirs(parent)
            fd = self._open(parent, flags)
        try:
            yield fd
        finally:
            os.close(fd)

    # ------------------------------------------------------------ interface
    def info(self, rel: Rel) -> EntryInfo | None:
        validate_rel(rel)
        if not rel:
            root_fd = self._hold_root()
            try:
                return _entry_info(os.fstat(root_fd))
            finally:
                self._release_root()
        try:
            with self._parent_dir(rel) as parent_fd:
                self._refuse_hidden_name(parent_fd, rel[-1])
                st = _lstat_at(parent_fd, rel[-1])
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if st is None else _entry_info(st)

    def open_read(self, rel: Rel) -> tuple[BinaryIO, EntryInfo]:
        validate_rel(rel)
        fd = self._open(rel, _FILE_READ)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), _rel_text(rel))
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "is not a regular file", _rel_text(rel))
            os.set_blocking(fd, True)
            reader = open(fd, "rb")  # noqa: SIM115 - the caller closes it
        except BaseException:
            os.close(fd)
            raise
        return reader, _entry_info(st)

    @contextmanager
    def atomic_writer(self, rel: Rel, *, exclusive: bool = False) -> Iterator[BinaryIO]:
        """Writes a temp file beside the target, then fsyncs it, renames it into place
        and fsyncs the folder. `exclusive` uses renameat2(RENAME_NOREPLACE), so a file
        that appears during the write is not overwritten (FileExistsError)."""
        validate_rel(rel)
        if not rel:
            raise IsADirectoryError(errno.EISDIR, "the root is a directory", ".")
        name = rel[-1]
        with self._parent_dir(rel, _DIR_READ, create=True) as parent_fd:
            self._refuse_hidden_name(parent_fd, name)
            existing = _lstat_at(parent_fd, name)
            refuse_replacing(
                None if existing is None else kind_of_mode(existing.st_mode), exclusive=exclusive, rel=rel
            )
            self._refuse_change(parent_fd, name, creates=existing is None)
            temp_name, temp_fd = _create_temp(parent_fd, name, existing)
            committed = False
            try:
                with open(temp_fd, "wb", closefd=False) as out:
                    yield out  # type: ignore[misc]
                os.fsync(temp_fd)
                os.close(temp_fd)
                temp_fd = -1
                if exclusive:
                    _rename_noreplace(parent_fd, temp_name, parent_fd, name)
                else:
                    os.rename(temp_name, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
                committed = True
                os.fsync(parent_fd)
            finally:
                if temp_fd >= 0:
                    os.close(temp_fd)
                if not committed:
                    _unlink_quietly(parent_fd, temp_name)

    def delete(self, rel: Rel) -> None:
        validate_rel(rel)
        if not rel:
            raise IsADirectoryError(errno.EISDIR, "the root is a directory", ".")
        with self._parent_dir(rel) as parent_fd:
            self._refuse_hidden_name(parent_fd, rel[-1])
            self._refuse_change(parent_fd, rel[-1], creates=False)
            os.unlink(rel[-1], dir_fd=parent_fd)  # EISDIR for a directory on Linux

    def rename(self, src: Rel, dst: Rel) -> None:
        validate_rel(src)
        validate_rel(dst)
        if not src or not dst:
            raise OSError(errno.EBUSY, "cannot rename the root itself")
        with self._parent_dir(src) as src_fd:
            self._refuse_hidden_name(src_fd, src[-1])
            moved = _lstat_at(src_fd, src[-1])
            if moved is None:  # before creating dst's folders
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), _rel_text(src))
            self._refuse_change(src_fd, src[-1], creates=False)
            with self._parent_dir(dst, create=True) as dst_fd:
                self._refuse_hidden_name(dst_fd, dst[-1])
                self._refuse_change(dst_fd, dst[-1], creates=True,
                                    is_folder=stat.S_ISDIR(moved.st_mode))
                _rename_noreplace(src_fd, src[-1], dst_fd, dst[-1])

    def scandir(
        self, rel: Rel, *, check: Callable[[], None] | None = None, detail: bool = True
    ) -> list[tuple[str, EntryInfo]]:
        validate_rel(rel)
        fd = self._open(rel, _DIR_READ)
        try:
            return self._visible(fd, _list_dir(fd, check, detail))
        finally:
            os.close(fd)

    def walk(
        self, rel: Rel, *, check: Callable[[], None] | None = None, detail: bool = True
    ) -> Iterator[tuple[Rel, EntryInfo]]:
        # A generator throughout, so an fd is opened only once iteration starts and
        # walk_tree's cleanup always owns it.
        validate_rel(rel)
        fd = self._open(rel, _DIR_READ)
        yield from walk_tree(
            rel,
            fd,
            list_dir=lambda dir_fd: self._visible(dir_fd, _list_dir(dir_fd, check, detail)),
            open_child=_open_child_dir,
            release=os.close,
            check=check,
        )

    def subtree(self, rel: Rel) -> HostBackend:
        """A backend rooted at the folder `rel`, opened beneath this root: operations
        through it cannot leave that folder, even by a symlink that stays in this root."""
        validate_rel(rel)
        fd = self._open(rel, _DIR_LOOKUP)
        return HostBackend(fd, deny_symlinks=self.deny_symlinks, hidden=self.hidden,
                           write_guard=self.write_guard)

    def mkdirs(self, rel: Rel) -> None:
        validate_rel(rel)
        try:
            os.close(self._open(rel, _DIR_LOOKUP))
            return
        except FileNotFoundError:
            pass
        for depth in range(len(rel)):
            parent_fd = self._open(rel[:depth], _DIR_LOOKUP)
            try:
                self._refuse_hidden_name(parent_fd, rel[depth])  # nor a store's folder made
                if _lstat_at(parent_fd, rel[depth]) is None:
                    self._refuse_change(parent_fd, rel[depth], creates=True, is_folder=True)
                os.mkdir(rel[depth], 0o777, dir_fd=parent_fd)
            except FileExistsError:
                pass  # a folder, or something the next open refuses
            finally:
                os.close(parent_fd)
        os.close(self._open(rel, _DIR_LOOKUP))
