"""What one confined child gets, computed on the trusted side from a `CapabilityDeclaration`.

A `ChildPlan` is plain data (it crosses to the launcher as JSON): the paths Landlock allows,
the rlimits, the environment, the identity and the program. Nothing here runs a process; the
child side (`child.py`) only carries the plan out, so every decision is made and testable here.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import math
import os
import select
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterable

from ...policy.credential_stores import (
    NEVER_READ_ENV,
    etc_secret_paths,
    never_read,
    outside_stores,
    policy_stores,
    sandbox_homes_folder,
    site_stores,
    store_link_refusal,
    unhideable_store,
)
from ...policy.errors import SandboxError, UnreadableWorkdirError
from ...policy.models import CapabilityDeclaration, FilesystemMode
from ...policy.paths import is_within, outermost, within_any
from ...policy.write_protected import kernel_workdirs, write_protection
from ..wire import ChildPlan
from . import host_reads
from .isolation import network_namespaces, private_mounts, read_only_view_available

__all__ = ["ChildPlan", "build_plan", "BASE_ENV_NAMES", "PROXY_PORT"]

# Where the egress proxy listens inside each child's own network namespace (so one number
# serves every sandbox at once).
PROXY_PORT = 3128
PROXY_ENV_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
# Always set by the runner; never taken from the Jupyter kernel's environment.
BASE_ENV_NAMES = ("PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")
# Programs a shell command needs: system binaries and libraries (no user data lives there).
SYSTEM_READ_SET = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/opt")
# Replaced by narrower grants when a policy reads "everywhere".
_EVERYWHERE_EXCLUDED = ("/proc", "/sys", "/dev", "/etc")


def hidden_by_mounts() -> bool:
    """Whether children hide what they may not read under mounts of their own namespace (an
    empty read-only tmpfs on a folder, /dev/null on a file), as bubblewrap does: then /etc is
    one Landlock rule and "read everywhere" one rule per top-level folder, with nothing to
    enumerate around a denied path. Needs the mount namespace of the read-only view."""
    return read_only_view_available()


@functools.lru_cache(maxsize=1)
def runtime_read_set() -> tuple[str, ...]:
    """The interpreter, its libraries, the package itself and system binaries (computed once:
    it walks /etc when secrets there cannot be hidden under mounts)."""
    package_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = host_reads.python_read_set(extra=[package_dir], etc_secrets_hidden=hidden_by_mounts())
    paths += [path for path in SYSTEM_READ_SET if os.path.exists(path)]
    return tuple(dict.fromkeys(paths))


def homes_folder() -> str:
    """Where sandboxes' private homes live (`credential_stores.sandbox_homes_folder`)."""
    return sandbox_homes_folder()


def denied_reads() -> list[str]:
    """What no sandbox reads, however a policy grants around it (`credential_stores.never_read`)."""
    return never_read()


def denied_for(capability: CapabilityDeclaration, denied: Iterable[str] | None = None
               ) -> tuple[tuple[str, ...], list[str]]:
    """(`denied`, by default `denied_reads()`, with the policy's own stores; those own stores,
    `never_read_paths`). A store of the site's or the policy's that a child could not be kept
    from (it holds the interpreter, or lies in a folder every child reads where no mount can
    hide it) refuses the run."""
    own = policy_stores(capability)
    read_by_all, mounts = runtime_read_set(), hidden_by_mounts()
    needed = (*read_by_all, *_needed_to_run())
    for stores, what in ((site_stores(), f"{NEVER_READ_ENV} entry"),
                         (own, "never_read_paths entry")):
        refusal = unhideable_store(stores, needed=needed, read_by_all=read_by_all,
                                   mounts=mounts, what=what)
        if refusal is not None:
            raise SandboxError(refusal)
    return (*(denied_reads() if denied is None else denied), *own), own


