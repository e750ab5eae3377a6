"""Which host paths a confined child may read: the decision, made on the trusted side.

Landlock only allows, so everything here produces lists of paths to grant: the minimum a
Python child needs (`python_read_set`), `/etc` minus its secrets, the credential stores of
every home folder and of the system (`credential_paths`), and "everything except these"
(`cover_except`). `plan.py` turns a policy into grants with them; the Landlock binding in
`linux/landlock.py` only carries the grants out.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable, Iterable

from ...policy.credential_stores import (
    HOME_CREDENTIAL_PATHS,
    SYSTEM_CREDENTIAL_PATHS,
    credential_paths,
    etc_entry_is_secret,
    etc_secret_paths,
    home_folders,
)
from ...policy.paths import is_within

__all__ = [
    "resolved", "python_read_set", "python_write_set", "etc_read_set", "etc_secret_paths", "credential_paths",
    "cover_except", "home_folders", "HOME_CREDENTIAL_PATHS", "SYSTEM_CREDENTIAL_PATHS",
]

def resolved(path: str) -> str | None:
    """`os.path.realpath(path)`, or None when the path changes while it is followed
    (realpath itself raises when a link on the way is removed meanwhile: a sandbox that may
    write there can make that happen at will)."""
    try:
        return os.path.realpath(path)
    except OSError:
        return None


# -- read sets ----------------------------------------------------------------------------------

def _grant_tree_except(
    root: str, is_secret: Callable[[str, str, str], bool], relroot: str = ""
) -> tuple[list[str], bool]:
    """Paths that cover ``root`` minus its secrets, and whether ``root`` itself is secret-free.

    A clean directory becomes one rule; a directory holding a secret is replaced by rules for
    its other children, recursively. Symlinked directories are not walked into.
    """
    grants: list[str] = []
    clean = True
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError:
        return [], False
    for entry in entries:
        relpath = f"{relroot}{entry.name}"
        if is_secret(relpath, entry.name, entry.path):
            clean = False
            continue
        if entry.is_dir(follow_symlinks=False):
            sub_grants, sub_clean = _grant_tree_except(entry.path, is_secret, relpath + "/")
            if sub_clean:
                grants.append(entry.path)
            else:
                grants.extend(sub_grants)
                clean = False
        else:
            grants.append(entry.path)
    return grants, clean


def etc_read_set(etc: str = "/etc") -> list[str]:
    """``/etc`` minus secrets, as rules: Landlock cannot deny beneath an allowed directory."""
    grants, _ = _grant_tree_except(etc, etc_entry_is_secret)
    return grants


def _mapped_library_dirs() -> list[str]:
    """Directories of the shared objects this process maps (ld.so, libc, extension modules)."""
    dirs: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/") and ".so" in fields[5]:
                    dirs.append(os.path.dirname(fields[5].rstrip("\n").removesuffix(" (deleted)")))
    except OSError:
        pass
    return dirs


def _minimal_cover(paths: Iterable[str]) -> list[str]:
    """Existing real paths with those beneath another dropped: fewer rules, same access."""
    real = sorted({os.path.realpath(path) for path in set(paths) if os.path.exists(path)})
    kept: list[str] = []
    for path in real:
        if not any(is_within(path, parent) for parent in kept):
            kept.append(path)
    return kept


# Device and Linux kernel entries a Python child needs. /dev/null, zero, urandom and random serve
# os.devnull and os.urandom/secrets/hash seeds; /sys/devices/system/cpu serves os.cpu_count and
# multiprocessing. /dev/tty is left out on purpose: a child with the user's terminal could read
# their keystrokes. /proc is the child's to rule (`child/bootstrap.py`): whole where it is its
# own, in part where it is the host's.
PYTHON_DEVICE_READ_SET = (
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
    "/sys/devices/system/cpu",
)


def python_read_set(extra: Iterable[str] = (), *, etc_secrets_hidden: bool = False) -> list[str]:
    """The minimum read set for running the current Python interpreter, as real paths.

    - ``sys.base_prefix``: the interpreter binary and the standard library.
    - ``sys.prefix``: the virtual environment (``pyvenv.cfg``, its ``bin``, site-packages).
    - ``sys.path`` entries inside those prefixes (the standard library, site-packages). Other
      entries -- the working directory under ``python -m``, ``PYTHONPATH``, the source tree of
      an editable install -- hold the caller's files, often a home directory with keys in it:
      pass what the child really needs as ``extra``.
    - The directories of every mapped shared object (``/proc/self/maps``): ld.so and libc live
      there, so ``exec`` of the interpreter can load.
    - ``/usr/lib/<triplet>`` and ``/lib*``: the loader's default search path, for extension
      modules loaded later (``_ssl`` pulls in libssl).
    - ``PYTHON_DEVICE_READ_SET``: the device and Linux kernel files listed there.
    - ``/etc`` minus secrets (``etc_read_set``): ld.so.cache, localtime, passwd, resolv.conf,
      ssl certificates, but never shadow-like files, sudoers, ssh host keys or private TLS keys.
      With ``etc_secrets_hidden`` (the child covers ``etc_secret_paths()`` with mounts),
      ``/etc`` is one rule instead of one per entry beside a secret.

    It walks ``/etc`` (about 10 ms here): compute it once per launcher, not per child.
    """
    prefixes = [os.path.realpath(p) for p in {sys.base_prefix, sys.prefix}]
    candidates: list[str] = [*prefixes, os.path.dirname(sys.executable), *extra]
    candidates += [
        entry
        for entry in sys.path
        if entry
        and os.path.isabs(entry)
        and any(is_within(os.path.realpath(entry), prefix) for prefix in prefixes)
    ]
    candidates += _mapped_library_dirs()
    triplet = sysconfig.get_config_var("MULTIARCH") or getattr(sys.implementation, "_multiarch", "")
    if triplet:
        candidates.append(f"/usr/lib/{triplet}")
    candidates += [f"/{name}" for name in ("lib", "lib64", "lib32", "libx32")]
    candidates += PYTHON_DEVICE_READ_SET
    return _minimal_cover(candidates) + (["/etc"] if etc_secrets_hidden else etc_read_set())


def python_write_set() -> list[str]:
    """Write access a Python child needs besides its own roots: ``subprocess.DEVNULL`` opens
    ``/dev/null`` read-write. ``/dev/shm`` (multiprocessing) is the caller's choice: it is shared
    with every other process on the host."""
    return ["/dev/null"]


def cover_except(root: str, denied: Iterable[str]) -> list[str]:
    """Rules that cover ``root`` minus every path in ``denied``.

    Landlock only allows, so a denial beneath an allowed folder is expressed by granting that
    folder's other children instead, recursively along the path to each denied entry. Only
    folders on those paths are listed. A symlink is never a rule: a rule follows the link, so
    ``~/keys -> ~/.ssh`` would grant ``.ssh`` and ``data -> /mnt/disk`` a folder the policy
    never named (or the link could be swapped before the child opens it); what a link inside
    ``root`` points at is covered by the rules for its own place.
    """
    # the folders above resolved, not a denied path's own name (see credential_paths)
    denied_set = {os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
                  for path in denied}

    def walk(folder: str) -> list[str]:
        if folder in denied_set:
            return []
        if not any(is_within(bad, folder) for bad in denied_set):
            return [folder]
        grants: list[str] = []
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            return []
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                grants.extend(walk(entry.path))
            elif entry.path not in denied_set:
                grants.append(entry.path)
        return grants

    return walk(os.path.realpath(root))
