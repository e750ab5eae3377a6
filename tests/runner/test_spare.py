"""The launcher's spare: the next run's child, made before the run is asked for.

A spare is forked, enters its user, PID, network, IPC and UTS namespaces and waits; what
depends on the run (the plan, the mount namespace, the covers, Landlock, seccomp) happens
when the run arrives. These tests check what that must not change: a run sees the host's
mounts as they are when it starts, not when its spare was made; a spare holds nothing of the
launcher's but its own end of the hand-off; a spare that dies waiting is replaced; and
closing the manager ends it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager
from sandbox_kernel_ext.runner.child.bootstrap import SPARE_NAME

SPARE = SPARE_NAME.decode()


def _spares(manager: SandboxManager, wait: float = 10.0) -> list[psutil.Process]:
    """The launcher's waiting spares (PID 1 of their namespace; the setup fork is gone),
    waited for: the launcher makes one once it has been idle a moment."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for process in psutil.Process(manager.launcher_pid).children():
            try:
                if process.name() == SPARE and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
            except psutil.Error:
                continue
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


@pytest.fixture
def manager():
    with SandboxManager() as m:
        yield m


def test_a_spare_waits_holding_only_its_end_of_the_hand_off(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    assert manager.execute(sid, ["/bin/true"]).exit_code == 0
    spares = _spares(manager)
    assert len(spares) == 1
    fds = os.listdir(f"/proc/{spares[0].pid}/fd")
    targets = [os.readlink(f"/proc/{spares[0].pid}/fd/{fd}") for fd in fds]
    # Not the launcher's socket to the kernel (the kernel would not see the launcher end),
    # not its wake-up pipe, no standard streams: the run brings those.
    assert len(targets) == 1 and targets[0].startswith("socket:"), targets


def test_a_spare_killed_while_it_waits_is_replaced(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    assert manager.execute(sid, ["/bin/true"]).exit_code == 0
    for _ in range(3):
        (spare,) = _spares(manager)
        spare.send_signal(signal.SIGKILL)
        # At once, before the launcher has reaped it: the run finds it gone and takes another.
        result = manager.execute(sid, ["/bin/echo", "ran"])
        assert result.exit_code == 0 and result.stdout == "ran\n", result.stderr


def test_closing_the_manager_ends_its_spare() -> None:
    manager = SandboxManager()
    try:
        sid = manager.create_sandbox(CapabilityDeclaration())
        manager.execute(sid, ["/bin/true"])
        (spare,) = _spares(manager)
    finally:
        manager.close()
    try:
        spare.wait(timeout=10)
    except psutil.TimeoutExpired:
        pytest.fail(f"spare {spare.pid} outlived its manager")


# Run in a mount namespace of its own (made by unshare(1)), so that the mount it makes never
# reaches the host's table: the manager, its launcher and their spares share that namespace.
AFTER_THE_SPARE = textwrap.dedent("""
    import os, subprocess, sys, time
    import psutil
    from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager
    folder, spare_name = sys.argv[1], sys.argv[2]
    policy = CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=[folder]))
    with SandboxManager(child_uid=0) as m:
        sid = m.create_sandbox(policy)
        assert m.execute(sid, ["/bin/true"]).exit_code == 0
        while not any(p.name() == spare_name for p in psutil.Process(m.launcher_pid).children()):
            time.sleep(0.01)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", os.path.join(folder, "mnt")], check=True)
        with open(os.path.join(folder, "mnt", "made-after"), "w") as f:
            f.write("fresh")
        result = m.execute(sid, ["/bin/cat", os.path.join(folder, "mnt", "made-after")])
        print(repr(result.stdout), repr(result.stderr))
""")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) to mount in a namespace of the test's own")
def test_a_run_sees_a_mount_made_after_its_spare() -> None:
    folder = tempfile.mkdtemp(prefix="sbx-spare-")
    try:
        os.mkdir(os.path.join(folder, "mnt"))
        os.chmod(folder, 0o755)
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
             AFTER_THE_SPARE, folder, SPARE],
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "'fresh' ''", done.stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)
