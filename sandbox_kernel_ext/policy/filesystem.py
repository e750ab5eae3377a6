"""aumai-sandbox's path checks for `FilesystemConfig`, with containment done right.

This is a logic-layer answer ("would the policy allow this?") for tools and for
explaining denials; it opens nothing, and a check here can race with a later open.
The runner enforces the same config in the Linux kernel (Landlock), which is what
actually confines a sandboxed process.

| mode         | reads                                            | writes                         |
|--------------|--------------------------------------------------|--------------------------------|
| `none`       | nothing                                          | nothing                        |
| `read_only`  | everywhere, or only `readable_paths` if given    | nothing                        |
| `read_write` | everywhere, or `readable_paths` + `writable_paths` | `writable_paths` |

An empty `writable_paths` in `read_write` mode means writes are allowed everywhere: that
is the seed's meaning, kept for compatibility; policies should list their paths. With
`readable_paths` set, only explicitly listed writable paths are added to the reads, not
"everywhere". Whatever the mode, nothing in `never_read_paths` is read or written: those
stores win over the paths above (the built-in credential list is the runner's and the
toolset's to apply; this answer knows only the policy's own).
"""

from __future__ import annotations

import os
from typing import Literal

from .credential_stores import store_paths
from .models import FilesystemConfig, FilesystemMode

__all__ = ["FilesystemPolicy", "validate_path_access"]

AccessMode = Literal["read", "write"]
_MODES = ("read", "write")


class _Root:
    """A configured path in both forms a candidate is compared with."""

    def __init__(self, path: str) -> None:
        self.shown = path
        self.lexical = _components(_lexical(path))
        self.real = _components(os.path.realpath(path))

    def contains(self, lexical: tuple[str, ...], real: tuple[str, ...]) -> bool:
        return _within(lexical, self.lexical) and _within(real, self.real)


def _lexical(path: str) -> str:
    """Absolute and `..`-collapsed by name only; relative paths are relative to the cwd."""
    return os.path.normpath(os.path.abspath(path))


def _components(path: str) -> tuple[str, ...]:
    """Path components, so `/tmp/work2` is not mistaken for a child of `/tmp/work`."""
    return tuple(part for part in path.split(os.sep) if part)


def _within(path: tuple[str, ...], root: tuple[str, ...]) -> bool:
    return path[: len(root)] == root


class FilesystemPolicy:
    """Answers read and write questions for one `FilesystemConfig`.

    A path is inside a configured path only if it is inside it both by name (after
    collapsing `..`) and after resolving symlinks (`os.path.realpath`, which also
    resolves the existing parents of a path that does not exist yet). So neither
    `/tmp/work/../etc/passwd` nor a symlink in `/tmp/work` pointing at `/etc` gets out.
    Configured paths are resolved once, when the policy is built.
    """

    def __init__(self, config: FilesystemConfig) -> None:
        self._config = config
        self._writable = [_Root(path) for path in config.writable_paths]
        readable = config.readable_paths
        self._readable = None if readable is None else [_Root(p) for p in readable]
        # by name, the folders above resolved: a link at a store's name denies not its target
        self._stores = [(p, _components(p)) for p in store_paths(config.never_read_paths)]

    @property
    def config(self) -> FilesystemConfig:
        return self._config

    def can_read(self, path: str | os.PathLike[str]) -> bool:
        return self.deny_reason(path, "read") is None

    def can_write(self, path: str | os.PathLike[str]) -> bool:
        return self.deny_reason(path, "write") is None

    def deny_reason(self, path: str | os.PathLike[str], mode: str) -> str | None:
        """Why `mode` access to `path` is refused, or None when it is allowed."""
        if mode not in _MODES:
            raise ValueError(f"mode must be 'read' or 'write', not {mode!r}")
        fs_mode = self._config.mode
        if fs_mode is FilesystemMode.none:
            return "filesystem access is disabled (mode is none)"
        if mode == "write" and fs_mode is FilesystemMode.read_only:
            return "writes are not allowed (mode is read_only)"
        try:
            text = os.fspath(path)
            if not isinstance(text, str) or not text:
                raise ValueError("path must be a non-empty string")
            lexical = _lexical(text)
            real = os.path.realpath(text)
        except (TypeError, ValueError) as exc:  # wrong type, NUL byte
            return f"invalid path {path!r}: {exc}"

        lexical_parts, real_parts = _components(lexical), _components(real)
        store = next((shown for shown, parts in self._stores
                      if _within(lexical_parts, parts) or _within(real_parts, parts)), None)
        if store is not None:
            target = lexical if lexical == real else f"{lexical} (resolves to {real})"
            return f"{target} is in never_read_paths ({store}): no sandbox reads it"
        roots = self._roots_for(mode)
        if roots is None:
            return None
        if any(root.contains(lexical_parts, real_parts) for root in roots):
            return None
        kind = "writable" if mode == "write" else "readable"
        allowed = ", ".join(root.shown for root in roots) or "none"
        target = lexical if lexical == real else f"{lexical} (resolves to {real})"
        return f"{target} is outside the {kind} paths ({allowed})"

    def _roots_for(self, mode: AccessMode) -> list[_Root] | None:
        """The paths that bound `mode` access; None means no bound (mode already checked)."""
        if mode == "write":
            return self._writable or None
        if self._readable is None:
            return None
        return [*self._readable, *self._writable]


def validate_path_access(
    path: str | os.PathLike[str], mode: str, config: FilesystemConfig
) -> bool:
    """Whether `path` may be accessed in `mode` ('read' or 'write') under `config`."""
    return FilesystemPolicy(config).deny_reason(path, mode) is None
