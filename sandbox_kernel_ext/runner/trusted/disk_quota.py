"""What a sandbox stores on disk, against the policy's `file_limits.max_total_bytes`.

The file toolset counts its own writes (`files/storage_ledger.py`); a confined child writes
with plain syscalls, which nothing on the way counts, and without a cgroup or a filesystem
quota of our own Linux has no per-tree disk budget. So the monitor measures: the blocks
allocated under the sandbox's writable folders and its home, walked, against what they held
when the sandbox was made. Each walk is timed and the next one waits at least twenty times as
long, so a large folder costs at most a twentieth of a core; what a cell writes between two
walks can pass the quota by that much before the kill (each file is held to
`max_file_size_mb` by RLIMIT_FSIZE all along).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable

__all__ = ["DiskQuota", "stored_bytes"]

# The next walk waits at least this many times as long as the last one took.
_COST_FACTOR = 20


def stored_bytes(folders: Iterable[str]) -> int:
    """Bytes allocated to everything under `folders` (each inode once; no symlink followed,
    no other filesystem entered)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top in folders:
        try:
            device = os.lstat(top).st_dev
        except OSError:
            continue
        pending = [top]
        while pending:
            try:
                entries = os.scandir(pending.pop())
            except OSError:
                continue  # removed meanwhile, or not ours to list
            with entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                        pending.append(entry.path)
    return total


class DiskQuota:
    """One sandbox's folders, what they held when it was made, and its quota."""

    def __init__(self, folders: list[str], limit: int) -> None:
        self.folders = list(folders)
        self.limit = limit
        self._lock = threading.Lock()
        started = time.monotonic()
        self.baseline = stored_bytes(self.folders)
        self.added = 0  # at the last walk
        self._next_walk = started + _COST_FACTOR * (time.monotonic() - started)

    def walk_if_due(self, min_interval: float, *, now_anyway: bool = False) -> int:
        """Bytes added since the sandbox was made, walked again when the last walk is old
        enough (else the last figure) or `now_anyway`."""
        with self._lock:
            now = time.monotonic()
            if now_anyway or now >= self._next_walk:
                self.added = stored_bytes(self.folders) - self.baseline
                took = time.monotonic() - now
                self._next_walk = now + max(min_interval, _COST_FACTOR * took)
            return self.added

    def exceeded(self, added: int) -> str | None:
        if added <= self.limit:
            return None
        return (f"disk quota exceeded: {added:,} bytes added to its writable folders and home, "
                f"file_limits.max_total_bytes is {self.limit:,}")
