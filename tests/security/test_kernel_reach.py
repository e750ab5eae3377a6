"""No route from a confined child to another process's limits or memory.

Without a PID namespace (Docker's default profile, a pod's uid) the kernel's process is in a
child's reach by pid: `prlimit` could lower its descriptor limit (its next run fails) or
raise its core limit and make it dump its memory to disk, where a later sandbox reads it.
These run in every profile the container harness runs (tests/containers).
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterator

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager
from sandbox_kernel_ext.runner.linux import landlock, seccomp

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or landlock.landlock_abi() < 1
    or not seccomp.seccomp_available(), reason="needs Landlock and seccomp"
)

ATTACK = """
import errno, os, resource, subprocess, sys, time
def attempt(pid, which, limits):
    try:
        resource.prlimit(pid, which, limits)
        return "changed"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
own = os.getpid()
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
results = {
    "kernel nofile": attempt(KERNEL, resource.RLIMIT_NOFILE, (8, 8)),
    "kernel core": attempt(KERNEL, resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2),
    "launcher core": attempt(LAUNCHER, resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2),
    "own child": attempt(helper.pid, resource.RLIMIT_NOFILE, (16, 16)),
    "own pid by number": attempt(own, resource.RLIMIT_NOFILE, (64, 64)),
}
helper.kill()
resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))  # pid 0: its own limits stay its own
results["self"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
"""


@pytest.fixture(scope="module")
def manager() -> Iterator[SandboxManager]:
    with SandboxManager() as made:
        yield made


def _limits(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/limits") as limits:
        return {line[:26].strip(): line[26:].split()[0] for line in limits.readlines()[1:]}


def test_a_child_changes_no_limit_but_its_own(manager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    manager.run_python(sid, "pass")  # the launcher runs from the first run
    kernel_before = resource.getrlimit(resource.RLIMIT_NOFILE)
    launcher = manager.launcher_pid  # the fork server this manager started
    assert launcher is not None
    code = ATTACK.replace("KERNEL", str(os.getpid())).replace("LAUNCHER", str(launcher))
    result = manager.run_python(sid, code, outputs=["results"])
    manager.destroy(sid)
    results = result.variables.get("results")
    assert results is not None, result
    # Refused (EPERM), or not even found (ESRCH) where a PID namespace hides the process.
    for name in ("kernel nofile", "kernel core", "launcher core", "own child",
                 "own pid by number"):
        assert results[name] in ("EPERM", "ESRCH"), (name, results)
    # ...by the filter itself: the child's own child is a process it could otherwise change.
    assert results["own child"] == "EPERM", results
    assert results["self"] == 32, results
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == kernel_before
    assert _limits(launcher)["Max core file size"] == "0"


def test_the_kernel_and_the_launcher_write_no_core(manager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    manager.run_python(sid, "pass")
    manager.destroy(sid)
    assert resource.getrlimit(resource.RLIMIT_CORE)[0] == 0
    assert manager.launcher_pid is not None
    launcher = _limits(manager.launcher_pid)["Max core file size"]
    assert launcher == "0"


SCHEDULING = """
import ctypes, errno, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
def attempt(call):
    try:
        call()
        return "changed"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
def ioprio(who):
    # IOPRIO_WHO_PROCESS, the idle class
    if libc.syscall(251 if os.uname().machine == "x86_64" else 30, 1, who, 3 << 13) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
results = {}
for name, pid in (("kernel", KERNEL), ("own child", helper.pid)):
    results[name + " nice"] = attempt(lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
    results[name + " affinity"] = attempt(lambda: os.sched_setaffinity(pid, {0}))
    results[name + " idle class"] = attempt(
        lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)))
    results[name + " io priority"] = attempt(lambda: ioprio(pid))
results["its uid's nice"] = attempt(lambda: os.setpriority(os.PRIO_USER, 0, 19))
helper.kill()
results["self nice"] = attempt(lambda: os.nice(1))
results["self affinity"] = attempt(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
"""


def test_a_child_changes_no_scheduling_but_its_own(manager) -> None:
    """Found in review: without a PID namespace a child set the kernel's threads to nice 19,
    one CPU and the idle class, for good (every later monitor thread inherits them)."""
    sid = manager.create_sandbox(CapabilityDeclaration())
    before = (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0))
    result = manager.run_python(sid, SCHEDULING.replace("KERNEL", str(os.getpid())),
                                outputs=["results"])
    manager.destroy(sid)
    results = result.variables.get("results")
    assert results is not None, result
    for name, outcome in results.items():
        if name.startswith("self "):
            assert outcome == "changed", (name, results)
        else:
            assert outcome in ("EPERM", "ESRCH"), (name, results)
    assert results["own child nice"] == "EPERM", results  # by the filter, not the namespace
    assert (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0)) == before
