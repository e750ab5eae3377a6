"""What a child can see of the processes around it, and `multiprocessing`, wherever it runs.

On a plain host a child has a /proc of its own PID namespace. Inside a pod's container the
runtime's masked /proc paths stop a fresh proc mount, and Docker's profile stops the PID
namespace too: there the container's /proc stays, and Landlock must keep every other
process's entries closed (found by `tests/containers`: a child read the Jupyter kernel's
command line). These tests run on the host and, through `tests/containers/test_profiles.py`,
under each container profile.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

LOOK = """
import json, os
def attempt(read):
    try:
        return read()[:40]
    except OSError as exc:
        return type(exc).__name__
def whole(read):
    try:
        return read()
    except OSError as exc:
        return type(exc).__name__
kernel = int(os.environ["SBX_KERNEL_PID"])
seen = {
    "kernel cmdline": attempt(lambda: open(f"/proc/{kernel}/cmdline").read()),
    "kernel environ": attempt(lambda: open(f"/proc/{kernel}/environ").read()),
    "kernel status": attempt(lambda: open(f"/proc/{kernel}/status").read()),
    "pid 1 cmdline": attempt(lambda: open("/proc/1/cmdline").read()),
    "listing": attempt(lambda: sorted(p for p in os.listdir("/proc") if p.isdigit())),
    "own status": attempt(lambda: open("/proc/self/status").read()),
    "sockets": [whole(lambda: open(path).read()) for path in (
        "/proc/self/net/tcp", "/proc/self/net/tcp6",
        f"/proc/{os.getpid()}/task/{os.getpid()}/net/tcp",
        f"/proc/self/task/{os.getpid()}/net/tcp6")],
}
print(json.dumps(seen))
"""


@pytest.fixture()
def manager() -> SandboxManager:
    with SandboxManager() as manager:
        yield manager


def test_a_child_reads_no_other_process(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=None)))  # "everywhere": /proc is not a grant
    listener = socket.create_server(("127.0.0.1", 0))
    port_hex = f":{listener.getsockname()[1]:04X} "
    try:
        result = manager.run_python(sid, LOOK, env={"SBX_KERNEL_PID": str(os.getpid())})
    finally:
        listener.close()
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    truth = {  # what those files hold, read from outside: the child must never get it
        "kernel cmdline": f"/proc/{os.getpid()}/cmdline",
        "kernel environ": f"/proc/{os.getpid()}/environ",
        "kernel status": f"/proc/{os.getpid()}/status",
        "pid 1 cmdline": "/proc/1/cmdline",
    }
    for name, path in truth.items():
        with open(path) as real:
            assert seen[name] != real.read()[:40], (name, seen[name])
    # The host's sockets (found in review: a child on the pod's network read its listening
    # ports through its own task/TID/net): a port this process listens on never shows.
    assert not any(port_hex in str(text) for text in seen["sockets"]), seen["sockets"]
    listing = seen["listing"]
    assert listing == "PermissionError" or str(os.getpid()) not in listing, listing
    assert seen["own status"].startswith("Name:"), seen["own status"]


def test_multiprocessing_works(manager: SandboxManager) -> None:
    folder = tempfile.mkdtemp(prefix="sbx-mp-")
    os.chmod(folder, 0o777)
    try:
        sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
            mode="read_write", writable_paths=[folder])))
        result = manager.run_python(sid, (
            "import multiprocessing as mp\n"
            "with mp.Pool(2) as pool:\n"
            "    print(pool.map(abs, [-1, -2, -3]))\n"
            "lock = mp.Lock()\n"
            "with lock:\n"
            "    print('locked')\n"), cwd=folder)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == "[1, 2, 3]\nlocked\n", result.stdout
    finally:
        os.rmdir(folder) if not os.listdir(folder) else None
