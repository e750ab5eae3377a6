"""Comparing host paths as strings, with no I/O and no dependencies.

One home for the checks every side of the package makes: the policy layer, the trusted side
of the runner and the confined child (which imports only this module of the policy layer).
Paths are compared as given: callers pass normalised (`realpath`'d) ones.
"""

from __future__ import annotations

__all__ = ["is_within", "virtual_path"]


def is_within(path: str, folder: str) -> bool:
    """True when the (normalised) `path` is `folder` or below it, compared by components."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def virtual_path(path: str, host: str, virtual: str) -> str | None:
    """`path` as named under a table root (`host` shown as `virtual`); None if not in it."""
    if not is_within(path, host):
        return None
    rest = path[len(host):].strip("/")
    return virtual.rstrip("/") + "/" + rest if rest else virtual
