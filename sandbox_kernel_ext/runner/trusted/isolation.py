"""What this host can enforce, measured once: the isolation report and the layer check.

Nothing ever runs with less isolation than asked without saying so: `missing_layers` names
each absent layer, `SandboxManager` warns with that list, and strict mode refuses.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import sys
from typing import Any

from ...policy.errors import SandboxError
from ...policy.models import SandboxTier
from ..linux import landlock, seccomp

__all__ = ["isolation_report", "missing_layers", "sized_homes_possible", "check_tier", "default_child_uid",
           "seen_uid", "read_only_view_available", "private_mounts", "user_namespaces",
           "NOBODY_UID"]

NOBODY_UID = 65534
# The first uid tried for a root kernel's children: high (no distribution hands it out, it is
# below 2**31 for tools that keep uids in a signed int) and not nobody's, which daemons share.
_DEDICATED_UID_TOP = 2**31 - 2
_DEDICATED_UID_FLOOR = 65535  # never a uid of the 16-bit range distributions hand out


@functools.lru_cache(maxsize=1)
def user_namespaces() -> bool:
    """Whether this process may make a user namespace (probed once)."""
    if not sys.platform.startswith("linux"):
        return False
    from ..linux.namespaces import userns_usable

    return userns_usable()


@functools.lru_cache(maxsize=1)
def read_only_view_available() -> bool:
    """Whether a child's mount namespace can show it the host read-only."""
    if not sys.platform.startswith("linux") or not (user_namespaces() or os.geteuid() == 0):
        return False
    from ..linux.namespaces import mount_setattr_available

    return mount_setattr_available()


@functools.lru_cache(maxsize=1)
def private_mounts() -> dict[str, bool]:
    """Whether a child gets a private /proc ("proc") and /dev/shm ("dev_shm"): each mount
    tried once, in throwaway forks with the namespaces a child has. Inside a container
    whose runtime masks /proc paths the first is refused; without namespaces, both. A plan
    asks for what this found, and a child whose mount then fails refuses to run."""
    if not sys.platform.startswith("linux") or not (user_namespaces() or os.geteuid() == 0):
        return {"proc": False, "dev_shm": False}
    from ..linux.namespaces import fresh_mounts

    return fresh_mounts(user_namespaces())


def network_namespaces() -> bool:
    """Whether a child can get its own network namespace (root, or user namespaces allowed),
    where the egress proxy listens for it."""
    return sys.platform.startswith("linux") and (os.geteuid() == 0 or user_namespaces())


@functools.lru_cache(maxsize=1)
def connect_notification() -> bool:
    """Whether the trusted side can answer a child's connects (seccomp user notification with
    descriptors put into the child: Linux 5.9), for egress without a network namespace."""
    if not sys.platform.startswith("linux") or seccomp.supported_arch() is None:
        return False
    if not _linux_at_least(5, 9):
        return False
    return seccomp.action_available(seccomp.NOTIFY)


def _linux_at_least(major: int, minor: int) -> bool:
    release = [int(part) for part in platform.release().split("-")[0].split(".")[:2]
               if part.isdigit()]
    return len(release) == 2 and tuple(release) >= (major, minor)


@functools.lru_cache(maxsize=1)
def sized_homes_possible() -> bool:
    """Whether a sandbox's home can be a tmpfs sized by its quota (`launcher/sized_home.py`):
    a tmpfs can be made and a child in namespaces of its own may attach a copy of it (Linux
    6.15; a container's seccomp profile may refuse the calls), tried once. Elsewhere homes
    stay on disk, under the walks."""
    if not sys.platform.startswith("linux") or not (user_namespaces() or os.geteuid() == 0):
        return False
    from ..linux.namespaces import shared_tmpfs_possible

    return shared_tmpfs_possible(user_namespaces())


def egress_possible() -> bool:
    """Whether a policy's egress rules can be enforced here: through a network namespace of
    the child's own, or by answering its connects; without either a sandbox has no network."""
    return network_namespaces() or connect_notification()


@functools.lru_cache(maxsize=1)
def _tree_clock() -> bool:
    from ..linux.cpu_clock import tree_clock_available

    return sys.platform.startswith("linux") and tree_clock_available()


