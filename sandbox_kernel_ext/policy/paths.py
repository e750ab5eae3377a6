"""Comparing host paths as strings, with no I/O and no dependencies.

One home for the checks every side of the package makes: the policy layer, the trusted side
of the runner and the confined child (which imports only this module of the policy layer).
Paths are compared as given: callers pass normalised (`realpath`'d) ones.
"""

from __future__ import annotations

__all__ = ["is_within", "virtual_path", "outermost", "within_any"]


def is_within(path: str, folder: str) -> bool:
    """True when the (normalised) `path` is `folder` or below it, compared by components."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def virtual_path(path: str, host: str, virtual: str) -> str | None:
    """`path` as named under a table root (`host` shown as `virtual`); None if not in it."""
    if not is_within(path, host):
        return None
    rest = path[len(host):].strip("/")
    return virtual.rstrip("/") + "/" + rest if rest else virtual


def outermost(paths: list[str]) -> list[str]:
    """`paths` without repeats and without those inside another, parents first (by depth,
    then name): one sorted pass, since a folder sorts right before what is in it when
    paths are compared as lists of components (a policy may name hundreds)."""
    kept: list[str] = []
    for path in sorted(set(paths), key=lambda p: p.split("/")):
        if not kept or not is_within(path, kept[-1]):
            kept.append(path)
    return sorted(kept, key=lambda p: (p.count("/"), p))


def within_any(path: str, folders: set[str]) -> str | None:
    """The folder of `folders` that holds `path` (or is it), nearest first; None if none:
    a look-up per folder above `path`, not a scan of `folders`."""
    while True:
        if path in folders:
            return path
        parent = path.rsplit("/", 1)[0] or "/"
        if parent == path:
            return None
        path = parent
