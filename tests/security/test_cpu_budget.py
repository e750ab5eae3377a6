"""CPU of children Linux reaps by itself still counts against the budget (issue 13, §2).

A process that ignores SIGCHLD has its children reaped by the kernel, their CPU time added to
no parent, so neither /proc nor getrusage() sees it: a review ran 8.7 CPU-seconds under
`max_cpu_seconds=2` this way, unkilled. Here a cell forks short-lived spinners one after
another, each well under the monitor's interval, each reaped by Linux, and must be killed for
CPU once the tree's total passes the budget.
"""

from __future__ import annotations

import sys

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, ResourceLimits, SandboxManager
from sandbox_kernel_ext.runner.linux.cpu_clock import tree_clock_available

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(not tree_clock_available(),
                       reason="perf_event_open refused here: the report says CPU of auto-reaped "
                              "children is not counted"),
]

SPINNERS = r"""
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # Linux reaps them; nobody waits
for round in range(ROUNDS):
    # Each spinner holds the write end of the round's pipe: its end of file says the round's
    # spinners have spun their whole share, so they never pile up (on a loaded machine a
    # round takes longer than any sleep would allow, and piled-up forks add up to the
    # memory budget before the CPU one).
    spun, spinning = os.pipe()
    for _ in range(WIDTH):
        if os.fork() == 0:
            os.close(spun)
            start = time.process_time()
            while time.process_time() - start < 0.15:  # shorter than one monitor interval
                pass
            os._exit(0)
    os.close(spinning)
    os.read(spun, 1)
    os.close(spun)
print("finished")
"""


@pytest.mark.parametrize("width", [1, 4], ids=["one at a time", "four at a time"])
def test_auto_reaped_children_are_counted_and_killed(width: int) -> None:
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(
        max_cpu_seconds=1.0, max_processes=64, max_memory_mb=512))
    with SandboxManager() as manager:
        result = manager.run_python(manager.create_sandbox(policy), SPINNERS,
                                    inputs={"ROUNDS": 40, "WIDTH": width}, timeout=60)
    # 40 rounds of 0.15 CPU-seconds per spinner: 6 (or 24) CPU-seconds, far over the budget
    assert result.killed is not None and "cpu" in result.killed.lower(), result
    assert "finished" not in result.stdout
    assert result.resource_usage["cpu_seconds"] >= 1.0, result.resource_usage


def test_the_report_counts_exited_children() -> None:
    """A finished run's CPU includes children reaped by Linux, not only those waited for."""
    with SandboxManager() as manager:
        result = manager.run_python(manager.create_sandbox(CapabilityDeclaration()), SPINNERS,
                                    inputs={"ROUNDS": 4, "WIDTH": 1}, timeout=60)
    assert result.exit_code == 0 and "finished" in result.stdout, result
    assert result.resource_usage["cpu_seconds"] >= 0.5, result.resource_usage  # 4 × 0.15


UNREADABLE_PROGRAM = r"""
import errno, os, shutil, signal, struct
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
home = os.environ["HOME"]
routes = {}
def attempt(name, make):
    path = os.path.join(home, name)
    try:
        make(path)
    except OSError as exc:
        routes[name] = "refused: " + errno.errorcode.get(exc.errno, str(exc.errno))
        return
    try:
        with open(path, "rb"):
            routes[name] = "readable"
    except PermissionError:
        routes[name] = "unreadable"
def by_chmod(path):
    shutil.copy("/bin/dash", path)
    os.chmod(path, 0o111)
def by_umask(path):
    old = os.umask(0o477)
    try:
        with open(path, "wb") as out, open("/bin/dash", "rb") as src:
            out.write(src.read())
    finally:
        os.umask(old)
    os.chmod(path, os.stat(path).st_mode | 0o111)
def by_acl(path):
    shutil.copy("/bin/dash", path)
    os.chmod(path, 0o755)
    # system.posix_acl_access: version 2; user::--x, group::--x, other::--x
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, 1, 0xFFFFFFFF)
                                           for tag in (0x01, 0x04, 0x20))
    os.setxattr(path, "system.posix_acl_access", acl)
for name, make in (("chmod", by_chmod), ("umask", by_umask), ("acl", by_acl)):
    attempt(name, make)
print(routes, flush=True)
unreadable = [os.path.join(home, n) for n, r in routes.items() if r == "unreadable"]
program = unreadable[0] if unreadable else "/bin/dash"
for _ in range(40):  # 40 spinners of ~0.2 CPU-seconds, reaped by Linux
    if os.fork() == 0:
        os.execv(program, [program, "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
    import time; time.sleep(0.2)
print("finished")
"""


def test_a_program_it_may_run_but_not_read_cannot_stop_the_clock() -> None:
    """Found in review: exec of a program its owner may run but not read makes a process
    non-dumpable, and Linux then stops its perf counters (a "security domain" crossing), so
    40 spinners ran 11 CPU-seconds under a 2 s budget. No route makes such a program now
    (chmod 0111, a umask without the owner's read bit, an ACL), and the tree is killed."""
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(
        max_cpu_seconds=1.0, max_processes=64, max_memory_mb=512))
    with SandboxManager() as manager:
        result = manager.run_python(manager.create_sandbox(policy), UNREADABLE_PROGRAM,
                                    timeout=120)
    assert "'unreadable'" not in result.stdout, result.stdout
    assert result.killed is not None and "cpu" in result.killed.lower(), result
    assert "finished" not in result.stdout
