"""A root kernel's children as root (`child_uid=0`), in a user namespace, with nothing root
could do.

Root kernels are common (Colab, most Docker images). Their children drop to an unprivileged
uid of their own by default (seen as nobody, 65534, inside), to which root's granted folders
are shown as its own through idmapped mounts. `child_uid=0` keeps uid 0 inside
a user namespace with every capability set and the bounding set empty, and these tests try what
being root could still be good for: capabilities regained by exec, kernel settings under /proc (whose
file modes let root write them), raw disks (root's by their modes), root's 0600 files outside
the grants, signals to root's processes. File permissions stop none of these for uid 0: each
must be stopped by the namespaces, the read-only mounts, Landlock or seccomp.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager
from sandbox_kernel_ext.runner.trusted.isolation import NOBODY_UID as NOBODY
from sandbox_kernel_ext.runner.trusted.isolation import default_child_uid

from no_user_namespaces import without_user_namespaces

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a root kernel's children: the tests run as root"),
]


@pytest.fixture()
def root_folder() -> Iterator[Path]:
    """What a root user makes and hands to a sandbox: mkdtemp's folder, root's and 0700."""
    path = Path(tempfile.mkdtemp(prefix="sbx-rootid-"))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _capability(writable: list[str], readable: list[str] | None) -> CapabilityDeclaration:
    return CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_write" if writable else "read_only", writable_paths=writable,
        readable_paths=readable))


def test_the_default_identity_is_unprivileged_and_root_is_asked_for() -> None:
    """File permissions keep root's private files from a default child, whose uid is not
    nobody's (daemons share that one); root's own uid is a choice, and the report says what
    it costs."""
    assert default_child_uid() not in (0, NOBODY)
    from sandbox_kernel_ext import isolation_report

    identity = isolation_report()["child_identity"]
    assert "child_uid=0" in identity and f"uid {default_child_uid()}" in identity


# Both identities must make root's folders usable: the default uid through the owner map
# (root's granted folders shown as its own), and root's own uid.
IDENTITIES = pytest.mark.parametrize("child_uid", [None, 0], ids=["default", "root"])


@IDENTITIES
def test_a_root_folder_is_writable_and_what_the_cell_makes_is_roots(
    root_folder: Path, child_uid: int | None
) -> None:
    assert stat.S_IMODE(root_folder.stat().st_mode) == 0o700 and root_folder.stat().st_uid == 0
    with SandboxManager(child_uid=child_uid) as manager:
        sid = manager.create_sandbox(_capability([str(root_folder)], []))
        result = manager.run_python(sid, f"""
import os, subprocess
open({str(root_folder / 'made.txt')!r}, 'w').write('x')
status = open('/proc/self/status').read()
after_exec = subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout
def caps(text):
    return {{line.split(':')[0]: line.split()[1] for line in text.splitlines() if line.startswith('Cap')}}
out = {{'uid': os.getuid(), 'caps': caps(status), 'caps_after_exec': caps(after_exec),
        'no_new_privs': [l.split()[1] for l in status.splitlines() if l.startswith('NoNewPrivs')],
        'uid_map': open('/proc/self/uid_map').read().split()}}
""", outputs=["out"])
    assert result.exit_code == 0, result.stderr
    out = result.variables["out"]
    host_uid = default_child_uid() if child_uid is None else child_uid
    seen = NOBODY if child_uid is None else child_uid  # the default has no account: nobody's name
    assert out["uid"] == seen
    assert out["uid_map"] == [str(seen), str(host_uid), "1"]  # a user namespace of its own
    zero = "0000000000000000"
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert out["caps"][name] == zero, out["caps"]
        assert out["caps_after_exec"][name] == zero, out["caps_after_exec"]  # exec as root gains none
    assert out["no_new_privs"] == ["1"]
    made = (root_folder / "made.txt").stat()
    assert (made.st_uid, made.st_gid) == (0, 0)


@IDENTITIES
def test_a_program_under_root_home_runs(child_uid: int | None) -> None:
    """pyenv's and conda's interpreters live under /root (0700): the child can enter it."""
    if not os.path.isdir("/root"):
        pytest.skip("no /root here")
    folder = Path(tempfile.mkdtemp(prefix="sbx-rootid-", dir="/root"))
    try:
        program = folder / "tool"
        program.write_text("#!/bin/sh\necho ran from /root\n")
        program.chmod(0o700)
        with SandboxManager(child_uid=child_uid) as manager:
            sid = manager.create_sandbox(_capability([], [str(folder)]))
            result = manager.execute(sid, [str(program)])
        assert result.exit_code == 0, result.stderr
        assert result.stdout == "ran from /root\n"
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


KERNEL_SETTINGS = ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
                   "/proc/sys/kernel/modprobe", "/proc/sysrq-trigger", "/proc/sys/fs/file-max")


def test_kernel_settings_cannot_be_written(root_folder: Path) -> None:
    """core_pattern would run a program as the host's root; every sysctl's mode lets root write."""
    before = {path: Path(path).read_text() for path in KERNEL_SETTINGS
              if os.access(path, os.R_OK) and path != "/proc/sysrq-trigger"}
    with SandboxManager(child_uid=0) as manager:
        sid = manager.create_sandbox(_capability([str(root_folder)], None))  # read everywhere
        result = manager.run_python(sid, f"""
