"""The fork server: one single-threaded process per `SandboxManager`, started by exec.

Landlock and seccomp confine only the calling thread, and a Jupyter kernel has many threads,
so no confinement ever happens in the kernel's process. The launcher is exec'd with a scrubbed
environment (a child's `/proc/self/environ` shows the environment its ancestors were exec'd
with), forks a confined child per request (`child.spawn`), hands the manager a pidfd for it,
reaps it as a child subreaper and reports its exit status and rusage.

Protocol over a SOCK_SEQPACKET pair, one JSON object per message, descriptors in SCM_RIGHTS:
  manager -> launcher  {"op": "spawn", "id": N, "plan": {...}, "fds": [names]} + fds
  launcher -> manager  {"op": "spawned", "id": N, "pid": P} + [pidfd]
                       {"op": "failed", "id": N, "error": "..."}
                       {"op": "exited", "id": N, "status": S, "cpu_seconds": C, "maxrss_kb": R}
End of file on the socket (the manager closed it or died) kills every live child and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from ..policy.errors import SandboxError
from .kernel_calls import prctl
from .child import ChildPlan

PR_SET_CHILD_SUBREAPER = 36
MAX_MESSAGE = 4 * 1024 * 1024
MAX_FDS = 8
# The launcher's whole environment: nothing of the kernel's (API keys) may reach a fork.
LAUNCHER_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT")


def userns_usable() -> bool:
    """Whether this process may create a user namespace (refused by some AppArmor setups)."""
    from .child import CLONE_NEWUSER, unshare

    pid = os.fork()
    if pid == 0:
        try:
            unshare(CLONE_NEWUSER)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and its descriptors; (b"", []) once the other side is gone."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    except OSError:
        return b"", []
    return data, fds


# -- the launcher process ------------------------------------------------------------------------

def serve(sock: socket.socket) -> None:
    from . import cell  # noqa: F401 - loaded here once, not by every confined child
    from .child import spawn

    rulesets = RulesetCache()

    prctl(PR_SET_CHILD_SUBREAPER, 1)
    use_userns = userns_usable()
    pid_namespaces = use_userns or os.geteuid() == 0
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel's interrupt is not ours
    live: dict[int, int] = {}  # child pid -> request id

    def send(message: dict[str, Any], fds: list[int] = ()) -> None:
        try:
            socket.send_fds(sock, [json.dumps(message).encode()], list(fds))
        except OSError:
            pass

    def report_exit(pid: int, status: int, usage: Any) -> None:
        send({"op": "exited", "id": live.pop(pid), "status": os.waitstatus_to_exitcode(status),
              "cpu_seconds": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss})

    def reap() -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in live:
                report_exit(pid, status, usage)
                if not pid_namespaces:
                    _kill_orphans(set(live))

    while True:
        try:
            ready, _, _ = select.select([sock, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
            reap()
        if sock not in ready:
            continue
        data, fds = receive(sock)
        if not data:
            break
        request: dict[str, Any] = {}
        pid, pidfd, error = 0, -1, None
        try:
            request = json.loads(data)
            names = request["fds"]
            if len(names) != len(fds):
                raise ValueError("descriptor count does not match")
            plan = ChildPlan.from_json(request["plan"])
            pid, error = spawn(plan, dict(zip(names, fds)), use_userns=use_userns,
                               rules=rulesets.get(plan))
            if pid and not error:
                pidfd = os.pidfd_open(pid)
        except Exception as exc:  # noqa: BLE001 - a bad request fails alone
            error = f"{type(exc).__name__}: {exc}"
        finally:
            for fd in fds:
                os.close(fd)
        if error or not pid:
            if pid:  # started but unusable: end it now, and reap it here, not in reap()
                _kill_quietly(pid)
                os.waitpid(pid, 0)
            send({"op": "failed", "id": request.get("id") if isinstance(request, dict) else None,
                  "error": error or "no child started"})
            continue
        live[pid] = request["id"]
        send({"op": "spawned", "id": request["id"], "pid": pid,
              "pid_namespace": use_userns or os.geteuid() == 0}, [pidfd])
        os.close(pidfd)
    for pid in list(live):
        _kill_quietly(pid)
    _kill_orphans(set())  # and whatever was reparented to us; then reap them all
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break


class RulesetCache:
    """Prepared Landlock rules by the paths they grant: opening ~250 paths costs about 1.5 ms,
    adding an opened one to a child's ruleset a syscall. Entries expire after `ttl` seconds,
    because an opened path keeps the inode it named then."""

    def __init__(self, ttl: float = 30.0, size: int = 16) -> None:
        self.ttl, self.size = ttl, size
        self._entries: dict[str, tuple[float, Any]] = {}

    def get(self, plan: ChildPlan) -> Any:
        from .child import prepare_rules

        key = json.dumps([plan.read_paths, plan.write_paths, plan.proxy_port])
        now = time.monotonic()
        entry = self._entries.pop(key, None)
        if entry is not None and now - entry[0] < self.ttl:
            self._entries[key] = entry
            return entry[1]
        if entry is not None and entry[1] is not None:
            entry[1].release()
        while len(self._entries) >= self.size:  # dicts keep order: the first is the oldest
            _, oldest = self._entries.pop(next(iter(self._entries)))
            if oldest is not None:
                oldest.release()
        ruleset = prepare_rules(plan)
        self._entries[key] = (now, ruleset)
        return ruleset


def _kill_orphans(keep: set[int]) -> None:
    """Without PID namespaces, what a finished child left running is reparented to us (the
    subreaper), out of reach of any tree sweep: kill every child of ours but the live ones.
    (An orphan of a sandbox still running goes too; leaking it past its sandbox is worse.)"""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                fields = stat_file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[1].decode() == me:
            _kill_quietly(int(entry))


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# The launcher loads only the modules it runs: the packages above it become bare namespaces,
# so their `__init__`s (pydantic, yaml, the file layer) stay out. Every fork copies the
# launcher's page tables, and a small launcher makes a fork about four times cheaper.
BOOTSTRAP = """
import sys, types
root = sys.argv[1]
for name, folder in (("sandbox_kernel_ext", root), ("sandbox_kernel_ext.policy", root + "/policy")):
    package = types.ModuleType(name)
    package.__path__ = [folder]
    sys.modules[name] = package
