"""A CPU clock for a whole process tree, every process that ever ran in it included.

Linux adds a child's CPU time to its parent only when the parent waits for it; a process that
ignores SIGCHLD has its children reaped by the kernel with their time added nowhere, so
/proc and getrusage() both lose it. A perf software counter (task-clock) opened on a process
with `inherit` follows every process it forks from then on, and Linux folds each one's count
into it when that process exits, however it is reaped. Bindings only: the launcher opens one
per run (`launcher/server.py`), the trusted side's monitor reads it.

It needs perf_event_open for the process (root, CAP_PERFMON, or `perf_event_paranoid` at most
2 with user-space counting); where it is refused, `open_tree_clock` returns None and the
isolation report says CPU of auto-reaped children is not counted.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

from .syscalls import libc

__all__ = ["open_tree_clock", "read_seconds", "tree_clock_available"]

PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_TASK_CLOCK = 1
PERF_FLAG_FD_CLOEXEC = 8
_ATTR_SIZE = 128  # struct perf_event_attr, PERF_ATTR_SIZE_VER7
# Bits of the attr's flags word: inherit to children, count user space only (what an
# unprivileged opener may count; a software clock counts the task's whole time on a CPU).
_INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 1, 1 << 5, 1 << 6
_SYSCALL = {"x86_64": 298, "aarch64": 241}.get(platform.machine())


def _attr() -> ctypes.Array[ctypes.c_char]:
    attr = bytearray(_ATTR_SIZE)
    struct.pack_into("IIQ", attr, 0, PERF_TYPE_SOFTWARE, _ATTR_SIZE, PERF_COUNT_SW_TASK_CLOCK)
    struct.pack_into("Q", attr, 40, _INHERIT | _EXCLUDE_KERNEL | _EXCLUDE_HV)
    return ctypes.create_string_buffer(bytes(attr), _ATTR_SIZE)


def open_tree_clock(pid: int) -> int | None:
    """A descriptor whose reads give the CPU time of `pid` and of everything it forks after
    this call, in nanoseconds; None where perf_event_open is refused or missing."""
    lib = libc()
    if lib is None or _SYSCALL is None:
        return None
    fd = lib.syscall(ctypes.c_long(_SYSCALL), _attr(), ctypes.c_int(pid), ctypes.c_int(-1),
                     ctypes.c_int(-1), ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    return fd if fd >= 0 else None


def read_seconds(fd: int) -> float | None:
    """The clock's count in seconds (None if it cannot be read)."""
    try:
        data = os.read(fd, 8)  # a perf counter has no offset: each read gives the count
    except OSError:
        return None
    return struct.unpack("Q", data)[0] / 1e9 if len(data) == 8 else None


def tree_clock_available() -> bool:
    """Whether this process may open the clock (probed on itself)."""
    fd = open_tree_clock(0)
    if fd is None:
        return False
    os.close(fd)
    return True
