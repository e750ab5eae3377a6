"""An in-memory backend: the same contract as the host backend with nothing on disk, for
agents that should only ever see a scratch space (and for tests)."""

from __future__ import annotations

import errno
import io
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from .backend import EntryInfo, FileBackend, Rel, refuse_replacing, validate_rel, walk_tree

# One counter for every store in the process, so an identity is never reused, even
# across stores or after a delete and re-create.
_versions = itertools.count(1)


class _File:
    __slots__ = ("data", "mtime_ns", "version")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.mtime_ns = time.time_ns()
        self.version = next(_versions)

    def info(self) -> EntryInfo:
        return EntryInfo("file", len(self.data), self.mtime_ns, (self.version,))


class _Dir:
    __slots__ = ("entries", "mtime_ns", "version")

    def __init__(self) -> None:
        self.entries: dict[str, _File | _Dir] = {}
        self.touch()

    def touch(self) -> None:
        self.mtime_ns = time.time_ns()
        self.version = next(_versions)

    def info(self) -> EntryInfo:
        return EntryInfo("dir", 0, self.mtime_ns, (self.version,))


def _error(code: int, rel: Rel) -> OSError:
    return OSError(code, os.strerror(code), "/".join(rel) or ".")  # OSError picks the subclass


class _StoreWriter(io.BytesIO):
    """Keeps what was written even if the caller closes it before the commit."""

    final: bytes | None = None

    def close(self) -> None:
        if not self.closed:
            self.final = self.getvalue()
        super().close()


class StoreBackend(FileBackend):
    """A tree of nodes under one lock. Directory nodes play the role of the host's
    directory fds: a walk or a writer holds the node, not its path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root = _Dir()

    # ----------------------------------------------------------- lookups
    # All of these run with the lock held.
    def _node(self, rel: Rel) -> _File | _Dir | None:
        """The node at `rel`; NotADirectoryError if a file sits where a folder should."""
        node: _File | _Dir = self._root
        for depth, part in enumerate(rel):
            if not isinstance(node, _Dir):
                raise _error(errno.ENOTDIR, rel[:depth])
            found = node.entries.get(part)
            if found is None:
                return None
            node = found
        return node

    def _dir(self, rel: Rel) -> _Dir:
        node = self._node(rel)
        if node is None:
            raise _error(errno.ENOENT, rel)
        if not isinstance(node, _Dir):
            raise _error(errno.ENOTDIR, rel)
        return node

    def _make_dirs(self, rel: Rel) -> _Dir:
        node = self._root
        for depth, part in enumerate(rel, 1):
            child = node.entries.get(part)
            if child is None:
                child = node.entries[part] = _Dir()
                node.touch()
            elif not isinstance(child, _Dir):
                raise _error(errno.ENOTDIR, rel[:depth])
            node = child
        return node

    # ------------------------------------------------------------ interface
    def info(self, rel: Rel) -> EntryInfo | None:
        validate_rel(rel)
        with self._lock:
            try:
                node = self._node(rel)
            except NotADirectoryError:
                return None
            return None if node is None else node.info()

    def open_read(self, rel: Rel) -> tuple[BinaryIO, EntryInfo]:
        validate_rel(rel)
        with self._lock:
            node = self._node(rel)
            if node is None:
                raise _error(errno.ENOENT, rel)
            if isinstance(node, _Dir):
                raise _error(errno.EISDIR, rel)
            return io.BytesIO(node.data), node.info()  # BytesIO shares the bytes: no copy

    @contextmanager
    def atomic_writer(self, rel: Rel, *, exclusive: bool = False) -> Iterator[BinaryIO]:
        """Buffers in memory and swaps the bytes in at a clean exit; `exclusive` is
        checked again at the commit, under the lock."""
        validate_rel(rel)
        if not rel:
            raise _error(errno.EISDIR, rel)
        with self._lock:
            self._check_target(rel, exclusive)
        out = _StoreWriter()
        try:
            yield out  # type: ignore[misc]
        except BaseException:
            out.close()
            raise
        out.close()
        with self._lock:
            self._check_target(rel, exclusive)
            parent = self._make_dirs(rel[:-1])
            parent.entries[rel[-1]] = _File(out.final or b"")
            parent.touch()

    def _check_target(self, rel: Rel, exclusive: bool) -> None:
        self._make_dirs(rel[:-1])
        node = self._node(rel)
        refuse_replacing(
            None if node is None else "dir" if isinstance(node, _Dir) else "file",
            exclusive=exclusive,
            rel=rel,
        )

    def delete(self, rel: Rel) -> None:
        validate_rel(rel)
        if not rel:
            raise _error(errno.EISDIR, rel)
        with self._lock:
            parent = self._dir(rel[:-1])
            node = parent.entries.get(rel[-1])
            if node is None:
                raise _error(errno.ENOENT, rel)
            if isinstance(node, _Dir):
                raise _error(errno.EISDIR, rel)
            del parent.entries[rel[-1]]
            parent.touch()

    def rename(self, src: Rel, dst: Rel) -> None:
        validate_rel(src)
        validate_rel(dst)
        if not src or not dst:
            raise OSError(errno.EBUSY, "cannot rename the root itself")
        with self._lock:
            src_parent = self._dir(src[:-1])
            node = src_parent.entries.get(src[-1])
            if node is None:
                raise _error(errno.ENOENT, src)
            if self._node(dst) is not None:
                raise _error(errno.EEXIST, dst)
            if dst[: len(src)] == src:
                raise _error(errno.EINVAL, dst)  # into itself, as rename(2) refuses
            dst_parent = self._make_dirs(dst[:-1])
            del src_parent.entries[src[-1]]
            dst_parent.entries[dst[-1]] = node
            src_parent.touch()
            dst_parent.touch()

    def scandir(
        self, rel: Rel, *, check: Callable[[], None] | None = None, detail: bool = True
    ) -> list[tuple[str, EntryInfo]]:
        validate_rel(rel)
        with self._lock:
            return self._list(self._dir(rel))

    def _list(self, node: _Dir) -> list[tuple[str, EntryInfo]]:
        return sorted((name, child.info()) for name, child in node.entries.items())

    def _list_locked(self, node: _Dir) -> list[tuple[str, EntryInfo]]:
        with self._lock:
            return self._list(node)

    def _open_child(self, node: _Dir, name: str) -> _Dir | None:
        with self._lock:
            child = node.entries.get(name)
        return child if isinstance(child, _Dir) else None

    def walk(
        self, rel: Rel, *, check: Callable[[], None] | None = None, detail: bool = True
    ) -> Iterator[tuple[Rel, EntryInfo]]:
        # The lock is taken per directory, never across a yield: the consumer may write.
        validate_rel(rel)
        with self._lock:
            top = self._dir(rel)
        yield from walk_tree(
            rel, top, list_dir=self._list_locked, open_child=self._open_child, release=_keep, check=check
        )

    def mkdirs(self, rel: Rel) -> None:
        validate_rel(rel)
        with self._lock:
            self._make_dirs(rel)


def _keep(node: _Dir) -> None:
    """Tree nodes need no release."""
