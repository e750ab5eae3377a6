"""What a sandboxed cell can use of the ordinary Python runtime: multiprocessing, with its
own /dev/shm, and what stays shut (unix sockets that could reach the host's services)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager


def test_multiprocessing_pools_pipes_and_semaphores_work(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    result = manager.run_python(sid, """
import multiprocessing as mp

def square(x):
    return x * x

with mp.get_context("fork").Pool(2) as pool:
    squares = pool.map(square, range(5))
left, right = mp.Pipe()
left.send("hi")
piped = right.recv()
""", outputs=["squares", "piped"], timeout=60)
    assert result.variables == {"squares": [0, 1, 4, 9, 16], "piped": "hi"}, result.stderr


def test_dev_shm_is_private_to_each_run(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    write = "open('/dev/shm/sandbox-marker', 'w').write('x')\nimport os\nseen = os.listdir('/dev/shm')"
    first = manager.run_python(sid, write, outputs=["seen"])
    assert first.variables == {"seen": ["sandbox-marker"]}, first.stderr
    assert not os.path.exists("/dev/shm/sandbox-marker")  # never the host's
    second = manager.run_python(sid, "import os\nseen = os.listdir('/dev/shm')", outputs=["seen"])
    assert second.variables == {"seen": []}  # nor the previous run's


def test_unix_sockets_to_host_services_stay_shut(manager: SandboxManager, shared_dir: Path) -> None:
    path = str(shared_dir / "service.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(1)
    try:
        policy = CapabilityDeclaration.model_validate(
            {"filesystem_config": {"mode": "read_write", "writable_paths": [str(shared_dir)]}})
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, f"""
import socket, errno
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({path!r})
    outcome = "connected"
except OSError as exc:
    outcome = errno.errorcode[exc.errno]
""", outputs=["outcome"])
        assert result.variables == {"outcome": "EAFNOSUPPORT"}, result.stderr
    finally:
        server.close()