def _paranoid() -> str:
    try:
        with open("/proc/sys/kernel/perf_event_paranoid") as setting:
            return setting.read().strip()
    except OSError:
        return "unknown"


@functools.lru_cache(maxsize=1)
def default_child_uid() -> int:
    """Under a root kernel, a uid of the sandboxes' own: no account, group or subordinate
    range names it (the account files, and the user databases the C library asks, such as
    systemd's or LDAP's), so no host process runs as it and none can trace or signal a child
    (a process of the child's own uid could; with nobody's, every daemon that drops to it).
    File permissions keep root's private files (logs, debconf's passwords, 0600 files
    anywhere) from it. Root's own uid (`SandboxManager(child_uid=0)`, in a user namespace with
    every capability dropped) makes root's folders and interpreter just work, but reads all
    of those. The same host gives the same uid, so every root kernel on it agrees."""
    taken = _named_ranges()
    uid = _DEDICATED_UID_TOP
    while uid > _DEDICATED_UID_FLOOR:
        below = next((start for start, end in taken if start <= uid < end), None)
        if below is not None:
            uid = below - 1  # under the whole range at once, not one id at a time
        elif _resolves(uid):
            uid -= 1
        else:
            return uid
    raise SandboxError("no uid between 65536 and 2**31 is free of this host's accounts, groups "
                       "and subordinate ranges for sandboxed children: pass "
                       "SandboxManager(child_uid=N) with a uid no process uses")


def _resolves(uid: int) -> bool:
    """Whether the C library's user or group databases know `uid` (NSS: files, systemd, LDAP)."""
    import grp
    import pwd

    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except (KeyError, OverflowError):
            continue
        return True
    return False


def _named_ranges() -> list[tuple[int, int]]:
    """[start, end) ranges of the uids and gids the host's account files name: /etc/passwd,
    /etc/group and the subordinate ranges of /etc/subuid and /etc/subgid (handed to users'
    own namespaces)."""
    def number(fields: list[str], index: int) -> int | None:
        text = fields[index] if index < len(fields) else ""
        return int(text) if text.isascii() and text.isdigit() else None

    ranges: list[tuple[int, int]] = []
    for path in ("/etc/passwd", "/etc/group"):  # name:password:ID:...
        for fields in _colon_lines(path):
            if (named := number(fields, 2)) is not None:
                ranges.append((named, named + 1))
    for path in ("/etc/subuid", "/etc/subgid"):  # name:first:count
        for fields in _colon_lines(path):
            first, count = number(fields, 1), number(fields, 2)
            if first is not None and count is not None:
                ranges.append((first, first + count))
    return ranges


