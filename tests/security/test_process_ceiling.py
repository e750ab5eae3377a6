"""A child's processes have a ceiling Linux enforces, for root's own uid too.

RLIMIT_NPROC binds no process of root's uid, so a `child_uid=0` sandbox's fork bomb was held
only by the monitor: on a loaded machine its first moments took every pid the host had
(other processes' forks failed with EAGAIN, the test suite's own shell among them). The
child's PID namespace now has a pid_max of its own (Linux 6.14): past it, fork fails with
EAGAIN inside the sandbox, and the host keeps its pids.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, ResourceLimits, SandboxManager
from sandbox_kernel_ext.runner.trusted.isolation import (
    _linux_at_least,
    private_mounts,
    user_namespaces,
)
from sandbox_kernel_ext.runner.trusted.plan import PROXY_PORT, pid_ceiling

MAX_PROCESSES = 20
# Children that cost almost nothing (sleep, not a forked interpreter), so that the memory
# budget does not end the run before the ceiling is reached.
BOMB = r"""
import errno, os
made = 0
try:
    while made < 5000:
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/sleep", ["sleep", "30"])
        made += 1
except OSError as exc:
    print(errno.errorcode[exc.errno], made)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="child_uid=0 is a root kernel's choice")
@pytest.mark.skipif(not private_mounts()["proc"], reason="no /proc of the child's own here")
@pytest.mark.skipif(not _linux_at_least(6, 14), reason="pid_max is the host's before Linux 6.14")
def test_a_root_childs_fork_bomb_stops_at_its_namespaces_ceiling() -> None:
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(
        max_processes=MAX_PROCESSES, max_memory_mb=2048))
    # A monitor that looks once an hour stands for one that a loaded machine starves: what
    # holds the bomb then is Linux alone.
    with SandboxManager(child_uid=0, monitor_interval=3600) as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, BOMB, timeout=60)
        ceiling = manager.run_python(sid, "print(open('/proc/sys/kernel/pid_max').read())")
    assert ceiling.stdout.strip() == str(pid_ceiling(MAX_PROCESSES))
    refusal, made = result.stdout.split()
    assert refusal == "EAGAIN" and int(made) < pid_ceiling(MAX_PROCESSES), result


def test_an_unprivileged_childs_fork_bomb_stops_at_its_rlimit() -> None:
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(max_processes=MAX_PROCESSES))
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, BOMB, timeout=60)
    refusal, made = result.stdout.split()
    assert refusal == "EAGAIN" and int(made) < MAX_PROCESSES, result


def test_the_kernels_other_processes_leave_a_sandbox_its_whole_budget() -> None:
    """Where a child keeps the kernel's uid with no user namespace of its own (Docker's
    profile), Linux counts its tasks with every task of that uid: the kernel's threads, the
    server's, other containers' of the same uid. A uid with more tasks than `max_processes`
    left every sandbox without a single fork (seen running the Docker profile's suite beside
    another container of the same uid). The budget is the sandbox's own, on top of them."""
    others = [subprocess.Popen(["sleep", "120"]) for _ in range(MAX_PROCESSES + 5)]
    try:
        policy = CapabilityDeclaration(resource_limits=ResourceLimits(
            max_processes=MAX_PROCESSES))
        with SandboxManager() as manager:
            sid = manager.create_sandbox(policy)
            result = manager.run_python(sid, (
                "import subprocess\n"
                "print(sum(subprocess.run(['true']).returncode for _ in range(3)))"), timeout=60)
    finally:
        for process in others:
            process.kill()
            process.wait()
    assert result.exit_code == 0 and result.stdout == "0\n", result


# Where the tests below mean something: a child counted with the kernel's uid (no user
# namespace of its own, a kernel that is not root): Docker's profile, in the container suite.
COUNTED_WITH_THE_KERNEL = pytest.mark.skipif(
    user_namespaces() or os.geteuid() == 0,
    reason="the child's tasks are counted apart from the kernel's here (a uid or user "
           "namespace of its own): tests/containers runs these under Docker's profile")

THREADS = """
import threading, time
threading.stack_size(64 * 1024)
started = 0
try:
    for _ in range({count}):
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
        started += 1
except RuntimeError:
    pass
print(started)
"""


