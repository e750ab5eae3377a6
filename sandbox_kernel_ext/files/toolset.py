"""File tools for LLM agents, confined to a Sandbox's virtual paths (the APIs of
filesystem-sandbox, ATLAS's filesystem_io, DeepAgents' file tools and orbiter).

Every operation: parse the virtual path, check the policy (grants, suffixes, sizes,
quotas), ask the approval broker where the path requires it, then do the I/O through a
backend that opens relative to the root's directory descriptor, so nothing checked
here can be swapped under it. Each operation runs under a time budget.
"""

from __future__ import annotations

import base64
import difflib
import errno
import mimetypes
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..approval.broker import ApprovalBroker
from ..approval.request import ApprovalRequest
from ..approval.responders import printable
from ..policy.credential_stores import never_read_inside
from ..policy.errors import (
    ConfigurationError,
    EditError,
    FilesystemError,
    FileTooLargeError,
    NotAFileError,
    PathExistsError,
    PathNotFoundError,
    PathNotInSandboxError,
    PathNotWritableError,
    QuotaExceededError,
    SandboxError,
    ToolError,
)
from ..policy.file_limits import FileLimits
from ..policy.models import CapabilityDeclaration
from ..policy.path_config import PathConfig, SandboxConfig
from ..policy.sandbox import Sandbox, VirtualPath
from ..policy.wording import byte_count
from ..policy.write_protected import WriteGuard
from .call_approval import CallApproval, call_key, leave_ticket, take_ticket
from .byte_streams import CHUNK, capped_lines, copy_at_most, read_chunks, looks_binary
from .backend import CHECK_EVERY, EntryInfo, EscapeRefused, FileBackend, WriteRefused
from .deadline import Deadline
from .glob_pattern import glob_matcher
from .host_backend import TEMP_SUFFIX, HostBackend, open_root
from .results import (
    ChangeResult,
    DirEntry,
    EditResult,
    FileView,
    ListResult,
    ReadResult,
    WriteResult,
)
from .storage_ledger import StorageLedger, ledger_for_host_root
from .store_backend import StoreBackend
from .text_slice import read_text_slice
from .tool_schemas import FILE_TOOLS, TOOLS_BY_NAME, ToolSpec, function_definition

_SNIFF = 8192
_PREVIEW_CHARS = 1500
_DIFF_BYTES = 4 * _PREVIEW_CHARS * 4  # larger files get their sizes, not a diff
_LOCK_STRIPES = 64

# Process-wide, keyed by the real root: two toolsets on one folder share the quota
# ledger, so they must also serialise on the same files or the deltas drift.
_stripes = [threading.Lock() for _ in range(_LOCK_STRIPES)]

# Who already approved the tool call running in this context (an approval wrapper), if anyone.
_call_approver: ContextVar[str | None] = ContextVar("sandbox_kernel_ext_call_approver", default=None)


@dataclass
class StagedWrite:
    """A write a sandboxed child makes through a descriptor (see `stage_write`): an unnamed
    temporary file, nowhere near the target until `commit_write` copies what was approved."""

    vp: VirtualPath
    config: PathConfig
    fd: int
    exclusive: bool = False

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _anonymous_file() -> int:
    """A descriptor of a file with no name (O_TMPFILE where the system has it): nothing is
    left behind, whoever dies."""
    with tempfile.TemporaryFile(buffering=0) as unnamed:
        return os.dup(unnamed.fileno())


@dataclass(frozen=True)
class _Location:
    """Where a virtual path's I/O happens: a backend confined to the granted prefix,
    the components below it, and the prefix's own components."""

    backend: FileBackend
    rel: tuple[str, ...]
    prefix: tuple[str, ...]


