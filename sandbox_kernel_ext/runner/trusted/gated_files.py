"""Approval-gated files for a sandboxed child, opened on its behalf by the trusted side.

Landlock's rules leave every `read_approval` root and every write behind `write_approval`
out of the child's reach, and that stays the ceiling: a child that wants such a file asks over
its control channel, and the parent runs the same checks, approvals, quotas and atomic writes
as the filesystem toolset (it *is* a toolset under the same policy and broker, so a grant made
for one covers the other), then hands over a descriptor. Writes go to a staged temp file that
becomes the real file only when the child closes it and the broker approves what was written.
"""

from __future__ import annotations

import errno
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...files.toolset import FileSystemToolset, StagedWrite
from ...policy.errors import ApprovalDeniedError, SandboxError
from ...policy.models import CapabilityDeclaration
from ...policy.paths import virtual_path

__all__ = ["GatedFiles", "GatedRoot", "gated_roots", "OpenAnswer"]

MAX_STAGED_WRITES = 16  # open at once per run: each holds a descriptor on the trusted side
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@dataclass(frozen=True)
class GatedRoot:
    """One root of the policy's path table as the child's hooks need to know it."""

    virtual: str  # "data" (a named root) or "/" (single-root mode)
    host: str  # the real folder
    writable: bool  # mode rw
    read_approval: bool
    write_approval: bool

    def needs_parent(self, write: bool) -> bool:
        """Whether Landlock's rules keep this access from the child (so the parent opens)."""
        if self.read_approval:
            return True  # the whole root is out of the child's reach
        return write and self.writable and self.write_approval

    def to_json(self) -> dict[str, Any]:
        return {"virtual": self.virtual, "host": self.host, "writable": self.writable,
                "read_approval": self.read_approval, "write_approval": self.write_approval}


def gated_roots(capability: CapabilityDeclaration) -> list[GatedRoot]:
    """The policy table's roots (empty without a table); relative roots resolve as the
    toolset resolves them."""
    if capability.sandbox_config() is None:
        return []
    from ...policy.sandbox import Sandbox

    sandbox = Sandbox.from_policy(capability)
    roots = []
    for name in sandbox.root_names:
        vp = sandbox.parse(f"/{name}" if name else "/")
        config = sandbox.path_config(vp)
        roots.append(GatedRoot(
            virtual=str(vp), host=sandbox.host_root(vp),
            writable=config.mode == "rw", read_approval=config.read_approval,
            write_approval=config.write_approval,
        ))
    return roots


class _WaitingBroker:
    """The broker, with `on_waiting` around each question: the run's clock stops only while
    someone is actually asked, not for answers the policy gives at once."""

    def __init__(self, broker: Any, on_waiting: Callable[[bool], None]) -> None:
        self._broker, self._on_waiting = broker, on_waiting

    def check(self, request: Any) -> None:
        self._on_waiting(True)
        try:
            self._broker.check(request)
        finally:
            self._on_waiting(False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)


@dataclass
class OpenAnswer:
    """A granted open: the descriptor to hand over and, for writes, the handle to commit."""

    fd: int
    handle: str | None


class GatedFiles:
    """Opens approval-gated files for one sandbox. Thread-safe; `close()` discards every
    staged write not yet committed (a killed or finished run leaves nothing half-written)."""

    def __init__(self, capability: CapabilityDeclaration, broker: Any, source: str, *,
                 roots: list[GatedRoot] | None = None,
                 on_waiting: Callable[[bool], None] = lambda waiting: None) -> None:
        """`roots`: `gated_roots(capability)`, when the caller already has them."""
        self.roots = gated_roots(capability) if roots is None else roots
        self._toolset = (
            FileSystemToolset.from_policy(capability, id=source,
                                          broker=_WaitingBroker(broker, on_waiting))
            if self.roots else None
        )
        self._lock = threading.Lock()
        self._staged: dict[str, StagedWrite] = {}
        self._closed = False

    def virtual_path(self, host_path: str) -> tuple[GatedRoot, str] | None:
        """The gated root holding `host_path` and its virtual path (None: not in a root)."""
        path = os.path.normpath(host_path)
        for root in self.roots:
            virtual = virtual_path(path, root.host, root.virtual)
            if virtual is not None:
                return root, virtual
        return None

    def open(self, host_path: str, flags: int) -> OpenAnswer:
        """Check, ask and open; raises PermissionError/OSError with the reason on refusal."""
        if not isinstance(host_path, str) or not os.path.isabs(host_path) or "\0" in host_path:
            raise PermissionError(errno.EACCES, "the path must be absolute", str(host_path)[:200])
        found = self.virtual_path(host_path)
        write = bool(flags & _WRITE_FLAGS)
        if found is None or not found[0].needs_parent(write):
            raise PermissionError(errno.EACCES, "not an approval-gated path of this policy",
                                  host_path)
        _root, virtual = found
        assert self._toolset is not None
        try:
            if not write:
                fd, _size = self._toolset.open_descriptor(virtual)
                return OpenAnswer(fd, None)
            keep = not flags & os.O_TRUNC
            staged = self._toolset.stage_write(virtual, keep_content=keep,
                                               exclusive=bool(flags & os.O_EXCL))
        except ApprovalDeniedError as exc:
            raise PermissionError(errno.EACCES, str(exc), virtual) from None
        except SandboxError as exc:
            raise PermissionError(errno.EACCES, str(exc), virtual) from None
        handle = secrets.token_hex(16)
        with self._lock:
            refusal = ("the run has ended" if self._closed else
                       f"more than {MAX_STAGED_WRITES} approval-gated files open for writing "
                       "at once; close some first" if len(self._staged) >= MAX_STAGED_WRITES
                       else None)
            if refusal is None:
                self._staged[handle] = staged
        if refusal is not None:
            staged.discard()
            raise OSError(errno.EMFILE, refusal, virtual)
        try:
            return OpenAnswer(os.dup(staged.fd), handle)
        except BaseException:
            self.discard(handle)
            raise

    def commit(self, handle: str) -> str:
        """Ask for the approval of what was written and put it in place; the summary."""
        with self._lock:
            staged = self._staged.pop(handle, None)
        if staged is None:
            raise KeyError(handle)
        assert self._toolset is not None
        try:
            return self._toolset.commit_write(staged, still_wanted=lambda: not self._closed).summary
        except ApprovalDeniedError as exc:
            raise PermissionError(errno.EACCES, str(exc), str(staged.vp)) from None
        except SandboxError as exc:
            raise PermissionError(errno.EACCES, str(exc), str(staged.vp)) from None

    def discard(self, handle: str) -> None:
        with self._lock:
            staged = self._staged.pop(handle, None)
        if staged is not None:
            staged.discard()

    def knows(self, handle: str) -> bool:
        with self._lock:
            return handle in self._staged

    def close(self) -> None:
        with self._lock:
            self._closed = True
            staged, self._staged = list(self._staged.values()), {}
        for write in staged:
            write.discard()
        if self._toolset is not None:
            self._toolset.close()  # its root descriptors, now rather than at garbage collection
