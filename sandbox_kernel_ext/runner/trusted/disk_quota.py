"""What a sandbox stores on disk, against the policy's `file_limits.max_total_bytes`.

The file toolset counts its own writes (`files/storage_ledger.py`); a confined child writes
with plain syscalls, which nothing on the way counts, and without a cgroup or a filesystem
quota of our own Linux has no per-tree disk budget. So the trusted side measures: the blocks
allocated under the sandbox's writable folders and its home, walked, plus files the tree holds
open with no name left (unlinked, or made with O_TMPFILE), against what the folders held when
the sandbox was made.

The walk goes by directory descriptor (`os.fwalk`): no path is too long for it, and no folder
swapped for a symlink leads it elsewhere. A folder it cannot list that it could list when the
sandbox was made counts as over the quota: what it holds cannot be known. Walks run on a
thread of their own and never hold up the monitor's other checks; each is timed, and the next
one comes twenty times as long after (a large folder costs a twentieth of a core), but never
more than 5 s after. What a cell writes between two walks can pass the quota by that much
before the kill (each file is held to what is left by RLIMIT_FSIZE all along).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["DiskQuota", "HOME_INODE_BYTES", "Usage", "home_inodes", "measure", "mounts_used"]

# The next walk waits at least this many times as long as the last one took, and at most
# this long: a cell that slows the walks down (a flood of empty files) cannot buy itself a
# long unwatched stretch.
_COST_FACTOR = 20
_MAX_PAUSE = 5.0
# A walk a burst asks for (`walk_now`) comes no sooner than this many times the last walk's
# cost after its end: a cell that keeps the free space falling with nothing to count (a file
# held only in a socket's queue) holds the walks to a fifth of a core.
_BURST_COST_FACTOR = 4
# What each file or folder costs at least: an inode, even with no block (250,000 empty files
# held no block but slowed every walk to a second).
INODE_BYTES = 256


# What each file or folder of a home's tmpfs costs the quota, in kernel memory (an inode and
# its dentry take about 1 KiB of slab): a 10 MB quota's home holds 10,240 of them.
HOME_INODE_BYTES = 1024


def home_inodes(size: int) -> int:
    """How many files and folders a home tmpfs of `size` bytes may hold."""
    return max(size // HOME_INODE_BYTES, 16)


def _pause_after(took: float) -> float:
    """How long after a walk that took `took` seconds the next one is due."""
    return min(_COST_FACTOR * took, _MAX_PAUSE)


class Usage:
    """One measurement: bytes allocated, and the folders that could not be listed."""

    def __init__(self) -> None:
        self.bytes = 0
        self.unlisted: set[str] = set()
        self.stop_above: int | None = None
        self._seen: set[tuple[int, int]] = set()

    def count(self, info: os.stat_result) -> None:
        if (info.st_dev, info.st_ino) not in self._seen:
            self._seen.add((info.st_dev, info.st_ino))
            self.bytes += max(info.st_blocks * 512, INODE_BYTES)
            if self.stop_above is not None and self.bytes > self.stop_above:
                raise _OverTheTop


class _OverTheTop(Exception):
    """The walk has counted past the point that matters (`measure`'s `stop_above`)."""


def measure(folders: Iterable[str], open_files: Iterable[str] = (), *,
            stop_above: int | None = None) -> Usage:
    """Blocks under `folders` (each inode once, at least `INODE_BYTES`; no symlink followed,
    no other filesystem entered; a top that is a file counts as itself) and of the
    `open_files` (/proc/PID/fd and /proc/PID/map_files entries) that have no name left on
    those folders' filesystems. With `stop_above`, the walk ends as soon as it has counted
    more than that many bytes (a burst past the quota is known without counting all of it)."""
    usage = Usage()
    usage.stop_above = stop_above
    try:
        devices = {info.st_dev for info in _walk_tops(folders, usage)}
        for link in open_files:
            try:
                info = os.stat(link)  # follows the descriptor to its file, named or not
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and info.st_dev in devices:
                usage.count(info)
    except _OverTheTop:
        pass
    return usage


def _walk_tops(folders: Iterable[str], usage: Usage) -> list[os.stat_result]:
    """Walk each of `folders` into `usage`; their own stat results (those that exist)."""
    tops = []
    for top in folders:
        try:
            info = os.lstat(top)
        except OSError:
            usage.unlisted.add(top)
            continue
        tops.append(info)
        usage.count(info)
        if stat.S_ISDIR(info.st_mode):
            _walk(top, info.st_dev, usage)
    return tops


def _walk(top: str, device: int, usage: Usage) -> None:
    def unlisted(error: OSError) -> None:
        if error.errno not in (errno.ENOENT, errno.ENOTDIR):  # gone or replaced meanwhile
            usage.unlisted.add(error.filename or top)

    try:
        _walk_from(top, device, usage, unlisted)
    except FileNotFoundError:  # the top itself went away after its lstat (a destroyed home):
        pass                   # fwalk opens it outside `onerror`'s reach


def _walk_from(top: str, device: int, usage: Usage, unlisted) -> None:
    for folder, dirs, files, folder_fd in os.fwalk(top, onerror=unlisted):
        keep = []
        for name in dirs:
            try:
                info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            except OSError:
                continue
            usage.count(info)
            if info.st_dev == device:
                keep.append(name)
        dirs[:] = keep
        for name in files:
            try:
                usage.count(os.stat(name, dir_fd=folder_fd, follow_symlinks=False))
            except OSError:
                continue


def _one_per_filesystem(folders: list[str]) -> list[str]:
    chosen: dict[int, str] = {}
    for folder in folders:
        try:
            chosen.setdefault(os.lstat(folder).st_dev, folder)
        except OSError:
            continue
    return list(chosen.values())


def _free_space(folders: list[str | int]) -> list[tuple[int, int] | None]:
    """(free bytes, free inodes) of each folder's filesystem (a path, or a descriptor on
    it), None where it cannot be read."""
    free: list[tuple[int, int] | None] = []
    for folder in folders:
        try:
            info = os.statvfs(folder)
        except OSError:
            free.append(None)
            continue
        free.append((info.f_bfree * info.f_frsize, info.f_ffree))
    return free


def mounts_used(mounts: Iterable[int]) -> int:
    """The bytes the filesystems of `mounts` (descriptors of a home's tmpfs) hold in their
    blocks. Their files and folders are not counted: the tmpfs caps them itself."""
    used = 0
    for mount in mounts:
        try:
            info = os.statvfs(mount)
        except OSError:  # closed: its sandbox was destroyed while a walk ran
            continue
        used += (info.f_blocks - info.f_bfree) * info.f_frsize
    return used


class DiskQuota:
    """One sandbox's folders (and the tmpfs of its home, if it has one: `mounts`, counted
    whole by `statvfs`), what they held when it was made, and its quota."""

    def __init__(self, folders: list[str], limit: int, mounts: Iterable[int] = ()) -> None:
        self.folders = list(folders)
        self.mounts = list(mounts)  # descriptors the caller owns and keeps open
        self.limit = limit
        self._lock = threading.Lock()
        started = time.monotonic()
        baseline = measure(self.folders)
        self.baseline = baseline.bytes + mounts_used(self.mounts)
        self._unlisted_before = baseline.unlisted  # not ours to list from the start
        self.added = 0  # at the last walk
        self.unlisted: set[str] = set()
        self._next_walk = time.monotonic() + _pause_after(time.monotonic() - started)
        self._walking: threading.Thread | None = None
        self._burst_walk_at = 0.0
        # One folder per filesystem the folders are on, and their free space and inodes
        # when the last walk began: a fall by more than the quota has left means a burst.
        self._filesystems: list[str | int] = [*_one_per_filesystem(self.folders), *self.mounts]
        self._free_at_walk = self._free_at_look = _free_space(self._filesystems)
        self.moving = False  # whether the free space changed between the last two looks

    def measure_now(self, open_files: Callable[[], list[str]] = list) -> int:
        """Walk now (on the caller's thread) and return the bytes added (once past the
        quota, the walk stops counting: the figure is then at least that)."""
        started = time.monotonic()
        self._free_at_walk = _free_space(self._filesystems)
        usage = measure(self.folders, open_files(), stop_above=self.baseline + self.limit)
        used = usage.bytes + mounts_used(self.mounts)
        with self._lock:
            ended = time.monotonic()
            self.added = used - self.baseline
            self.unlisted = usage.unlisted - self._unlisted_before
            self._next_walk = ended + _pause_after(ended - started)
            self._burst_walk_at = ended + _BURST_COST_FACTOR * (ended - started)
            return self.added

    def walk_now(self, open_files: Callable[[], list[str]],
                 on_measured: Callable[[int], None]) -> None:
        """Start a walk on the walk thread now (a burst was seen), unless one is running or
        the last ended less than `_BURST_COST_FACTOR` times its cost ago; `on_measured(added)`
        is called on that thread when it is done, so the caller can judge it at once."""
        with self._lock:
            busy = self._walking is not None and self._walking.is_alive()
            if busy or time.monotonic() < self._burst_walk_at:
                return
            self._walking = threading.Thread(target=self._walk_and_report,
                                             args=(open_files, on_measured),
                                             name="sandbox-disk-walk", daemon=True)
            self._walking.start()

    def _walk_and_report(self, open_files: Callable[[], list[str]],
                         on_measured: Callable[[int], None]) -> None:
        on_measured(self.measure_now(open_files))

    def measure_if_due(self) -> int:
        """Walk now if the last walk is old enough (on the caller's thread), else its figure."""
        with self._lock:
            due = time.monotonic() >= self._next_walk
            added = self.added
        return self.measure_now() if due else added

    def walk_if_due(self, min_interval: float, open_files: Callable[[], list[str]] = list) -> int:
        """The bytes added at the last walk; starts another walk on its own thread when the
        last one is old enough (at least `min_interval`, and twenty times its cost)."""
        with self._lock:
            due = time.monotonic() >= self._next_walk
            busy = self._walking is not None and self._walking.is_alive()
            if due and not busy:
                self._next_walk = time.monotonic() + min_interval
                self._walking = threading.Thread(target=self.measure_now, args=(open_files,),
                                                 name="sandbox-disk-walk", daemon=True)
                self._walking.start()
            return self.added

    def burst_seen(self) -> bool:
        """Whether the filesystems the folders are on have lost more space (or more inodes,
        at `INODE_BYTES` each) since the last walk began than the quota has left: a walk is
        due now. A `statfs` per filesystem, cheap enough to ask every few milliseconds; what
        other processes write there only brings a walk sooner, never a kill."""
        with self._lock:
            left = self.limit - self.added
        free = _free_space(self._filesystems)
        self.moving, self._free_at_look = free != self._free_at_look, free
        for before, now in zip(self._free_at_walk, free):
            if before is None or now is None:
                continue
            if before[0] - now[0] > left or (before[1] - now[1]) * INODE_BYTES > left:
                return True
        return False

    def exceeded(self, added: int) -> str | None:
        with self._lock:
            unlisted = sorted(self.unlisted)
        if unlisted:
            return (f"disk quota cannot be measured: {unlisted[0]} can no longer be listed "
                    "(what it holds would count against file_limits.max_total_bytes)")
        if added <= self.limit:
            return None
        return (f"disk quota exceeded: {added:,} bytes added to its writable folders and home, "
                f"file_limits.max_total_bytes is {self.limit:,}")