@functools.lru_cache(maxsize=1)
def _needed_to_run() -> tuple[str, ...]:
    """What a child cannot run without inside the folders of `runtime_read_set`: the
    interpreter's own file and its import path (a store there would hide them)."""
    prefixes = [os.path.realpath(prefix) for prefix in {sys.prefix, sys.base_prefix}]
    paths = [os.path.realpath(sys.executable), *prefixes]
    paths += [os.path.realpath(entry) for entry in sys.path if entry and os.path.isabs(entry)]
    return tuple(path for path in dict.fromkeys(paths)
                 if any(is_within(path, prefix) for prefix in prefixes)
                 or path == os.path.realpath(sys.executable))


def _own_stores_win(own: list[str], readable: list[str], writable: list[str],
                    named: list[str]) -> tuple[list[str], list[str], list[str]]:
    """A policy's own stores win over its grants: a grant that is one or lies in one is
    dropped, and names it no more (so it is hidden, or split around, where a grant holds it)."""
    return outside_stores(readable, own), outside_stores(writable, own), outside_stores(named, own)


def withheld_from_everywhere() -> list[str]:
    """What a "read everywhere" policy never grants wholesale: the credential list, and the
    folders it grants only in part (`/proc`, `/sys`, `/dev`, `/etc`)."""
    return [*denied_reads(), *_EVERYWHERE_EXCLUDED]


@functools.lru_cache(maxsize=1)
def etc_secrets() -> tuple[str, ...]:
    """What a child hides in /etc when /etc is one rule (walked once, as the runtime set is)."""
    return tuple(etc_secret_paths())


@functools.lru_cache(maxsize=4)
def _everywhere_read_set() -> tuple[str, ...]:
    """Rules for "read everywhere": the top-level folders but those granted in part, so a
    folder made later anywhere below is readable at once. What may not be read below them is
    hidden by the child's mounts, or, without mounts, left out of the rules at each run
    (`split_around_denied`)."""
    return tuple(host_reads.cover_except("/", _EVERYWHERE_EXCLUDED))


def split_around_denied(readable: list[str], denied: Iterable[str],
                        named: Iterable[str]) -> list[str]:
    """Without mounts to hide them: each readable folder that holds a denied path the policy
    does not name itself, as rules for everything in it but that path (`cover_except`),
    listed anew at each run, so a folder or file made since is readable and a store made
    since is not. A readable path inside a denied one that the policy does not name (a
    link planted where a policy path was, `data -> ~/.aws`) is left out."""
    named = set(named)
    denied = [path for path in dict.fromkeys(denied) if path not in named]
    rules: list[str] = []
    for path in readable:
        if path not in named and any(is_within(path, bad) for bad in denied):
            continue
        inside = [bad for bad in denied if is_within(bad, path)]
        rules += host_reads.cover_except(path, inside) if inside else [path]
    return list(dict.fromkeys(rules))


def hidden_paths(capability: CapabilityDeclaration, denied: tuple[str, ...],
                 granted: Iterable[str] = ()) -> dict[str, list[str]]:
    """What the child covers with mounts (those that exist when it starts), as names by
    folder: /etc's secrets, the credential list, the sandboxes' homes, Jupyter's runtime
    folder and the roots reads of which a person approves, inside whatever the policy grants
    ("everywhere", or a folder that holds one), except a path the policy names itself
    (`granted`: its own folders, never the top-level ones of "everywhere")."""
    if not hidden_by_mounts():
        return {}
    return _by_folder(guarded_paths(capability, denied), frozenset(granted))


def guarded_paths(capability: CapabilityDeclaration, denied: tuple[str, ...]) -> tuple[str, ...]:
    """What a child may not read inside its grants: /etc's secrets, the credential list (with
    the sandboxes' homes and Jupyter's runtime folder, in `denied`) and the roots reads of
    which a person approves. Hidden under mounts, or split around without them."""
    return (*etc_secrets(), *denied, *approval_roots(capability)[0])


@functools.lru_cache(maxsize=16)
def _by_folder(paths: tuple[str, ...], named: frozenset[str]) -> dict[str, list[str]]:
    """Candidates but those `named`, by folder: each folder is looked at once instead of a
    stat per path (hundreds of candidates, in a few dozen folders, most of which do not
    exist). The same sandbox asks the same each run, so the answer is kept."""
    folders: dict[str, list[str]] = {}
    for path in dict.fromkeys(paths):
        folder, name = os.path.split(path)
        if name and path not in named:
            folders.setdefault(folder, []).append(name)
    return folders


