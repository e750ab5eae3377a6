"""The launcher's spare: the next run's child, made before the run is asked for.

A spare is forked, enters its user, PID, network, IPC and UTS namespaces and waits; what
depends on the run (the plan, the mount namespace, the covers, Landlock, seccomp) happens
when the run arrives. These tests check what that must not change: a run sees the host's
mounts as they are when it starts, not when its spare was made; a spare holds nothing of the
launcher's but its own end of the hand-off; a spare that dies waiting is replaced; and
closing the manager ends it.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import psutil
import pytest

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager
from sandbox_kernel_ext.runner.linux.tasks import SPARE_NAME
from sandbox_kernel_ext.runner.trusted.isolation import NOBODY_UID as NOBODY, default_child_uid

SPARE = SPARE_NAME.decode()
# Whether a run takes the view prepared for it depends on the host staying as it was: another
# sandbox made meanwhile (by anything else running) rightly makes a new one.
pytestmark = pytest.mark.alone


def _spares(manager: SandboxManager, count: int = 1, wait: float = 10.0) -> list[psutil.Process]:
    """The launcher's waiting spares (PID 1 of their namespace; the setup fork is gone),
    waited for until there are `count`: the launcher makes one once it has been idle a
    moment, and prepares one for a sandbox's next run after each run."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for process in psutil.Process(manager.launcher_pid).children():
            try:
                # Not a setup fork (named so too): it is no PID 1 of a namespace, and without
                # namespaces it has a child until the hand-over and then exits at once
                # (seen under load: listed, then gone before the test could stop it).
                if (process.name() == SPARE and process.status() != psutil.STATUS_ZOMBIE
                        and not process.children() and _pid_one(process.pid) is not False):
                    found.append(process)
            except psutil.Error:
                continue
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def _pid_one(pid: int) -> bool | None:
    """Whether `pid` is PID 1 of its own PID namespace (a spare is; its setup fork is not);
    None where the child has no PID namespace of its own."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return None if len(ids) < 2 else ids[-1] == "1"
    except OSError:
        return False
    return None


@pytest.fixture
def manager():
    with SandboxManager() as m:
        yield m


def test_spares_wait_holding_only_their_hand_off(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    assert manager.execute(sid, ["/bin/true"]).exit_code == 0
    # Not the launcher's socket to the kernel (the kernel would not see the launcher end),
    # not its wake-up pipe, no standard streams (the run brings those), nor the prepared
    # view's plan: the hand-off, and the prepared one's Landlock ruleset. A spare still
    # being made holds its status pipe for a moment (seen on a loaded machine): the state
    # once both wait is what counts.
    expected = [["anon_inode", "socket"], ["socket"]]
    deadline = time.monotonic() + 60
    while True:
        spares = _spares(manager, count=2)  # one for any run, one prepared for the next
        try:
            held = sorted(sorted(os.readlink(f"/proc/{spare.pid}/fd/{fd}").split(":")[0]
                                 for fd in os.listdir(f"/proc/{spare.pid}/fd"))
                          for spare in spares)
        except FileNotFoundError:  # replaced while it was looked at
            held = []
        if held == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert held == expected, held


def test_a_spare_killed_while_it_waits_is_replaced(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    assert manager.execute(sid, ["/bin/true"]).exit_code == 0
    for _ in range(3):
        for spare in _spares(manager, count=2):  # the prepared one and the other
            try:
                spare.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass  # replaced since it was listed (a loaded machine): gone is what we want
        # At once, before the launcher has reaped them: the run finds them gone and takes
        # a new one.
        result = manager.execute(sid, ["/bin/echo", "ran"])
        assert result.exit_code == 0 and result.stdout == "ran\n", result.stderr


def test_closing_the_manager_ends_its_spare() -> None:
    manager = SandboxManager()
    try:
        sid = manager.create_sandbox(CapabilityDeclaration())
        manager.execute(sid, ["/bin/true"])
        spares = _spares(manager, count=2)
    finally:
        manager.close()
    assert len(spares) == 2
    for spare in spares:
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


# ---------------------------------------------------------------- views prepared ahead
def _prepared_spare(manager: SandboxManager) -> psutil.Process:
    """The spare holding a prepared view (its Landlock ruleset is built already), waited for:
    the launcher prepares it after a run returns, which on a loaded machine takes a while."""
    deadline = time.monotonic() + 60  # liveness only
    while True:
        for spare in _spares(manager, count=2):
            try:
                held = [os.readlink(f"/proc/{spare.pid}/fd/{fd}")
                        for fd in os.listdir(f"/proc/{spare.pid}/fd")]
            except OSError:  # gone meanwhile: the next listing has what replaced it
                continue
            if any("landlock-ruleset" in target for target in held):
                return spare
        if time.monotonic() > deadline:
            pytest.fail("no spare was prepared for the sandbox's next run")
        time.sleep(0.01)


def _ran_in(manager: SandboxManager, sid: str) -> int:
    """The host pid of the sandbox's last run."""
    child = manager._get(sid).child
    assert child is not None
    return child.pid


