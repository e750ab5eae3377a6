"""What a run double-forks stays in the run: its memory and CPU count against the run's
budgets, and it ends when the run ends.

Found in review: without a PID namespace (Docker's default profile, a pod's uid) a process a
cell double-forked was reparented to the launcher, out of the tree the monitor samples; six
of them held 400 MB each under a 256 MB budget. The run's first process is now a subreaper,
as PID 1 of a PID namespace is. Runs in every container profile with the security suite.
"""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

from sandbox_kernel_ext import CapabilityDeclaration, ResourceLimits, SandboxManager

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

LIMIT_MB = 96

# The grandchild says it is there, then holds three times the limit; its parent has ended,
# so it is an orphan; the run's own process sleeps on.
NAME = f"sbxorph{os.getpid() % 100000}"  # a process name holds 15 bytes
ORPHAN = f"""
import ctypes, os, sys, time
NAME = {NAME!r}
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        ctypes.CDLL(None).prctl(15, NAME.encode(), 0, 0, 0)  # PR_SET_NAME
        os.write(w, b"orphaned\\n")
        held = bytearray({3 * LIMIT_MB} << 20)
        for i in range(0, len(held), 4096):
            held[i] = 1
        time.sleep(60)
    os._exit(0)
os.close(w)
print(os.read(r, 64).decode().strip(), flush=True)
time.sleep(30)
"""


def _orphans() -> list[int]:
    """Host processes named as the orphan names itself, alive."""
    found = []
    for process in psutil.process_iter(["name", "status"]):
        if process.info["name"] == NAME and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process.pid)
    return found


def test_an_orphans_memory_counts_and_it_ends_with_the_run() -> None:
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(
        max_memory_mb=LIMIT_MB, max_cpu_seconds=30, max_processes=16))
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, ORPHAN, timeout=40)
        assert "orphaned" in result.stdout, result  # the attack ran
        assert "Memory limit exceeded" in (result.killed or ""), result
        deadline = time.monotonic() + 10
        while _orphans() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _orphans()  # ended with the run, not left for the sandbox's end


def test_the_run_cannot_give_its_orphans_away() -> None:
    """Found in review: the cell is the run's first process, so it could clear its own
    subreaper flag (prctl(PR_SET_CHILD_SUBREAPER, 0)) and send the next orphan to the
    launcher, outside every budget (308 MB under 96 MB). Seccomp refuses that prctl, so the
    orphan stays in the run and the run ends at the limit."""
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(
        max_memory_mb=LIMIT_MB, max_cpu_seconds=30, max_processes=16))
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('cleared' if libc.prctl(36, 0, 0, 0, 0) == 0 else 'refused', flush=True)\n"
            + ORPHAN)
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, code, timeout=40)
    assert result.stdout.startswith("refused"), result
    assert "Memory limit exceeded" in (result.killed or ""), result
    deadline = time.monotonic() + 10
    while _orphans() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _orphans()
