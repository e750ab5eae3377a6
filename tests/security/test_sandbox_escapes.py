"""Escape attempts against the whole `SandboxManager` stack, each in a real confined child.

Every test runs one attack through `SandboxManager.run_python` or `.execute` (the launcher's
fork, namespaces, rlimits, Landlock, seccomp) and asserts three things:

1. the attempt failed inside the child (its own report, exit code, stdout/stderr or kill reason);
2. nothing outside the writable roots changed: the `World` fixture snapshots every file outside
   the writable root (content, mode, owner) plus the child uid's entries of /tmp and /dev/shm
   (when that uid is also this process's, any process of the machine may add entries of it
   at any time: then the names this module's attacks use, `sbx-escape-*`), and the autouse
   `unharmed` fixture compares after each test;
3. the test process (the "kernel") and the launcher are unharmed: both alive, the test process
   holds the same number of descriptors as before, and no process of the child's uid and ours
   survives.

The whole module runs twice, once per identity a root kernel's child can have: an
unprivileged uid of its own (the default, which sees itself as nobody, 65534) and root's own
uid in a user namespace (`child_uid=0`).

The targets are chosen so that plain file permissions would ALLOW each attack (world-readable
canaries, world-writable folders, files owned by the child's uid): a failure means confinement
stopped it.

Another engineer's sandboxes may run on this host at the same time, so "no process remains" is
checked for OUR processes: descendants of this test process (when the child's uid is not ours),
and any process whose environment carries this module's marker or one of our sandbox homes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import platform
import shutil
import socket
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from leftovers import sandbox_processes

from sandbox_kernel_ext.policy.models import (
    CapabilityDeclaration,
    FilesystemConfig,
    FilesystemMode,
    ResourceLimits,
)
from sandbox_kernel_ext.runner.linux import seccomp
from sandbox_kernel_ext.runner.linux.landlock import landlock_abi
from sandbox_kernel_ext.runner.trusted.isolation import isolation_report, seen_uid
from sandbox_kernel_ext.runner.trusted.manager import SandboxManager

# Both identities a root kernel's child can have: an unprivileged uid of its own (the default)
# and root's own (`child_uid=0`, in a user namespace with no capability). The world's files
# belong to the child's uid, so file permissions let it do every attack.
# A kernel that is not root (a Jupyter pod's, uid 1000) has one: its own uid, so the world's
# files are all the child's own, which lets it do even more by file permissions.
IDENTITIES = ({"default-uid": None, "root-in-userns": 0} if os.geteuid() == 0
              else {"kernel-uid": None})
ABI = landlock_abi()
MARKER_NAME = "SBX_ESCAPE_SUITE"
MARKER = f"escape-{uuid.uuid4().hex[:12]}"
CANARY_TEXT = "canary: must never change or leak 9d41\n"
SECRET_KEY_TEXT = "-----BEGIN FAKE OPENSSH PRIVATE KEY----- sbxtest 51f0\n"
ENV_SECRET = "s3cr3t"

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(ABI < 1, reason="no Landlock on this kernel: filesystem confinement absent"),
]
needs_seccomp = pytest.mark.skipif(
    not seccomp.seccomp_available(), reason="no seccomp filter on this kernel/architecture"
)
needs_scoping = pytest.mark.skipif(ABI < 6, reason="Landlock signal/abstract-unix scoping needs ABI 6")
needs_truncate = pytest.mark.skipif(ABI < 3, reason="Landlock TRUNCATE right needs ABI 3")
needs_refer = pytest.mark.skipif(ABI < 2, reason="Landlock REFER right needs ABI 2")

SYSCALLS = {
    "x86_64": {"openat": 257, "process_vm_readv": 310, "io_uring_setup": 425, "mount": 165},
    "aarch64": {"openat": 56, "process_vm_readv": 270, "io_uring_setup": 425, "mount": 40},
}.get(platform.machine())
needs_known_arch = pytest.mark.skipif(
    SYSCALLS is None, reason=f"syscall numbers unknown for {platform.machine()}"
)

LIMITS = dict(max_memory_mb=200, max_cpu_seconds=2, max_processes=20, max_output_mb=1)

# Prepended to every Python cell: `attempt(fn)` reports ["ok", value] or ["err", errno, text].
PRELUDE = r'''
import ctypes, errno, os, signal, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
def attempt(fn):
    try:
        value = fn()
        return ["ok", value if isinstance(value, (str, int, float, bool, type(None), list)) else repr(value)]
    except OSError as exc:
        return ["err", exc.errno, str(exc)]
    except Exception as exc:
        return ["err", None, type(exc).__name__ + ": " + str(exc)]
def read(path):
    with open(path) as handle:
        return handle.read()
def raw(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *args)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result
'''


# -- the world: roots, canaries, snapshots ----------------------------------------------------------


def _own(path: Path, uid: int, mode: int) -> None:
    if os.geteuid() == 0:  # else every file is the kernel's, which is the child's uid too
        os.chown(path, uid, uid)
    os.chmod(path, mode)


@dataclass
class World:
    base: Path  # parent of every root (0755): "the parent of a root"
    ro: Path  # readable root, world-writable folder so only Landlock keeps it read-only
    rw: Path  # writable root (0777)
    outside: Path  # not granted, 0755, world-readable canary
    outside_w: Path  # not granted, 0777: file permissions would let the child write here
    canary: Path  # outside/canary.txt, root 0644
    owned_outside: Path  # outside_w/owned.txt, owned by the child's uid (DAC allows link/rename)
    ro_file: Path  # ro/data.txt, the child uid's, 0666 (DAC allows write/truncate/unlink)
    ro_rootfile: Path  # ro/root.txt, root 0644 (chmod must fail)
    uid: int  # the sandboxed child's

    def names(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items()}

    def snapshot(self) -> dict[str, Any]:
        """Every entry outside the writable root, plus the child uid's entries of /tmp and
        /dev/shm (`_entries_of`)."""
        state: dict[str, Any] = {}
        for folder, dirs, files in os.walk(self.base):
            if Path(folder) == self.rw:
                dirs[:] = []
                continue
            for name in dirs + files:
                path = os.path.join(folder, name)
                if Path(path) == self.rw:
                    continue
                info = os.lstat(path)
                digest = None
                if stat.S_ISREG(info.st_mode):
                    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                elif stat.S_ISLNK(info.st_mode):
                    digest = os.readlink(path)
                state[path] = (stat.S_IMODE(info.st_mode), stat.S_IFMT(info.st_mode),
                               info.st_uid, info.st_gid, info.st_size, digest)
        for shared in ("/tmp", "/dev/shm"):
            state[f"{shared}:{self.uid}"] = sorted(_entries_of(self.uid, shared))
        return state


def _entries_of(uid: int, folder: str) -> list[str]:
    """Entries of `folder` owned by `uid`, except the managers' own sandbox homes. A uid this
    process has too (root's, a non-root kernel's) is also every other such process's, which
    add entries at any time (a browser, a kernel, another test run): then only the names
    this module's attacks write (`sbx-escape-*`)."""
    if not os.path.isdir(folder):
        return []
    shared = uid == os.geteuid()
    out = []
    for entry in os.scandir(folder):
        try:
            if (entry.stat(follow_symlinks=False).st_uid == uid
                    and not entry.name.startswith("sandbox-")
                    and (not shared or entry.name.startswith("sbx-escape"))):
                out.append(entry.name)
        except OSError:
            pass
    return out


