"""Memory a cell holds outside its resident set counts against its limit or cannot be had
(issue 13, section 2). Found: with `max_memory_mb: 128`, a cell held 1.2 GB of host memory in
memfds (the monitor saw 15 MB) and as much in System V shared memory, detached so that no
process's resident set showed it. Each attack allocates three times the limit by one route,
then says how much it holds; it must never get there.
"""

from __future__ import annotations

import json

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, ResourceLimits, SandboxManager

LIMIT_MB = 128

HOLD = """
import ctypes, ctypes.util, json, os, time
held, error = 0, None
try:
{body}
except OSError as exc:
    error = f"{{type(exc).__name__}}: errno {{exc.errno}}"
print(json.dumps({{"held_mb": held // (1 << 20), "error": error}}), flush=True)
"""

MEMFD = """
    fds = []
    for _ in range(12):
        fd = os.memfd_create("hold")
        os.posix_fallocate(fd, 0, 32 << 20)  # tmpfs pages, in no process's resident set
        fds.append(fd)
        held += 32 << 20
"""

SYSV = """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    for _ in range(12):
        shmid = libc.shmget(0, 32 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
        if shmid < 0:
            raise OSError(ctypes.get_errno(), "shmget")
        address = libc.shmat(shmid, None, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "shmat")
        ctypes.memset(address, 1, 32 << 20)
        libc.shmdt(ctypes.c_void_p(address))  # detached: resident in no process
        held += 32 << 20
"""

MSGQ = """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    queues = 0
    for _ in range(4096):
        if libc.msgget(0, 0o1600) < 0:
            raise OSError(ctypes.get_errno(), "msgget")
        queues += 1
    held = queues * 16384  # each queue may hold msgmnb (16 KiB) of kernel memory
"""


SEMAPHORES = """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    for _ in range(600):  # found in review: 1,500 sets of 32,000 held 3 GB
        if libc.semget(0, 32000, 0o1600) < 0:
            raise OSError(ctypes.get_errno(), "semget")
        held += 32000 * 64  # about what the kernel keeps per semaphore
"""

VMSPLICE = """
    import mmap
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    # Found in review: a page vmspliced into a pipe keeps its whole (huge) page alive after
    # munmap, outside every resident set.
    r, w = os.pipe()
    area = mmap.mmap(-1, 2 << 20)
    area.write(b"x" * (2 << 20))
    page = iovec(ctypes.addressof(ctypes.c_char.from_buffer(area)), 4096)
    if libc.vmsplice(w, ctypes.byref(page), 1, 0) < 0:
        raise OSError(ctypes.get_errno(), "vmsplice")
    held = 1 << 40  # the route is open: what it holds is bounded only by pipes and pages
"""


@pytest.mark.parametrize("route", ["memfd", "sysv_shm", "sysv_msg", "sysv_sem", "vmsplice"])
def test_memory_outside_the_resident_set_cannot_exceed_the_limit(
    manager: SandboxManager, route: str
) -> None:
    body = {"memfd": MEMFD, "sysv_shm": SYSV, "sysv_msg": MSGQ, "sysv_sem": SEMAPHORES,
            "vmsplice": VMSPLICE}[route]
    sid = manager.create_sandbox(CapabilityDeclaration(
        resource_limits=ResourceLimits(max_memory_mb=LIMIT_MB)))
    try:
        result = manager.run_python(sid, HOLD.format(body=body), timeout=60)
    finally:
        manager.destroy(sid)
    report = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    if result.killed:
        assert "Memory limit" in result.killed
        return
    assert report is not None, result.stderr
    assert report["held_mb"] <= LIMIT_MB, report
    assert report["error"] is not None  # the route was refused, and said so
