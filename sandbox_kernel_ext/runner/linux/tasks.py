"""How many tasks (processes and threads) of a uid run outside every sandbox: what
RLIMIT_NPROC counts beside a sandbox's own.

Linux counts a uid's tasks per user namespace. A child that keeps the kernel's uid with no
user namespace of its own (Docker's default profile refuses them, and so do hosts that
restrict unprivileged user namespaces) is counted with every task of that uid: the kernel's
threads, the Jupyter server's, other kernels'. Its budget is then what the uid has outside
the sandboxes plus the sandbox's own (`plan.rlimits_for`). Tasks of other sandboxes are left
out, or one sandbox's tasks would widen the next one's room (and that one's, the first's
again): a sandbox's task carries more seccomp filters than the kernel, and cannot drop one.
"""

from __future__ import annotations

import os

__all__ = ["unsandboxed_tasks"]


def unsandboxed_tasks(uid: int) -> int:
    """Tasks whose real uid is `uid` and which carry no more seccomp filters than this
    process, among the processes it can see (all of that uid's where Linux does not say how
    many filters a process has, before 5.9)."""
    own = _status_fields("/proc/self")
    limit = own[2] if own is not None else None
    total = 0
    try:
        with os.scandir("/proc") as entries:
            for entry in entries:
                if not entry.name.isdigit():
                    continue
                fields = _status_fields(entry.path)
                if fields is None or fields[0] != uid:
                    continue
                if limit is None or fields[2] is None or fields[2] <= limit:
                    total += fields[1]
    except OSError:  # /proc unreadable part-way: what was counted
        pass
    return total


def _status_fields(folder: str) -> tuple[int, int, int | None] | None:
    """(real uid, threads, seccomp filters or None) of a process; None if it is gone."""
    real, threads, filters = None, None, None
    try:
        with open(f"{folder}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Uid:"):
                    real = int(line.split()[1])
                elif line.startswith(b"Threads:"):
                    threads = int(line.split()[1])
                elif line.startswith(b"Seccomp_filters:"):
                    filters = int(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        return None
    if real is None or threads is None:
        return None
    return real, threads, filters