def present_hidden(hidden: dict[str, list[str]],
                   versions: list[object] | None = None) -> dict[str, list[str]]:
    """The hidden names that exist now, by folder: what the child covers. A folder's answer
    is kept while the folder is unchanged (same inode, modification and change times), so a
    run costs one stat per folder instead of a listing in the child; an answer read within
    two seconds of the folder's last change is not kept, since a change in the same
    timestamp tick would not show. `versions` gets, for each folder, its identity and that of
    each hidden entry found in it (what `view_stamp` is made of: an entry replaced since a
    view was prepared makes it another view)."""
    found: dict[str, list[str]] = {}
    now = time.time_ns()
    for folder, names in hidden.items():
        try:
            info = os.stat(folder)
        except OSError:
            if versions is not None:
                versions.append(None)
            continue
        key = (folder, tuple(names))
        version = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
        cached = _PRESENT.get(key)
        if cached is not None and cached[0] == version:
            there = cached[1]
        else:
            there = _present_in(folder, names)
            if now - max(info.st_mtime_ns, info.st_ctime_ns) > _SETTLED_NS:
                if len(_PRESENT) >= _PRESENT_MAX:
                    _PRESENT.clear()
                _PRESENT[key] = (version, there)
        if versions is not None:
            versions.append((info.st_dev, info.st_ino,
                             [_entry_identity(os.path.join(folder, name)) for name in there]))
        if there:
            found[folder] = list(there)
    return found