del sys.argv[1]
from sandbox_kernel_ext.runner.launcher import main
main()
"""
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    fd = int(sys.argv[1])
    sock = socket.socket(fileno=fd)
    # Nothing of ours belongs on stdout; a fork's buffered copy of it would be written twice.
    serve(sock)


# -- the manager's side --------------------------------------------------------------------------

class SpawnedChild:
    """A running confined child as the manager sees it: pid, pidfd, and its exit when known."""

    def __init__(self) -> None:
        self.pid = 0
        self.pidfd = -1
        self.pid_namespace = True
        self.error: str | None = None
        self.status: int | None = None
        self.cpu_seconds = 0.0
        self.maxrss_kb = 0
        self.started = threading.Event()
        self.exited = threading.Event()
        self.kill_requested = False

    def kill(self) -> None:
        """SIGKILL PID 1 of the child's namespace: the kernel then kills all of it. Asked
        before the launcher's answer arrives, the kill happens as soon as it does."""
        self.kill_requested = True
        if self.pidfd >= 0 and not self.exited.is_set() and not self.pid_namespace:
            _sweep_descendants(self.pid)  # no namespace to take them with it
        if self.pidfd >= 0 and not self.exited.is_set():
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass

    def wait_started(self) -> None:
        """Block until the child runs; raise SandboxError with the reason it could not."""
        self.started.wait()
        if self.error is not None:
            raise SandboxError(f"the sandbox could not start: {self.error}")

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def _sweep_descendants(pid: int) -> None:
    """SIGKILL every descendant of `pid`, repeatedly while new ones appear (without a PID
    namespace this is the only way; `setsid` children stay descendants until reparented)."""
    import psutil

    for _ in range(5):
        try:
            found = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return
        if not found:
            return
        for process in found:
            try:
                process.kill()
            except psutil.Error:
                pass


class LauncherClient:
    """Starts the launcher on first use and talks to it; thread-safe; restarts it if it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._pending: dict[int, SpawnedChild] = {}
        self._next_id = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {name: os.environ[name] for name in LAUNCHER_ENV_NAMES if name in os.environ}
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOTSTRAP, _PACKAGE_DIR, str(child.fileno())],
                pass_fds=[child.fileno()], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, cwd="/", start_new_session=True,
            )
        finally:
            child.close()
        self._sock = parent
        self._reader = threading.Thread(
            target=self._read_loop, args=(parent,), name="sandbox-launcher-reader", daemon=True
        )
        self._reader.start()

    def spawn(self, plan: ChildPlan, fds: dict[str, int]) -> SpawnedChild:
        """Ask for a child and return at once; `wait_started()` on the result waits for it
        (so the caller can record it first, and a kill in between is not lost)."""
        child = SpawnedChild()
        with self._lock:
            if self._sock is None or self._process is None or self._process.poll() is not None:
                self._cleanup_locked()
                self._start()
            self._next_id += 1
            request_id = self._next_id
            self._pending[request_id] = child
            message = {"op": "spawn", "id": request_id, "plan": plan.to_json(), "fds": list(fds)}
            assert self._sock is not None
            try:
                socket.send_fds(self._sock, [json.dumps(message).encode()], list(fds.values()))
            except OSError as exc:
                self._pending.pop(request_id, None)
                raise SandboxError(f"the sandbox launcher is gone: {exc}") from None
        return child

    def _read_loop(self, sock: socket.socket) -> None:
        while True:
            data, fds = receive(sock)
            if not data:
                break
            message = json.loads(data)
            with self._lock:
                child = self._pending.get(message.get("id"))
            if child is None:
                for fd in fds:
                    os.close(fd)
                continue
            op = message["op"]
            if op == "spawned":
                child.pid, child.pidfd = message["pid"], fds[0]
                child.pid_namespace = message["pid_namespace"]
                if child.kill_requested:
                    child.kill()
                child.started.set()
            elif op == "failed":
                child.error = message["error"]
                self._finish(message["id"], child)
            elif op == "exited":
                child.status = message["status"]
                child.cpu_seconds = message["cpu_seconds"]
                child.maxrss_kb = message["maxrss_kb"]
                self._finish(message["id"], child)
        with self._lock:
            orphans = list(self._pending.items())
        for request_id, child in orphans:
            child.error = child.error or "the sandbox launcher exited"
            self._finish(request_id, child)

    def _finish(self, request_id: int, child: SpawnedChild) -> None:
        with self._lock:
            self._pending.pop(request_id, None)
        child.started.set()
        child.exited.set()

    def _cleanup_locked(self) -> None:
        if self._sock is not None:
            try:  # wakes our reader thread and gives the launcher its end of file
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._process is not None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def close(self) -> None:
        """Closing the socket makes the launcher kill its live children and exit."""
        with self._lock:
            self._cleanup_locked()
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None


if __name__ == "__main__":
    main()