import errno, os
out = {{}}
for path in {KERNEL_SETTINGS!r}:
    try:
        with open(path, 'w') as handle:
            handle.write('|/bin/sh -c id' if 'core_pattern' in path else '1')
        out[path] = 'written'
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
mounts = {{line.split()[4]: line.split()[5] for line in open('/proc/self/mountinfo')}}
out['/proc/sys mount'] = mounts.get('/proc/sys', 'not a mount')
""", outputs=["out"])
    assert result.exit_code == 0, result.stderr
    out = result.variables["out"]
    # Two layers: a read-only mount of its own, and Landlock, which grants no write under /proc
    assert out.pop("/proc/sys mount").split(",")[0] == "ro", out
    for path, what in out.items():
        if what == "ENOENT":
            continue
        assert what in ("EROFS", "EACCES", "EPERM"), (path, what)
    assert {path: Path(path).read_text() for path in before} == before


def _block_device() -> str | None:
    for entry in sorted(os.scandir("/dev"), key=lambda e: e.name):
        try:
            if stat.S_ISBLK(entry.stat(follow_symlinks=False).st_mode):
                return entry.path
        except OSError:
            continue
    return None


def test_roots_private_files_stay_closed_to_the_default_child(root_folder: Path) -> None:
    """Found in review of root's own uid: reading "everywhere", root in name reads every 0600
    file of root's (debconf's passwords, logs, a key left in /tmp). The default child is
    unprivileged and sees root's files as its own only in the folders its policy grants."""
    secret_dir = Path(tempfile.mkdtemp(prefix="sbx-rootid-secret-"))
    secret = secret_dir / "private"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    secret_dir.chmod(0o755)
    targets = [str(secret), *(p for p in ("/var/cache/debconf/passwords.dat",
                                          "/var/log/apt/term.log") if os.path.exists(p))]
    try:
        with SandboxManager() as manager:
            sid = manager.create_sandbox(_capability([str(root_folder)], None))
            result = manager.run_python(sid, f"""
import errno
out = {{}}
for path in {targets!r}:
    try:
        open(path, 'rb').read(16)
        out[path] = 'read'
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
open({str(root_folder / 'mine')!r}, 'w').write('in the granted folder')
""", outputs=["out"])
    finally:
        subprocess.run(["rm", "-rf", str(secret_dir)], check=False)
    assert result.exit_code == 0, result.stderr
    assert set(result.variables["out"].values()) <= {"EACCES", "EPERM", "ENOENT"}, result.variables
    assert (root_folder / "mine").stat().st_uid == 0  # the granted folder is still its own


def test_raw_disks_and_roots_private_files_stay_closed(root_folder: Path) -> None:
    """Root may read a block device or any 0600 file of its own by their modes: only the
    grants decide, under "read everywhere" too."""
    secret_dir = Path(tempfile.mkdtemp(prefix="sbx-rootid-secret-"))
    secret = secret_dir / "private"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    device = _block_device()
    try:
        with SandboxManager(child_uid=0) as manager:
            narrow = manager.create_sandbox(_capability([str(root_folder)], []))
            everywhere = manager.create_sandbox(_capability([str(root_folder)], None))
            code = f"""
import errno
out = {{}}
for path in {[str(secret), device] if device else [str(secret)]!r}:
    try:
        open(path, 'rb').read(16)
        out[path] = 'read'
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
"""
            narrow_result = manager.run_python(narrow, code, outputs=["out"])
            everywhere_result = manager.run_python(everywhere, code, outputs=["out"])
    finally:
        subprocess.run(["rm", "-rf", str(secret_dir)], check=False)
    assert narrow_result.exit_code == 0, narrow_result.stderr
    assert all(v in ("EACCES", "EPERM") for v in narrow_result.variables["out"].values()), narrow_result
    assert everywhere_result.exit_code == 0, everywhere_result.stderr
    if device is not None:  # "everywhere" grants a few devices by name, never a disk
        assert everywhere_result.variables["out"][device] in ("EACCES", "EPERM"), everywhere_result


