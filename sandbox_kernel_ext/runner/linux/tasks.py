"""How many tasks (processes and threads) a uid has: what RLIMIT_NPROC counts.

Linux counts a uid's tasks per user namespace. A child that keeps the kernel's uid with no
user namespace of its own (Docker's default profile refuses them) is counted with every task
of that uid: the kernel's threads, the Jupyter server's, other containers' of the same uid.
Its budget is then what the uid has now plus the sandbox's own (`plan.rlimits_for`).
"""

from __future__ import annotations

import os

__all__ = ["uid_tasks"]


def uid_tasks(uid: int) -> int:
    """Tasks whose real uid is `uid`, among the processes this process can see."""
    total = 0
    try:
        entries = os.scandir("/proc")
    except OSError:
        return 0
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            total += _tasks_of(entry.path, uid)
    return total


def _tasks_of(folder: str, uid: int) -> int:
    """The process's thread count if its real uid is `uid`, else 0 (also if it is gone)."""
    try:
        with open(f"{folder}/status", "rb") as status:
            real, threads = None, 0
            for line in status:
                if line.startswith(b"Uid:"):
                    real = int(line.split()[1])
                elif line.startswith(b"Threads:"):
                    threads = int(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        return 0
    return threads if real == uid else 0
