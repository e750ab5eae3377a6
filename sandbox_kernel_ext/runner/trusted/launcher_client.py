"""The trusted side's handle on the launcher: starts it by exec, asks it for children, and
follows each child from its pidfd to its exit (`SpawnedChild`).

The launcher itself (`launcher/server.py`) runs in a process of its own; this module only
names it in the command line it execs, so nothing of the launcher loads in the Jupyter kernel.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

from ...policy.errors import SandboxError
from ..linux.cpu_clock import read_seconds
from .isolation import seen_uid
from ..wire import receive_message, send_message

__all__ = ["LauncherClient", "SpawnedChild", "LAUNCHER_ENV_NAMES"]

# The launcher's whole environment: nothing of the Jupyter kernel's (API keys) may reach a fork.
LAUNCHER_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT")
START_TIMEOUT = 60.0  # for the launcher to say a child runs (it forks at once)

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
from sandbox_kernel_ext.runner.launcher.server import main
main()
"""
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SpawnedChild:
    """A running confined child as the manager sees it: pid, pidfd, and its exit when known."""

    def __init__(self) -> None:
        self.pid = 0
        self.pidfd = -1
        self.cpu_clock = -1  # the tree's perf task clock (linux/cpu_clock.py), if the host allows
        self.pid_namespace = True
        self.error: str | None = None
        self.status: int | None = None
        self.cpu_seconds = 0.0
        self.maxrss_kb = 0
        self.started = threading.Event()
        self.exited = threading.Event()
        self.kill_requested = False

    def kill(self) -> None:
        """SIGKILL PID 1 of the child's namespace: Linux then kills all of it. Asked
        before the launcher's answer arrives, the kill happens as soon as it does."""
        self.kill_requested = True
        if self.pidfd >= 0 and not self.exited.is_set() and not self.pid_namespace:
            # No namespace to take them with it: the child is stopped first, so it cannot see
            # its children die (a wait() returning) and finish its cell while they are swept.
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGSTOP)
            except (ProcessLookupError, OSError):
                pass
            _sweep_descendants(self.pid)
        if self.pidfd >= 0 and not self.exited.is_set():
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass

    def send_signal(self, signum: int) -> bool:
        """Send `signum` to the child (PID 1 of its namespace) while it runs; False if gone."""
        if self.pidfd < 0 or self.exited.is_set():
            return False
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except (ProcessLookupError, OSError):
            return False
        return True

    def wait_started(self, timeout: float = START_TIMEOUT) -> None:
        """Block until the child runs; raise SandboxError with the reason it could not, or
        when the launcher has not answered within `timeout` seconds (the child is killed
        if it appears later)."""
        if not self.started.wait(timeout):
            self.kill()
            raise SandboxError(f"the sandbox did not start within {timeout:g} s: the launcher "
                               "did not answer (the host may be out of memory or processes)")
        if self.error is not None:
            raise SandboxError(f"the sandbox could not start: {self.error}")

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        if self.cpu_clock >= 0:  # its last reading holds every process the tree ever had
            self.cpu_seconds = max(self.cpu_seconds, read_seconds(self.cpu_clock) or 0.0)
            os.close(self.cpu_clock)
            self.cpu_clock = -1


