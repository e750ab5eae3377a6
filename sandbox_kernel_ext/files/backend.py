"""The storage interface the file toolset does all of its I/O through.

The toolset decides *whether* an operation is allowed; a backend decides nothing about
policy but guarantees that what it touches stays inside its root, even when the tree
changes between the toolset's check and the backend's use.
"""

from __future__ import annotations

import errno
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, ContextManager, Literal, TypeVar

Rel = tuple[str, ...]
"""Components below the root; () is the root itself. Never '', '.', '..', '/' or NUL."""

EntryKind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """What the toolset needs to know about one entry; `identity` changes whenever the
    content may have changed, so it can key caches (a per-file line index, say)."""

    kind: EntryKind
    size: int
    mtime_ns: int
    identity: tuple[int, ...]


class EscapeRefused(Exception):
    """Resolution would leave the root or meet a symlink the backend refuses.

    `reason` is a short phrase for people and models; it never names a host path.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class WriteRefused(Exception):
    """A change the write guard refuses (`policy.write_protected.WriteGuard`); `reason`
    names no host path."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def validate_rel(rel: Rel) -> Rel:
    """Refuse components that could climb or split; the host backend passes final names
    straight to `*at()` calls, so this check is what keeps `unlink('..', dir_fd)` out."""
    for part in rel:
        if not part or part in (".", "..") or "/" in part or "\0" in part:
            raise ValueError(f"invalid path component {part!r}")
    return rel


_KIND_BY_FORMAT: dict[int, EntryKind] = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
}


def kind_of_mode(mode: int) -> EntryKind:
    return _KIND_BY_FORMAT.get(stat.S_IFMT(mode), "other")


def refuse_replacing(existing: EntryKind | None, *, exclusive: bool, rel: Rel) -> None:
    """The atomic writer's rules for what may sit under the target name, shared so both
    backends answer alike: nothing (or a file unless exclusive) may be replaced."""
    if existing is None:
        return
    where = "/".join(rel)
    if exclusive:
        raise FileExistsError(errno.EEXIST, "already exists", where)
    if existing == "dir":
        raise IsADirectoryError(errno.EISDIR, "is a directory", where)
    if existing == "symlink":
        # Replacing the link would silently detach it from the file it names.
        raise EscapeRefused("it is a symlink; write to the file it points to instead")
    if existing != "file":
        raise OSError(errno.EINVAL, "is not a regular file", where)


Handle = TypeVar("Handle")

CHECK_EVERY = 512
"""Entries between deadline checks inside one large folder."""


def walk_tree(
    top: Rel,
    handle: Handle,
    *,
    list_dir: Callable[[Handle], list[tuple[str, EntryInfo]]],
    open_child: Callable[[Handle, str], Handle | None],
    release: Callable[[Handle], None],
    check: Callable[[], None] | None,
) -> Iterator[tuple[Rel, EntryInfo]]:
    """Pre-order, name-sorted walk shared by the backends.

    A handle is whatever lets a backend reach a directory without looking its path up
    again (an fd, a tree node), so a directory renamed or swapped mid-walk cannot
    redirect the walk. `open_child` returns None for a child that vanished or stopped
    being a real directory. Owns `handle` and releases every handle it opened, also
    when the consumer stops early or `check` raises.
    """
    stack: list[tuple[Rel, Handle, Iterator[tuple[str, EntryInfo]]]] = []
    try:
        try:
            if check is not None:
                check()
            first = iter(list_dir(handle))
        except BaseException:
            release(handle)
            raise
        stack.append((top, handle, first))
        seen = 0
        while stack:
            rel, current, entries = stack[-1]
            for name, info in entries:
                child = rel + (name,)
                seen += 1
                if check is not None and seen % CHECK_EVERY == 0:
                    check()
                yield child, info
                if info.kind != "dir":
                    continue
                if check is not None:
                    check()
                sub = open_child(current, name)
                if sub is None:
                    continue
                try:
                    sub_entries = list_dir(sub)
                except BaseException:
                    release(sub)
                    raise
                stack.append((child, sub, iter(sub_entries)))
                break
            else:
                stack.pop()
                release(current)
    finally:
        while stack:
            release(stack.pop()[1])


class FileBackend(ABC):
    """One root's storage. Every method takes validated components (`Rel`) and raises
    plain OSErrors for ordinary failures; only escapes raise `EscapeRefused`."""

    @abstractmethod
    def info(self, rel: Rel) -> EntryInfo | None:
        """None when missing; a final symlink is reported, not followed."""

    @abstractmethod
    def open_read(self, rel: Rel) -> tuple[BinaryIO, EntryInfo]:
        """A seekable binary file (caller closes) and what it was when opened."""

    @abstractmethod
    def atomic_writer(self, rel: Rel, *, exclusive: bool = False) -> ContextManager[BinaryIO]:
        """Commits on clean exit only; readers see the old content or the new, never half."""

    @abstractmethod
    def delete(self, rel: Rel) -> None:
        """Files and symlinks only; a symlink itself is removed, never its target."""

    @abstractmethod
    def rename(self, src: Rel, dst: Rel) -> None:
        """FileExistsError rather than overwriting `dst`."""

    @abstractmethod
    def scandir(
        self, rel: Rel, *, check: Callable[[], None] | None = None, detail: bool = True
    ) -> list[tuple[str, EntryInfo]]:
        """One directory, sorted by name, symlinks reported not followed. With
        `detail=False` only `kind` is filled in (size -1): a listing of names needs no
        stat per entry, which is most of its cost on a host."""

    @abstractmethod
    def walk(
        self, rel: Rel, *, check: Callable[[], None] | None = None, detail: bool = True
    ) -> Iterator[tuple[Rel, EntryInfo]]:
        """Everything below `rel` (root-relative), pre-order and sorted; `check` runs
        before each directory and every `CHECK_EVERY` entries, so a deadline can stop
        a large walk."""

    @abstractmethod
    def mkdirs(self, rel: Rel) -> None:
        """Like `os.makedirs(exist_ok=True)`; NotADirectoryError if a file is in the way."""

    def close(self) -> None:
        """Release what the backend holds; later calls fail."""

    def __enter__(self) -> FileBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
