"""A cell's own, narrower policy: what `%%sandbox` options may ask of the session's policy.

The session's policy is a ceiling. A cell may lower a budget, name paths the ceiling already
lets a sandbox reach, and name destinations the ceiling's egress rules already allow; anything
else is a `NarrowingError` naming the field and the ceiling. Nothing here runs a process: the
functions compare models and real paths (`os.path.realpath`), so the decision is testable alone.

Paths follow `Sandbox.derive`: once a cell names any path (`allow_read` or `allow_write`), it
gets only the paths it names (the runner still adds the interpreter and the sandbox's own home).
A path inside an approval-gated root of the ceiling's path table stays gated: naming it never
turns an approval into a grant.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .credential_stores import never_read, policy_stores
from .egress import EgressFilter, MalformedTargetError, parse_authority
from .errors import SandboxPermissionEscalationError
from .models import (
    CapabilityDeclaration,
    FilesystemConfig,
    FilesystemMode,
    NetworkEgressRule,
    normalize_domain,
)
from .path_config import PathConfig
from .sandbox import is_within

__all__ = ["Narrowing", "NarrowingError", "lower_only", "narrow", "narrow_network"]

Number = TypeVar("Number", int, float)


class NarrowingError(SandboxPermissionEscalationError):
    """A cell asked for more than the session's policy; `field` says which request."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Narrowing:
    """What one cell asks for; None and empty tuples keep the ceiling's value."""

    max_memory_mb: int | None = None
    max_cpu_seconds: float | None = None
    allow_read: tuple[str, ...] = ()
    allow_write: tuple[str, ...] = ()
    allow_net: tuple[str, ...] = ()  # "domain", "domain:port", "*.domain", "[v6]:port"


def lower_only(field: str, requested: Number, ceiling: Number, unit: str = "") -> Number:
    """`requested` if it is positive and at most `ceiling`; else a NarrowingError."""
    shown = f"{requested:g}{unit}"
    if not (math.isfinite(requested) and requested > 0):
        raise NarrowingError(field, f"{field} must be a positive number, got {shown}")
    if requested > ceiling:
        raise NarrowingError(
            field,
            f"{field} {shown} is above the session policy's ceiling of {ceiling:g}{unit}; "
            "a cell may only lower it",
        )
    return requested


def narrow(
    ceiling: CapabilityDeclaration,
    narrowing: Narrowing,
    *,
    denied: Iterable[str] | None = None,
    cwd: str | None = None,
) -> CapabilityDeclaration:
    """The policy one cell runs under: `ceiling` with `narrowing` applied, never more.

    `denied`: host paths the runner withholds (its credential list and the folders it grants
    only in part; by default the credential list, `never_read()`): a named path may not lie
    in one the ceiling does not name itself, nor, under "read everywhere", hold one. `cwd`:
    where relative paths in `narrowing` resolve (default: the working directory).
    """
    if denied is None:
        denied = never_read()
    limits = ceiling.resource_limits
    update: dict[str, object] = {}
    if narrowing.max_memory_mb is not None or narrowing.max_cpu_seconds is not None:
        changes: dict[str, object] = {}
        if narrowing.max_memory_mb is not None:
            changes["max_memory_mb"] = lower_only(
                "max_memory_mb", narrowing.max_memory_mb, limits.max_memory_mb, " MB")
        if narrowing.max_cpu_seconds is not None:
            changes["max_cpu_seconds"] = lower_only(
                "max_cpu_seconds", narrowing.max_cpu_seconds, limits.max_cpu_seconds, " s")
        update["resource_limits"] = limits.model_validate({**limits.model_dump(), **changes})
    if narrowing.allow_net:
        update["network_egress_rules"] = narrow_network(
            ceiling.network_egress_rules, narrowing.allow_net)
    if narrowing.allow_read or narrowing.allow_write:
        update.update(_narrow_paths(ceiling, narrowing, denied, cwd or os.getcwd()))
    if not update:
        return ceiling
    narrowed = ceiling.model_copy(update=update)
    if narrowing.allow_read or narrowing.allow_write:
        # checked here as real paths: the sandbox must get these, not what they point at
        # by the time it is made (a folder swapped for a symlink in between)
        narrowed._paths_resolved = True
    return narrowed


