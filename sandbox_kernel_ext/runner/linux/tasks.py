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

__all__ = ["PROXY_THREAD_NAME", "SPARE_NAME", "unsandboxed_tasks"]

# What a spare calls itself in `ps` (and /proc/PID/comm) until its run arrives: a process made
# ahead, not a run. Its run takes back the launcher's name.
SPARE_NAME = b"sandbox-spare"
# The egress proxy's threads (`trusted/egress_proxy.py`): a sandbox starts one per connection,
# up to its proxy's cap, and closes them when it likes. Counted, they would become another
# sandbox's room the moment it closed them.
PROXY_THREAD_NAME = b"sandbox-egress"
# Tasks of the kernel's uid that belong to sandboxes though they carry no more filters than
# the kernel, by how their names begin (Python 3.14 names a thread's task after the thread,
# cut to 15 bytes: "sandbox-egress-"). Leaving a task out can only narrow a room: a child that
# names its own threads so gains nothing.
_SANDBOXES_OWN = (SPARE_NAME, PROXY_THREAD_NAME)


def unsandboxed_tasks(uid: int) -> int:
    """Tasks whose real uid is `uid`, which carry no more seccomp filters than this process
    and are not a spare or a proxy thread, among the processes it can see (every process
    of that uid where Linux does not say how many filters a process has, before 5.9).
    Counted task by task, each by its name read after it was listed: a proxy thread that
    starts or ends during the scan is never counted."""
    own = _status_fields("/proc/self")
    limit = own[1] if own is not None else None
    total = 0
    try:
        with os.scandir("/proc") as entries:
            for entry in entries:
                if not entry.name.isdigit():
                    continue
                fields = _status_fields(entry.path)
                if fields is None or fields[0] != uid:
                    continue
                if limit is None or fields[1] is None or fields[1] <= limit:
                    total += _tasks_outside_sandboxes(entry.path)
    except OSError:  # /proc unreadable part-way: what was counted
        pass
    return total


def _tasks_outside_sandboxes(folder: str) -> int:
    """The process's tasks (threads) that are not named as a sandbox's; 0 if it is gone."""
    try:
        with os.scandir(f"{folder}/task") as tasks:
            names = [entry.path for entry in tasks if entry.name.isdigit()]
    except OSError:
        return 0
    counted = 0
    for task in names:
        try:
            with open(f"{task}/comm", "rb") as comm:
                name = comm.read().rstrip(b"\n")
        except OSError:
            continue  # ended since it was listed
        counted += not name.startswith(_SANDBOXES_OWN)
    return counted


def _status_fields(folder: str) -> tuple[int, int | None] | None:
    """(real uid, seccomp filters or None) of a process; None if it is gone."""
    real, filters = None, None
    try:
        with open(f"{folder}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Uid:"):
                    real = int(line.split()[1])
                elif line.startswith(b"Seccomp_filters:"):
                    filters = int(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        return None
    if real is None:
        return None
    return real, filters