def _make_world(uid: int) -> World:
    base = Path(tempfile.mkdtemp(prefix="sbx-escape-", dir="/tmp"))
    os.chmod(base, 0o755)
    ro, rw, outside, outside_w = (base / n for n in ("ro", "rw", "outside", "outside_w"))
    for folder, mode in ((ro, 0o777), (rw, 0o777), (outside, 0o755), (outside_w, 0o777)):
        folder.mkdir()
        os.chmod(folder, mode)
    canary = outside / "canary.txt"
    canary.write_text(CANARY_TEXT)
    _own(canary, 0, 0o644)
    owned = outside_w / "owned.txt"
    owned.write_text(CANARY_TEXT)
    _own(owned, uid, 0o644)
    ro_file = ro / "data.txt"
    ro_file.write_text("read-only data\n")
    _own(ro_file, uid, 0o666)
    ro_root = ro / "root.txt"
    ro_root.write_text("root data\n")
    _own(ro_root, 0, 0o644)
    return World(base, ro, rw, outside, outside_w, canary, owned, ro_file, ro_root, uid)


def _capability(world: World, *, readable: list[str] | None | str = "default", **limits: Any
                ) -> CapabilityDeclaration:
    readable_paths = [str(world.ro)] if readable == "default" else readable
    return CapabilityDeclaration(
        filesystem_config=FilesystemConfig(
            mode=FilesystemMode.read_write, readable_paths=readable_paths,
            writable_paths=[str(world.rw)],
        ),
        resource_limits=ResourceLimits(**{**LIMITS, **limits}),
    )


# -- our processes -------------------------------------------------------------------------------

OUR_HOMES: set[str] = set()


def _our_sandbox_processes(uid: int) -> list[str]:
    """Processes of the child's uid that this module started (see the module docstring)."""
    return sandbox_processes(uid, MARKER, OUR_HOMES)