def test_roots_processes_outside_cannot_be_signalled(root_folder: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        with SandboxManager(child_uid=0) as manager:
            sid = manager.create_sandbox(_capability([str(root_folder)], None))
            result = manager.run_python(sid, f"""
import errno, os, signal
out = {{}}
for name, target in (('pid', {victim.pid}), ('everyone', -1), ('group', -{os.getpgid(0)})):
    try:
        os.kill(target, signal.SIGKILL if name != 'everyone' else signal.SIGTERM)
        out[name] = 'sent'
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
""", outputs=["out"])
        assert result.exit_code in (0, -signal.SIGTERM), result
        assert victim.poll() is None, "a root process outside the sandbox was killed"
        if result.variables:
            assert result.variables["out"]["pid"] in ("ESRCH", "EPERM"), result.variables
    finally:
        victim.kill()
        victim.wait()


# Root where nested user namespaces are refused: the launcher is root but cannot make a user
# namespace, so its children must drop to their uid with the bounding set emptied first (it cannot
# be emptied after the uid change).
NO_USER_NAMESPACES_AS_ROOT = without_user_namespaces(drop_to_nobody=False)

RUN_AS_ROOT_WITHOUT_USERNS = """
import sys, tempfile, warnings
tempfile.tempdir = sys.argv[1]
warnings.simplefilter("ignore")
from sandbox_kernel_ext import SandboxManager, CapabilityDeclaration, isolation_report
print("identity:", isolation_report()["child_identity"])
with SandboxManager() as m:
    sid = m.create_sandbox(CapabilityDeclaration())
    r = m.run_python(sid, "import os\\nprint(os.getuid(), [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapBnd', 'CapPrm', 'CapEff'))])")
    print("child:", r.exit_code, r.stdout.strip(), r.stderr[-300:])
try:
    SandboxManager(child_uid=0)
    print("root child: allowed")
except Exception as exc:
    print("root child:", type(exc).__name__, "needs user namespaces" in str(exc))
"""


def test_without_user_namespaces_a_root_kernels_child_keeps_no_capability(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="sbx-rootid-nouserns-", dir="/tmp"))
    folder.chmod(0o777)
    try:
        (folder / "wrap.py").write_text(NO_USER_NAMESPACES_AS_ROOT)
        (folder / "run.py").write_text(RUN_AS_ROOT_WITHOUT_USERNS)
        python = sys.executable
        done = subprocess.run([python, str(folder / "wrap.py"), python, str(folder / "run.py"),
                               str(folder)], capture_output=True, text=True, timeout=120,
                              cwd=str(folder))
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)
    assert done.returncode == 0, done.stderr
    assert f"identity: unprivileged uid {default_child_uid()} by default" in done.stdout, done.stdout
    assert "with no user namespace" in done.stdout, done.stdout  # as it is made here
    zero = "0000000000000000"
    assert f"child: 0 {default_child_uid()} ['{zero}', '{zero}', '{zero}']" in done.stdout, done.stdout
    # root with no user namespace to hold it keeps what only namespaces take away: refused
    assert "root child: SandboxError True" in done.stdout, done.stdout


def test_the_uid_search_skips_whole_ranges_asks_the_user_databases_and_has_a_floor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review: the search stepped one id at a time through a subordinate range
    (an hour for `containers:1000000:2147483647`), read only the account files (a systemd or
    LDAP user of that uid went unseen) and, with every id taken, returned -1, which
    setresuid reads as "unchanged": children as host root."""
    from sandbox_kernel_ext import SandboxError
    from sandbox_kernel_ext.runner.trusted import isolation

    assert isolation._resolves(0) and isolation._resolves(NOBODY)  # through the C library
    monkeypatch.setattr(isolation, "_named_ranges", lambda: [(1_000_000, 2**31)])
    monkeypatch.setattr(isolation, "_resolves", lambda uid: uid == 999_999)
    isolation.default_child_uid.cache_clear()
    try:
        assert isolation.default_child_uid() == 999_998
        monkeypatch.setattr(isolation, "_named_ranges", lambda: [(0, 2**32)])
        isolation.default_child_uid.cache_clear()
        with pytest.raises(SandboxError, match="no uid between"):
            isolation.default_child_uid()
    finally:
        monkeypatch.undo()
        isolation.default_child_uid.cache_clear()


@pytest.mark.parametrize("bad", [-1, 2**32 - 1, 2**40, "1000"])
def test_a_child_uid_that_is_no_uid_is_refused(bad: object) -> None:
    from sandbox_kernel_ext import SandboxError

    with pytest.raises(SandboxError, match="child_uid must be"):
        SandboxManager(child_uid=bad)  # type: ignore[arg-type]
