"""Virtual paths and permission checks (filesystem-sandbox). Reads no file content: `resolve`
follows symlinks with realpath, and I/O itself is the file backends' job.

A virtual path is `<name>/rel/path` in multi-path mode and `/rel/path` in single-root mode,
as filesystem-sandbox spells them; input may be written either way (`/data/a.txt` and
`data/a.txt`, `/a.txt` and `a.txt` name the same file), and everything this package returns
or says uses those spellings, so a path a model reads can be passed back as it is. Checks here decide what
the policy allows; the file backends below enforce it race-free when they open files.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from .errors import (
    ConfigurationError,
    FileTooLargeError,
    PathNotInSandboxError,
    PathNotWritableError,
    SandboxPermissionEscalationError,
    SuffixNotAllowedError,
)
from .path_config import PathConfig, SandboxConfig
from .credential_stores import policy_stores, store_link_refusal
from .paths import is_within

if TYPE_CHECKING:
    from .models import CapabilityDeclaration


@dataclass(frozen=True)
class VirtualPath:
    """A parsed virtual path: the root's name (None in single-root mode) and components."""

    root: str | None
    parts: tuple[str, ...]

    @property
    def is_top(self) -> bool:
        """True for `/` in multi-path mode: above every root, inside none."""
        return self.root is None and not self.parts and self._multi

    _multi: bool = False

    def __str__(self) -> str:
        """filesystem-sandbox's spelling: `data/sub/a.txt` under a named root, `/sub/a.txt`
        in single-root mode, `.` for the top level above the named roots."""
        if self.root is not None:
            return "/".join((self.root, *self.parts))
        if self._multi:
            return "."
        return "/" + "/".join(self.parts)

    def contains(self, other: VirtualPath) -> bool:
        return (
            self.root == other.root
            and other.parts[: len(self.parts)] == self.parts
            and not self.is_top
        )

    def at(self, parts: tuple[str, ...]) -> VirtualPath:
        """Another path in the same root."""
        return VirtualPath(self.root, parts, self._multi)

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else ""


@dataclass(frozen=True)
class _Root:
    name: str | None
    host: str  # real path of the root directory
    config: PathConfig


@dataclass(frozen=True)
class _Grant:
    """What a derived sandbox may touch, as virtual prefixes, with the real host path
    of each so a symlink inside a root cannot lead from one prefix to another."""

    read: tuple[VirtualPath, ...]
    write: tuple[VirtualPath, ...]
    readonly: bool
    hosts: dict[VirtualPath, str]

    def prefixes(self, access: str) -> tuple[VirtualPath, ...]:
        if access == "write":
            return () if self.readonly else self.write
        return self.read + self.write