@COUNTED_WITH_THE_KERNEL
def test_another_sandboxs_tasks_do_not_widen_a_sandboxs_room() -> None:
    """Found in review: counting every task of the uid counted other sandboxes' too, so a
    session started beside one holding many threads got their room on top of its own, and
    once they ended it had it all (threads are bounded by RLIMIT_NPROC alone: the monitor
    counts processes); two sessions taking turns widened each other without end. A
    sandbox's tasks are never counted for another, so after the first session ends the
    second starts about its own `max_processes` of threads, not theirs on top.

    "About": the kernel's own threads that come and go (a cell's monitor, a disk-quota walk)
    are counted when the second session starts and may have ended by the time it forks,
    leaving their room to it, as the guarantees say; on a loaded host one or two. So the
    first holds far more threads than those, and the bound sits halfway between the two
    outcomes."""
    room = 3 * MAX_PROCESSES
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(
        max_processes=room, max_memory_mb=1024))
    with SandboxManager() as manager:
        first, second = manager.create_sandbox(policy), manager.create_sandbox(policy)
        holding = manager.start_session(first)
        holds = holding.run_cell(THREADS.format(count=room - 4))
        held = int(holds.stdout or 0)
        assert held >= room // 2, holds  # the attack ran
        widened = manager.start_session(second)  # counted while the first holds its threads
        try:
            holding.close()
            manager.destroy(first)
            started = widened.run_cell(THREADS.format(count=5 * room))
        finally:
            widened.close()
    assert 0 < int(started.stdout) < room + held // 2, (held, started)


# Connections to the sandbox's egress proxy that never send a request: each holds one of the
# proxy's worker threads in the kernel until its head times out or the session ends.
SILENT_CONNECTIONS = """
import socket
held = [socket.create_connection(("127.0.0.1", {port}), timeout=10) for _ in range({count})]
print(len(held))
"""


@COUNTED_WITH_THE_KERNEL
@pytest.mark.parametrize("managers", ["one manager", "two managers"])
def test_another_sandboxs_proxy_connections_do_not_widen_a_sandboxs_room(managers: str) -> None:
    """Found in review: the egress proxy serves each connection on a thread of the kernel,
    a task of the kernel's uid that carries the kernel's filters, so it was counted as
    outside every sandbox. A sandbox that held 40 silent connections while another session
    started gave that session their 40 on top of its own room once it dropped them (60
    threads under `max_processes` 20), the session's manager another (the `%%sandbox`
    magics' and an agent tool's) as well as its own."""
    connections = 2 * MAX_PROCESSES
    egress = CapabilityDeclaration(
        network_egress_rules=[{"domain": "example.test", "ports": [443]}],
        resource_limits=ResourceLimits(max_processes=MAX_PROCESSES))
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(
        max_processes=MAX_PROCESSES, max_memory_mb=1024))
    with SandboxManager() as manager, SandboxManager() as other:
        starting = manager if managers == "one manager" else other
        connecting, second = manager.create_sandbox(egress), starting.create_sandbox(policy)
        starting.run_python(second, "pass")  # its launcher started: the steps below are quick
        holding = manager.start_session(connecting)
        before = _own_threads()
        opened = holding.run_cell(SILENT_CONNECTIONS.format(port=PROXY_PORT, count=connections))
        assert opened.stdout.strip() == str(connections), opened  # the attack ran
        deadline = time.monotonic() + 60  # liveness: the proxy accepts them on its own thread
        while _own_threads() - before < connections - 4:
            assert time.monotonic() < deadline, "the proxy never served the connections"
            time.sleep(0.05)
        widened = starting.start_session(second)  # counted while the proxy serves them
        try:
            # still served after the count (a silent connection's thread ends at the
            # proxy's 10 s head timeout): else the count could not have seen them
            assert _own_threads() - before >= connections - 4
            holding.close()  # its connections are dropped, their threads end
            manager.destroy(connecting)
            started = widened.run_cell(THREADS.format(count=5 * MAX_PROCESSES))
        finally:
            widened.close()
    assert 0 < int(started.stdout) < MAX_PROCESSES + connections // 2, started


def _own_threads() -> int:
    """Threads of this process (the kernel's side, where the proxy serves)."""
    return len(os.listdir("/proc/self/task"))