class FileSystemToolset:
    """Read, write, edit, delete, move, copy and list files inside a Sandbox.

    `limits` are merged with `SANDBOX_KERNEL_EXT_FS_*` environment variables (the
    stricter value wins). `broker` decides approval-gated paths; the default one denies
    with a clear message because nobody can be asked.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        id: str | None = None,
        max_retries: int = 1,
        *,
        broker: ApprovalBroker | None = None,
        limits: FileLimits | None = None,
    ) -> None:
        self._sandbox = sandbox
        self.id = id
        self.max_retries = max_retries
        self.broker = broker if broker is not None else ApprovalBroker()
        self.limits = FileLimits.effective(limits)
        self._backends: dict[tuple, FileBackend] = {}
        self._ledgers: dict[str | None, StorageLedger] = {}
        self._setup_lock = threading.RLock()
        # what runs outside any sandbox stays as it is inside the writable roots, as in a run
        writable = sandbox.host_write_roots()
        self._write_guard = WriteGuard(writable, sandbox.policy_file, writable) if writable else None

    # ---------------------------------------------------------------- building
    @classmethod
    def create_default(
        cls, root: str | Path, mode: str = "rw", id: str | None = None
    ) -> FileSystemToolset:
        """One root named `data` (virtual `/data`) on `root`. Writes there need no
        approval: the caller chose the folder."""
        if mode not in ("ro", "rw"):
            raise ConfigurationError(f"mode must be 'ro' or 'rw', not {mode!r}")
        config = SandboxConfig(paths={"data": PathConfig(root=str(root), mode=mode, write_approval=False)})
        return cls(Sandbox(config), id=id)

    @classmethod
    def from_policy(
        cls,
        policy: CapabilityDeclaration,
        *,
        id: str | None = None,
        broker: ApprovalBroker | None = None,
    ) -> FileSystemToolset:
        """The toolset a policy file's `paths`/`root` table and `file_limits` describe."""
        return cls(Sandbox.from_policy(policy), id=id, broker=broker, limits=policy.file_limits)

    @property
    def sandbox(self) -> Sandbox:
        return self._sandbox

    @property
    def source(self) -> str:
        return f"toolset:{self.id or 'filesystem'}"

    def close(self) -> None:
        with self._setup_lock:
            for backend in self._backends.values():
                backend.close()
            self._backends.clear()

    def __enter__(self) -> FileSystemToolset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing
    def _root_backend(self, vp: VirtualPath) -> FileBackend:
        key = (vp.root, ())
        backend = self._backends.get(key)
        if backend is not None:
            return backend
        with self._setup_lock:
            backend = self._backends.get(key)
            if backend is None:
                if self.limits.backend == "store":
                    backend = StoreBackend()
                else:
                    try:
                        root = self._sandbox.host_root(vp)  # resolved when it was read
                        backend = HostBackend(open_root(root), deny_symlinks=self.limits.deny_symlinks,
                                              hidden=never_read_inside(root, self._sandbox.never_read),
                                              write_guard=self._write_guard)
                    except OSError:
                        raise PathNotFoundError(str(vp.at(())), "is a root whose folder is missing or not a folder") from None
                self._backends[key] = backend
            return backend

    def _at(self, vp: VirtualPath, access: str) -> _Location:
        """The backend for `vp`: in a derived sandbox a host backend opened beneath the
        granted prefix, so a symlink inside the root cannot lead to an ungranted part."""
        prefix = self._sandbox.grant_prefix(vp, access).parts
        root = self._root_backend(vp)
        if not prefix or not isinstance(root, HostBackend):
            return _Location(root, vp.parts, ())
        key = (vp.root, prefix)
        backend = self._backends.get(key)
        if backend is None:
            with self._setup_lock:
                backend = self._backends.get(key)
                if backend is None:
                    with self._io(vp.at(prefix)):
                        backend = self._backends[key] = root.subtree(prefix)
        return _Location(backend, vp.parts[len(prefix) :], prefix)

    def _ledger(self, vp: VirtualPath) -> StorageLedger:
        ledger = self._ledgers.get(vp.root)
        if ledger is not None:
            return ledger
        with self._setup_lock:
            ledger = self._ledgers.get(vp.root)
            if ledger is None:
                backend = self._root_backend(vp)

                def measure() -> int:
                    deadline = Deadline(max(self.limits.operation_timeout, 30.0), "measuring the storage quota")
                    return sum(
                        i.size
                        for rel, i in backend.walk((), check=deadline.check)
                        if i.kind == "file" and not _is_temp(rel[-1])
                    )

                if isinstance(backend, HostBackend):
                    ledger = ledger_for_host_root(self._sandbox.host_root(vp), measure)
                else:
                    ledger = StorageLedger(measure)
                self._ledgers[vp.root] = ledger
            return ledger

    def _scope(self, vp: VirtualPath) -> str:
        """What a virtual path's root really is: one toolset's store, or a host folder."""
        if self.limits.backend == "store":
            return f"store:{id(self._root_backend(vp)):x}"
        return self._sandbox.host_root(vp)

    def _location(self, vp: VirtualPath) -> str:
        """The file on this machine, for the person approving (a store has none)."""
        if self.limits.backend == "store":
            return ""
        return os.path.join(self._sandbox.host_root(vp), *vp.parts)

    def _lock_key(self, vp: VirtualPath) -> tuple:
        return (self._scope(vp), vp.parts)

    @contextmanager
    def _path_lock(self, *vps: VirtualPath) -> Iterator[None]:
        """Serialise operations on the same files (across toolsets sharing a root) so
        quota deltas are exact."""
        stripes = sorted({hash(self._lock_key(vp)) % _LOCK_STRIPES for vp in vps})
        for i in stripes:
            _stripes[i].acquire()
        try:
            yield
        finally:
            for i in reversed(stripes):
                _stripes[i].release()

    @contextmanager
    def _io(self, vp: VirtualPath) -> Iterator[None]:
        """Turn backend errors into errors that name the virtual path."""
        try:
            yield
        except SandboxError:
            raise
        except EscapeRefused as exc:
            raise PathNotInSandboxError(
                str(vp), exc.reason, self._sandbox.readable_roots, self._sandbox.writable_roots
            ) from None
        except WriteRefused as exc:
            raise PathNotWritableError(str(vp), exc.reason, self._sandbox.writable_roots) from None
        except FileNotFoundError:
            raise PathNotFoundError(str(vp)) from None
        except IsADirectoryError:
            raise NotAFileError(str(vp)) from None
        except NotADirectoryError:
            raise PathNotFoundError(str(vp), "has a file where a folder was expected") from None
        except FileExistsError:
            raise PathExistsError(str(vp)) from None
        except OSError as exc:
            reason = "it is not a regular file" if exc.errno == errno.EINVAL else (exc.strerror or str(exc))
            raise FilesystemError(f"Cannot use '{vp}': {reason}.") from None

    def _deadline(self, what: str) -> Deadline:
        return Deadline(self.limits.operation_timeout, what)

    def _file_limit(self, config: PathConfig) -> int | None:
        limits = [x for x in (config.max_file_bytes, self.limits.max_file_bytes) if x is not None]
        return min(limits) if limits else None

    def _check_size(self, vp: VirtualPath, config: PathConfig, size: int) -> None:
        limit = self._file_limit(config)
        if limit is not None and size > limit:
            raise FileTooLargeError(str(vp), size, limit)

    def _prepare(self, path: str, access: str) -> tuple[VirtualPath, PathConfig]:
        vp = self._sandbox.parse(path)
        if access == "write":
            self._sandbox.check_write(vp)
        else:
            self._sandbox.check_read(vp)
        if not vp.parts:
            raise NotAFileError(str(vp), "it is a root folder: give a file path inside it")
        config = self._sandbox.path_config(vp)
        self._sandbox.check_suffix(vp.name, config)
        return vp, config

    def _approve(
        self, operation: str, vp: VirtualPath, access: str, size: int | None = None, summary: str = ""
    ) -> None:
        config = self._sandbox.path_config(vp)
        needed = config.write_approval if access == "write" else config.read_approval
        if needed:
            request = ApprovalRequest(
                operation=operation,
                path=str(vp),
                access=access,
                size=size,
                summary=summary,
                source=self.source,
                scope=self._scope(vp),
                location=self._location(vp),
            )
            approver = _call_approver.get()
            if approver is not None:
                self.broker.record_approved_elsewhere(request, approver)
            else:
                self.broker.check(request)

    def _info(self, vp: VirtualPath, access: str = "read") -> EntryInfo | None:
        with self._io(vp):
            where = self._at(vp, access)
            return where.backend.info(where.rel)

    def _open_read(self, vp: VirtualPath):
        with self._io(vp):
            where = self._at(vp, "read")
            return where.backend.open_read(where.rel)

    # --------------------------------------------------------------------- read
    def read(self, path: str, max_chars: int = 20_000, offset: int = 0) -> ReadResult:
        """A slice of a file: text as UTF-8, binary as base64. Never loads more than the
        slice (plus a one-time streamed index for large text files)."""
        if offset < 0 or max_chars < 0:
            raise FilesystemError("offset and max_chars must be zero or more")
        vp, config = self._prepare(path, "read")
        self._approve("read", vp, "read")
        deadline = self._deadline(f"reading '{vp}'")
        max_chars = min(max_chars, self.limits.max_read_bytes)  # a character is at least a byte
        with self._io(vp):
            f, info = self._open_read(vp)
            with f:
                self._check_size(vp, config, info.size)
                mime = mimetypes.guess_type(vp.name)[0]
                head = f.read(_SNIFF)
                if looks_binary(head, mime):
                    f.seek(min(offset, info.size))
                    data = f.read(max_chars)
                    return ReadResult(
                        content=base64.b64encode(data).decode("ascii"),
                        truncated=offset + len(data) < info.size,
                        total_chars=info.size,
                        offset=offset,
                        chars_read=len(data),
                        path=str(vp),
                        mime_type=mime or "application/octet-stream",
                        content_encoding="base64",
                    )
                piece = read_text_slice(
                    f,
                    size=info.size,
                    identity=info.identity,
                    offset=offset,
                    max_chars=max_chars,
                    max_bytes=self.limits.max_read_bytes,
                    check=deadline.check,
                )
        return ReadResult(
            content=piece.text,
            truncated=offset + len(piece.text) < piece.total_chars,
            total_chars=piece.total_chars,
            offset=offset,
            chars_read=len(piece.text),
            path=str(vp),
            mime_type=mime or "text/plain",
        )

    def view(self, path: str, start_line: int = 1, max_lines: int = 200) -> FileView:
        """Numbered lines from `start_line`, long lines capped (DeepAgents' read_file)."""
        if start_line < 1 or max_lines < 1:
            raise FilesystemError("start_line and max_lines must be 1 or more")
        vp, config = self._prepare(path, "read")
        self._approve("read", vp, "read")
        deadline = self._deadline(f"viewing '{vp}'")
        cap = self.limits.max_line_chars
        lines: list[str] = []
        budget = self.limits.max_read_bytes
        truncated = False
        number = 0
        with self._io(vp):
            f, info = self._open_read(vp)
            with f:
                self._check_size(vp, config, info.size)
                if looks_binary(f.read(_SNIFF), mimetypes.guess_type(vp.name)[0]):
                    raise FilesystemError(f"'{vp}' is binary; use read() to get it as base64.")
                f.seek(0)
                for number, (raw, dropped) in enumerate(capped_lines(f, cap * 4), start=1):
                    if number % 1024 == 0:
                        deadline.check()
                    if number < start_line:
                        continue
                    if len(lines) >= max_lines or budget <= 0:
                        truncated = True
                        break
                    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if len(text) > cap or dropped:
                        text = text[:cap] + "… [line cut]"
                    budget -= len(text)
                    lines.append(f"{number:6d}\t{text}")
        end = start_line + len(lines) - 1
        if info.size == 0:
            summary = f"{vp} is empty."
        elif not lines:
            summary = f"{vp} has only {number} lines; nothing from line {start_line}."
        else:
            more = f"; more follow, continue with start_line={end + 1}" if truncated else ""
            summary = f"Lines {start_line}-{end} of {vp}{more}."
        return FileView(
            path=str(vp), lines=lines, start_line=start_line, end_line=end, truncated=truncated, summary=summary
        )

    # -------------------------------------------------------------------- write
    def write(self, path: str, content: str) -> str:
        """Write a text file atomically; parent folders are created."""
        return self.write_file(path, content).summary

    def write_file(self, path: str, content: str | bytes) -> WriteResult:
        vp, config = self._prepare(path, "write")
        data = _encode(vp, content)
        self._check_write_size(vp, config, len(data))
        old = self._existing_file(vp)
        self._approve("write", vp, "write", len(data), self._change_summary(vp, old, data, len(data)))
        # Approvals happen before the lock (a person may take minutes); what the write
        # replaces is looked at again under it, so the quota delta is exact.
        with self._path_lock(vp):
            old = self._existing_file(vp)
            self._store(vp, [data], len(data), old, f"writing '{vp}'")
        verb = "Created" if old is None else "Overwrote"
        return WriteResult(
            path=str(vp),
            bytes_written=len(data),
            created=old is None,
            summary=f"{verb} {vp} ({byte_count(len(data))}).",
        )

    def _existing_file(self, vp: VirtualPath) -> EntryInfo | None:
        info = self._info(vp, "write")
        if info is not None and info.kind == "dir":
            raise NotAFileError(str(vp))
        return info

    def _check_write_size(self, vp: VirtualPath, config: PathConfig, size: int) -> None:
        if size > self.limits.max_write_bytes:
            raise QuotaExceededError(
                f"Cannot write '{vp}': {size:,} bytes is over the {self.limits.max_write_bytes:,}-byte "
                "limit for one write. Split the content into smaller files.",
                actual=size,
                limit=self.limits.max_write_bytes,
            )
        self._check_size(vp, config, size)

    def _store(
        self,
        vp: VirtualPath,
        chunks,
        size: int,
        old: EntryInfo | None,
        what: str,
    ) -> None:
        """Reserve quota, write atomically under the deadline, give quota back on failure."""
        ledger = self._ledger(vp)
        delta = size - (old.size if old is not None and old.kind == "file" else 0)
        ledger.reserve(delta, self.limits.max_total_bytes, f"Writing '{vp}'")
        deadline = self._deadline(what)
        try:
            where = self._at(vp, "write")
            with self._io(vp), where.backend.atomic_writer(where.rel) as out:
                for chunk in chunks:
                    for i in range(0, len(chunk), CHUNK):
                        deadline.check()
                        out.write(chunk[i : i + CHUNK])
        except BaseException:
            ledger.reserve(-delta, None, "")
            raise

    # ------------------------------------------- descriptors for a sandboxed child
    # A confined child cannot open an approval-gated file itself (Landlock's rules leave it
    # out); the runner asks here on its behalf and hands over a descriptor, so the policy's
    # checks, its approvals, quotas and atomic writes are the same as for the tools.
    def open_descriptor(self, path: str) -> tuple[int, int]:
        """(read-only descriptor, size) of a file, after the checks and the read approval."""
        vp, config = self._prepare(path, "read")
        info = self._info(vp)
        if info is None:
            raise PathNotFoundError(str(vp))
        self._check_size(vp, config, info.size)
        self._approve("read", vp, "read", info.size, f"open for reading, {byte_count(info.size)}")
        f, info = self._open_read(vp)
        with f:
            self._check_size(vp, config, info.size)
            return os.dup(f.fileno()), info.size

    def stage_write(self, path: str, *, keep_content: bool = False,
                    exclusive: bool = False) -> StagedWrite:
        """An unnamed temp file the child writes through its descriptor; `commit_write` asks
        for the approval with what was written, then puts a copy in place. `keep_content`
        starts it as a copy of the current file (append and update modes; that is a read,
        so a `read_approval` root asks for it first)."""
        vp, config = self._prepare(path, "write")
        if self.limits.backend == "store":
            raise FilesystemError(f"Cannot open '{vp}' for a sandboxed process: its root is an "
                                  "in-memory store, not a folder")
        old = self._existing_file(vp)
        if exclusive and old is not None:
            raise PathExistsError(str(vp))
        fd = _anonymous_file()
        try:
            if keep_content and old is not None:
                self._approve("read", vp, "read", old.size,
                              f"open for updating, {byte_count(old.size)} (its content is read)")
                f, info = self._open_read(vp)
                with f:
                    self._check_write_size(vp, config, info.size)
                    for chunk in read_chunks(f, info.size):
                        os.write(fd, chunk)
                os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return StagedWrite(vp, config, fd, exclusive)

    def commit_write(
        self, write: StagedWrite, *, still_wanted: Callable[[], bool] | None = None
    ) -> WriteResult:
        """Snapshot what the child wrote (it keeps its descriptor, so only a copy it cannot
        touch is shown, checked and written), ask for the approval with that diff, then write
        the copy atomically. On any refusal nothing at the path changes. `still_wanted` is
        asked after the approval (a person may take minutes): False discards."""
        vp, config = write.vp, write.config
        snapshot = -1
        try:
            size = os.fstat(write.fd).st_size
            self._check_write_size(vp, config, size)
            snapshot = _anonymous_file()
            copied = copy_at_most(write.fd, snapshot, size)
            write.discard()
            old = self._existing_file(vp)
            head = os.pread(snapshot, min(copied, _DIFF_BYTES + 1), 0)
            summary = self._change_summary(vp, old, head, copied)
            self._approve("write", vp, "write", copied, summary)
            if still_wanted is not None and not still_wanted():
                raise FilesystemError(f"Cannot write '{vp}': the writer is gone.")
            with self._path_lock(vp):
                old = self._existing_file(vp)
                ledger = self._ledger(vp)
                delta = copied - (old.size if old is not None and old.kind == "file" else 0)
                ledger.reserve(delta, self.limits.max_total_bytes, f"Writing '{vp}'")
                try:
                    where = self._at(vp, "write")
                    with self._io(vp), where.backend.atomic_writer(
                            where.rel, exclusive=write.exclusive) as out:
                        for offset in range(0, copied, CHUNK):
                            out.write(os.pread(snapshot, min(CHUNK, copied - offset), offset))
                except BaseException:
                    ledger.reserve(-delta, None, "")
                    raise
        finally:
            write.discard()
            if snapshot >= 0:
                os.close(snapshot)
        verb = "Created" if old is None else "Overwrote"
        return WriteResult(path=str(vp), bytes_written=copied, created=old is None,
                           summary=f"{verb} {vp} ({byte_count(copied)}).")

    def _read_text(self, vp: VirtualPath, config: PathConfig, what: str) -> tuple[str, EntryInfo]:
        """A whole (size-checked) text file, read in chunks under the time budget."""
        deadline = self._deadline(what)
        with self._io(vp):
            f, info = self._open_read(vp)
            with f:
                self._check_size(vp, config, info.size)
                parts = []
                for chunk in read_chunks(f, info.size):
                    deadline.check()
                    parts.append(chunk)
        try:
            return b"".join(parts).decode("utf-8"), info
        except UnicodeDecodeError:
            raise FilesystemError(f"Cannot edit '{vp}': it is not UTF-8 text.") from None

    def _change_summary(self, vp: VirtualPath, old: EntryInfo | None, data: bytes, size: int) -> str:
        """A preview (new file) or unified diff (replacement) for the person approving, of a
        `size`-byte write whose first bytes are `data`. What it leaves out, it says it left out:
        a person must never approve a hunk they were not shown without being told."""
        if not self._sandbox.path_config(vp).write_approval:
            return ""
        if old is None or old.kind != "file":
            head = data[:_PREVIEW_CHARS]
            preview = f"new file, {byte_count(size)}:\n{head.decode('utf-8', errors='replace')}"
            if size > len(head):
                preview += f"\n[… preview ends here: {size - len(head):,} more bytes not shown]"
            return preview
        if old.size > _DIFF_BYTES or size > _DIFF_BYTES:
            return (f"replaces {byte_count(old.size)} with {byte_count(size)} "
                    f"(a diff is shown only for files up to {_DIFF_BYTES:,} bytes)")
        with self._io(vp):
            f, _ = self._open_read(vp)
            with f:
                before = f.read(_DIFF_BYTES).decode("utf-8", errors="replace")
        diff = difflib.unified_diff(
            before.splitlines(), data.decode("utf-8", errors="replace").splitlines(), "before", "after", lineterm="", n=1
        )
        return _cut("\n".join(diff), "the diff goes on") or "no change"

    def edit(self, path: str, old_text: str, new_text: str) -> str:
        """Replace `old_text`, which must occur exactly once."""
        return self.edit_file(path, old_text, new_text).summary

    def edit_file(self, path: str, old_text: str, new_text: str) -> EditResult:
        vp, config = self._prepare(path, "write")
        if not old_text:
            raise EditError(str(vp), 0)
        # The match count tells something about the content, so a read gate applies too.
        self._approve("read", vp, "read")
        text, _ = self._read_text(vp, config, f"editing '{vp}'")
        matches = text.count(old_text)
        if matches != 1:
            raise EditError(str(vp), matches)
        data = _encode(vp, text.replace(old_text, new_text, 1))
        self._check_write_size(vp, config, len(data))
        summary = "\n".join(
            difflib.unified_diff(old_text.splitlines(), new_text.splitlines(), "before", "after", lineterm="", n=1)
        )
        self._approve("edit", vp, "write", len(data), _cut(summary, "the diff goes on"))
        with self._path_lock(vp):
            now, info = self._read_text(vp, config, f"editing '{vp}'")
            if now != text:
                raise FilesystemError(
                    f"'{vp}' changed while the edit waited for approval; read it again and retry."
                )
            self._store(vp, [data], len(data), info, f"editing '{vp}'")
        return EditResult(path=str(vp), replaced=1, summary=f"Edited {vp}: replaced 1 occurrence.")

    # ----------------------------------------------------------------- changes
    def delete(self, path: str) -> str:
        """Delete a file (folders are refused)."""
        return self.delete_file(path).summary

    def delete_file(self, path: str) -> ChangeResult:
        vp, _ = self._prepare(path, "write")
        info = self._file_entry(vp, "write", "delete")
        self._approve("delete", vp, "write", info.size, f"delete {byte_count(info.size)}")
        with self._path_lock(vp):
            info = self._file_entry(vp, "write", "delete")
            with self._io(vp):
                where = self._at(vp, "write")
                where.backend.delete(where.rel)
            if info.kind == "file":
                self._ledger(vp).reserve(-info.size, None, "")
        return ChangeResult(path=str(vp), summary=f"Deleted {vp}.")

    def move(self, source: str, destination: str) -> str:
        """Move or rename a file; refuses to overwrite an existing destination."""
        return self.move_file(source, destination).summary

    def move_file(self, source: str, destination: str) -> ChangeResult:
        return self._transfer(source, destination, remove_source=True)

    def copy(self, source: str, destination: str) -> str:
        """Copy a file; the source may be read-only, the destination must be writable."""
        return self.copy_file(source, destination).summary

    def copy_file(self, source: str, destination: str) -> ChangeResult:
        return self._transfer(source, destination, remove_source=False)

    def _transfer(self, source: str, destination: str, *, remove_source: bool) -> ChangeResult:
        op = "move" if remove_source else "copy"
        src_access = "write" if remove_source else "read"
        src, src_config = self._prepare(source, src_access)
        dst, dst_config = self._prepare(destination, "write")
        self._file_entry(src, src_access, op)
        self._transfer_target(dst, op)
        # Sizes come from the opened file, not the entry: a symlink's own size says
        # nothing about the bytes a copy would store. The open file is what gets copied.
        f, info = self._open_read(src)
        with f:
            self._check_size(src, src_config, info.size)
            self._check_size(dst, dst_config, info.size)
            if remove_source:
                self._approve("move", src, "write", info.size, f"move to {dst}")
            if not remove_source or src.root != dst.root:
                # Content leaving its root is a read of it, gated like any read.
                self._approve(op, src, "read", info.size, f"{op} to {dst}")
            self._approve(op, dst, "write", info.size, f"{op} from {src} ({info.size:,} bytes)")
            with self._path_lock(src, dst):
                entry = self._file_entry(src, src_access, op)
                self._transfer_target(dst, op)
                here, there = self._at(src, src_access), self._at(dst, "write")
                if remove_source and here.backend is there.backend:
                    with self._io(dst):
                        here.backend.rename(here.rel, there.rel)
                else:
                    self._store(dst, read_chunks(f, info.size), info.size, None, f"{op} to '{dst}'")
                    if remove_source:
                        with self._io(src):
                            here.backend.delete(here.rel)
                        if entry.kind == "file":
                            self._ledger(src).reserve(-entry.size, None, "")
        verb = "Moved" if remove_source else "Copied"
        return ChangeResult(path=str(dst), source=str(src), summary=f"{verb} {src} to {dst}.")

    def _file_entry(self, vp: VirtualPath, access: str, op: str) -> EntryInfo:
        """The existing file `op` (delete, move, copy) acts on; folders are refused."""
        entry = self._info(vp, access)
        if entry is None:
            raise PathNotFoundError(str(vp))
        if entry.kind == "dir":
            raise NotAFileError(str(vp), f"{op} works on files only")
        return entry

    def _transfer_target(self, dst: VirtualPath, op: str) -> None:
        if self._info(dst, "write") is not None:
            raise PathExistsError(str(dst), f"{op} to")

    # -------------------------------------------------------------------- lists
    def list_files(self, path: str = ".", pattern: str = "**/*") -> list[str]:
        """Virtual paths of files under `path` whose path relative to it matches the glob
        `pattern` (`**` spans folders; a pattern without `/` or `**` stays in `path`)."""
        return self.find_files(path, pattern).files

    def find_files(self, path: str = ".", pattern: str = "**/*") -> ListResult:
        try:
            matcher = glob_matcher(pattern)
        except re.error as exc:
            raise FilesystemError(f"'{pattern}' is not a valid glob pattern ({exc}).") from None
        recursive = "/" in pattern or "**" in pattern
        top = self._sandbox.parse(path)
        bases = self._listing_bases(top)
        deadline = self._deadline(f"listing '{top}'")
        limit = self.limits.max_list_entries
        found: list[str] = []
        for base in bases:
            with self._io(base):
                where = self._at(base, "read")
                config = self._sandbox.path_config(base)
                if recursive:
                    entries = where.backend.walk(where.rel, check=deadline.check, detail=False)
                else:
                    listing = where.backend.scandir(where.rel, check=deadline.check, detail=False)
                    entries = ((where.rel + (n,), i) for n, i in listing)
                # Matched relative to `top`, with the root name when listing every root.
                skip = len(top.parts) - len(where.prefix)
                head = str(base.at(())).rstrip("/") + "/"  # 'data/' (or '/' for a single root)
                with closing(entries):
                    for count, (rel, info) in enumerate(entries, start=1):
                        if count % CHECK_EVERY == 0:
                            deadline.check()
                        if info.kind == "dir" or _is_temp(rel[-1]):
                            continue
                        full = where.prefix + rel
                        shown = "/".join((base.root, *full) if top.is_top else rel[skip:])
                        if not matcher(shown) or (config.suffixes is not None and not Sandbox.suffix_allowed(rel[-1], config)):
                            continue
                        found.append(head + "/".join(full))
                        if len(found) > limit:
                            raise _too_many(f"More than {limit:,} files match '{pattern}' under '{top}'; "
                                            "use a narrower path or pattern.", len(found), limit)
        found.sort()  # as filesystem-sandbox returns them: the same listing, the same order
        return ListResult(files=found, summary=f"{len(found)} file(s) match '{pattern}' under '{top}'.")

    def _listing_bases(self, top: VirtualPath) -> list[VirtualPath]:
        if not top.is_top:
            self._sandbox.check_read(top)
            return [top]
        return [self._sandbox.parse(r) for r in self._sandbox.readable_roots]

    def list_directory(self, path: str = ".") -> list[DirEntry]:
        """One folder's entries with their types (the top level lists the roots)."""
        top = self._sandbox.parse(path)
        if top.is_top:
            return [DirEntry(name=r.lstrip("/"), type="dir", size=0) for r in self._sandbox.readable_roots]
        self._sandbox.check_read(top)
        limit = self.limits.max_list_entries
        deadline = self._deadline(f"listing '{top}'")
        with self._io(top):
            where = self._at(top, "read")
            entries = [
                (n, i) for n, i in where.backend.scandir(where.rel, check=deadline.check) if not _is_temp(n)
            ]
        deadline.check()  # a backend that cannot stop mid-folder is still held to the budget
        if len(entries) > limit:
            raise _too_many(f"'{top}' has {len(entries):,} entries, more than the {limit:,} one listing "
                            "may return; use list_files with a pattern.", len(entries), limit)
        return [DirEntry(name=n, type=i.kind, size=i.size) for n, i in entries]

    # ------------------------------------------------------------- LLM tools
    def tool_definitions(self) -> list[dict[str, Any]]:
        """Function-calling definitions of every tool this sandbox can use (write tools
        are left out when nothing is writable)."""
        roots = self._sandbox.readable_roots
        writable = self._sandbox.writable_roots
        context = f"Readable: {', '.join(roots) or 'nothing'}. Writable: {', '.join(writable) or 'nothing'}."
        return [
            function_definition(spec, context) for spec in FILE_TOOLS if writable or not spec.writes
        ]

    def call(
        self,
        name: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        approved_by: str | None = None,
    ) -> dict[str, Any]:
        """Run a tool call from a model: validate the arguments against the tool's schema
        and return the typed result as JSON-safe data. Policy refusals raise SandboxError
        subclasses whose messages are written for the model.

        `approved_by` names who already approved this whole call (an approval wrapper): the
        toolset then logs that answer instead of asking its broker. A call that follows this
        toolset's own `needs_approval` for the same tool and arguments counts as approved by
        the wrapper that asked (see `call_approval`)."""
        spec, args = self._tool_call(name, arguments)
        if approved_by is None and take_ticket(call_key(self, name, arguments)):
            approved_by = "the approval wrapper"
        token = _call_approver.set(approved_by)
        try:
            result = getattr(self, spec.method)(**args.model_dump())
        finally:
            _call_approver.reset(token)
        if isinstance(result, list):
            return {"entries": [entry.model_dump() for entry in result]}
        return result.model_dump()

    @staticmethod
    def _tool_call(name: str, arguments: dict[str, Any] | str | None) -> tuple[ToolSpec, Any]:
        """The tool's spec and its validated arguments; ToolError naming what is wrong."""
        spec = TOOLS_BY_NAME.get(name)
        if spec is None:
            raise ToolError(f"Unknown tool '{name}'. Tools: {', '.join(TOOLS_BY_NAME)}.")
        try:
            args = (
                spec.args.model_validate_json(arguments)
                if isinstance(arguments, str)
                else spec.args.model_validate(arguments or {})
            )
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolError(f"Bad arguments for {name}: {problems}.") from None
        return spec, args

    # ------------------------------------------------ approval wrappers (PydanticAI)
    def approval_status(self, name: str, tool_args: dict[str, Any] | str | None) -> CallApproval:
        """What a call needs, from the policy alone (no file is touched): blocked (with the
        refusal the call itself would give), pre-approved, or a person's approval."""
        try:
            spec, args = self._tool_call(name, tool_args)
        except ToolError as exc:
            return CallApproval.blocked(str(exc))
        asks = False
        for argument, access in spec.gates:
            try:
                vp = self._sandbox.parse(getattr(args, argument))
                if access == "write":
                    self._sandbox.check_write(vp)
                else:
                    self._sandbox.check_read(vp)
                config = self._sandbox.path_config(vp)
                self._sandbox.check_suffix(vp.name, config)
            except SandboxError as exc:
                return CallApproval.blocked(str(exc))
            asks = asks or (config.write_approval if access == "write" else config.read_approval)
        return CallApproval.needs_approval() if asks else CallApproval.pre_approved()

    def needs_approval(
        self, name: str, tool_args: dict[str, Any], ctx: Any = None, config: Any = None
    ) -> Any:
        """The approval-wrapper protocol (`SupportsNeedsApproval`): this call's status. When
        it needs a person, the wrapper asks, and the call it then makes is not asked again."""
        status = self.approval_status(name, tool_args)
        leave_ticket(call_key(self, name, tool_args) if status.is_needs_approval else None)
        return status.for_wrapper()

    def get_approval_description(self, name: str, tool_args: dict[str, Any], ctx: Any = None) -> str:
        """The approval-wrapper protocol (`SupportsApprovalDescription`): one line for the
        person deciding, naming paths as this toolset spells them."""
        args = tool_args if isinstance(tool_args, dict) else {}

        def shown(key: str) -> str:
            # The model chose the path: escaped, so control and bidi characters cannot
            # redraw the prompt the person answers.
            value = args.get(key, ".")
            try:
                return printable(str(self._sandbox.parse(value)))
            except SandboxError:
                return printable(repr(value))

        def chars(key: str) -> int:
            value = args.get(key)
            return len(value) if isinstance(value, str) else 0

        describe = {
            "read_file": lambda: f"Read from {shown('path')}",
            "view_file": lambda: f"Read from {shown('path')}",
            "write_file": lambda: f"Write {chars('content'):,} chars to {shown('path')}",
            "edit_file": lambda: f"Edit {shown('path')}: replace {chars('old_text'):,} chars "
                                 f"with {chars('new_text'):,} chars",
            "delete_file": lambda: f"Delete {shown('path')}",
            "move_file": lambda: f"Move {shown('source')} to {shown('destination')}",
            "copy_file": lambda: f"Copy {shown('source')} to {shown('destination')}",
            "list_files": lambda: f"List files in {shown('path')} matching "
                                  f"{printable(repr(args.get('pattern', '**/*')))}",
            "list_directory": lambda: f"List {shown('path')}",
        }.get(name)
        if describe is not None:
            return describe()
        return printable(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})")

    def storage_used(self, path: str) -> int:
        """Bytes the quota ledger counts for the root holding `path`."""
        vp = self._sandbox.parse(path)
        with self._io(vp):
            return self._ledger(vp).used

    def rescan_storage(self, path: str) -> int:
        """Measure the root holding `path` again (after changes made behind the toolset's
        back) and return the new count."""
        vp = self._sandbox.parse(path)
        with self._io(vp):
            ledger = self._ledger(vp)
            ledger.refresh()
            return ledger.used

    def __repr__(self) -> str:
        return f"FileSystemToolset(id={self.id!r}, {self._sandbox!r}, backend={self.limits.backend!r})"


def _cut(text: str, goes_on: str) -> str:
    """`text` up to the preview's length, saying how much was left out."""
    if len(text) <= _PREVIEW_CHARS:
        return text
    return f"{text[:_PREVIEW_CHARS]}\n[… {goes_on}: {len(text) - _PREVIEW_CHARS:,} more characters not shown]"


def _encode(vp: VirtualPath, content: str | bytes) -> bytes:
    if isinstance(content, str):
        try:
            return content.encode("utf-8")
        except UnicodeEncodeError:
            raise FilesystemError(f"Cannot write '{vp}': the content is not valid Unicode text.") from None
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    raise TypeError(f"content must be str or bytes, not {type(content).__name__}")


def _too_many(message: str, count: int, limit: int) -> QuotaExceededError:
    return QuotaExceededError(message, actual=count, limit=limit)


def _is_temp(name: str) -> bool:
    """An unfinished write's temp file (left by a crash): never listed or counted."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)