READ = "import sys\ntry:\n    print(repr(open(sys.argv[1]).read()))\nexcept OSError as exc:\n    print(type(exc).__name__)"


def test_the_next_run_takes_the_view_prepared_for_it(manager: SandboxManager) -> None:
    # A narrow policy: with "everywhere" the view covers the whole host's folders, so any
    # change of its top level between two runs is (rightly) a new view. A store planted in
    # any home, or another sandbox made, is one either way: this needs a quiet host.
    folder = tempfile.mkdtemp(prefix="sbx-prep-")
    try:
        os.chmod(folder, 0o755)
        sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
            mode="read_only", readable_paths=[folder])))
        for _ in range(3):
            assert manager.execute(sid, ["/bin/true"]).exit_code == 0
            prepared = _prepared_spare(manager)
            result = manager.execute(sid, ["/bin/echo", "ran"])
            assert result.stdout == "ran\n", result.stderr
            assert _ran_in(manager, sid) == prepared.pid
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def home() -> str:
    """A world-readable home in /home (so the credential list covers it), settled: changed
    more than two seconds ago, as a home usually is."""
    folder = f"/home/sbxprep-{os.urandom(4).hex()}"
    os.mkdir(folder, 0o755)
    os.chmod(folder, 0o755)
    with open(f"{folder}/notes.txt", "w") as notes:
        notes.write("public\n")
    past = time.time() - 10
    os.utime(folder, (past, past))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_store_made_after_the_view_was_prepared_is_hidden(home: str) -> None:
    everywhere = CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=None))
    with SandboxManager() as manager:
        sid = manager.create_sandbox(everywhere)
        store = f"{home}/.aws/credentials"
        first = manager.execute(sid, [sys.executable, "-I", "-S", "-c", READ, store])
        assert first.stdout == "FileNotFoundError\n", first.stderr
        prepared = _prepared_spare(manager)
        os.mkdir(f"{home}/.aws", 0o755)
        with open(store, "w") as planted:
            planted.write("SECRET\n")
        os.chmod(store, 0o644)
        second = manager.execute(sid, [sys.executable, "-I", "-S", "-c", READ, store])
        assert second.stdout in ("''\n", "FileNotFoundError\n"), second.stdout
        assert _ran_in(manager, sid) != prepared.pid  # the stale view was ended, not used
        notes = manager.execute(sid, [sys.executable, "-I", "-S", "-c", READ, f"{home}/notes.txt"])
        assert notes.stdout == "'public\\n'\n", notes.stderr  # the control: the home is read


@pytest.mark.parametrize("grant", ["writable_paths", "readable_paths"])
def test_a_folder_replaced_after_the_view_was_prepared_is_the_new_one(
        manager: SandboxManager, grant: str) -> None:
    """The staleness check compares device and inode numbers: the prepared view holds each
    granted folder (a mount, a Landlock rule), so the number of a removed one cannot go to
    the folder made in its place while the view waits (ext4 gives a freed number straight
    back). Removed and made again, with a tree in it, several times: each run sees the new
    one, never the removed one a stale view would hold."""
    parent = tempfile.mkdtemp(prefix="sbx-prep-")
    try:
        folder = os.path.join(parent, "out")
        os.makedirs(os.path.join(folder, "deep"))
        os.chmod(parent, 0o755)
        sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
            mode="read_write" if grant == "writable_paths" else "read_only", **{grant: [folder]})))
        assert manager.execute(sid, ["/bin/true"]).exit_code == 0
        for round_ in range(4):
            _prepared_spare(manager)
            before = (os.stat(folder).st_ino, os.stat(os.path.join(folder, "deep")).st_ino)
            shutil.rmtree(folder)
            os.makedirs(os.path.join(folder, "deep"))
            with open(os.path.join(folder, "deep", "mark"), "w") as mark:
                mark.write(f"round {round_}\n")
            os.chmod(folder, 0o777)
            os.chmod(os.path.join(folder, "deep"), 0o777)
            assert os.stat(folder).st_ino != before[0]  # what the check relies on
            command = f"cat {folder}/deep/mark" + (
                f" && echo kept > {folder}/deep/file" if grant == "writable_paths" else "")
            result = manager.execute(sid, ["/bin/sh", "-c", command])
            assert result.exit_code == 0, result.stderr
            assert result.stdout == f"round {round_}\n"  # the new tree, not the removed one
            if grant == "writable_paths":
                with open(os.path.join(folder, "deep", "file")) as written:
                    assert written.read() == "kept\n"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_a_store_replaced_after_the_view_was_prepared_stays_hidden(home: str) -> None:
    everywhere = CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=None))
    store = f"{home}/.netrc"
    with open(store, "w") as planted:
        planted.write("OLD SECRET\n")
    os.chmod(store, 0o644)
    with SandboxManager() as manager:
        sid = manager.create_sandbox(everywhere)
        first = manager.execute(sid, [sys.executable, "-I", "-S", "-c", READ, store])
        assert first.stdout in ("''\n", "FileNotFoundError\n"), first.stdout
        _prepared_spare(manager)
        # As editors and credential helpers write: a new file renamed over the old one. On
        # the host that takes the prepared view's cover off the old file with it.
        with open(store + ".new", "w") as fresh:
            fresh.write("NEW SECRET\n")
        os.chmod(store + ".new", 0o644)
        os.rename(store + ".new", store)
        second = manager.execute(sid, [sys.executable, "-I", "-S", "-c", READ, store])
        assert second.stdout in ("''\n", "FileNotFoundError\n"), second.stdout


# ------------------------------------------- host processes of the child's uid and of nobody's
def _as_uid(uid: int, action) -> str:  # type: ignore[no-untyped-def]
    """Run `action()` in a fork that is `uid` on the host (the children's own, the worst
    case; or 65534, as a daemon running as `nobody` is); its result, or the error it
    raised, as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            outcome = repr(action())
        except BaseException as exc:  # noqa: BLE001
            outcome = f"{type(exc).__name__}: {exc}"
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        outcome = answer.read()
    os.waitpid(pid, 0)
    return outcome


def _take_descriptor(pid: int, fd: int) -> int:
    """pidfd_getfd(2): a copy of another process's descriptor, as ptrace would allow."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd, the same on every arch
        if got < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return got
    finally:
        os.close(pidfd)


@pytest.mark.skipif(os.geteuid() != 0, reason="children run as the kernel's own uid otherwise")
def test_a_host_process_of_the_childs_uid_cannot_take_a_waiting_spare(
        manager: SandboxManager) -> None:
    folder = tempfile.mkdtemp(prefix="sbx-prep-")  # root's: shown to the child by a tree
    try:
        sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
            mode="read_write", writable_paths=[folder])))
        assert manager.execute(sid, ["/bin/true"]).exit_code == 0
        tried = 0
        for spare in _spares(manager, count=2):
            try:
                held = os.listdir(f"/proc/{spare.pid}/fd")
            except FileNotFoundError:
                continue  # replaced since it was listed (a loaded machine): nothing to take
            for fd in held:
                outcome = _as_uid(manager.child_uid,
                                  lambda: _take_descriptor(spare.pid, int(fd)))
                assert outcome.startswith(("PermissionError", "ProcessLookupError")), outcome
                tried += outcome.startswith("PermissionError")
        assert tried, "no spare's descriptor was tried"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="children run as the kernel's own uid otherwise")
def test_a_stopped_spare_does_not_hold_up_the_run(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    assert manager.execute(sid, ["/bin/true"]).exit_code == 0
    _prepared_spare(manager)  # the spares the run could take are made
    spares: list[psutil.Process] = []
    deadline = time.monotonic() + 60  # liveness only
    while len(spares) < 2:  # stop both, as a process of the child's uid could
        assert time.monotonic() < deadline, f"only {len(spares)} spare(s) could be stopped"
        for spare in _spares(manager, count=2):
            if spare.pid in {s.pid for s in spares}:
                continue
            outcome = _as_uid(manager.child_uid, lambda: os.kill(spare.pid, signal.SIGSTOP))
            if outcome == "None":
                spares.append(spare)
            else:  # gone since it was listed (replaced): the next listing has its successor
                assert outcome.startswith("ProcessLookupError"), outcome
    box: list = []
    runner = threading.Thread(target=lambda: box.append(
        manager.execute(sid, ["/bin/echo", "hi"], timeout=30)))
    runner.start()
    runner.join(timeout=300)  # liveness, not speed: without a deadline it never returns
    try:
        assert not runner.is_alive(), "the run waited on a stopped spare"
        assert box[0].stdout == "hi\n", box[0].stderr
    finally:
        for spare in spares:
            try:
                spare.kill()
            except psutil.Error:
                pass
        runner.join()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a home of another uid")
def test_a_cover_the_prepared_view_could_not_place_is_not_missing_later(home: str) -> None:
    """The spare (an unprivileged uid) cannot enter a closed home, so its view has no cover there;
    once the home is opened, a run must not take that view (a fresh child covers it)."""
    everywhere = CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=None))
    store = f"{home}/.aws/credentials"
    os.mkdir(f"{home}/.aws", 0o755)
    with open(store, "w") as planted:
        planted.write("SECRET\n")
    os.chmod(store, 0o644)
    os.chown(home, 1000, 1000)
    os.chmod(home, 0o700)
    with SandboxManager() as manager:
        sid = manager.create_sandbox(everywhere)
        first = manager.execute(sid, [sys.executable, "-I", "-S", "-c", READ, store])
        assert first.stdout == "PermissionError\n", first.stdout
        _prepared_spare(manager)
        os.chmod(home, 0o755)  # only the home's mode changes
        second = manager.execute(sid, [sys.executable, "-I", "-S", "-c", READ, store])
        assert second.stdout in ("''\n", "FileNotFoundError\n"), second.stdout


def test_a_root_kernels_children_have_a_uid_no_account_names() -> None:
    """No account, group or subordinate range of this host names it, and it is not nobody's."""
    uid = default_child_uid()
    assert uid not in (0, NOBODY)
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    with pytest.raises(KeyError):
        grp.getgrgid(uid)
    for path in ("/etc/subuid", "/etc/subgid"):
        if os.path.exists(path):
            for line in open(path):
                _, start, count = line.strip().split(":")
                assert not int(start) <= uid < int(start) + int(count), line


@pytest.mark.skipif(os.geteuid() != 0, reason="children run as the kernel's own uid otherwise")
@pytest.mark.parametrize("attack", ["plant", "stop"])
def test_a_host_process_of_nobodys_uid_cannot_reach_a_run(
        manager: SandboxManager, attack: str) -> None:
    """The default children were uid 65534, which daemons share as nobody: such a process
    could trace a confined run and, through its /proc/PID/root, use the root's folder it is
    shown as its own to plant a set-user-ID root file (the run's seccomp filter is the run's,
    not the tracer's), or stop it. The run sees itself as 65534 and is another uid."""
    folder = tempfile.mkdtemp(prefix="sbx-setuid-")  # root's, shown to the child by a tree
    try:
        sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
            mode="read_write", writable_paths=[folder])))
        seen = manager.execute(sid, ["/usr/bin/id", "-u"]).stdout
        assert seen == f"{NOBODY}\n", seen
        box: list = []
        runner = threading.Thread(target=lambda: box.append(
            manager.execute(sid, ["/bin/sh", "-c", "echo up; sleep 5"],
                            on_output=lambda stream, text: started.set())))
        started = threading.Event()
        runner.start()
        started.wait(30)
        pid = manager._get(sid).child.pid
        planted = f"/proc/{pid}/root{folder}/planted"

        def plant() -> None:
            os.close(os.open(planted, os.O_CREAT | os.O_WRONLY, 0o755))
            os.chmod(planted, 0o4755)

        outcome = _as_uid(NOBODY, plant if attack == "plant" else
                          lambda: os.kill(pid, signal.SIGSTOP))
        assert outcome.startswith("PermissionError"), outcome
        manager.kill(sid, "done")
        runner.join()
        on_host = os.path.join(folder, "planted")
        made = os.path.exists(on_host) and os.stat(on_host)
        assert not (made and made.st_uid == 0 and made.st_mode & 0o4000), outcome
    finally:
        shutil.rmtree(folder, ignore_errors=True)