# -- network ------------------------------------------------------------------------------------

def narrow_network(
    rules: Sequence[NetworkEgressRule], requested: Iterable[str]
) -> list[NetworkEgressRule]:
    """The rules for the requested destinations, each allowed by `rules` (ports, private
    ranges and rate too), and charged to the rate windows of the rules that allow it."""
    return [rule for text in requested for rule in _narrow_destination(rules, text)]


def _narrow_destination(rules: Sequence[NetworkEgressRule], text: str) -> list[NetworkEgressRule]:
    wildcard = text.strip().startswith("*.")
    try:
        host, port = parse_authority(text.strip()[2:] if wildcard else text.strip())
        domain = normalize_domain(("*." if wildcard else "") + host)
    except (MalformedTargetError, ValueError) as exc:
        raise NarrowingError(
            "allow_net", f"allow_net {text!r} is not DOMAIN[:PORT]: {exc}") from None
    covering = _covering(rules, domain)
    if port is not None:
        covering = [rule for rule in covering if not rule.ports or port in rule.ports]
    if not covering:
        allowed = ", ".join(
            rule.domain + (":" + "/".join(map(str, rule.ports)) if rule.ports else "")
            for rule in rules
        ) or "no network at all"
        raise NarrowingError(
            "allow_net",
            f"allow_net {text!r} is not allowed by the session policy (it allows: {allowed})",
        )
    if port is not None:
        ports = [port]
    elif any(not rule.ports for rule in covering):
        ports = []  # some covering rule allows any port
    else:
        ports = sorted({p for rule in covering for p in rule.ports})
    rate = min(rule.rate_limit_per_min for rule in covering)
    # Private ranges only where every covering rule names them (narrowing never widens).
    private = sorted(set.intersection(*(set(rule.private_networks) for rule in covering)))
    narrowed = NetworkEgressRule(domain=domain, ports=ports, rate_limit_per_min=rate,
                                 private_networks=private).charged_as(covering)
    return [narrowed, *_under(rules, domain, port)] if wildcard else [narrowed]


def _under(rules: Sequence[NetworkEgressRule], wildcard: str, port: int | None
           ) -> list[NetworkEgressRule]:
    """The session's more specific rules for names under `wildcard`, kept as they are (on
    `port` only, if one was asked for): in the session they, not the wildcard, decide for
    their hosts, with their own private ranges and rate."""
    zone = EgressFilter([NetworkEgressRule(domain=wildcard)])
    kept = []
    for rule in rules:
        name = rule.domain.removeprefix("*.")
        if rule.domain == wildcard or not zone.rules_for_domain(name):
            continue
        if port is not None and rule.ports and port not in rule.ports:
            continue  # for this port the session's wildcard decides, as it does here
        copy = rule.model_copy(update={"ports": [port]} if port is not None else {})
        kept.append(copy.charged_as([rule]))
    return kept


def _covering(rules: Sequence[NetworkEgressRule], domain: str) -> list[NetworkEgressRule]:
    """The rules that match every host `domain` (itself maybe `*.` + a name) matches."""
    if not domain.startswith("*."):
        return EgressFilter(rules).rules_for_domain(domain)
    # A wildcard asks for every subdomain of a name: only a wildcard for that name, or one
    # matching the name itself, covers them all.
    matching = EgressFilter(rules).rules_for_domain(domain[2:])
    return [rule for rule in rules if rule.domain.startswith("*.")
            and (rule.domain == domain or rule in matching)]


# -- paths --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _TableRoot:
    name: str | None  # None: the single-root table
    host: str
    config: PathConfig

    @property
    def gated(self) -> bool:
        return self.config.read_approval or self.config.write_approval


def _real(path: str, base: str) -> str:
    return os.path.realpath(os.path.join(base, os.path.expanduser(path)))