class Sandbox:
    """Security boundary for virtual paths: resolution, permissions, suffixes, sizes."""

    def __init__(self, config: SandboxConfig, base_path: Path | None = None, *,
                 never_read: Iterable[str] = (), policy_file: str | None = None) -> None:
        """`never_read`: the policy's own credential stores as absolute paths
        (`credential_stores.policy_stores`), hidden in every root besides the built-in list,
        even a root that is one or lies in one. `policy_file`: the file the policy was read
        from, which no write changes (`write_protected.WriteGuard`)."""
        self.config = config
        self.base_path = Path(base_path) if base_path is not None else Path.cwd()
        self.never_read = tuple(never_read)
        self.policy_file = policy_file
        self._grant: _Grant | None = None
        if config.root is not None:
            rc = config.root
            self._multi = False
            as_path = PathConfig(
                root=str(rc.root),
                mode="ro" if rc.readonly else "rw",
                suffixes=rc.suffixes,
                max_file_bytes=rc.max_file_bytes,
                write_approval=False,
                read_approval=False,
            )
            self._roots = {None: _Root(None, self._host(str(rc.root)), as_path)}
        else:
            self._multi = True
            self._roots = {
                name: _Root(name, self._host(pc.root), pc)
                for name, pc in (config.paths or {}).items()
            }
            for a in self._roots.values():
                for b in self._roots.values():
                    if a is not b and is_within(b.host, a.host):
                        raise ConfigurationError(
                            f"roots '{a.name}' and '{b.name}' overlap (one folder holds the other), "
                            "so a file would have two policies; give each root its own folder"
                        )

    @classmethod
    def from_policy(cls, policy: CapabilityDeclaration) -> Sandbox:
        """The sandbox a policy file's `paths`/`root` table describes."""
        config = policy.sandbox_config()
        if config is None:
            raise ConfigurationError(
                "this policy has no 'paths' or 'root' table, so it grants the file tools nothing"
            )
        source = policy.source_file
        return cls(config, policy.base_path, never_read=policy_stores(policy),
                   policy_file=None if source is None else str(source))

    def _host(self, root: str) -> str:
        """The root's real folder, resolved once, here. One reached only through a symlink
        into a credential store is refused, as the runner refuses it: a store is served
        only when the policy names it by its own path."""
        path = Path(os.path.expanduser(root))
        if not path.is_absolute():
            path = self.base_path / path
        real = os.path.realpath(path)
        refusal = store_link_refusal(f"root {root!r}", os.path.normpath(path), real)
        if refusal is not None:
            raise ConfigurationError(refusal)
        return real

    # ----------------------------------------------------------------- parsing
    def parse(self, path: str) -> VirtualPath:
        """Split a virtual path into root and components, lexically. Refuses `..`,
        NUL bytes and unknown root names; never touches the disk."""
        if not isinstance(path, str):
            raise PathNotInSandboxError(repr(path), "a path must be a string", *self._allowed())
        if "\0" in path:
            raise PathNotInSandboxError(path.replace("\0", "\\0"), "it contains a NUL byte", *self._allowed())
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            shown = path.encode("utf-8", "backslashreplace").decode("ascii", "replace")
            raise PathNotInSandboxError(shown, "it is not valid Unicode text", *self._allowed()) from None
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise PathNotInSandboxError(
                path, "'..' is not allowed; write the path from its root instead", *self._allowed()
            )
        if not self._multi:
            return VirtualPath(None, tuple(parts))
        if not parts:
            return VirtualPath(None, (), True)
        name, rest = parts[0], tuple(parts[1:])
        if name not in self._roots:
            hint = (
                "host paths are not accepted; use a virtual path that starts with a root name"
                if path.startswith("/") and rest
                else f"there is no root named '{name}'"
            )
            raise PathNotInSandboxError(path, hint, *self._allowed())
        return VirtualPath(name, rest, True)

    def _root_of(self, vp: VirtualPath, path: str) -> _Root:
        if vp.is_top:
            raise PathNotInSandboxError(path, "name a root, not the top level", *self._allowed())
        return self._roots[vp.root]

    def host_root(self, vp: VirtualPath) -> str:
        """Real host path of the root that holds `vp` (for the file backends)."""
        return self._root_of(vp, str(vp)).host

    @property
    def root_names(self) -> list[str | None]:
        return list(self._roots)

    # ------------------------------------------------------------- permissions
    def _may_read(self, vp: VirtualPath) -> bool:
        if vp.is_top or vp.root not in self._roots:
            return False
        if self._grant is None:
            return True
        return any(p.contains(vp) for p in (*self._grant.read, *self._grant.write))

    def _may_write(self, vp: VirtualPath) -> bool:
        if vp.is_top or vp.root not in self._roots or self._roots[vp.root].config.mode != "rw":
            return False
        if self._grant is None:
            return True
        return not self._grant.readonly and any(p.contains(vp) for p in self._grant.write)

    def _real(self, vp: VirtualPath, access: str) -> str | None:
        """The real host path of `vp` if it stays inside its root and, in a derived
        sandbox, inside a prefix granted for `access`; else None."""
        root = self._roots[vp.root]
        real = os.path.realpath(os.path.join(root.host, *vp.parts))
        if not is_within(real, root.host):
            return None
        if self._grant is None:
            return real
        bounds = (self._grant.hosts[p] for p in self._grant.prefixes(access))
        return real if any(is_within(real, b) for b in bounds) else None

    def resolve(self, path: str) -> Path:
        """The host path for a virtual path this sandbox may read or write.

        Raises PathNotInSandboxError for `..`, unknown roots, paths outside the granted
        prefixes and symlinks that lead out of their root (or out of a granted prefix)."""
        vp = self.parse(path)
        self._root_of(vp, path)
        if not self._may_read(vp):
            raise PathNotInSandboxError(path, "nothing this sandbox grants holds it", *self._allowed())
        real = self._real(vp, "read")
        if real is None:
            raise PathNotInSandboxError(path, "a symlink on this path leads outside what is granted", *self._allowed())
        return Path(real)

    def can_read(self, path: str) -> bool:
        return self._can(path, "read")

    def can_write(self, path: str) -> bool:
        return self._can(path, "write")

    def _can(self, path: str, access: str) -> bool:
        try:
            vp = self.parse(path)
        except PathNotInSandboxError:
            return False
        allowed = self._may_write(vp) if access == "write" else self._may_read(vp)
        return allowed and self._real(vp, access) is not None

    def grant_prefix(self, vp: VirtualPath, access: str) -> VirtualPath:
        """The longest granted prefix holding `vp` for `access` (its root when this
        sandbox is not derived): file I/O is confined beneath it."""
        if self._grant is None:
            return VirtualPath(vp.root, (), self._multi)
        holding = [p for p in self._grant.prefixes(access) if p.contains(vp)]
        if not holding:
            raise PathNotInSandboxError(str(vp), "nothing this sandbox grants holds it", *self._allowed())
        return max(holding, key=lambda p: len(p.parts))

    def check_read(self, vp: VirtualPath) -> None:
        """Raise unless `vp` may be read (lexical check; the backend catches symlinks)."""
        if not self._may_read(vp):
            raise PathNotInSandboxError(str(vp), "nothing this sandbox grants holds it", *self._allowed())

    def check_write(self, vp: VirtualPath) -> None:
        if self._may_write(vp):
            return
        self.check_read(vp)
        root = self._roots[vp.root]
        reason = (
            "its root is read-only"
            if root.config.mode != "rw"
            else "this sandbox does not grant writes there"
        )
        raise PathNotWritableError(str(vp), reason, self.writable_roots)

    def path_config(self, vp: VirtualPath) -> PathConfig:
        return self._root_of(vp, str(vp)).config

    def needs_read_approval(self, path: str) -> bool:
        return self._root_of(self.parse(path), path).config.read_approval

    def needs_write_approval(self, path: str) -> bool:
        return self._root_of(self.parse(path), path).config.write_approval

    def get_path_config(self, path: str) -> tuple[str, Path, PathConfig]:
        """(root name, resolved host path, config); the name is '/' in single-root mode."""
        vp = self.parse(path)
        resolved = self.resolve(path)
        return (vp.root or "/"), resolved, self.path_config(vp)

    @staticmethod
    def suffix_allowed(path: Path | str, config: PathConfig) -> bool:
        return config.suffixes is None or PurePosixPath(str(path)).suffix.lower() in config.suffixes

    def check_suffix(self, path: Path | str, config: PathConfig) -> None:
        if not self.suffix_allowed(path, config):
            name = PurePosixPath(str(path)).name
            raise SuffixNotAllowedError(name, PurePosixPath(name).suffix.lower(), config.suffixes or [])

    def check_size(self, path: Path | str, config: PathConfig, size: int | None = None) -> None:
        """Raise FileTooLargeError when the file (or `size`, for content about to be
        written) is over the path's limit."""
        if config.max_file_bytes is None:
            return
        if size is None:
            try:
                size = os.stat(path).st_size
            except OSError:
                return
        if size > config.max_file_bytes:
            raise FileTooLargeError(PurePosixPath(str(path)).name, size, config.max_file_bytes)

    # ------------------------------------------------------------------ roots
    def _all_roots(self) -> list[VirtualPath]:
        return [VirtualPath(name, (), self._multi) for name in self._roots]

    @property
    def readable_roots(self) -> list[str]:
        if self._grant is None:
            return [str(v) for v in self._all_roots()]
        return sorted({str(p) for p in (*self._grant.read, *self._grant.write)})

    @property
    def writable_roots(self) -> list[str]:
        if self._grant is None:
            return [str(v) for v in self._all_roots() if self._may_write(v)]
        if self._grant.readonly:
            return []
        return sorted({str(p) for p in self._grant.write if self._may_write(p)})

    def host_write_roots(self) -> list[str]:
        """The real folders of the roots that may be written (as the policy has them, not
        narrowed by a derived grant)."""
        return [root.host for root in self._roots.values() if root.config.mode == "rw"]

    def _allowed(self) -> tuple[list[str], list[str]]:
        return self.readable_roots, self.writable_roots

    # ------------------------------------------------------------------ derive
    def derive(
        self,
        *,
        allow_read: str | list[str] | None = None,
        allow_write: str | list[str] | None = None,
        readonly: bool | None = None,
        inherit: bool = False,
    ) -> Sandbox:
        """A child sandbox that can only do less: it starts with no access (or this
        sandbox's access with `inherit=True`) plus the listed prefixes, each of which
        must already be allowed here. Any widening raises SandboxPermissionEscalationError."""
        reads = self._expand(allow_read)
        writes = self._expand(allow_write)
        parent_readonly = not self.writable_roots
        if readonly is False and parent_readonly:
            raise SandboxPermissionEscalationError(
                "Cannot derive a writable sandbox from a read-only one. "
                f"Readable: {', '.join(self.readable_roots) or 'nothing'}."
            )
        child_readonly = parent_readonly if readonly is None else readonly
        for vp in reads:
            if not (self._may_read(vp) and self._real(vp, "read")):
                raise SandboxPermissionEscalationError(
                    f"Cannot allow reading '{vp}': the parent sandbox cannot read it. "
                    f"Readable: {', '.join(self.readable_roots) or 'nothing'}."
                )
        for vp in writes:
            if not (self._may_write(vp) and self._real(vp, "write")):
                raise SandboxPermissionEscalationError(
                    f"Cannot allow writing '{vp}': the parent sandbox cannot write it. "
                    f"Writable: {', '.join(self.writable_roots) or 'nothing'}."
                )
        if readonly and writes:
            raise ConfigurationError("readonly=True contradicts allow_write; drop one of them")
        if inherit:
            base_read = self._grant.read + self._grant.write if self._grant else tuple(self._all_roots())
            base_write = self._grant.write if self._grant else tuple(
                v for v in self._all_roots() if self._may_write(v)
            )
            reads, writes = base_read, () if child_readonly else base_write
        child = object.__new__(Sandbox)
        child.config = self.config
        child.base_path = self.base_path
        child.never_read = self.never_read
        child.policy_file = self.policy_file
        child._multi = self._multi
        child._roots = self._roots
        hosts = {
            p: os.path.realpath(os.path.join(self._roots[p.root].host, *p.parts)) for p in (*reads, *writes)
        }
        child._grant = _Grant(tuple(reads), tuple(writes), child_readonly, hosts)
        return child

    def _expand(self, paths: str | Iterable[str] | None) -> tuple[VirtualPath, ...]:
        if paths is None:
            return ()
        if isinstance(paths, str):
            paths = [paths]
        out: list[VirtualPath] = []
        for path in paths:
            vp = self.parse(path)
            out.extend(self._all_roots() if vp.is_top else [vp])
        return tuple(out)

    def __repr__(self) -> str:
        return f"Sandbox(readable={self.readable_roots}, writable={self.writable_roots})"