class _HomeAnswer:
    """The launcher's answer to `LauncherClient.sized_home`: the tmpfs's mount, or why not."""

    def __init__(self) -> None:
        self.mount = -1
        self.error: str | None = None
        self.started = threading.Event()
        self.exited = threading.Event()


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

    def __init__(self, child_uid: int | None = None) -> None:
        self.child_uid = child_uid  # what a root launcher's children run as
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._pending: dict[int, SpawnedChild | _HomeAnswer] = {}
        self._next_id = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {name: os.environ[name] for name in LAUNCHER_ENV_NAMES if name in os.environ}
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOTSTRAP, _PACKAGE_DIR, str(child.fileno()),
                 "" if self.child_uid is None
                 else f"{self.child_uid}:{seen_uid(self.child_uid)}"],
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

    def spawn(self, fds: dict[str, int], key: str | None = None) -> SpawnedChild:
        """Ask for a child and return at once; `wait_started()` on the result waits for it
        (so the caller can record it first, and a kill in between is not lost). `fds` are
        the child's descriptors by name, its plan's memfd ("plan") among them; `key` names
        a view prepared for it (`prepare`), if any."""
        child = SpawnedChild()
        self._request(child, {"op": "spawn", "fds": list(fds), "key": key}, list(fds.values()))
        return child

    def _request(self, answer: SpawnedChild | _HomeAnswer, message: dict[str, object],
                 fds: list[int] = ()) -> int:
        """Send `message` under a new id (starting the launcher if it is not running), its
        answer to be filled in by the reader into `answer`; the id."""
        with self._lock:
            if self._sock is None or self._process is None or self._process.poll() is not None:
                self._cleanup_locked()
                self._start()
            self._next_id += 1
            request_id = self._next_id
            self._pending[request_id] = answer
            assert self._sock is not None
            try:
                send_message(self._sock, {**message, "id": request_id}, fds)
            except OSError as exc:
                self._pending.pop(request_id, None)
                raise SandboxError(f"the sandbox launcher is gone: {exc}") from None
        return request_id

    def sized_home(self, size: int, inodes: int) -> int:
        """A new tmpfs of `size` bytes and `inodes` files for a sandbox's home
        (`launcher/sized_home.py`), as a detached mount the caller owns; SandboxError saying
        why where it cannot be made."""
        reply = _HomeAnswer()
        request_id = self._request(reply, {"op": "home", "size": size, "inodes": inodes})
        answered = False
        try:
            answered = reply.exited.wait(timeout=START_TIMEOUT)
        finally:  # an interrupt included
            with self._lock:
                self._pending.pop(request_id, None)  # an answer after this is closed unread
            if not answered and reply.mount >= 0:  # answered just as we stopped waiting
                os.close(reply.mount)
                reply.mount = -1
        if not answered:
            raise SandboxError("the sandbox launcher did not answer for the home's tmpfs")
        if reply.mount < 0:
            raise SandboxError(reply.error or "the sandbox launcher made no tmpfs")
        return reply.mount

    def prepare(self, key: str, fds: dict[str, int]) -> None:
        """Have a spare make a view ahead (the plan's memfd and trees in `fds`), for a
        spawn with the same `key`; nothing is started for it if the launcher is not running.
        The caller still closes `fds`."""
        self._send_if_running({"op": "prepare", "key": key, "fds": list(fds)}, list(fds.values()))

    def discard(self, key: str) -> None:
        """End the spare prepared under `key` (its sandbox is gone, or its view is stale)."""
        self._send_if_running({"op": "discard", "key": key})

    def _send_if_running(self, message: dict[str, object], fds: list[int] = ()) -> None:
        with self._lock:
            if self._sock is None or self._process is None or self._process.poll() is not None:
                return
            try:
                send_message(self._sock, message, fds)
            except OSError:
                pass  # gone: the next spawn starts it again

    def _read_loop(self, sock: socket.socket) -> None:
        while True:
            data, fds = receive_message(sock)
            if not data:
                break
            for fd in fds:  # ours alone: no program the kernel starts may inherit one
                os.set_inheritable(fd, False)
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
                child.cpu_clock = fds[1] if len(fds) > 1 else -1
                for extra in fds[2:]:
                    os.close(extra)
                child.pid_namespace = message["pid_namespace"]
                if child.kill_requested:
                    child.kill()
                child.started.set()
            elif op == "failed":
                child.error = message["error"]
                self._finish(message["id"], child)
            elif op == "home" and isinstance(child, _HomeAnswer):
                child.mount = fds.pop(0) if fds else -1
                for extra in fds:
                    os.close(extra)
                child.error = message.get("error")
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