def _table_roots(ceiling: CapabilityDeclaration) -> list[_TableRoot]:
    base = str(ceiling.base_path)
    table = ceiling.sandbox_config()
    if table is None:
        return []
    if table.root is not None:
        single = PathConfig(root=str(table.root.root), mode="ro" if table.root.readonly else "rw",
                            write_approval=False, read_approval=False)
        return [_TableRoot(None, _real(str(table.root.root), base), single)]
    return [_TableRoot(name, _real(entry.root, base), entry)
            for name, entry in (table.paths or {}).items()]


class _Ceiling:
    """The host paths the ceiling lets a sandboxed process reach, and how."""

    def __init__(self, ceiling: CapabilityDeclaration, denied: Iterable[str]) -> None:
        base = str(ceiling.base_path)
        config = ceiling.filesystem_config
        self.everywhere = (config.mode is not FilesystemMode.none
                           and config.readable_paths is None)
        self.readable = [] if config.mode is FilesystemMode.none or self.everywhere else [
            _real(p, base) for p in config.readable_paths or ()]
        self.writable = [_real(p, base) for p in config.writable_paths] if (
            config.mode is FilesystemMode.read_write) else []
        self.denied = sorted({os.path.realpath(p) for p in denied})
        self.own = policy_stores(ceiling)  # `never_read_paths`: win over every grant
        self.never_read_paths = list(config.never_read_paths)
        self.table = _table_roots(ceiling)

    def in_own_store(self, path: str) -> str | None:
        """Why naming `path` is refused when it is or lies in one of the ceiling's own
        stores (`never_read_paths`): the cell would be granted nothing."""
        store = next((store for store in self.own if is_within(path, store)), None)
        if store is None:
            return None
        return (f"it lies in {store}, which the session policy's never_read_paths keeps from "
                "every sandbox")

    def table_root(self, path: str) -> _TableRoot | None:
        return next((root for root in self.table if is_within(path, root.host)), None)

    def holds_gated(self, path: str, *, write: bool) -> str | None:
        """Why naming `path` is refused when it holds a root the table gates (for a read, a
        read-gated one; for a write, any): the narrowed policy has no table left to gate it."""
        held = next((root for root in self.table if root.host != path
                     and is_within(root.host, path)
                     and (root.gated if write else root.config.read_approval)), None)
        if held is None:
            return None
        return (f"it holds {held.host}, an approval-gated root of the session policy's path "
                "table; name that root itself (it stays gated) or folders beside it")

    def in_withheld(self, path: str) -> str | None:
        """Why naming `path` is refused when it lies in what the runner withholds (a
        credential store, a folder granted only in part) and the ceiling does not name that
        store itself: the narrowed policy would name it, and a store a policy names is
        granted (the runner hides a store only inside a grant, never the grant itself)."""
        store = next((d for d in self.denied if is_within(path, d)), None)
        if store is None:
            return None
        named = [p for p in [*self.readable, *self.writable] if is_within(p, store)]
        if any(is_within(path, p) for p in named):
            return None
        return f"it lies in {store}, which the session policy never lets a sandbox read"

    def fs_readable(self, path: str) -> str | None:
        """None when `path` is readable; else why not."""
        held = (self.holds_gated(path, write=False) or self.in_own_store(path)
                or self.in_withheld(path))
        if held is not None:
            return held
        if any(is_within(path, p) for p in [*self.readable, *self.writable]):
            return None
        if self.everywhere:
            clash = next((d for d in self.denied if is_within(d, path)), None)
            if clash is None:
                return None
            return f"it holds {clash}, which the session policy never lets a sandbox read"
        return "it is outside what the session policy lets a sandbox read" + self._listing()

    def fs_writable(self, path: str) -> str | None:
        held = (self.holds_gated(path, write=True) or self.in_own_store(path)
                or self.in_withheld(path))
        if held is not None:
            return held
        if any(is_within(path, p) for p in self.writable):
            return None
        return "it is outside what the session policy lets a sandbox write" + self._listing()

    def _listing(self) -> str:
        readable = "everywhere but credential stores" if self.everywhere else (
            ", ".join(self.readable) or "nothing")
        table = ", ".join(root.host for root in self.table)
        return (f" (readable: {readable}; writable: {', '.join(self.writable) or 'nothing'}"
                + (f"; path table: {table}" if table else "") + ")")


