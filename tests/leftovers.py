"""Which sandbox processes a test module started and left running.

Not every process of the sandbox's uid on the host: another sandbox (a user's, a parallel
test run) may be running beside the tests. A process counts as the module's when it is a
descendant of this test process (only when the sandbox uid is not ours, since our own
launchers are descendants too), or, wherever it went (a process the runner failed to kill is
reparented away, but keeps its environment), when its environment carries the module's
marker (as a variable, or inside a value such as PATH: the only thing a launcher keeps of its
parent's environment) or its HOME lies in one of the folders the module handed out.
A launcher's spare (the next run's child, made ahead and waiting, named `SPARE_NAME` until
its run arrives) is not a leftover while its launcher lives.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path

import psutil

from sandbox_kernel_ext.runner.linux.tasks import SPARE_NAME


def own_sleep_marker() -> str:
    """A number for a test's `sleep N` that no other test uses, here or in a test group
    running beside it, so a scan of every process on the host finds this test's alone."""
    return str(10**8 + secrets.randbelow(10**8))


def is_spare(proc: psutil.Process) -> bool:
    """Whether `proc` is a launcher's spare, waiting for a run (not a run left behind)."""
    try:
        return proc.name() == SPARE_NAME.decode()
    except psutil.Error:
        return False


def sandbox_processes(uid: int, marker: str, homes: Iterable[str | Path] = ()) -> list[str]:
    """`pid [cmdline]` of each live process of `uid` that the module started."""
    folders = [str(home).rstrip("/") for home in homes]
    descendants: set[int] = set()
    if uid != os.getuid():
        descendants = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for proc in psutil.process_iter(["uids", "cmdline"]):
        try:
            uids = proc.info["uids"]
            if uids is None or uid not in (uids.real, uids.effective, uids.saved):
                continue
            ours = proc.pid in descendants
            if not ours:
                try:
                    env = proc.environ()
                except (psutil.AccessDenied, psutil.ZombieProcess):
                    env = {}
                home = env.get("HOME", "")
                ours = (any(marker in value for value in env.values())
                        or any(home == f or home.startswith(f + "/") for f in folders))
            if ours and proc.status() != psutil.STATUS_ZOMBIE and not is_spare(proc):
                found.append(f"{proc.pid} {proc.info['cmdline']}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def leftover_sandbox_processes(uid: int, marker: str, homes: Iterable[str | Path] = (),
                               wait: float = 10.0) -> list[str]:
    """`sandbox_processes`, after waiting up to `wait` seconds for none to be left (a
    namespace's teardown is asynchronous)."""
    homes = list(homes)
    pause = threading.Event()
    for _ in range(int(wait / 0.05)):
        if not sandbox_processes(uid, marker, homes):
            return []
        pause.wait(0.05)
    return sandbox_processes(uid, marker, homes)