def _colon_lines(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            return [line.rstrip("\n").split(":") for line in lines if not line.startswith("#")]
    except OSError:
        return []


def seen_uid(host_uid: int) -> int:
    """The uid a child of `host_uid` sees itself as inside its user namespace: the default
    child, which has no account, shows as nobody (65534), so tools that look their user up
    find one; another uid shows as itself."""
    return NOBODY_UID if host_uid == default_child_uid() else host_uid


def _child_identity() -> str:
    """Who a child is, as this host makes it (with or without a user namespace): the report
    and `%sandbox status` print it after "Sandboxed children run as"."""
    namespaced = user_namespaces()
    if os.name != "posix" or os.geteuid() != 0:
        uid = os.geteuid() if os.name == "posix" else "?"
        if namespaced:
            return (f"the Jupyter kernel's own uid ({uid}), in a user namespace of their own "
                    "with no capability on the host")
        signals = (", and Landlock's scoping from signalling it"
                   if landlock.landlock_abi() >= landlock.SCOPE_ABI else
                   "; this kernel's Landlock cannot keep them from signalling it")
        return (f"the Jupyter kernel's own uid ({uid}), with no user namespace (this host "
                "refuses them): on the host they are that uid, as the kernel is; seccomp keeps "
                f"them from tracing the kernel's process or changing its limits{signals}")
    if not namespaced:
        return (f"unprivileged uid {default_child_uid()} by default, which no account, group "
                "or subordinate range of this host names, with no user namespace (this host "
                "refuses them): a folder of root's that a policy grants is open to them only "
                "as far as its modes let any user (child_uid=N runs them as N instead)")
    return (f"unprivileged uid {default_child_uid()} by default, which no account, group or "
            "subordinate range of this host names, so no host process can trace or signal a "
            "child; the child sees itself as nobody (65534) in its user namespace. The "
            "folders its policy grants that root owns (and a folder of root's on the way to "
            "them, such as /root) are shown to it as its own through idmapped mounts: what it "
            "creates there is root's (the Jupyter kernel runs as root; child_uid=0 runs "
            "children as root in a user namespace with every capability dropped, which reads "
            "root's private files; child_uid=N runs them as N, which a host process of that "
            "uid can trace)")


def _process_ceiling() -> str:
    """What bounds the number of a child's processes on this host (the report's words)."""
    if not user_namespaces() and os.geteuid() != 0:
        return ("RLIMIT_NPROC (max_processes more than the tasks of the kernel's uid outside "
                "every sandbox when a run or session starts: with no user namespace Linux "
                "counts the child's tasks with all of that uid's, also those of other "
                "containers of the same uid, which this process cannot see and which take "
                "from the child's room) and the monitor's count of its processes")
    return ("RLIMIT_NPROC (max_processes, per uid; root's uid is exempt), and the PID "
            "namespace's own pid_max (302 + max_processes), which binds root's uid too"
            if private_mounts()["proc"] and _linux_at_least(6, 14) else
            "RLIMIT_NPROC (max_processes, per uid; root's uid is exempt: a child_uid=0 tree "
            "is held by the monitor alone, so its first moments can take many of the host's "
            "pids) and the monitor's count")


def _home_space() -> str:
    """Where a sandbox's home lives on this host (the report's words)."""
    return ("a tmpfs of each sandbox's own, of the quota's size and one file per KiB of it: "
            "past either, writes there fail with ENOSPC (its pages are memory, outside the "
            "memory budget but within the quota; a quota whose tmpfs could take more than a "
            "quarter of the memory available keeps its home on disk, under the quota's "
            "walks)" if sized_homes_possible() else
            "a folder on the host's disk, under the quota's walks: a burst of writes can pass "
            "the quota until the next walk (this host cannot give a child a tmpfs copy of "
            "its own: that needs mounts in its namespace and Linux 6.15)")


def isolation_report() -> dict[str, Any]:
    """Which confinement layers this host gives a sandboxed process, and which it lacks."""
    linux = sys.platform.startswith("linux")
    abi = landlock.landlock_abi()
    unenforced = landlock.LandlockRuleset().unenforced() if abi else ["landlock"]
    layers = {
        "landlock": abi >= 1,
        "landlock_tcp": abi >= landlock.NET_ABI,
        "landlock_scoping": abi >= landlock.SCOPE_ABI,
        "seccomp": linux and seccomp.supported_arch() is not None,
        "user_namespace": user_namespaces(),
        "pid_namespace": linux and (user_namespaces() or os.geteuid() == 0),
        "network_namespace": network_namespaces(),
        # Egress without a network namespace: every connect answered by the kernel's process.
        "connect_notification": connect_notification(),
        # Outside its writable roots the child sees the host read-only (no metadata changes).
        "read_only_host_view": read_only_view_available(),
        # Its own /proc (only its processes) and /dev/shm (multiprocessing's semaphores).
        "private_proc": private_mounts()["proc"],
        "private_dev_shm": private_mounts()["dev_shm"],
        "rlimits": os.name == "posix",
        # CPU of children Linux reaps itself (their parent ignores SIGCHLD) counts too.
        "tree_cpu_clock": _tree_clock(),
        "process_tree_monitor": True,
    }
    return {
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": sys.version.split()[0],
        "landlock_abi": abi,
        "landlock_unenforced": [] if abi == 0 else unenforced,
        "running_as_root": os.name == "posix" and os.geteuid() == 0,
        "child_identity": _child_identity(),
        "disk_quota": ("file_limits.max_total_bytes over what a sandbox adds to its writable "
                       "folders and home: timed walks (twenty times their cost apart, at most "
                       "5 s) and a kill past it; RLIMIT_FSIZE holds each file to what is left"),
        "process_ceiling": _process_ceiling(),
        "home_space": _home_space(),
        "process_view": (
            "a /proc of the child's own PID namespace" if private_mounts()["proc"] else
            "the host's /proc, of which Landlock lets a child read its first process's own "
            "entries (but net/) and a few system-wide files (cpuinfo, meminfo, stat, ...) "
            "only; ps and /proc/self of the processes it starts fail, and which pids exist "
            "(and their owners) can still be learned by stat"),
        "egress": (
            "the proxy listens in the child's own network namespace (loopback only)"
            if network_namespaces() else
            "no network namespace: every connect of the child stops and the Jupyter kernel's "
            "process answers it (seccomp user notification), with its own connection to the "
            "proxy for the proxy's address and a refusal for any other"
            if connect_notification() else
            "none: a policy with egress rules gets no network at all"),
        "dev_shm": (
            "a tmpfs of the child's own" if private_mounts()["dev_shm"] else
            "the host's /dev/shm (multiprocessing's semaphores), for policies that may write: "
            "shared with every process of the child's uid there, Jupyter's own included, "
            "outside the disk quota, and not emptied when a run ends"),
        "denied_paths_hidden_by": (
            "mounts in the child's namespace (an empty tmpfs or /dev/null on each; /etc and "
            '"read everywhere" need no enumeration)' if read_only_view_available() else
            "Landlock rules around each denied path, enumerated once per process"
        ),
        "layers": layers,
        "missing": missing_layers(),
        "tiers": {
            "seccomp": "available" if all(layers[k] for k in ("landlock", "seccomp")) else "partial",
            "gvisor": f"unavailable: runsc found ({shutil.which('runsc')}) but not driven yet"
            if shutil.which("runsc") else "unavailable: runsc is not on PATH",
            "firecracker": "unavailable: not supported by this release",
        },
    }


def missing_layers() -> list[str]:
    """Each confinement layer the `seccomp` tier wants and this host cannot give."""
    missing: list[str] = []
    if not sys.platform.startswith("linux"):
        return [f"linux (this is {platform.system()}): no Landlock, seccomp or namespaces"]
    abi = landlock.landlock_abi()
    if abi < 1:
        missing.append("landlock (filesystem confinement)")
    else:
        missing += [f"landlock:{name}" for name in landlock.LandlockRuleset().unenforced()]
    if seccomp.supported_arch() is None:
        missing.append(f"seccomp (no syscall table for {platform.machine()})")
    if not user_namespaces() and os.geteuid() != 0:
        missing.append("namespaces (user namespaces are refused: no PID or network namespace, "
                       "no read-only view of the host)")
    elif not read_only_view_available():
        missing.append("read-only view of the host (no mount_setattr before Linux 5.12): a child "
                       "can change the metadata of files its uid owns outside its roots")
    mounts = private_mounts()
    if not mounts["proc"]:
        missing.append("private /proc (a fresh proc mount is refused here, as inside a container "
                       "whose runtime masks /proc paths): a child reads only its first "
                       "process's own /proc entries and a few system-wide files")
    if not mounts["dev_shm"]:
        missing.append("private /dev/shm (no mount namespace): a child shares the host's "
                       "/dev/shm with every process of its uid")
    if not _tree_clock():
        missing.append("CPU clock of the whole tree (perf_event_open refused, "
                       f"perf_event_paranoid {_paranoid()}): CPU of children reaped by Linux "
                       "(their parent ignores SIGCHLD) is not counted")
    return missing


def check_tier(tier: SandboxTier) -> None:
    """Refuse, with the reason, every tier but `seccomp` (the Linux kernel confinement this runner gives)."""
    if tier is SandboxTier.firecracker:
        raise SandboxError(
            "sandbox_tier 'firecracker' is not available: this release has no Firecracker "
            "backend; use 'seccomp' (Linux kernel confinement) or 'gvisor'"
        )
    if tier is SandboxTier.gvisor:
        runsc = shutil.which("runsc")
        if runsc is None:
            raise SandboxError(
                "sandbox_tier 'gvisor' needs gVisor's runsc on PATH, and it is not installed; "
                "install gVisor or use sandbox_tier 'seccomp'"
            )
        raise SandboxError(
            f"sandbox_tier 'gvisor': runsc is installed ({runsc}) but this release does not "
            "drive it yet; use sandbox_tier 'seccomp'"
        )
    return None
