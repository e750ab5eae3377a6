"""ATLAS's async handlers: JSON-ready dicts for a tool router.

The sandbox root comes from `SANDBOX_KERNEL_EXT_FS_ROOT` or ATLAS's own
`ATLAS_FILESYSTEM_SANDBOX` (default: the working directory) and the quotas from the other
`SANDBOX_KERNEL_EXT_FS_*` variables or ATLAS's names for them, read on every call as the seed
does. The root is virtual `/`; paths are relative to it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ..policy.errors import (
    ConfigurationError,
    MissingPathError,
    PathNotFoundError,
    SandboxViolationError,
)
from ..policy.file_limits import ENV_PREFIX
from ..policy.path_config import RootSandboxConfig, SandboxConfig
from ..policy.sandbox import Sandbox
from .toolset import FileSystemToolset

ROOT_VARIABLE = ENV_PREFIX + "ROOT"
ROOT_VARIABLES = (ROOT_VARIABLE, "ATLAS_FILESYSTEM_SANDBOX")
T = TypeVar("T")


def _root() -> str:
    """The root the environment names (the working directory when none does); two names
    for two different folders are refused rather than one silently chosen."""
    named = {var: os.environ[var] for var in ROOT_VARIABLES if os.environ.get(var)}
    if len({os.path.realpath(path) for path in named.values()}) > 1:
        raise ConfigurationError(
            "the sandbox root is set twice, to different folders: "
            + ", ".join(f"{var}={path!r}" for var, path in named.items()) + "; keep one")
    var, root = next(iter(named.items()), (ROOT_VARIABLE, os.getcwd()))
    if not os.path.isdir(root):
        raise SandboxViolationError(f"the sandbox root set by {var} is not a directory")
    return root


def _toolset() -> FileSystemToolset:
    root = _root()
    return FileSystemToolset(Sandbox(SandboxConfig(root=RootSandboxConfig(root=root))), id="filesystem")


async def _run(work: Callable[[FileSystemToolset], T]) -> T:
    def call() -> T:
        with _toolset() as toolset:
            try:
                return work(toolset)
            except PathNotFoundError as exc:  # ATLAS reports a missing path as a violation
                raise MissingPathError(exc.path, exc.what) from None

    return await asyncio.to_thread(call)


async def filesystem_read(path: str, offset: int = 0, max_chars: int | None = None) -> dict[str, Any]:
    """A file's content with its MIME type; binary content is base64 (`content_encoding`)."""

    def work(t: FileSystemToolset) -> dict[str, Any]:
        limit = t.limits.max_read_bytes if max_chars is None else max_chars
        return t.read(path, max_chars=limit, offset=offset).model_dump()

    return await _run(work)


async def filesystem_write(path: str, content: str) -> dict[str, Any]:
    """Create or replace a file atomically, within the per-write and total quotas."""
    return await _run(lambda t: t.write_file(path, content).model_dump())


async def filesystem_list(path: str = ".") -> dict[str, Any]:
    """One folder's entries with type and size."""

    def work(t: FileSystemToolset) -> dict[str, Any]:
        entries = t.list_directory(path)
        return {"path": str(t.sandbox.parse(path)), "entries": [e.model_dump() for e in entries]}

    return await _run(work)