def _resolve(path: str, cwd: str, field: str) -> str:
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise NarrowingError(field, f"{field} {path!r} is not a path")
    try:
        real = _real(path, cwd)
    except OSError as exc:  # a link removed while it was followed: changing under us
        raise NarrowingError(field, f"{field} {path!r} changed while it was resolved "
                                    f"({exc.strerror}); try again") from None
    if not os.path.exists(real):
        raise NarrowingError(field, f"{field} {path!r} does not exist (resolved to {real})")
    return real


def _narrow_paths(
    ceiling: CapabilityDeclaration, narrowing: Narrowing, denied: Iterable[str], cwd: str
) -> dict[str, object]:
    limits = _Ceiling(ceiling, denied)
    read: list[str] = []
    write: list[str] = []
    gated: list[tuple[_TableRoot, str, str]] = []  # (root, path, "ro" | "rw")

    for text in narrowing.allow_write:
        path = _resolve(text, cwd, "allow_write")
        root = limits.table_root(path)
        if root is not None and root.config.mode != "rw":
            raise NarrowingError("allow_write", f"allow_write {text!r} is in the read-only root "
                                 f"{root.host} of the session policy's path table")
        if root is not None and root.gated:
            gated.append((root, path, "rw"))
            continue
        why = None if root is not None else limits.fs_writable(path)
        if why is not None:
            raise NarrowingError("allow_write", f"allow_write {text!r} ({path}): {why}")
        write.append(path)

    for text in narrowing.allow_read:
        path = _resolve(text, cwd, "allow_read")
        root = limits.table_root(path)
        if root is not None and root.config.read_approval:
            gated.append((root, path, "ro"))
            continue
        why = None if root is not None else limits.fs_readable(path)
        if why is not None:
            raise NarrowingError("allow_read", f"allow_read {text!r} ({path}): {why}")
        read.append(path)

    write = _outermost(write)
    read = [p for p in _outermost(read) if not any(is_within(p, w) for w in write)]
    filesystem = FilesystemConfig(
        mode=FilesystemMode.read_write if write else FilesystemMode.read_only,
        writable_paths=write,
        readable_paths=read,
        never_read_paths=limits.never_read_paths,  # the ceiling's own stores stay its cells'
    )
    return {"filesystem_config": filesystem, "root": None, "paths": _gated_table(gated)}


def _outermost(paths: list[str]) -> list[str]:
    """Paths in order, without repeats and without any that another one holds."""
    unique = list(dict.fromkeys(paths))
    return [p for p in unique if not any(q != p and is_within(p, q) for q in unique)]


def _gated_table(gated: list[tuple[_TableRoot, str, str]]) -> dict[str, PathConfig] | None:
    """Approval-gated roots re-rooted at the named paths, keeping their approvals and limits.

    Roots of a table may not overlap, so a path inside another named one is dropped when the
    outer one covers it (a write covers reads), and a write inside a named read is refused.
    """
    if not gated:
        return None
    kept: list[tuple[_TableRoot, str, str]] = []
    for root, path, mode in sorted(gated, key=lambda g: (g[2] != "rw", len(g[1]))):
        if any(is_within(path, other) for _, other, _ in kept):
            continue
        inner = next((other for _, other, _ in kept if is_within(other, path)), None)
        if inner is not None:
            raise NarrowingError("allow_read", f"allow_read {path} holds allow_write {inner}, "
                                 "both in one approval-gated root; name only the write")
        kept.append((root, path, mode))
    table: dict[str, PathConfig] = {}
    for root, path, mode in kept:
        name = root.name or "root"
        label, count = name, 2
        while label in table:
            label, count = f"{name}-{count}", count + 1
        table[label] = root.config.model_copy(update={"root": path, "mode": mode})
    return table