def _wait_no_sandbox_processes(uid: int, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = _our_sandbox_processes(uid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- fixtures ------------------------------------------------------------------------------------


class Env:
    """The module's manager, world and sandboxes, with run helpers."""

    def __init__(self, manager: SandboxManager, world: World) -> None:
        self.manager = manager
        self.world = world
        self.sid = self.new_sandbox(_capability(world))

    def new_sandbox(self, capability: CapabilityDeclaration, manager: SandboxManager | None = None
                    ) -> str:
        manager = manager or self.manager
        sid = manager.create_sandbox(capability)
        OUR_HOMES.add(manager._get(sid).home)
        return sid

    def py(self, code: str, *, sid: str | None = None, manager: SandboxManager | None = None,
           inputs: dict[str, Any] | None = None, timeout: float = 15.0) -> Any:
        """Run PRELUDE + code; the cell puts its findings in `out`."""
        inputs = {"w": self.world.names(), "test_pid": os.getpid(),
                  "launcher_pid": self.manager.launcher_pid, **(inputs or {})}
        return (manager or self.manager).run_python(
            sid or self.sid, PRELUDE + code, inputs=inputs, outputs=["out"], timeout=timeout,
            env={MARKER_NAME: MARKER},
        )

    def sh(self, script: str, *, sid: str | None = None, timeout: float = 15.0) -> Any:
        return self.manager.execute(sid or self.sid, ["bash", "-c", script], timeout=timeout,
                                    env={MARKER_NAME: MARKER})


@pytest.fixture(scope="module", params=list(IDENTITIES.values()), ids=list(IDENTITIES))
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    manager = SandboxManager(child_uid=request.param)
    world = _make_world(manager.child_uid if manager.child_uid is not None else os.getuid())
    try:
        box = Env(manager, world)
        warm = box.py("out = os.getuid()")
        assert warm.exit_code == 0 and warm.variables == {"out": seen_uid(world.uid)}, warm
        assert _alive(manager.launcher_pid)
        yield box
    finally:
        manager.close()
        shutil.rmtree(world.base, ignore_errors=True)


@pytest.fixture(autouse=True)
def unharmed(env: Env) -> Iterator[None]:
    """After each test: outside unchanged, kernel and launcher alive, no leftovers."""
    world = env.world
    before = world.snapshot()
    fds_before = _fd_count()
    launcher = env.manager.launcher_pid
    yield
    left = _wait_no_sandbox_processes(world.uid)
    # Clean the writable root for the next test (we are root).
    for entry in world.rw.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    assert not left, f"uid-{world.uid} processes survived the test: {left}"
    assert world.canary.read_text() == CANARY_TEXT
    assert world.snapshot() == before, "something outside the writable root changed"
    deadline = time.monotonic() + 5
    while _fd_count() != fds_before and time.monotonic() < deadline:
        time.sleep(0.05)  # a run's pipes are closed by the manager's reader thread
    assert _fd_count() == fds_before, "the test process leaked or lost descriptors"
    assert env.manager.launcher_pid == launcher and _alive(launcher), "the launcher died"


# A write or a change of metadata outside the writable roots is refused by the read-only view
# of the host first (EROFS), else by Landlock (EACCES) or by file permissions (EPERM).
WRITE_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)


def _denied(report: Any, *errnos: int) -> None:
    """`report` is attempt()'s ["err", errno, text]; with errnos, the errno must be one of them."""
    assert report[0] == "err", f"attempt SUCCEEDED: {report}"
    if errnos:
        assert report[1] in errnos, f"unexpected failure {report}, wanted {errnos}"


def _unread(report: Any) -> None:
    """A denied read: refused by Landlock, or hidden under a mount of the child's namespace
    (an empty folder where the folder was, /dev/null where the file was: nothing to read)."""
    if report[0] == "ok":
        assert report[1] in ("", []), f"read SUCCEEDED: {report}"
    else:
        assert report[1] in (errno.EACCES, errno.ENOENT), f"unexpected failure {report}"


def _ok_run(result: Any) -> dict[str, Any]:
    assert result.killed is None and result.exit_code == 0, result
    return result.variables["out"]


# == reads outside the roots =======================================================================


def test_read_outside_with_python_open(env: Env) -> None:
    out = _ok_run(env.py("out = [attempt(lambda: read(w['canary'])), attempt(lambda: read(w['ro_file']))]"))
    _denied(out[0], errno.EACCES)
    assert out[1] == ["ok", "read-only data\n"]  # the control: the readable root reads


def test_read_outside_with_os_open(env: Env) -> None:
    out = _ok_run(env.py("out = attempt(lambda: os.read(os.open(w['canary'], os.O_RDONLY), 100).decode())"))
    _denied(out, errno.EACCES)


@needs_known_arch
def test_read_outside_with_raw_openat_syscall(env: Env) -> None:
    code = """
AT_FDCWD = -100
def go():
    fd = raw(openat, ctypes.c_int(AT_FDCWD), ctypes.c_char_p(w['canary'].encode()), ctypes.c_int(os.O_RDONLY), ctypes.c_int(0))
    return os.read(fd, 100).decode()
out = attempt(go)
"""
    out = _ok_run(env.py(code, inputs={"openat": SYSCALLS["openat"]}))
    _denied(out, errno.EACCES)


def test_read_outside_with_cat_in_a_subprocess(env: Env) -> None:
    code = "p = subprocess.run(['cat', w['canary']], capture_output=True, text=True); out = [p.returncode, p.stdout, p.stderr]"
    rc, stdout, stderr = _ok_run(env.py(code))
    assert rc != 0 and CANARY_TEXT not in stdout and "Permission denied" in stderr


def test_read_outside_with_cat_executed_directly(env: Env) -> None:
    r = env.manager.execute(env.sid, ["cat", str(env.world.canary)], timeout=15,
                            env={MARKER_NAME: MARKER})
    assert r.exit_code != 0 and CANARY_TEXT not in r.stdout and "Permission denied" in r.stderr, r


def test_listing_the_filesystem_root_fails(env: Env) -> None:
    out = _ok_run(env.py("out = [attempt(lambda: os.listdir('/')), attempt(lambda: [e.name for e in os.scandir('/')])]"))
    _denied(out[0], errno.EACCES)
    _denied(out[1], errno.EACCES)


def test_listing_the_parent_of_a_root_fails(env: Env) -> None:
    out = _ok_run(env.py("out = [attempt(lambda: os.listdir(w['base'])), attempt(lambda: os.listdir(w['outside']))]"))
    _denied(out[0], errno.EACCES)
    _denied(out[1], errno.EACCES)


def test_proc_self_root_path_to_outside_fails(env: Env) -> None:
    out = _ok_run(env.py("out = [attempt(lambda: read('/proc/self/root' + w['canary'])), attempt(lambda: read('/proc/1/root' + w['canary']))]"))
    _denied(out[0])
    _denied(out[1])


def test_dotdot_traversal_from_a_root_fails(env: Env) -> None:
    code = """
os.chdir(w['rw'])
out = [attempt(lambda: read(w['rw'] + '/../outside/canary.txt')),
       attempt(lambda: read('../outside/canary.txt')),
       attempt(lambda: read(w['ro'] + '/../../..' + w['canary'])),
       attempt(lambda: os.listdir('..'))]
"""
    for report in _ok_run(env.py(code)):
        _denied(report, errno.EACCES)


# == symlinks, hard links, renames =================================================================


def test_symlink_planted_in_writable_root_cannot_read_outside(env: Env) -> None:
    code = """
link = os.path.join(w['rw'], 'to_canary')
os.symlink(w['canary'], link)                      # planting is allowed: rw root
dirlink = os.path.join(w['rw'], 'to_outside')
os.symlink(w['outside'], dirlink)
out = [attempt(lambda: read(link)), attempt(lambda: read(dirlink + '/canary.txt')), attempt(lambda: os.listdir(dirlink))]
"""
    for report in _ok_run(env.py(code)):
        _denied(report, errno.EACCES)


def test_symlink_planted_in_writable_root_cannot_write_outside(env: Env) -> None:
    code = """
os.symlink(w['outside_w'] + '/created_via_link', os.path.join(w['rw'], 'new_target'))
os.symlink(w['owned_outside'], os.path.join(w['rw'], 'owned_target'))
os.symlink(w['outside_w'], os.path.join(w['rw'], 'dir_target'))
def write(path, mode='w'):
    with open(path, mode) as h:
        h.write('pwned')
out = [attempt(lambda: write(w['rw'] + '/new_target')),
       attempt(lambda: write(w['rw'] + '/owned_target', 'a')),
       attempt(lambda: write(w['rw'] + '/dir_target/created_via_dirlink'))]
"""
    for report in _ok_run(env.py(code)):
        _denied(report, *WRITE_REFUSED)
    assert not (env.world.outside_w / "created_via_link").exists()
    assert not (env.world.outside_w / "created_via_dirlink").exists()
    assert env.world.owned_outside.read_text() == CANARY_TEXT


@needs_refer
def test_hard_link_from_writable_root_to_outside_file_fails(env: Env) -> None:
    # owned_outside belongs to the child's uid, so protected_hardlinks would allow it: only Landlock stops it.
    code = """
out = [attempt(lambda: os.link(w['owned_outside'], w['rw'] + '/hard_owned')),
       attempt(lambda: os.link(w['canary'], w['rw'] + '/hard_canary'))]
"""
    out = _ok_run(env.py(code))
    _denied(out[0], errno.EXDEV, errno.EACCES, errno.EPERM)
    _denied(out[1], errno.EXDEV, errno.EACCES, errno.EPERM)
    assert not (env.world.rw / "hard_owned").exists() and not (env.world.rw / "hard_canary").exists()
    assert env.world.owned_outside.stat().st_nlink == 1 and env.world.canary.stat().st_nlink == 1


@needs_refer
def test_rename_from_writable_root_to_outside_fails(env: Env) -> None:
    code = """
src = w['rw'] + '/mine.txt'
with open(src, 'w') as h:
    h.write('mine')
out = [attempt(lambda: os.rename(src, w['outside_w'] + '/moved.txt')),
       attempt(lambda: os.rename(src, w['ro'] + '/moved.txt')),
       attempt(lambda: os.path.exists(src))]
"""
    out = _ok_run(env.py(code))
    _denied(out[0], errno.EXDEV, errno.EACCES)
    _denied(out[1], errno.EXDEV, errno.EACCES)
    assert out[2] == ["ok", True]
    assert not (env.world.outside_w / "moved.txt").exists() and not (env.world.ro / "moved.txt").exists()


@needs_refer
def test_rename_from_outside_into_writable_root_fails(env: Env) -> None:
    code = """
out = [attempt(lambda: os.rename(w['owned_outside'], w['rw'] + '/stolen.txt')),
       attempt(lambda: os.rename(w['ro_file'], w['rw'] + '/stolen_ro.txt')),
       attempt(lambda: os.rename(w['canary'], w['rw'] + '/stolen_canary.txt'))]
"""
    for report in _ok_run(env.py(code)):
        _denied(report, errno.EXDEV, errno.EACCES)
    assert env.world.owned_outside.read_text() == CANARY_TEXT and env.world.ro_file.exists()
    assert list(env.world.rw.iterdir()) == []


def test_inherited_descriptor_of_the_kernel_is_not_readable(env: Env) -> None:
    """An fd the kernel leaves inheritable (no O_CLOEXEC) before the launcher starts."""
    fd = os.open(env.world.canary, os.O_RDONLY)
    os.set_inheritable(fd, True)
    manager = SandboxManager()  # its launcher starts now, while `fd` is inheritable
    try:
        sid = env.new_sandbox(_capability(env.world), manager)
        info = os.fstat(fd)
        code = """
def scan():
    hits = []
    for name in os.listdir('/proc/self/fd'):
        try:
            st = os.stat('/proc/self/fd/' + name)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (dev, ino):
            hits.append(int(name))
    return hits
out = [attempt(lambda: os.read(n, 100).decode()),
       attempt(lambda: read('/proc/self/fd/%d' % n)),
       attempt(lambda: os.fstat(n).st_ino),
       scan(), sorted(int(x) for x in os.listdir('/proc/self/fd'))]
"""
        r = env.py(code, sid=sid, manager=manager,
                   inputs={"n": fd, "dev": info.st_dev, "ino": info.st_ino})
        out = _ok_run(r)
        _denied(out[0], errno.EBADF)
        _denied(out[1])
        _denied(out[2], errno.EBADF)
        assert out[3] == [], f"the canary is open in the child as fds {out[3]}"
        # Also not through the launcher, whose pid is outside the child's pid namespace.
        launcher_fds = os.listdir(f"/proc/{manager.launcher_pid}/fd")
        assert str(fd) not in launcher_fds or os.readlink(f"/proc/{manager.launcher_pid}/fd/{fd}") != str(env.world.canary)
        assert CANARY_TEXT not in r.stdout + r.stderr
    finally:
        manager.close()
        os.close(fd)


# == writes into read-only places ==================================================================


def test_create_in_read_only_root_fails(env: Env) -> None:
    code = """
def create():
    with open(w['ro'] + '/new.txt', 'x') as h:
        h.write('x')
out = [attempt(create), attempt(lambda: os.mkdir(w['ro'] + '/newdir')),
       attempt(lambda: os.symlink('/etc/passwd', w['ro'] + '/newlink')),
       attempt(lambda: os.mkfifo(w['ro'] + '/fifo'))]
"""
    for report in _ok_run(env.py(code)):
        _denied(report, *WRITE_REFUSED)
    assert sorted(p.name for p in env.world.ro.iterdir()) == ["data.txt", "root.txt"]


@needs_truncate
def test_truncate_and_overwrite_in_read_only_root_fail(env: Env) -> None:
    # data.txt is the child uid's and 0666: file permissions would allow all three.
    code = """
def write():
    with open(w['ro_file'], 'r+') as h:
        h.write('XX')
out = [attempt(lambda: os.truncate(w['ro_file'], 0)),
       attempt(lambda: os.close(os.open(w['ro_file'], os.O_WRONLY | os.O_TRUNC))),
       attempt(write)]
"""
    for report in _ok_run(env.py(code)):
        _denied(report, *WRITE_REFUSED)
    assert env.world.ro_file.read_text() == "read-only data\n"


def test_unlink_in_read_only_root_fails(env: Env) -> None:
    code = "out = [attempt(lambda: os.unlink(w['ro_file'])), attempt(lambda: os.unlink(w['ro_rootfile'])), attempt(lambda: os.unlink(w['canary']))]"
    for report in _ok_run(env.py(code)):
        _denied(report, *WRITE_REFUSED)
    assert env.world.ro_file.exists() and env.world.ro_rootfile.exists()


# Where the isolation report names a layer missing, the attacks only it stops are not tried
# (docs/guarantees.md's tables say what holds there instead); each such skip says which layer.
needs_read_only_view = pytest.mark.skipif(
    not isolation_report()["layers"]["read_only_host_view"],
    reason="no read-only view of the host here (reported missing): a child can change the "
           "metadata of its uid's own files outside its roots")
needs_private_shm = pytest.mark.skipif(
    not isolation_report()["layers"]["private_dev_shm"],
    reason="no private /dev/shm here (reported missing): the host's is shared")


@needs_read_only_view
def test_chmod_of_a_root_owned_file_in_read_only_root_fails(env: Env) -> None:
    code = "out = [attempt(lambda: os.chmod(w['ro_rootfile'], 0o777)), attempt(lambda: os.chmod(w['canary'], 0o777)), attempt(lambda: os.chown(w['ro_rootfile'], 65534, 65534))]"
    for report in _ok_run(env.py(code)):
        _denied(report, *WRITE_REFUSED)
    assert stat.S_IMODE(env.world.ro_rootfile.stat().st_mode) == 0o644


@needs_read_only_view
def test_metadata_of_the_childs_own_file_in_read_only_root_cannot_change(env: Env) -> None:
    """Landlock has no right for metadata changes and file permissions let the owner make
    them: the child's view of the host is read-only outside its writable roots (EROFS)."""
    info = env.world.ro_file.stat()
    code = """
out = [attempt(lambda: os.chmod(w['ro_file'], 0o600)), attempt(lambda: os.utime(w['ro_file'], (0, 0))),
       attempt(lambda: os.chown(w['ro_file'], -1, 65534))]
"""
    try:
        out = _ok_run(env.py(code))
    finally:  # undo, so the world stays intact for the other tests
        os.chmod(env.world.ro_file, stat.S_IMODE(info.st_mode))
        os.utime(env.world.ro_file, ns=(info.st_atime_ns, info.st_mtime_ns))
        os.chown(env.world.ro_file, info.st_uid, info.st_gid)
    for report in out:
        _denied(report, errno.EROFS)


def test_shell_redirection_outside_the_roots_fails(env: Env) -> None:
    target_tmp = f"/tmp/sbx-escape-{uuid.uuid4().hex[:8]}"
    w = env.world
    r = env.sh(f"echo x > {target_tmp}; echo x > {w.outside_w}/shell.txt; "
               f"echo x >> {w.owned_outside}; echo x > {w.ro}/shell.txt; echo done")
    assert r.killed is None and "done" in r.stdout, r
    refused = r.stderr.count("Permission denied") + r.stderr.count("Read-only file system")
    assert refused == 4, r.stderr
    assert not os.path.exists(target_tmp)
    assert not (w.outside_w / "shell.txt").exists() and not (w.ro / "shell.txt").exists()
    assert w.owned_outside.read_text() == CANARY_TEXT


@needs_private_shm
def test_dev_shm_is_never_the_hosts(env: Env) -> None:
    """/dev/shm is shared by every process on the host: a child gets a private tmpfs there
    (multiprocessing needs one), and neither sees nor leaves anything in the host's."""
    name = f"sbx-escape-{uuid.uuid4().hex[:8]}"
    planted = f"/dev/shm/{name}-host"
    with open(planted, "w") as f:
        f.write("host data")
    try:
        code = """
def create():
    fd = os.open('/dev/shm/' + name, os.O_CREAT | os.O_RDWR, 0o600)
    os.write(fd, b'x')
def posix_shm():
    from multiprocessing import shared_memory
    shared_memory.SharedMemory(name=name + '-mp', create=True, size=4096)
def read_host():
    open('/dev/shm/' + name + '-host').read()
out = [attempt(create), attempt(posix_shm), attempt(read_host)]
"""
        out = _ok_run(env.py(code, inputs={"name": name}))
        assert out[0][0] == "ok" and out[1][0] == "ok", out  # the private one works
        _denied(out[2], errno.ENOENT)  # the host's file is not there
        assert [n for n in os.listdir("/dev/shm") if n.startswith(name)] == [f"{name}-host"]
    finally:
        os.unlink(planted)


CREATE_EVERY_WAY = """
import socket
def ways(folder):
    base = folder + '/' + name
    def o_creat(): os.close(os.open(base + '-file', os.O_CREAT | os.O_WRONLY, 0o600))
    def mkdir(): os.mkdir(base + '-dir')
    def mkfifo(): os.mkfifo(base + '-fifo')
    def bind():
        with socket.socket(socket.AF_UNIX) as s: s.bind(base + '-sock')
    def symlink(): os.symlink('/etc/hostname', base + '-symlink')
    def hardlink(): os.link(w['rw'] + '/' + name + '-linked', base + '-hardlink')
    def rename(): os.rename(w['rw'] + '/' + name + '-moved', base + '-moved')
    def tmpfile():
        fd = os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600)
        os.link(f'/proc/self/fd/{fd}', base + '-tmpfile', follow_symlinks=True)
    return [attempt(f) for f in (o_creat, mkdir, mkfifo, bind, symlink, hardlink, rename, tmpfile)]
for made in ('-linked', '-moved'):
    with open(w['rw'] + '/' + name + made, 'w') as f: f.write('x')
out = {folder: ways(folder) for folder in ('/tmp', '/dev/shm')}
"""


def test_nothing_a_child_makes_in_tmp_or_dev_shm_lands_in_the_hosts(env: Env) -> None:
    """Every way to make a name (a file, a folder, a FIFO, a socket, links, a rename from
    the writable root, an O_TMPFILE linked in) in /tmp and /dev/shm: the child's own are
    private or refused, and the host's get nothing. (The catch-all of `unharmed` cannot
    watch these folders for every name where the child's uid is also this process's.)"""
    name = f"sbx-made-{uuid.uuid4().hex[:8]}"
    out = _ok_run(env.py(CREATE_EVERY_WAY, inputs={"name": name}))
    private_shm = isolation_report()["layers"]["private_dev_shm"]
    for folder in ("/tmp", "/dev/shm") if private_shm else ("/tmp",):
        landed = [n for n in os.listdir(folder) if n.startswith(name)]
        assert landed == [], (folder, landed, out[folder])


# == secrets ========================================================================================


@pytest.fixture
def fake_home() -> Iterator[Path]:
    """/home/sbxtest, world-readable, with a world-readable ~/.ssh/id_rsa (must be created
    before the sandbox, whose read-everywhere set is computed at creation)."""
    home = Path("/home/sbxtest")
    if home.exists():
        pytest.skip("/home/sbxtest exists already; refusing to touch it")
    home.mkdir(parents=True)
    try:
        os.chmod(home, 0o755)
        (home / ".ssh").mkdir()
        os.chmod(home / ".ssh", 0o755)
        (home / ".ssh" / "id_rsa").write_text(SECRET_KEY_TEXT)
        os.chmod(home / ".ssh" / "id_rsa", 0o644)
        (home / "notes.txt").write_text("public notes\n")
        os.chmod(home / "notes.txt", 0o644)
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_ssh_key_unreadable_even_when_reading_everywhere(env: Env, fake_home: Path) -> None:
    sid = env.new_sandbox(_capability(env.world, readable=None))
    try:
        code = """
out = [attempt(lambda: read('/home/sbxtest/notes.txt')),
       attempt(lambda: read('/home/sbxtest/.ssh/id_rsa')),
       attempt(lambda: os.listdir('/home/sbxtest/.ssh')),
       attempt(lambda: subprocess.run(['cat', '/home/sbxtest/.ssh/id_rsa'], capture_output=True, text=True).stdout)]
"""
        r = env.py(code, sid=sid)
        out = _ok_run(r)
        assert out[0] == ["ok", "public notes\n"]  # the control: the home itself reads
        _unread(out[1])
        _unread(out[2])
        assert out[3] == ["ok", ""]
        assert "FAKE OPENSSH" not in r.stdout + r.stderr + repr(out)
    finally:
        env.manager.destroy(sid)


def test_read_everywhere_sandbox_cannot_reach_another_sandboxes_home(env: Env) -> None:
    """Found by this suite: homes sat in /tmp, which "read everywhere" grants, and every home
    belongs to the same uid. Homes now live in one folder that every sandbox is denied (or
    sees as an empty mount holding only its own home).
    (Changing the other home's mode is the metadata limit of the xfail test above.)"""
    home_a = env.manager._get(env.sid).home
    _ok_run(env.py("open(os.environ['HOME'] + '/private.txt', 'w').write('tenant A secret'); out = 1"))
    sid_b = env.new_sandbox(_capability(env.world, readable=None))
    try:
        code = """
out = [attempt(lambda: os.listdir(a)), attempt(lambda: read(a + '/private.txt')),
       attempt(lambda: os.chmod(a, 0o755)), attempt(lambda: open(a + '/planted', 'w').close())]
"""
        out = _ok_run(env.py(code, sid=sid_b, inputs={"a": home_a}))
    finally:
        env.manager.destroy(sid_b)
        os.chmod(home_a, 0o700)
        Path(home_a, "private.txt").unlink(missing_ok=True)
    _denied(out[3], *WRITE_REFUSED, errno.ENOENT)  # writing there is stopped (or no "there")
    assert not Path(home_a, "planted").exists()
    # nor in A's home as A's runs see it (a tmpfs only they attach, where the host allows)
    assert _ok_run(env.py("out = os.path.exists(os.environ['HOME'] + '/planted')")) is False
    for report in out[:2]:
        _unread(report)


def test_etc_shadow_unreadable(env: Env) -> None:
    if not os.path.exists("/etc/shadow"):
        pytest.skip("this host has no /etc/shadow")
    sid = env.new_sandbox(_capability(env.world, readable=None))
    try:
        code = "out = [attempt(lambda: read('/etc/shadow')), attempt(lambda: read('/etc/passwd')[:5])]"
        for s in (sid, env.sid):
            out = _ok_run(env.py(code, sid=s))
            _unread(out[0])
            assert out[1][0] == "ok"  # the control: the rest of /etc reads
        r = env.sh("cat /etc/shadow; echo rc=$?", sid=sid)
        assert "rc=" in r.stdout and "root:" not in r.stdout, r
    finally:
        env.manager.destroy(sid)


def test_kernel_environment_secret_never_reaches_the_child(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBX_TEST_SECRET", ENV_SECRET)
    manager = SandboxManager()  # its launcher starts with the secret in its environment
    try:
        sid = env.new_sandbox(_capability(env.world), manager)
        code = """
out = [os.environ.get('SBX_TEST_SECRET'),
       attempt(lambda: open('/proc/self/environ', 'rb').read().decode(errors='replace')),
       subprocess.run(['env'], capture_output=True, text=True).stdout,
       attempt(lambda: open('/proc/1/environ', 'rb').read().decode(errors='replace'))]
"""
        r = env.py(code, sid=sid, manager=manager)
        out = _ok_run(r)
        assert out[0] is None
        assert out[1][0] == "ok" and ENV_SECRET not in out[1][1]
        assert "PATH=" in out[2] and ENV_SECRET not in out[2]
        assert ENV_SECRET not in repr(out[3])
        e = manager.execute(sid, ["env"], timeout=15, env={MARKER_NAME: MARKER})
        assert e.exit_code == 0 and "HOME=" in e.stdout and ENV_SECRET not in e.stdout, e
        assert "SBX_TEST_SECRET" not in e.stdout
    finally:
        manager.close()


def test_kernel_proc_environ_and_cmdline_are_invisible(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBX_TEST_SECRET", ENV_SECRET)  # now in this process's environ
    code = """
out = [attempt(lambda: open('/proc/%d/environ' % test_pid, 'rb').read().decode(errors='replace')),
       attempt(lambda: open('/proc/%d/cmdline' % test_pid, 'rb').read().decode(errors='replace')),
       attempt(lambda: open('/proc/%d/cmdline' % launcher_pid, 'rb').read().decode(errors='replace')),
       attempt(lambda: sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))]
"""
    r = env.py(code)
    out = _ok_run(r)
    for report in out[:3]:
        _denied(report, errno.ENOENT, errno.EACCES)
    if isolation_report()["layers"]["private_proc"]:
        assert out[3] == ["ok", [1]], f"the child's /proc shows other processes: {out[3]}"
    else:  # the pod's /proc (reported): Landlock lets it read its own entries only
        _denied(out[3], errno.EACCES)
    assert ENV_SECRET not in r.stdout + repr(out) and "pytest" not in repr(out)


# == processes ======================================================================================


@needs_scoping
def test_signal_to_the_kernel_fails(env: Env) -> None:
    code = "out = [attempt(lambda: os.kill(test_pid, signal.SIGKILL)), attempt(lambda: os.kill(test_pid, 0)), attempt(lambda: os.killpg(test_pid, signal.SIGKILL))]"
    out = _ok_run(env.py(code))
    for report in out:
        _denied(report, errno.ESRCH, errno.EPERM)
    assert _alive(os.getpid())


@needs_scoping
def test_signal_to_the_launcher_fails(env: Env) -> None:
    launcher = env.manager.launcher_pid
    # The launcher is the child's real parent, but outside its pid namespace: getppid() is 0
    # (and kill(0, ...) would only reach the child's own process group), and kill(-1, ...)
    # reaches only the namespace, where there is nobody else.
    code = """
out = [attempt(lambda: os.kill(launcher_pid, signal.SIGKILL)), attempt(lambda: os.kill(launcher_pid, signal.SIGTERM)),
       attempt(lambda: os.kill(-1, signal.SIGKILL)), os.getppid()]
"""
    out = _ok_run(env.py(code))
    for report in out[:2]:
        _denied(report, errno.ESRCH, errno.EPERM)
    if isolation_report()["layers"]["pid_namespace"]:
        _denied(out[2], errno.ESRCH, errno.EPERM)
        assert out[3] == 0, "the launcher is visible in the child's pid namespace"
    # Without one (reported missing) kill(-1) answers 0 even when every process refused the
    # signal (Linux counts a refusal as a try); Landlock's scope refused them: the autouse
    # check finds the launcher, the kernel and the world unharmed.
    assert _alive(launcher)
    time.sleep(0.3)
    assert _alive(launcher) and _alive(os.getpid())
    assert _ok_run(env.py("out = 1")) == 1  # the launcher still serves


@needs_seccomp
def test_ptrace_attach_to_the_kernel_fails(env: Env) -> None:
    code = """
PTRACE_ATTACH, PTRACE_SEIZE, PTRACE_TRACEME = 16, 0x4206, 0
def call(req, pid):
    ctypes.set_errno(0)
    res = libc.ptrace(ctypes.c_long(req), ctypes.c_long(pid), None, None)
    if res == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return res
out = [attempt(lambda: call(PTRACE_ATTACH, test_pid)), attempt(lambda: call(PTRACE_SEIZE, test_pid)),
       attempt(lambda: call(PTRACE_TRACEME, 0))]
"""
    out = _ok_run(env.py(code))
    for report in out:
        _denied(report, errno.EPERM)
    assert psutil.Process().status() != psutil.STATUS_TRACING_STOP
    assert "TracerPid:\t0" in Path("/proc/self/status").read_text()


@needs_seccomp
@needs_known_arch
def test_process_vm_readv_of_the_kernel_fails(env: Env) -> None:
    secret = ctypes.create_string_buffer(b"kernel-memory-secret-77")
    code = """
class IOVec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = IOVec(ctypes.cast(buf, ctypes.c_void_p), 23)
remote = IOVec(addr, 23)
def go():
    raw(nr, ctypes.c_int(test_pid), ctypes.byref(local), ctypes.c_ulong(1), ctypes.byref(remote), ctypes.c_ulong(1), ctypes.c_ulong(0))
    return buf.value.decode(errors='replace')
def own():
    raw(nr, ctypes.c_int(os.getpid()), ctypes.byref(local), ctypes.c_ulong(1), ctypes.byref(local), ctypes.c_ulong(1), ctypes.c_ulong(0))
out = [attempt(go), attempt(own)]
"""
    out = _ok_run(env.py(code, inputs={"addr": ctypes.addressof(secret), "nr": SYSCALLS["process_vm_readv"]}))
    _denied(out[0], errno.EPERM)
    _denied(out[1], errno.EPERM)  # seccomp denies it outright, even on itself
    assert secret.value == b"kernel-memory-secret-77"


@needs_seccomp
def test_changing_identity_fails(env: Env) -> None:
    """No other uid or group, and no capability: unprivileged, root is the prize; as root (in
    its user namespace) any other user's files are."""
    uid = seen_uid(env.world.uid)
    other = 0 if uid != 0 else 1000
    code = f"""
out = [attempt(lambda: os.setuid({other})), attempt(lambda: os.setresuid({other}, {other}, {other})),
       attempt(lambda: os.setgid({other})), attempt(lambda: os.setgroups([{other}])),
       [os.getuid(), os.geteuid(), os.getgid()],
       subprocess.run(['sudo', '-n', 'true'], capture_output=True).returncode if os.path.exists('/usr/bin/sudo') else 1,
       [line.split()[1] for line in open('/proc/self/status') if line.startswith('CapEff')]]
"""
    out = _ok_run(env.py(code))
    for report in out[:4]:
        _denied(report, errno.EPERM, errno.EINVAL)
    assert out[4] == [uid, uid, uid]
    assert out[5] != 0
    assert out[6] == ["0000000000000000"]


@needs_seccomp
def test_unshare_fails(env: Env) -> None:
    code = """
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
def unshare(flags):
    if hasattr(os, 'unshare'):
        return os.unshare(flags)
    ctypes.set_errno(0)
    if libc.unshare(ctypes.c_int(flags)) == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
out = [attempt(lambda: unshare(CLONE_NEWUSER)), attempt(lambda: unshare(CLONE_NEWUSER | CLONE_NEWNS)),
       attempt(lambda: unshare(CLONE_NEWNET))]
"""
    for report in _ok_run(env.py(code)):
        _denied(report, errno.EPERM)
    if shutil.which("unshare"):
        r = env.sh("unshare -r id -u; echo rc=$?")
        assert "rc=0" not in r.stdout and "\n0\n" not in "\n" + r.stdout, r


@needs_seccomp
@needs_known_arch
def test_mount_fails(env: Env) -> None:
    code = """
def mount(src, target, fstype, flags=0):
    raw(nr, ctypes.c_char_p(src), ctypes.c_char_p(target.encode()), ctypes.c_char_p(fstype), ctypes.c_ulong(flags), None)
MS_BIND, MS_REMOUNT = 4096, 32
out = [attempt(lambda: mount(b'none', w['rw'], b'tmpfs')),
       attempt(lambda: mount(w['outside'].encode(), w['rw'], None, MS_BIND)),
       attempt(lambda: mount(None, '/', None, MS_REMOUNT))]
"""
    for report in _ok_run(env.py(code, inputs={"nr": SYSCALLS["mount"]})):
        _denied(report, errno.EPERM)
    r = env.sh(f"mount --bind {env.world.outside} {env.world.rw}; echo rc=$?; ls {env.world.rw}")
    assert "rc=0" not in r.stdout and "canary.txt" not in r.stdout, r
    assert list(env.world.rw.iterdir()) == []


@needs_seccomp
@needs_known_arch
def test_io_uring_setup_is_denied(env: Env) -> None:
    code = "params = ctypes.create_string_buffer(120)\nout = attempt(lambda: raw(nr, ctypes.c_uint(4), params))"
    out = _ok_run(env.py(code, inputs={"nr": SYSCALLS["io_uring_setup"]}))
    _denied(out, errno.EPERM)


@needs_seccomp
def test_inotify_cannot_watch_a_folder_it_may_not_read(env: Env) -> None:
    """Found in review: Landlock does not check inotify_add_watch, so a cell could watch
    the names and activity of files in a folder whose listing it is refused."""
    code = """
fd = libc.inotify_init1(0)
def watch(path):
    wd = libc.inotify_add_watch(fd, path.encode(), 0xfff)
    if wd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return wd
out = [attempt(lambda: os.listdir(w['outside'])), attempt(lambda: watch(w['outside'])),
       attempt(lambda: watch(w['rw']))]
"""
    listing, outside, own = _ok_run(env.py(code))
    _denied(listing, errno.EACCES)
    _denied(outside, errno.EPERM)
    _denied(own, errno.EPERM)  # no inotify at all: seccomp cannot tell the folders apart


@needs_seccomp
def test_tiocsti_keystroke_injection_fails(env: Env) -> None:
    code = """
import fcntl, termios
def tty():
    fd = os.open('/dev/tty', os.O_RDWR)
    fcntl.ioctl(fd, termios.TIOCSTI, b'x')
out = [attempt(lambda: fcntl.ioctl(0, termios.TIOCSTI, b'x')), attempt(lambda: fcntl.ioctl(1, termios.TIOCSTI, b'x')),
       attempt(tty)]
"""
    out = _ok_run(env.py(code))
    _denied(out[0], errno.EPERM)  # seccomp answers before the tty layer
    _denied(out[1], errno.EPERM)
    _denied(out[2])  # no controlling terminal after setsid


# == network =======================================================================================


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _assert_no_connection(listener: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        conn, _ = listener.accept()
        conn.close()


def test_tcp_connect_to_kernel_loopback_fails(env: Env, tcp_listener: socket.socket) -> None:
    port = tcp_listener.getsockname()[1]
    code = """
def connect(family, addr):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(addr)
    return 'connected'
out = [attempt(lambda: connect(socket.AF_INET, ('127.0.0.1', port))),
       attempt(lambda: connect(socket.AF_INET6, ('::1', port))),
       attempt(lambda: socket.create_connection(('localhost', port), timeout=2) and 'connected')]
"""
    out = _ok_run(env.py(code, inputs={"port": port}))
    for report in out:
        _denied(report)
    assert out[0][1] == errno.EAFNOSUPPORT, out
    r = env.sh(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected; echo rc=$?")
    assert "connected" not in r.stdout, r
    _assert_no_connection(tcp_listener)


def test_udp_sendto_kernel_loopback_fails(env: Env) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver.bind(("127.0.0.1", 0))
        receiver.setblocking(False)
        port = receiver.getsockname()[1]
        code = "out = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'leak', ('127.0.0.1', port)))"
        out = _ok_run(env.py(code, inputs={"port": port}))
        _denied(out, errno.EAFNOSUPPORT, errno.EPERM)
        r = env.sh(f"echo leak > /dev/udp/127.0.0.1/{port}; echo rc=$?")
        assert "rc=0" not in r.stdout, r
        time.sleep(0.2)
        with pytest.raises(BlockingIOError):
            receiver.recvfrom(100)
    finally:
        receiver.close()


@contextlib.contextmanager
def _host_unix_socket(kind: int, name: str) -> Iterator[tuple[socket.socket, str]]:
    """A unix socket of the host's, bound at a path that file permissions let the child reach."""
    folder = tempfile.mkdtemp(prefix="sbx-escape-sock-", dir="/tmp")
    server = socket.socket(socket.AF_UNIX, kind)
    try:
        os.chmod(folder, 0o777)
        path = os.path.join(folder, name)
        server.bind(path)
        os.chmod(path, 0o777)
        if kind == socket.SOCK_STREAM:
            server.listen(4)
        server.setblocking(False)
        yield server, path
        assert os.listdir(folder) == [name]
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_pathname_unix_socket_of_the_kernel_is_unreachable(env: Env) -> None:
    with _host_unix_socket(socket.SOCK_STREAM, "kernel.sock") as (server, path):
        code = """
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return 'connected'
out = attempt(connect)
"""
        out = _ok_run(env.py(code, inputs={"path": path}))
        _denied(out, errno.EAFNOSUPPORT, errno.EACCES, errno.EPERM)
        _assert_no_connection(server)


def test_a_datagram_socketpair_cannot_reach_a_pathname_socket_of_the_host(env: Env) -> None:
    """Found in review: a SOCK_DGRAM pair can be re-pointed at any pathname datagram socket
    (sendto/connect to a path; Landlock does not check either), e.g. /dev/log or systemd's
    notify socket, even carrying descriptors. Only stream pairs (multiprocessing's) may exist."""
    with _host_unix_socket(socket.SOCK_DGRAM, "notify.sock") as (host, path):
        code = """
def sendto():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b'READY=1', path)
    return 'sent'
def reconnect():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    a.connect(path)
    a.send(b'READY=1')
    return 'sent'
def seqpacket():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.sendto(b'READY=1', path)
    return 'sent'
def stream_pair_still_works():
    a, b = socket.socketpair()
    a.sendall(b'ping')
    return b.recv(4).decode()
out = [attempt(sendto), attempt(reconnect), attempt(seqpacket), stream_pair_still_works()]
"""
        *attempts, stream = _ok_run(env.py(code, inputs={"path": path}))
        for report in attempts:
            _denied(report, errno.EAFNOSUPPORT, errno.EPERM)
        assert stream == "ping"
        with pytest.raises(BlockingIOError):
            host.recv(100)  # nothing arrived


@needs_scoping
def test_abstract_unix_socket_of_the_kernel_is_unreachable(env: Env) -> None:
    name = f"\0sbx-escape-{uuid.uuid4().hex[:8]}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(name)
        server.listen(4)
        server.setblocking(False)
        code = """
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(name)
    return 'connected'
def dgram():
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'x', name)
out = [attempt(connect), attempt(dgram)]
"""
        for report in _ok_run(env.py(code, inputs={"name": name})):
            _denied(report, errno.EAFNOSUPPORT, errno.EPERM, errno.ECONNREFUSED)
        _assert_no_connection(server)
    finally:
        server.close()


def test_dns_resolution_fails(env: Env) -> None:
    code = "out = [attempt(lambda: socket.getaddrinfo('example.com', 80)), attempt(lambda: socket.gethostbyname('example.org'))]"
    out = _ok_run(env.py(code))
    _denied(out[0])
    _denied(out[1])
    r = env.sh("getent hosts example.com; echo rc=$?")
    assert "rc=0" not in r.stdout, r


# == resource exhaustion and leftovers =============================================================


def test_fork_bomb_ends_and_leaves_nothing(env: Env) -> None:
    # The classic one-liner: the top shell (PID 1 of the namespace) returns at once, and its
    # exit takes the whole namespace, bomb included, down with it.
    r = env.sh(":(){ :|:& };:", timeout=5)
    assert r.exit_code is not None
    assert _wait_no_sandbox_processes(env.world.uid) == []
    # The same bomb with the top shell staying alive: RLIMIT_NPROC stalls it and the run must
    # end by a kill (process limit or timeout), not by itself.
    r = env.sh(":(){ :|:& };:; sleep 300", timeout=5)
    assert r.exit_code == -1 and r.killed is not None, r
    assert "[sandbox] killed:" in r.stderr
    assert _wait_no_sandbox_processes(env.world.uid) == []
    assert _ok_run(env.py("out = 'alive'")) == "alive"


def test_memory_bomb_is_killed(env: Env) -> None:
    code = """
import time
hold = []
while True:
    hold.append(bytearray(b'\\x01') * (2 * 1024 * 1024))  # touched pages: resident memory
    time.sleep(0.02)
"""
    r = env.py(code, timeout=60)
    assert r.exit_code == -1 and r.killed is not None and "Memory" in r.killed, r
    assert "[sandbox] killed:" in r.stderr


def test_cpu_spin_is_killed(env: Env) -> None:
    r = env.py("while True:\n    pass\n", timeout=60)
    assert r.exit_code == -1 and r.killed is not None and "CPU" in r.killed, r
    assert "[sandbox] killed:" in r.stderr


def test_output_flood_is_capped(env: Env) -> None:
    code = "chunk = 'x' * (1024 * 1024)\nfor _ in range(20):\n    sys.stdout.write(chunk)\nsys.stdout.flush()\nout = 'done'"
    r = env.py(code, timeout=60)
    mib = 1024 * 1024
    assert len(r.stdout.encode()) <= mib + 200, len(r.stdout)
    assert "dropped" in r.stdout
    dropped = r.resource_usage.get("output_dropped_bytes")
    assert dropped and dropped.get("stdout", 0) >= 18 * mib, r.resource_usage


def test_sleeping_setsid_grandchild_dies_with_the_timeout(env: Env) -> None:
    r = env.sh("setsid sleep 300 & sleep 300", timeout=1)
    assert r.exit_code == -1 and r.killed is not None and "timeout" in r.killed, r
    assert "[sandbox] killed:" in r.stderr
    assert _wait_no_sandbox_processes(env.world.uid) == []
    sleepers = [p.pid for p in psutil.process_iter(["name", "uids", "cmdline"])
                if p.info["name"] == "sleep" and p.info["uids"] and p.info["uids"].real == env.world.uid
                and p.info["cmdline"] == ["sleep", "300"] and p.pid in _ours_by_env(env.world.uid)]
    assert sleepers == []


def test_setsid_grandchild_does_not_outlive_a_shell_that_exits(env: Env) -> None:
    r = env.sh("setsid sleep 300 & exit 0", timeout=15)
    assert r.killed is None or "timeout" not in r.killed, r
    assert _wait_no_sandbox_processes(env.world.uid) == []
    assert [p for p in _ours_by_env(env.world.uid)] == []


def _ours_by_env(uid: int) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real == uid \
                    and proc.environ().get(MARKER_NAME) == MARKER \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return pids