def _entry_identity(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_ctime_ns


class _MountTable:
    """Counts the changes of this process's mount table, which the launcher and its spares
    share until a run takes a namespace of its own: /proc/self/mounts polls as changed once
    a mount comes or goes. Where it cannot be watched, every look is a change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._poller: select.poll | None = None
        self._fd = -1
        self._generation = 0

    def generation(self) -> str:
        with self._lock:
            if self._fd < 0:
                try:
                    self._fd = os.open("/proc/self/mounts", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return os.urandom(8).hex()
                self._poller = select.poll()
                self._poller.register(self._fd, select.POLLPRI | select.POLLERR)
            assert self._poller is not None
            if self._poller.poll(0):
                self._generation += 1
            return str(self._generation)


MOUNT_TABLE = _MountTable()


def view_stamp(versions: list[object]) -> str:
    """The digest of what a view was made from beyond the plan's own fields: the mount
    table's generation, the hidden entries' and the granted folders' identities."""
    text = json.dumps([MOUNT_TABLE.generation(), versions], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _present_in(folder: str, names: list[str]) -> tuple[str, ...]:
    """A folder with many candidates (the credential list in a home) is listed once, which
    costs less than a stat per name; one with a few (the homes' folder in /tmp) is not, since
    listing a crowded folder costs more."""
    if len(names) <= 8:
        return tuple(name for name in names if os.path.lexists(os.path.join(folder, name)))
    try:
        listed = set(os.listdir(folder))
    except OSError:
        return ()
    return tuple(name for name in names if name in listed)


_PRESENT: dict[tuple[str, tuple[str, ...]], tuple[tuple[int, ...], tuple[str, ...]]] = {}
_PRESENT_MAX = 4096
_SETTLED_NS = 2_000_000_000


def _refuse_stores_in_writable(writable: list[str], denied: Iterable[str],
                               named: Iterable[str]) -> None:
    """A credential store inside a writable folder is hidden under its name only: a cell
    could rename the folder holding it and find it unhidden at its next run. So a writable
    folder may not hold one (unless the policy names the store itself)."""
    named = set(named)
    roots = set(writable)
    for path in denied:
        root = within_any(os.path.dirname(path), roots) if path not in named else None
        if root is not None and os.path.lexists(path):
            raise SandboxError(
                f"writable path {root} holds {path}, a credential store sandboxes never "
                "read; a cell could move it out from under its cover. Grant the folders "
                "beside it instead"
            )


def explicit_grants(capability: CapabilityDeclaration) -> list[str]:
    """The folders a policy names itself and lets the child reach (not those "read
    everywhere" stands for, nor roots whose reads a person approves), each only if named
    without a symlink: a link planted where a policy path is (`data -> ~/.aws`) must not
    make a store count as named."""
    config = capability.filesystem_config
    given: list[str] = []
    if config.mode is not FilesystemMode.none:
        given += [*config.writable_paths, *(config.readable_paths or [])]
    table = capability.sandbox_config()
    if table is not None:
        given += [str(table.root.root)] if table.root is not None else [
            entry.root for entry in (table.paths or {}).values() if not entry.read_approval]
    base = str(capability.base_path)
    named = []
    for path in given:
        full = os.path.normpath(os.path.join(base, os.path.expanduser(path)))
        if host_reads.resolved(full) == full:
            named.append(full)
    return named


def policy_grants(readable: list[str], writable: list[str]) -> list[str]:
    """The real paths the policy grants by naming them (however spelled), without the
    top-level folders "read everywhere" stands for."""
    everywhere = set(_everywhere_read_set())
    return [*writable, *(path for path in readable if path not in everywhere and path != "/")]


def owner_mapped_paths(granted: Iterable[str], reached: Iterable[str]) -> list[str]:
    """What a root kernel's unprivileged child sees through the owner map (root's files as
    its own): each `granted` folder root owns, and the first folder of root's on the way to
    anything `granted` or `reached` (the runtime's read set) that others may not search (/root
    around pyenv's interpreter). Folders inside another mapped one are left to it."""
    mapped: list[str] = []
    granted = list(granted)
    for path in granted:
        try:
            info = os.stat(path)
        except OSError:
            continue
        # A shared folder like /tmp (sticky, anyone may write) needs no map, and must not
        # get one: root's private files there would turn the child's, and the child's own
        # files there (its home) nobody's
        shared = info.st_mode & stat.S_ISVTX and info.st_mode & 0o002
        if info.st_uid == 0 and not shared:
            mapped.append(path)
    for path in [*granted, *reached]:
        blocker = _closed_root_folder_above(path)
        if blocker is not None:
            mapped.append(blocker)
    return outermost(mapped)


def _closed_root_folder_above(path: str) -> str | None:
    """The outermost folder above `path` that root owns and others may not enter."""
    folder = ""
    for part in path.strip("/").split("/")[:-1]:
        folder += "/" + part
        try:
            info = os.stat(folder)
        except OSError:
            return None
        if info.st_uid == 0 and not info.st_mode & 0o001:
            return folder
    return None


def _real_paths(paths: list[str], base: str, what: str, resolved: bool = False) -> list[str]:
    """Each policy path resolved once. One that leads through a symlink into a credential
    store (`data/settings -> ~/.ssh/config`) is refused: only a store the policy names
    itself is granted. `resolved`: the paths were resolved and checked already (a cell's
    narrowing), so one that resolves anywhere else now is refused."""
    out = []
    for path in paths:
        spelled = os.path.normpath(os.path.join(base, os.path.expanduser(path)))
        full = host_reads.resolved(spelled)
        if full is None:  # a link removed while it was followed
            raise SandboxError(f"{what} {path!r} changed while it was resolved; try again")
        if not os.path.exists(full):
            raise SandboxError(f"{what} {path!r} does not exist (resolved to {full})")
        if resolved and full != spelled:
            raise SandboxError(
                f"{what} {spelled} was checked as a real path and now resolves to {full}: "
                "was a folder replaced by a symlink? Refusing to run")
        refusal = store_link_refusal(f"{what} {path!r}", spelled, full)
        if refusal is not None:
            raise SandboxError(refusal)
        out.append(full)
    return out


def filesystem_grants(capability: CapabilityDeclaration) -> tuple[list[str], list[str]]:
    """(readable, writable) host paths the policy grants, before the runtime's own set.

    aumai-sandbox's `filesystem_config` and the filesystem-sandbox path table both count: a table root with
    mode `rw` and no `write_approval` is writable, `ro` (or `rw` behind an approval) readable,
    and a `read_approval` root is not reachable from a sandboxed process at all: its cell asks
    the trusted side, which opens the file after a yes. "Read everywhere" leaves gated roots out, and
    a plain grant around or inside one is refused. The credential list and the gated roots
    inside a grant are the plan's to hide (`build_plan`).
    """
    base = str(capability.base_path)
    config = capability.filesystem_config
    readable: list[str] = []
    writable: list[str] = []
    table = capability.sandbox_config()
    ask_to_read, ask_to_write = approval_roots(capability)
    if config.mode is not FilesystemMode.none:
        if config.mode is FilesystemMode.read_write:
            if not config.writable_paths:
                raise SandboxError(
                    "filesystem_config.mode is read_write but writable_paths is empty: aumai-sandbox "
                    "reads that as 'write everywhere', which the runner refuses; list the folders"
                )
            writable += _real_paths(config.writable_paths, base, "writable path",
                                    capability.paths_resolved)
        if config.readable_paths is not None:
            readable += _real_paths(config.readable_paths, base, "readable path",
                                    capability.paths_resolved)
    # "/" named as a readable path is "everywhere": /proc, /sys and /dev only in part
    everywhere = config.mode is not FilesystemMode.none and (
        config.readable_paths is None or "/" in readable)
    readable = [path for path in readable if path != "/"]
    _refuse_overlap(readable, ask_to_read, "readable path", "read_approval")
    if everywhere:
        # Holds the gated roots and the denied paths: hidden by the child, or split around.
        readable += list(_everywhere_read_set())
    _refuse_overlap(writable, ask_to_write, "writable path",
                    "read_approval, write_approval or mode ro")
    if table is not None:
        if table.root is not None:
            root = _real_paths([str(table.root.root)], base, "root",
                              capability.paths_resolved)[0]
            (readable if table.root.readonly else writable).append(root)
        for name, entry in (table.paths or {}).items():
            if entry.read_approval:
                continue
            root = _real_paths([entry.root], base, f"paths.{name}.root",
                               capability.paths_resolved)[0]
            if entry.mode == "rw" and not entry.write_approval:
                writable.append(root)
            else:
                readable.append(root)
    return readable, writable


def approval_roots(capability: CapabilityDeclaration) -> tuple[list[str], list[str]]:
    """(roots whose reads, roots whose writes a person decides) as real host paths. The
    Landlock rules must leave these out, or the approval would be only a Python hook: a cell
    asks the trusted side, which opens the file for it after a yes."""
    table = capability.sandbox_config()
    ask_to_read: list[str] = []
    ask_to_write: list[str] = []
    if table is None or table.root is not None:
        return ask_to_read, ask_to_write
    base = str(capability.base_path)
    for name, entry in (table.paths or {}).items():
        root = _real_paths([entry.root], base, f"paths.{name}.root",
                           capability.paths_resolved)[0]
        if entry.read_approval:
            ask_to_read.append(root)
        if entry.read_approval or entry.write_approval or entry.mode != "rw":
            ask_to_write.append(root)
    return ask_to_read, ask_to_write


def _refuse_overlap(granted: list[str], gated: list[str], what: str, why: str) -> None:
    """A plain grant holding (or inside) a root the table gates would open it without asking."""
    for path in granted:
        for root in gated:
            if is_within(path, root) or is_within(root, path):
                raise SandboxError(
                    f"{what} {path} overlaps the table root {root}, which has {why}: the "
                    "sandbox could reach it without a person's yes. Grant folders beside it, "
                    "not around or inside it"
                )


def child_environment(
    capability: CapabilityDeclaration, home: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """A fresh environment: the runner's base, then names the policy allows by name (with
    `read_env` and `env_allowlist`; patterns like `LC_*` work), then the caller's `extra`."""
    interpreter_bin = os.path.dirname(sys.executable)
    env = {
        "PATH": f"{interpreter_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if "read_env" in capability.permissions and capability.env_allowlist:
        for name, value in os.environ.items():
            if name not in BASE_ENV_NAMES and any(
                fnmatch.fnmatchcase(name, pattern) for pattern in capability.env_allowlist
            ):
                env[name] = value
    for name, value in (extra or {}).items():
        if not isinstance(name, str) or not isinstance(value, str) or "=" in name or not name:
            raise SandboxError(f"environment entry {name!r} must be a NAME=str pair")
        env[name] = value
    return env


# A session's cells run in one long-lived process: matplotlib draws through our backend, and
# a plotly figure displays as its data (which the trusted side draws, `charts.py`), not as
# HTML that loads plotly.js from a network.
SESSION_ENV = {"MPLBACKEND": "module://sandbox_kernel_ext.runner.child.figures",
               "PLOTLY_RENDERER": "plotly_mimetype"}


def rlimits_for(capability: CapabilityDeclaration, kind: str = "python",
                disk_headroom: int | None = None, shared_tasks: int = 0) -> dict[str, list[int]]:
    """Backstops Linux enforces per process; the monitor enforces the exact budgets on the
    whole tree. A session has no CPU rlimit: its budget is per cell, and the rlimit would
    count every cell the process ever ran. `disk_headroom`, what the disk quota has left,
    caps each file too. `shared_tasks`: tasks of the child's uid outside the sandbox that
    Linux counts with the child's (`linux/tasks.py`), added to its process budget."""
    limits = capability.resource_limits
    mib = 1024 * 1024
    cpu = math.ceil(limits.max_cpu_seconds) + 1
    # Address space, not RSS: give headroom for what libraries reserve but never touch; the
    # monitor kills on the tree's resident memory at the real limit.
    address_space = (limits.max_memory_mb + max(limits.max_memory_mb, 256)) * mib
    file_size = limits.max_file_size_mb * mib
    if disk_headroom is not None:
        file_size = min(file_size, max(disk_headroom, 0))
    rlimits = {
        "RLIMIT_AS": [address_space, address_space],
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_FSIZE": [file_size, file_size],
        "RLIMIT_NOFILE": [limits.max_open_files] * 2,
        "RLIMIT_NPROC": [limits.max_processes + shared_tasks] * 2,
        "RLIMIT_CORE": [0, 0],
    }
    if kind == "session":
        del rlimits["RLIMIT_CPU"]
    return rlimits


def resolve_command(argv: list[str], env: dict[str, str]) -> list[str]:
    """argv with its program resolved on the child's PATH (so errors come before the fork)."""
    if not argv or not isinstance(argv[0], str) or not argv[0]:
        raise SandboxError("command must be a non-empty list of strings")
    if any(not isinstance(arg, str) or "\0" in arg for arg in argv):
        raise SandboxError("every command argument must be a string without NUL bytes")
    program = argv[0]
    if "/" not in program:
        found = shutil.which(program, path=env["PATH"])
        if found is None:
            raise SandboxError(f"command not found on the sandbox's PATH: {program!r}")
        program = found
    return [program, *argv[1:]]


def build_plan(
    capability: CapabilityDeclaration,
    *,
    kind: str,
    argv: list[str],
    home: str,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    uid: int | None = None,
    gid: int | None = None,
    denied: tuple[str, ...] | None = None,
    pinned: tuple[list[str], list[str]] | None = None,
    proxy_port: int | None = None,
    disk_headroom: int | None = None,
    owner_mapping: bool = False,
    sized_home: bool = False,
    shared_tasks: int = 0,
) -> ChildPlan:
    """`pinned`: the grants as resolved when the sandbox was made. A grant that resolves
    elsewhere now (a folder swapped for a symlink, perhaps by an earlier run of this very
    sandbox) refuses the run instead of granting the link's target. `owner_mapping`: the run
    comes with an owner map (a root kernel's unprivileged child), so root's granted folders
    are shown to the child as its own. `sized_home`: the home is a tmpfs the run brings.
    `shared_tasks`: see `rlimits_for`."""
    denied, own = denied_for(capability, denied)  # the credential list and the policy's own
    readable, writable = filesystem_grants(capability)
    if cwd and not any(is_within(os.path.realpath(cwd), path) for path in (
            *runtime_read_set(), *readable, *writable, home, *host_reads.python_write_set())):
        # before the rest of the plan: the notebook layer asks first for the notebook's folder
        raise UnreadableWorkdirError(f"working directory {os.path.realpath(cwd)} is not "
                                     "readable under this policy")
    _refuse_moved(readable, writable, pinned)
    readable, writable, named = _own_stores_win(own, readable, writable, explicit_grants(capability))
    granted, granted_reads = policy_grants(readable, writable), readable
    if not hidden_by_mounts():
        readable = split_around_denied(readable, guarded_paths(capability, denied), named)
    hidden = hidden_paths(capability, denied, named)
    _refuse_stores_in_writable(writable, denied, named)
    _refuse_homes(readable, writable, hidden)
    child_env, argv = _environment_and_command(capability, kind, argv, home, env, proxy_port)
    folders = [path for path in writable if os.path.isdir(path)]  # a writable file is no cwd
    workdir = os.path.realpath(cwd) if cwd else (folders[0] if folders else home)
    protected, closed, readable, writable = _write_protection(capability, readable,
                                                              writable, named)
    write_paths = [home, *writable, *host_reads.python_write_set()]
    read_paths = [*runtime_read_set(), *readable]
    _refuse_overlap(list(runtime_read_set()), approval_roots(capability)[0],
                    "the interpreter's or system folder", "read_approval")
    if not any(is_within(workdir, path) for path in [*read_paths, *write_paths]):
        raise UnreadableWorkdirError(f"working directory {workdir} is not readable under this "
                                     "policy")
    owner_mapped = owner_mapped_paths(granted, runtime_read_set()) if owner_mapping else []
    mounts = private_mounts()
    write_paths = list(dict.fromkeys([*write_paths, *_host_shm(writable, mounts["dev_shm"])]))
    present, stamp = _view_state(hidden, [*read_paths, *write_paths, *owner_mapped, *protected],
                                 closed)
    return ChildPlan(
        kind=kind,
        argv=argv,
        env=child_env,
        cwd=workdir,
        read_paths=read_paths,
        write_paths=write_paths,
        rlimits=rlimits_for(capability, kind, disk_headroom, shared_tasks),
        uid=uid,
        gid=gid,
        proxy_port=proxy_port,
        hidden_paths=present,
        view_stamp=stamp,
        owner_mapped=owner_mapped,
        protected_paths=protected if hidden_by_mounts() else [],
        closed_folders=closed,
        list_everywhere=mounts["proc"] and hidden_by_mounts() and _reads_everywhere(granted_reads),
        private_proc=mounts["proc"],
        private_shm=mounts["dev_shm"],
        # where the proxy cannot listen in a namespace of the child's own
        connect_by_notification=proxy_port is not None and not network_namespaces(),
        sized_home=home if sized_home else None,
        pid_max=pid_ceiling(capability.resource_limits.max_processes) if mounts["proc"] else None,
    )


# Linux hands out pids below this only until a namespace's numbers first wrap (RESERVED_PIDS):
# a namespace's pid_max must lie above it, and past the wrap only the pids between it and
# pid_max are left.
LINUX_RESERVED_PIDS = 300


def pid_ceiling(max_processes: int) -> int:
    """The pid_max of a child's PID namespace: its first process, the policy's processes and
    one more, above the numbers Linux keeps after the first wrap. A fork bomb of a child
    that RLIMIT_NPROC does not bind (root's own uid) stops there, not at the host's pid_max."""
    return LINUX_RESERVED_PIDS + max_processes + 2


def _host_shm(writable: list[str], private_shm: bool) -> list[str]:
    """The host's /dev/shm as a write path where the child has none of its own and the policy
    may write at all: multiprocessing's semaphores (shared, and outside the quota: the
    report says so)."""
    return ["/dev/shm"] if not private_shm and writable and os.path.isdir("/dev/shm") else []


def _view_state(hidden: dict[str, list[str]], paths: list[str], closed: list[str]
                ) -> tuple[dict[str, list[str]], str]:
    """The hidden paths present now, and the stamp of everything a view prepared ahead binds
    and rules by inode (`paths`, and the listings of the `closed` folders, whose subfolders
    it rules): one replaced since makes a new view."""
    versions: list[object] = [_identity(path) for path in paths]
    versions += [_listing_identity(folder) for folder in closed]
    present = present_hidden(hidden, versions)  # adds the hidden folders' and entries'
    return present, view_stamp(versions)


def _refuse_moved(readable: list[str], writable: list[str],
                  pinned: tuple[list[str], list[str]] | None) -> None:
    """A grant that resolves elsewhere than when the sandbox was made refuses the run."""
    if pinned is not None and (readable, writable) != pinned:
        moved = sorted(set(readable + writable) - set(pinned[0] + pinned[1]))
        raise SandboxError(
            "a policy path resolves somewhere else than when the sandbox was created "
            f"(now {', '.join(moved) or 'a different set'}): was a folder replaced by a symlink? "
            "Refusing to run; create a new sandbox if the change is intended"
        )


def _environment_and_command(capability: CapabilityDeclaration, kind: str, argv: list[str],
                             home: str, env: dict[str, str] | None, proxy_port: int | None
                             ) -> tuple[dict[str, str], list[str]]:
    """The child's environment (the proxy's address the runner's alone) and its argv."""
    child_env = child_environment(capability, home, env)
    for name in (*PROXY_ENV_NAMES, "NO_PROXY", "no_proxy"):
        child_env.pop(name, None)  # only the runner says where the way out is
    if proxy_port is not None:
        child_env.update(dict.fromkeys(PROXY_ENV_NAMES, f"http://127.0.0.1:{proxy_port}"))
    if kind == "exec":
        argv = resolve_command(argv, child_env)
    elif kind == "session":
        child_env = {**SESSION_ENV, **child_env}
    return child_env, argv


def _refuse_homes(readable: list[str], writable: list[str],
                  hidden: dict[str, list[str]]) -> None:
    """No grant inside the sandboxes' homes, nor around them unless they are hidden there."""
    homes = os.path.realpath(homes_folder())
    for path in readable + writable:
        holds_hidden_homes = (path in readable  # "everywhere" holds /tmp
                              and os.path.basename(homes) in hidden.get(os.path.dirname(homes), ()))
        if is_within(path, homes) or (is_within(homes, path) and not holds_hidden_homes):
            raise SandboxError(f"policy path {path} reaches into the sandboxes' homes ({homes})")


def _write_protection(capability: CapabilityDeclaration, readable: list[str],
                      writable: list[str], named: list[str]
                      ) -> tuple[list[str], list[str], list[str], list[str]]:
    """(the protected paths inside the writable ones, the folders closed to new names,
    readable, writable): with mounts the child binds the protected paths read-only; without,
    Landlock only allows, so a writable folder holding one becomes rules for its other
    entries (its own top level, and each folder on the way, only readable). The closed
    folders are Landlock's in both (`child/bootstrap.py` `rules_for`)."""
    named_writable = [path for path in named if path in writable]
    protected, closed = write_protection(writable, kernel_workdirs(), _policy_file(capability),
                                         named_writable)
    closed = [folder for folder in closed if not any(is_within(folder, path) for path in protected)]
    if protected and not hidden_by_mounts():
        return protected, closed, [*readable, *writable], split_around_denied(
            writable, protected, named_writable)
    return protected, closed, readable, writable


def _reads_everywhere(readable: list[str]) -> bool:
    """Whether the grants are "read everywhere" (`filesystem_grants` puts its rules in)."""
    return set(_everywhere_read_set()) <= set(readable)


def _policy_file(capability: CapabilityDeclaration) -> str | None:
    source = capability.source_file
    return None if source is None else str(source)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _listing_identity(folder: str) -> tuple[int, int, int] | None:
    """A folder's identity and the time its list of names last changed."""
    try:
        info = os.stat(folder)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns
