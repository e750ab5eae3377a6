"""Escape attempts against the Landlock and seccomp layers, each in a real confined process.

Every attack runs in a fresh ``python -I -c`` child (single-threaded, unlike pytest) that builds
its rules as root, drops to uid/gid 65534 (Landlock does not stop chmod/chown by root), confines
itself and attacks. Each attack also runs once *unconfined* (same uid drop, no Landlock or
seccomp) in its own fresh world: the control proves the attack would work, so a pass means the
confinement stopped it, not file permissions. After each confined run the test checks that
nothing outside the writable root changed and that the secret never reached the child's output.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from sandbox_kernel_ext.runner.linux import landlock, seccomp
from sandbox_kernel_ext.runner.trusted import host_reads

NOBODY = 65534
SECRET_TEXT = "TOP-SECRET-7f3a"
LANDLOCK_MODULE = Path(landlock.__file__).resolve()
SECCOMP_MODULE = Path(seccomp.__file__).resolve()
ABI = landlock.landlock_abi()

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged uid"),
]
needs_landlock = pytest.mark.skipif(ABI < 1, reason="no Landlock on this kernel")
needs_net = pytest.mark.skipif(ABI < 4, reason="Landlock TCP rules need ABI 4")
needs_scoping = pytest.mark.skipif(ABI < 6, reason="Landlock scoping needs ABI 6")
needs_seccomp = pytest.mark.skipif(not seccomp.seccomp_available(), reason="no seccomp filter")


# The child. It loads the runner folder as a package of its own instead of importing
# sandbox_kernel_ext, whose __init__ pulls in pydantic: 0.7 s per child otherwise.
CHILD = r'''
import ctypes, errno, importlib.util, json, os, signal, socket, subprocess, sys, threading, time

config = json.loads(sys.argv[1])
globals().update(config["names"])
libc = ctypes.CDLL(None, use_errno=True)

def load(name, path):
    """The runner folder as a package of its own, so its relative imports work."""
    folder = os.path.dirname(path)
    if "skx_runner" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "skx_runner", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules["skx_runner"] = package
        spec.loader.exec_module(package)
    return importlib.import_module("skx_runner." + os.path.basename(path)[:-3])

landlock = load("skx_landlock", config["landlock_module"])
seccomp = load("skx_seccomp", config["seccomp_module"])

def drop_privileges():
    os.setgroups([])
    os.setgid(config["uid"])
    os.setuid(config["uid"])

def attempt(action):
    """'ok', or the errno name the attack failed with."""
    try:
        action()
    except OSError as exc:
        if exc.errno is None:
            return type(exc).__name__
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "ok"

def raw(number, *args):
    """A raw syscall, past every libc and Python wrapper."""
    typed = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = libc.syscall(ctypes.c_long(number), *typed)
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result

def read(path):
    with open(path) as handle:
        return handle.read()

results = {}
exec(config["setup"])
ruleset = None
if config["landlock"] is not None:
    rules = config["landlock"]
    ruleset = landlock.LandlockRuleset()
    for path in config["python_read_set"] + rules["read"]:
        ruleset.allow_read(path)
    for path in config["python_write_set"] + rules["write"]:
        ruleset.allow_write(path)
    for port in rules["tcp_connect"]:
        ruleset.allow_tcp_connect(port)
    if rules["scope_signals"]:
        ruleset.scope_signals()
    if rules["scope_abstract_unix"]:
        ruleset.scope_abstract_unix()
    ruleset.build()
if config["uid"] is not None:
    drop_privileges()
if ruleset is not None:
    ruleset.restrict_self()
if config["seccomp"] is not None:
    seccomp.SeccompFilter(**config["seccomp"]).install()
exec(config["attack"])
print(json.dumps(results), flush=True)
'''


@dataclass
class World:
    """A fresh directory tree: a secret outside every root, a read-only root, a writable root."""

    base: Path

    @property
    def outside(self) -> Path:
        return self.base / "outside"

    @property
    def secret(self) -> Path:
        return self.outside / "secret.txt"

    @property
    def ro(self) -> Path:
        return self.base / "ro"

    @property
    def rw(self) -> Path:
        return self.base / "rw"

    def names(self) -> dict[str, str]:
        return {
            "BASE": str(self.base),
            "OUTSIDE": str(self.outside),
            "SECRET": str(self.secret),
            "RO": str(self.ro),
            "RW": str(self.rw),
        }

    def snapshot(self) -> dict[str, tuple[object, ...]]:
        """Everything but the writable root: kind, mode, owner, times, content, link target."""
        state: dict[str, tuple[object, ...]] = {}
        for path in sorted(self.base.rglob("*")):
            if path == self.rw or self.rw in path.parents:
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                content: object = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                content = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                content = None
            state[str(path)] = (info.st_mode, info.st_uid, info.st_gid, info.st_nlink,
                                info.st_mtime_ns, info.st_size, content)
        return state


def _own(path: Path, mode: int) -> None:
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, mode)


def build_world() -> World:
    """Permissions let uid 65534 do every attack, so only the confinement can stop it."""
    base = Path(tempfile.mkdtemp(prefix="skx-security-"))
    os.chmod(base, 0o755)
    world = World(base)
    world.outside.mkdir(mode=0o755)
    world.secret.write_text(SECRET_TEXT)
    os.chmod(world.secret, 0o644)
    (world.outside / "nobody_owned.txt").write_text("outside, owned by the sandbox uid")
    _own(world.outside / "nobody_owned.txt", 0o644)
    (world.outside / "dropbox").mkdir()
    _own(world.outside / "dropbox", 0o777)
    world.ro.mkdir()
    _own(world.ro, 0o755)
    (world.ro / "file.txt").write_text("read-only content")
    _own(world.ro / "file.txt", 0o644)
    (world.ro / "sub").mkdir()
    _own(world.ro / "sub", 0o755)
    world.rw.mkdir()
    _own(world.rw, 0o755)
    (world.rw / "own.txt").write_text("the sandbox's own file")
    _own(world.rw / "own.txt", 0o644)
    # Planted by someone else before the run: links from the writable root to the outside.
    os.symlink(world.secret, world.rw / "planted_file")
    os.symlink(world.outside / "dropbox", world.rw / "planted_dir")
    os.lchown(world.rw / "planted_file", NOBODY, NOBODY)
    os.lchown(world.rw / "planted_dir", NOBODY, NOBODY)
    return world


WorldFactory = Callable[[], World]


@pytest.fixture
def make_world() -> Iterator[WorldFactory]:
    worlds: list[World] = []

    def factory() -> World:
        worlds.append(build_world())
        return worlds[-1]

    yield factory
    for world in worlds:
        shutil.rmtree(world.base, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Every test waits for all its processes and closes all its descriptors."""
    fds_before = set(os.listdir("/proc/self/fd"))
    yield
    assert psutil.Process().children(recursive=True) == []
    assert set(os.listdir("/proc/self/fd")) == fds_before


@dataclass
class Confinement:
    """What the child applies: Landlock roots (None: no Landlock), seccomp args (None: none)."""

    read: list[str] = field(default_factory=list)
    write: list[str] = field(default_factory=list)
    tcp_connect: list[int] = field(default_factory=list)
    scope_signals: bool = False
    scope_abstract_unix: bool = False
    landlock: bool = True
    seccomp: dict[str, object] | None = None


@dataclass
class ChildRun:
    results: dict[str, str]
    returncode: int
    stdout: str
    stderr: str


def run_child(
    world: World,
    attack: str,
    confinement: Confinement | None,
    *,
    setup: str = "",
    uid: int | None = NOBODY,
    names: dict[str, object] | None = None,
) -> ChildRun:
    """Run ``attack`` in a fresh interpreter: setup as root, drop to ``uid``, confine, attack."""
    landlock_config = None
    seccomp_config = None
    if confinement is not None:
        if confinement.landlock:
            landlock_config = {
                "read": [str(world.ro), "/usr/bin", "/bin"] + confinement.read,
                "write": [str(world.rw)] + confinement.write,
                "tcp_connect": confinement.tcp_connect,
                "scope_signals": confinement.scope_signals,
                "scope_abstract_unix": confinement.scope_abstract_unix,
            }
        seccomp_config = confinement.seccomp
    config = {
        "landlock_module": str(LANDLOCK_MODULE),
        # /proc whole: these children have the host's (no namespaces), as the runner's did
        "python_read_set": [*host_reads.python_read_set(), "/proc"],
        "python_write_set": host_reads.python_write_set(),
        "seccomp_module": str(SECCOMP_MODULE),
        "names": {**world.names(), **(names or {})},
        "setup": setup,
        "attack": attack,
        "uid": uid,
        "landlock": landlock_config,
        "seccomp": seccomp_config,
    }
    completed = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, json.dumps(config)],
        cwd=world.rw,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = completed.stdout.strip().splitlines()
    results = json.loads(lines[-1]) if completed.returncode == 0 and lines else {}
    return ChildRun(results, completed.returncode, completed.stdout, completed.stderr)


Expected = dict[str, "str | set[str]"]


def assert_outcomes(run: ChildRun, expected: Expected) -> None:
    assert run.returncode == 0, run.stderr
    for key, want in expected.items():
        got = run.results.get(key)
        allowed = want if isinstance(want, set) else {want}
        assert got in allowed, f"{key}: got {got!r}, expected {want!r}; all: {run.results}"


def attack_both_ways(
    make_world: WorldFactory,
    attack: str,
    confinement: Confinement,
    confined: Expected,
    control: Expected | None = None,
    *,
    setup: str = "",
) -> tuple[World, ChildRun]:
    """The control run (no confinement) must succeed where said; the confined run must fail as
    said and change nothing outside the writable root."""
    control_world = make_world()
    control_run = run_child(control_world, attack, None, setup=setup)
    assert_outcomes(control_run, control if control is not None else dict.fromkeys(confined, "ok"))

    world = make_world()
    before = world.snapshot()
    run = run_child(world, attack, confinement, setup=setup)
    assert_outcomes(run, confined)
    assert world.snapshot() == before, "something outside the writable root changed"
    assert SECRET_TEXT not in run.stdout + run.stderr
    return world, run


# -- Landlock: filesystem -----------------------------------------------------------------------

READ_OUTSIDE = r'''
results["open"] = attempt(lambda: read(SECRET))
results["os.open"] = attempt(lambda: os.close(os.open(SECRET, os.O_RDONLY)))
AT_FDCWD = -100
results["raw openat"] = attempt(
    lambda: os.close(raw(257 if os.uname().machine == "x86_64" else 56,
                         AT_FDCWD, ctypes.c_char_p(SECRET.encode()), os.O_RDONLY, 0)))
cat = subprocess.run(["/usr/bin/cat", SECRET], capture_output=True, text=True)
results["cat"] = "ok" if cat.returncode == 0 and cat.stdout else "denied"
results["listdir outside"] = attempt(lambda: os.listdir(OUTSIDE))
'''


@needs_landlock
def test_reads_outside_the_roots_fail_by_every_route(make_world: WorldFactory) -> None:
    confined = {key: "EACCES" for key in ("open", "os.open", "raw openat", "listdir outside")}
    attack_both_ways(make_world, READ_OUTSIDE, Confinement(), {**confined, "cat": "denied"})


@needs_landlock
def test_listing_the_filesystem_root_fails(make_world: WorldFactory) -> None:
    attack = 'results["listdir /"] = attempt(lambda: os.listdir("/"))'
    attack_both_ways(make_world, attack, Confinement(), {"listdir /": "EACCES"})


WRITE_IN_READ_ONLY = r'''
target = os.path.join(RO, "file.txt")
results["read works"] = attempt(lambda: read(target))
results["write"] = attempt(lambda: open(target, "a").write("x"))
results["open O_TRUNC"] = attempt(lambda: os.close(os.open(target, os.O_WRONLY | os.O_TRUNC)))
results["truncate"] = attempt(lambda: os.truncate(target, 0))
results["create"] = attempt(lambda: open(os.path.join(RO, "new.txt"), "x").close())
results["mkdir"] = attempt(lambda: os.mkdir(os.path.join(RO, "newdir")))
results["symlink"] = attempt(lambda: os.symlink(SECRET, os.path.join(RO, "link")))
results["mkfifo"] = attempt(lambda: os.mkfifo(os.path.join(RO, "fifo")))
results["rmdir"] = attempt(lambda: os.rmdir(os.path.join(RO, "sub")))
results["rename within"] = attempt(lambda: os.rename(target, os.path.join(RO, "moved.txt")))
moved = os.path.join(RO, "moved.txt")
results["unlink"] = attempt(lambda: os.unlink(moved if os.path.exists(moved) else target))
'''


@needs_landlock
def test_read_only_root_cannot_be_changed(make_world: WorldFactory) -> None:
    keys = ("write", "open O_TRUNC", "truncate", "create", "mkdir", "symlink", "mkfifo",
            "rename within", "rmdir", "unlink")
    confined: Expected = {**dict.fromkeys(keys, "EACCES"), "read works": "ok"}
    attack_both_ways(make_world, WRITE_IN_READ_ONLY, Confinement(), confined)


RENAME_AND_LINK = r'''
results["link outside into rw"] = attempt(
    lambda: os.link(os.path.join(OUTSIDE, "nobody_owned.txt"), os.path.join(RW, "hardlink")))
results["link ro into rw"] = attempt(
    lambda: os.link(os.path.join(RO, "file.txt"), os.path.join(RW, "hardlink2")))
results["rename out of rw"] = attempt(
    lambda: os.rename(os.path.join(RW, "own.txt"), os.path.join(OUTSIDE, "dropbox", "own.txt")))
results["rename ro into rw"] = attempt(
    lambda: os.rename(os.path.join(RO, "file.txt"), os.path.join(RW, "stolen.txt")))
results["write via planted dir"] = attempt(
    lambda: open(os.path.join(RW, "planted_dir", "dropped.txt"), "w").close())
'''


@needs_landlock
def test_renames_and_links_cannot_cross_the_writable_root(make_world: WorldFactory) -> None:
    denied = {"EACCES", "EXDEV"}
    keys = ("rename out of rw", "rename ro into rw", "link outside into rw", "link ro into rw",
            "write via planted dir")
    confined = dict.fromkeys(keys, denied)
    world, _ = attack_both_ways(make_world, RENAME_AND_LINK, Confinement(), confined)
    assert sorted(os.listdir(world.rw)) == ["own.txt", "planted_dir", "planted_file"]


PATH_TRICKS = r'''
results["/proc/self/root"] = attempt(lambda: read("/proc/self/root" + SECRET))
results["/proc/self/cwd/.."] = attempt(lambda: read("/proc/self/cwd/../outside/secret.txt"))
results["rw/.."] = attempt(lambda: read(os.path.join(RW, "..", "outside", "secret.txt")))
results["ro/.."] = attempt(lambda: read(os.path.join(RO, "..", "outside", "secret.txt")))
results["relative .."] = attempt(lambda: read("../outside/secret.txt"))
results["planted symlink"] = attempt(lambda: read(os.path.join(RW, "planted_file")))
results["listdir planted dir"] = attempt(lambda: os.listdir(os.path.join(RW, "planted_dir")))
own_link = os.path.join(RW, "own_link")
os.symlink(SECRET, own_link)  # creating the link is allowed; following it is not
results["own symlink"] = attempt(lambda: read(own_link))
results["/proc/self/fd reopen"] = attempt(lambda: read(f"/proc/self/fd/{opath_fd}"))
'''
OPEN_O_PATH_BEFORE_CONFINEMENT = "opath_fd = os.open(SECRET, os.O_PATH)\n"


@needs_landlock
def test_proc_root_dotdot_symlinks_and_fd_reopen_fail(make_world: WorldFactory) -> None:
    keys = ("/proc/self/root", "/proc/self/cwd/..", "rw/..", "ro/..", "relative ..",
            "planted symlink", "listdir planted dir", "own symlink", "/proc/self/fd reopen")
    attack_both_ways(
        make_world, PATH_TRICKS, Confinement(), dict.fromkeys(keys, "EACCES"),
        setup=OPEN_O_PATH_BEFORE_CONFINEMENT,
    )


@needs_landlock
def test_writable_root_works_and_readable_descriptors_opened_before_still_read(
    make_world: WorldFactory,
) -> None:
    """The writable root is fully usable; and, as DESIGN.md says, Landlock does not revoke a
    descriptor opened before the restriction: the launcher must close inherited descriptors."""
    attack = r'''
results["create"] = attempt(lambda: open(os.path.join(RW, "new.txt"), "w").write("hi"))
results["mkdir"] = attempt(lambda: os.makedirs(os.path.join(RW, "a", "b")))
results["rename"] = attempt(
    lambda: os.rename(os.path.join(RW, "new.txt"), os.path.join(RW, "a", "b", "n.txt")))
results["truncate"] = attempt(lambda: os.truncate(os.path.join(RW, "own.txt"), 1))
results["unlink"] = attempt(lambda: os.unlink(os.path.join(RW, "own.txt")))
results["devnull"] = attempt(
    lambda: subprocess.run(["/usr/bin/true"], stdout=subprocess.DEVNULL, check=True))
results["inherited fd"] = "read" if os.read(inherited_fd, 100).startswith(b"TOP-SECRET") else "no"
'''
    world = make_world()
    setup = "inherited_fd = os.open(SECRET, os.O_RDONLY)\n"
    run = run_child(world, attack, Confinement(), setup=setup)
    keys = ("create", "mkdir", "rename", "truncate", "unlink", "devnull")
    assert_outcomes(run, {**dict.fromkeys(keys, "ok"), "inherited fd": "read"})
    assert (world.rw / "a" / "b" / "n.txt").read_text() == "hi"


@needs_landlock
def test_file_rules_use_only_file_rights_and_missing_paths_are_skipped(
    make_world: WorldFactory,
) -> None:
    world = make_world()
    writable_file = world.outside / "dropbox" / "writable.txt"
    writable_file.write_text("")
    _own(writable_file, 0o666)
    attack = r'''
results["write the file"] = attempt(lambda: open(WRITABLE_FILE, "w").write("ok"))
results["create a sibling"] = attempt(lambda: open(WRITABLE_FILE + ".new", "w").close())
results["read the dir"] = attempt(lambda: os.listdir(os.path.dirname(WRITABLE_FILE)))
probe = landlock.LandlockRuleset()
probe.allow_read("/definitely/missing").allow_write(WRITABLE_FILE)
results["skipped"] = ",".join(probe.build())
probe.close()
'''
    confinement = Confinement(write=[str(writable_file)], read=["/definitely/missing"])
    run = run_child(world, attack, confinement, names={"WRITABLE_FILE": str(writable_file)})
    assert_outcomes(run, {"write the file": "ok", "create a sibling": "EACCES",
                          "read the dir": "EACCES", "skipped": "/definitely/missing"})
    assert writable_file.read_text() == "ok"


# -- Landlock: network and scoping --------------------------------------------------------------

@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener
    listener.close()


TCP_ATTACK = r'''
def connect():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
        client.settimeout(5)
        client.connect(("127.0.0.1", PORT))
def bind():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
results["connect"] = attempt(connect)
results["bind"] = attempt(bind)
'''


@needs_net
def test_tcp_connect_denied_unless_the_port_is_allowed(
    make_world: WorldFactory, tcp_listener: socket.socket
) -> None:
    port = tcp_listener.getsockname()[1]
    names = {"PORT": port}
    control = run_child(make_world(), TCP_ATTACK, None, names=names)
    assert_outcomes(control, {"connect": "ok", "bind": "ok"})
    denied = run_child(make_world(), TCP_ATTACK, Confinement(), names=names)
    assert_outcomes(denied, {"connect": "EACCES", "bind": "EACCES"})
    allowed = run_child(make_world(), TCP_ATTACK, Confinement(tcp_connect=[port]), names=names)
    assert_outcomes(allowed, {"connect": "ok", "bind": "EACCES"})


@needs_scoping
def test_abstract_unix_socket_outside_the_domain_is_unreachable(
    make_world: WorldFactory,
) -> None:
    name = f"\0skx-test-{uuid.uuid4().hex}"
    attack = r'''
def connect():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(ABSTRACT_NAME)
results["connect"] = attempt(connect)
'''
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(name)
        listener.listen(8)
        names = {"ABSTRACT_NAME": name}
        assert_outcomes(run_child(make_world(), attack, None, names=names), {"connect": "ok"})
        unscoped = run_child(make_world(), attack, Confinement(), names=names)
        # Scoping, not the file rules, is what stops it:
        assert_outcomes(unscoped, {"connect": "ok"})
        scoped = run_child(make_world(), attack, Confinement(scope_abstract_unix=True), names=names)
        assert_outcomes(scoped, {"connect": "EPERM"})


# The child forks before confining: the fork parent plays the launcher (same uid, outside the
# domain) and waits; the fork child goes on to confine itself and attack once the parent has
# its uid (else the control's signal is refused by uid, not scoping: seen under load).
LAUNCHER_PARENT = r'''
dropped_r, dropped_w = os.pipe()
sandboxed = os.fork()
if sandboxed:
    drop_privileges()
    os.write(dropped_w, b"x")
    _, status = os.waitpid(sandboxed, 0)
    os._exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 1)
os.close(dropped_w)
if os.read(dropped_r, 1) != b"x":
    os._exit(3)
os.close(dropped_r)
'''
SIGNAL_ATTACK = r'''
results["signal launcher"] = attempt(lambda: os.kill(os.getppid(), 0))
results["kill victim"] = attempt(lambda: os.kill(VICTIM, signal.SIGTERM))
'''


@needs_scoping
def test_signals_to_processes_outside_the_domain_are_denied(make_world: WorldFactory) -> None:
    victims = []
    try:
        for _ in range(2):
            victims.append(subprocess.Popen(["/bin/sleep", "60"], user=NOBODY, group=NOBODY,
                                            extra_groups=[]))
        control = run_child(make_world(), SIGNAL_ATTACK, None, setup=LAUNCHER_PARENT,
                            names={"VICTIM": victims[0].pid})
        assert_outcomes(control, {"signal launcher": "ok", "kill victim": "ok"})
        assert victims[0].wait(timeout=10) == -signal.SIGTERM

        confined = run_child(make_world(), SIGNAL_ATTACK, Confinement(scope_signals=True),
                             setup=LAUNCHER_PARENT, names={"VICTIM": victims[1].pid})
        assert_outcomes(confined, {"signal launcher": "EPERM", "kill victim": "EPERM"})
        assert victims[1].poll() is None, "the victim outside the domain was killed"
    finally:
        for victim in victims:
            victim.kill()
            victim.wait()


# -- seccomp --------------------------------------------------------------------------------------

SECCOMP_ONLY = Confinement(landlock=False, seccomp={})

PTRACE_ATTACK = r'''
PTRACE_ATTACH, PR_SET_DUMPABLE = 16, 4
libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # setuid made us non-dumpable; the attacker undoes it
sleeper = os.fork()
if sleeper == 0:
    time.sleep(60)
    os._exit(0)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def attach():
    if libc.ptrace(PTRACE_ATTACH, sleeper, None, None) == -1:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
results["ptrace attach child"] = attempt(attach)
os.kill(sleeper, signal.SIGKILL)
while True:  # a traced child reports its stop first; reap until it is gone
    _, status = os.waitpid(sleeper, 0)
    if os.WIFEXITED(status) or os.WIFSIGNALED(status):
        break

class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
source, target = ctypes.create_string_buffer(b"memory", 6), ctypes.create_string_buffer(6)
local, remote = IoVec(ctypes.addressof(target), 6), IoVec(ctypes.addressof(source), 6)
results["process_vm_readv"] = attempt(
    lambda: raw(310, os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
'''


@needs_seccomp
def test_ptrace_and_process_vm_are_denied(make_world: WorldFactory) -> None:
    if seccomp.supported_arch() != "x86_64":
        pytest.skip("raw syscall numbers in the attack are x86_64")
    attack_both_ways(make_world, PTRACE_ATTACK, SECCOMP_ONLY,
                     {"ptrace attach child": "EPERM", "process_vm_readv": "EPERM"})


SOCKET_ATTACK = r'''
def make(*args):
    socket.socket(*args).close()
results["unix stream"] = attempt(lambda: make(socket.AF_UNIX, socket.SOCK_STREAM))
results["unix dgram"] = attempt(lambda: make(socket.AF_UNIX, socket.SOCK_DGRAM))
results["socketpair"] = attempt(lambda: [s.close() for s in socket.socketpair()])
results["inet udp"] = attempt(lambda: make(socket.AF_INET, socket.SOCK_DGRAM))
results["inet tcp"] = attempt(
    lambda: make(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC))
results["inet6 tcp"] = attempt(lambda: make(socket.AF_INET6, socket.SOCK_STREAM))
results["netlink"] = attempt(lambda: make(socket.AF_NETLINK, socket.SOCK_RAW, 0))
'''


@needs_seccomp
def test_socket_families_outside_the_allowlist_are_denied(make_world: WorldFactory) -> None:
    keys = ("unix stream", "unix dgram", "socketpair", "inet udp", "inet tcp", "inet6 tcp",
            "netlink")
    attack_both_ways(make_world, SOCKET_ATTACK, SECCOMP_ONLY, dict.fromkeys(keys, "EAFNOSUPPORT"))

    inet_only = Confinement(landlock=False, seccomp={"allow_socket_families": [socket.AF_INET]})
    run = run_child(make_world(), SOCKET_ATTACK, inet_only)
    assert_outcomes(run, {"unix stream": "EAFNOSUPPORT", "socketpair": "EAFNOSUPPORT",
                          "inet tcp": "ok", "inet udp": "EPERM", "inet6 tcp": "EAFNOSUPPORT"})


@needs_seccomp
@needs_landlock
def test_pathname_unix_socket_needs_seccomp_landlock_alone_lets_it_through(
    make_world: WorldFactory,
) -> None:
    """docker.sock / ssh-agent: connect() to a pathname unix socket is not a Landlock access."""
    attack = r'''
def connect():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(AGENT)
results["connect"] = attempt(connect)
'''
    world = make_world()
    agent = world.outside / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(agent))
        os.chmod(agent, 0o777)
        listener.listen(8)
        names = {"AGENT": str(agent)}
        landlock_only = run_child(world, attack, Confinement(), names=names)
        assert_outcomes(landlock_only, {"connect": "ok"})
        both = Confinement(seccomp={})
        assert_outcomes(run_child(world, attack, both, names=names), {"connect": "EAFNOSUPPORT"})


KERNEL_SURFACE_ATTACK = r'''
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
params = ctypes.create_string_buffer(120)
def io_uring():
    os.close(raw(425, 4, params))
results["io_uring_setup"] = attempt(io_uring)
def clone_new_user():
    pid = raw(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
results["clone(CLONE_NEWUSER)"] = attempt(clone_new_user)
results["unshare user"] = attempt(lambda: raw(272, CLONE_NEWUSER))  # last: it moves us
results["bpf"] = attempt(lambda: raw(321, 0, 0, 0))
results["perf_event_open"] = attempt(lambda: raw(298, 0, 0, -1, -1, 0))
results["keyctl"] = attempt(lambda: raw(250, 0, -1, 0))
results["x32 getpid"] = attempt(lambda: raw(0x40000000 | 39))
'''


@needs_seccomp
def test_kernel_attack_surface_and_namespaces_are_denied(make_world: WorldFactory) -> None:
    if seccomp.supported_arch() != "x86_64":
        pytest.skip("raw syscall numbers in the attack are x86_64")
    confined = dict.fromkeys(
        ("io_uring_setup", "unshare user", "clone(CLONE_NEWUSER)", "bpf", "perf_event_open",
         "keyctl", "x32 getpid"), "EPERM")
    control: Expected = {"io_uring_setup": "ok", "unshare user": "ok", "clone(CLONE_NEWUSER)": "ok",
                         "x32 getpid": {"ENOSYS", "ok"}}  # x32 is usually compiled out
    attack_both_ways(make_world, KERNEL_SURFACE_ATTACK, SECCOMP_ONLY, confined, control)


CLONE3_ATTACK = r'''
results["clone3"] = attempt(lambda: raw(435, 0, 0))
def fork_and_wait():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 7
results["fork"] = attempt(fork_and_wait)
ran = []
worker = threading.Thread(target=lambda: ran.append(1))
worker.start(); worker.join()
results["thread"] = "ok" if ran else "no"
echo = subprocess.run(["/bin/echo", "hi"], capture_output=True)
results["subprocess"] = "ok" if echo.stdout == b"hi\n" else "no"
'''


@needs_seccomp
def test_clone3_gets_enosys_and_fork_threads_subprocess_still_work(
    make_world: WorldFactory,
) -> None:
    if seccomp.supported_arch() != "x86_64":
        pytest.skip("raw syscall numbers in the attack are x86_64")
    attack_both_ways(
        make_world, CLONE3_ATTACK, SECCOMP_ONLY,
        {"clone3": "ENOSYS", "fork": "ok", "thread": "ok", "subprocess": "ok"},
        {"clone3": {"EINVAL", "EFAULT"}, "fork": "ok", "thread": "ok", "subprocess": "ok"},
    )


@needs_seccomp
def test_a_foreign_architecture_is_killed_at_its_first_syscall(make_world: WorldFactory) -> None:
    foreign = "aarch64" if seccomp.supported_arch() == "x86_64" else "x86_64"
    run = run_child(make_world(), "", Confinement(landlock=False, seccomp={"arch": foreign}))
    assert run.returncode == -signal.SIGSYS


# -- a real Python child under python_read_set() -------------------------------------------------

PYTHON_CHILD = r'''
program = (
    "import json, os, sys\n"
    "print(1)\n"
    "with open(os.path.join(sys.argv[1], 'out.json'), 'w') as f: json.dump({'ok': True}, f)\n"
    "try:\n    open(sys.argv[2]).read(); print('LEAK')\n"
    "except PermissionError:\n    print('denied')\n"
)
child = subprocess.run([sys.executable, "-c", program, RW, SECRET], capture_output=True, text=True)
results["returncode"] = str(child.returncode)
results["stdout"] = child.stdout
results["stderr"] = child.stderr
'''


@needs_landlock
@pytest.mark.parametrize("uid", [None, NOBODY], ids=["root", "nobody"])
def test_python_runs_with_python_read_set_and_a_writable_tmp(
    make_world: WorldFactory, uid: int | None
) -> None:
    if uid is not None:
        try:
            subprocess.run([sys.executable, "-I", "-c", "pass"], user=uid, group=uid,
                           extra_groups=[], capture_output=True, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"uid {uid} cannot run {sys.executable} here: {exc}")
    world = make_world()
    run = run_child(world, PYTHON_CHILD, Confinement(), uid=uid)
    assert run.returncode == 0, run.stderr
    assert run.results["returncode"] == "0", run.results["stderr"]
    assert run.results["stdout"] == "1\ndenied\n"
    assert json.loads((world.rw / "out.json").read_text()) == {"ok": True}


# -- in-process checks that never confine pytest itself ------------------------------------------

def test_ruleset_masks_follow_the_abi() -> None:
    if ABI < 6:
        pytest.skip("needs a kernel with ABI 6 to pin lower ABIs")
    masks = {abi: landlock.LandlockRuleset(abi=abi) for abi in range(1, 7)}
    assert masks[1].handled_access_fs == (1 << 13) - 1
    assert masks[2].handled_access_fs & landlock.ACCESS_FS_REFER
    assert not masks[2].handled_access_fs & landlock.ACCESS_FS_TRUNCATE
    assert masks[3].handled_access_fs & landlock.ACCESS_FS_TRUNCATE
    assert masks[3].handled_access_net == 0 and "tcp" in masks[3].unenforced()
    assert masks[4].handled_access_net == 3
    assert not masks[4].handled_access_fs & landlock.ACCESS_FS_IOCTL_DEV
    assert masks[5].handled_access_fs & landlock.ACCESS_FS_IOCTL_DEV
    assert masks[5].scope_signals().scoped == 0 and masks[5].unenforced() == ["scope_signals"]
    assert masks[6].scope_signals().scope_abstract_unix().scoped == 3
    assert masks[6].unenforced() == []


def test_python_read_set_keeps_secrets_out() -> None:
    read_set = host_reads.python_read_set()
    assert sys.base_prefix in read_set or any(sys.base_prefix.startswith(p + "/") for p in read_set)
    # /proc is the child's to rule (whole where private, its own entries where not)
    assert "/proc" not in read_set and "/dev/urandom" in read_set and "/etc" not in read_set
    for secret in ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh", "/etc/ssl/private"):
        assert not any(secret == p or secret.startswith(p + "/") for p in read_set), secret
    assert "/etc/passwd" in read_set and "/etc/ld.so.cache" in read_set


def test_restricting_a_multi_threaded_process_is_refused() -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="thread"):
            landlock.LandlockRuleset().restrict_self()
        with pytest.raises(RuntimeError, match="thread"):
            seccomp.SeccompFilter().install()
    finally:
        release.set()
        worker.join()


def test_seccomp_program_is_valid_bpf() -> None:
    families = {socket.AF_INET, socket.AF_UNIX}
    program = seccomp.SeccompFilter(allow_socket_families=families).instructions()
    assert program[-1][0] == seccomp.BPF_RET_K and len(program) < 256
    with pytest.raises(seccomp.SeccompUnavailableError, match="supported"):
        seccomp.SeccompFilter(arch="riscv64")
    returns = {insn[3] for insn in program if insn[0] == seccomp.BPF_RET_K}
    assert seccomp.SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT in returns
