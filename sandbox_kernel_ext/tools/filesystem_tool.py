"""orbiter's `FilesystemTool`: a host-path facade over the file layer's toolset."""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any, ClassVar

from ..files.toolset import FileSystemToolset
from ..policy.errors import SandboxError, ToolError
from ..policy.file_limits import FileLimits
from ..policy.path_config import PathConfig, SandboxConfig
from ..policy.sandbox import Sandbox, is_within
from .base import Tool


# A root's name as messages spell it (`d0/a.txt`, `'d0'`, `Readable: d0, d1.`), never a
# component further along a path (`d0/d1.txt`) or part of a longer word.
_VIRTUAL_NAME = re.compile(r"(?<![\w/.\-])(d\d+)(?![\w\-])")


class FilesystemTool(Tool):
    """Read, write or list files inside `allowed_directories` (host paths).

    Unlike orbiter, `None` or an empty list does not allow everything: it allows only
    the current working directory. Paths are checked by the toolset's race-free I/O, so
    a symlink inside an allowed directory cannot lead out of it.
    """

    name = "filesystem"
    description = "Read, write, or list files within the sandbox workspace."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": ["read", "write", "list"],
                "description": "Filesystem action to perform.",
            },
            "path": {"type": "string", "description": "Absolute or relative file/directory path."},
            "content": {"type": "string", "description": "Content to write (required for 'write' action)."},
        },
        "required": ["action", "path"],
    }

    def __init__(self, allowed_directories: list[str] | None = None, *, limits: FileLimits | None = None) -> None:
        real = {os.path.realpath(d) for d in (allowed_directories or [os.getcwd()])}
        # A directory inside another allowed one adds nothing and would overlap it.
        dirs = sorted(d for d in real if not any(o != d and is_within(d, o) for o in real))
        self.allowed_directories = dirs
        self._names = {f"d{i}": d for i, d in enumerate(dirs)}
        config = SandboxConfig(
            paths={name: PathConfig(root=d, mode="rw", write_approval=False) for name, d in self._names.items()}
        )
        self.toolset = FileSystemToolset(Sandbox(config), id=self.name, limits=limits)

    def _virtual(self, path: str) -> str:
        host = os.path.realpath(os.path.join(os.getcwd(), os.path.expanduser(path)))
        best = None
        for name, root in self._names.items():
            if is_within(host, root) and (
                best is None or len(root) > len(self._names[best])
            ):
                best = name
        if best is None:
            raise ToolError(
                f"Path '{path}' is outside the allowed directories: {', '.join(self.allowed_directories)}."
            )
        rel = os.path.relpath(host, self._names[best])
        return f"/{best}" + ("" if rel == "." else f"/{rel}")

    async def execute(self, **kwargs: Any) -> str | dict[str, Any]:
        action = kwargs.get("action")
        path = kwargs.get("path")
        if not isinstance(path, str) or not path:
            raise ToolError("'path' is required and must be a non-empty string.")
        if action not in ("read", "write", "list"):
            raise ToolError(f"Unknown action {action!r}; use 'read', 'write' or 'list'.")
        content = kwargs.get("content")
        if action == "write" and not isinstance(content, str):
            raise ToolError("'content' (a string) is required for the 'write' action.")
        vpath = self._virtual(path)
        try:
            return await asyncio.to_thread(self._run, action, path, vpath, content)
        except (SandboxError, OSError, ValueError) as exc:
            raise ToolError(f"{action} of '{path}' failed: {self._host_names(str(exc))}") from exc

    def _host_names(self, message: str) -> str:
        """Say the model's own (host) paths instead of the toolset's virtual `dN` names."""
        return _VIRTUAL_NAME.sub(lambda m: self._names.get(m.group(1), m.group(0)), message)

    def _run(self, action: str, path: str, vpath: str, content: str | None) -> str | dict[str, Any]:
        if action == "read":
            result = self.toolset.read(vpath, max_chars=self.toolset.limits.max_read_bytes)
            note = (
                f"\n[truncated: showed {result.chars_read:,} of {result.total_chars:,} characters]"
                if result.truncated
                else ""
            )
            return result.content + note
        if action == "write":
            self.toolset.write(vpath, content or "")
            return f"Wrote {len(content or ''):,} chars to {path}"
        entries = self.toolset.list_directory(vpath)
        return {"directory": path, "entries": [{"name": e.name, "type": e.type} for e in entries]}
