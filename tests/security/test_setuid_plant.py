"""A cell never leaves a program on the host that runs as someone else.

With `child_uid=0` a root kernel's child is root (in a user namespace, with no capability), so
a file it creates in a writable root is root's: with a set-user-ID bit it would be a setuid-root program
for whoever runs it on the host. Found in review of an earlier design whose files also landed
as root's. Every route a mode takes into the filesystem is tried here: the chmod family (the
libc calls and the raw syscalls, fchmodat2 included), creating with a mode (open, openat,
creat, mkdir, mknod, and openat2, whose mode sits in memory), and the tools that copy modes
(`cp -p`, `install -m`, `tar -p`). Afterwards nothing in the root carries either bit.
"""

from __future__ import annotations

import io
import os
import platform
import stat
import tarfile
from pathlib import Path

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager
from sandbox_kernel_ext.runner.linux import seccomp

pytestmark = [
    pytest.mark.skipif(not seccomp.seccomp_available(), reason="no seccomp filter here"),
]

NUMBERS = {
    "x86_64": {"fchmodat": 268, "fchmodat2": 452, "openat2": 437, "chmod": 90, "creat": 85},
    "aarch64": {"fchmodat": 53, "fchmodat2": 452, "openat2": 437},
}.get(platform.machine(), {})

CELL = r"""
import ctypes, errno, os, shutil, subprocess
libc = ctypes.CDLL(None, use_errno=True)
root = ROOT
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def raw(number, *args):
    ctypes.set_errno(0)
    if libc.syscall(ctypes.c_long(number), *args) == -1:
        raise OSError(ctypes.get_errno(), "")
def path(name):
    return os.path.join(root, name)
out = {}
shutil.copy("/bin/true", path("prog"))
b = path("prog").encode()
fd = os.open(path("prog"), os.O_RDONLY)
for mode in (0o4755, 0o2755, 0o6755, 0o4000, 0o2000):
    attempt(f"chmod {mode:o}", lambda: os.chmod(path("prog"), mode))
    attempt(f"fchmod {mode:o}", lambda: os.fchmod(fd, mode))
    if "fchmodat" in NUMBERS:
        attempt(f"fchmodat {mode:o}", lambda: raw(NUMBERS["fchmodat"], -100, b, mode))
    if "fchmodat2" in NUMBERS:
        attempt(f"fchmodat2 {mode:o}", lambda: raw(NUMBERS["fchmodat2"], -100, b, mode, 0))
    if "chmod" in NUMBERS:
        attempt(f"raw chmod {mode:o}", lambda: raw(NUMBERS["chmod"], b, mode))
attempt("open O_CREAT 4755", lambda: os.close(os.open(path("o1"), os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("open O_CREAT 2755", lambda: os.close(os.open(path("o2"), os.O_CREAT | os.O_WRONLY, 0o2755)))
if "creat" in NUMBERS:
    attempt("creat 4755", lambda: raw(NUMBERS["creat"], path("o3").encode(), 0o4755))
attempt("mkdir 2755", lambda: os.mkdir(path("d1"), 0o2755))
attempt("mkdir 4755", lambda: os.mkdir(path("d2"), 0o4755))
attempt("mknod 4644", lambda: os.mknod(path("n1"), 0o4644 | 0o100000))
if "openat2" in NUMBERS:
    # struct open_how {u64 flags; u64 mode; u64 resolve}: O_CREAT|O_WRONLY, 04755
    how = (ctypes.c_uint64 * 3)(0o100 | 0o1, 0o4755, 0)
    attempt("openat2", lambda: raw(NUMBERS["openat2"], -100, path("o4").encode(), ctypes.byref(how), 24))
for name, argv in {
    "cp -p": ["cp", "-p", "/bin/su" if os.path.exists("/bin/su") else "/bin/true", path("cp")],
    "install -m 4755": ["install", "-m", "4755", "/bin/true", path("inst")],
    "tar -p": ["tar", "-xpf", path("setuid.tar"), "-C", root],
}.items():
    done = subprocess.run(argv, capture_output=True, text=True)
    out[name] = done.returncode
"""


def _setuid_tar(folder: Path) -> None:
    """An archive whose one member asks for mode 04755, as a downloaded tarball might."""
    data = Path("/bin/true").read_bytes()
    member = tarfile.TarInfo("from-tar")
    member.size, member.mode = len(data), 0o4755
    with tarfile.open(folder / "setuid.tar", "w") as archive:
        archive.addfile(member, io.BytesIO(data))


def _special_files(folder: Path) -> list[str]:
    found = []
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            info = os.lstat(os.path.join(parent, name))
            if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(f"{name} {oct(info.st_mode)} uid {info.st_uid}")
    return found


@pytest.mark.parametrize("child_uid", [None, 0], ids=["default", "root-in-userns"])
def test_no_route_leaves_a_setuid_or_setgid_file(shared_dir: Path, child_uid: int | None) -> None:
    if child_uid is not None and os.geteuid() != 0:
        pytest.skip("choosing the child's uid needs a root kernel")
    _setuid_tar(shared_dir)
    with SandboxManager(child_uid=child_uid) as manager:
        sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
            mode="read_write", writable_paths=[str(shared_dir)], readable_paths=None)))
        result = manager.run_python(sid, CELL, inputs={"ROOT": str(shared_dir), "NUMBERS": NUMBERS},
                                    outputs=["out"], timeout=60)
    assert result.exit_code == 0 and result.killed is None, result
    attempts = result.variables["out"]
    succeeded = {name: what for name, what in attempts.items()
                 if what == "ok" and not name.startswith(("cp", "install", "tar"))}
    assert not succeeded, f"a set-user-ID or set-group-ID mode was accepted: {succeeded}"
    if "openat2" in attempts:  # refused as "not here", so programs fall back to openat
        assert attempts["openat2"] == "ENOSYS", attempts
    assert attempts["install -m 4755"] != 0  # install reports the refused chmod
    assert _special_files(shared_dir) == []
    made = (shared_dir / "prog").stat()
    # the kernel user's: a root kernel's unprivileged child writes root's folder through the owner map
    assert made.st_uid == os.geteuid()


def test_plain_modes_still_work(manager: SandboxManager, shared_dir: Path) -> None:
    """The refusal is for the two bits only: programs that chmod +x or make 0700 folders run."""
    sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_write", writable_paths=[str(shared_dir)], readable_paths=[])))
    try:
        result = manager.run_python(sid, f"""
import os, stat
p = {str(shared_dir / 'tool')!r}
open(p, 'w').write('#!/bin/sh\\necho ran\\n')
os.chmod(p, 0o755)
os.mkdir({str(shared_dir / 'private')!r}, 0o700)
os.chmod({str(shared_dir / 'private')!r}, 0o1777)  # the sticky bit is harmless
import subprocess
out = subprocess.run([p], capture_output=True, text=True).stdout
""", outputs=["out"])
    finally:
        manager.destroy(sid)
    assert result.exit_code == 0, result.stderr
    assert result.variables["out"] == "ran\n"
    assert stat.S_IMODE((shared_dir / "private").stat().st_mode) == 0o1777
