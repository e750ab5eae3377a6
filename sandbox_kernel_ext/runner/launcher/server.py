"""The fork server: one single-threaded process per `SandboxManager`, started by exec.

Landlock and seccomp confine only the calling thread, and a Jupyter kernel has many threads,
so no confinement ever happens in the Jupyter kernel's process. The launcher is exec'd with a scrubbed
environment (a child's `/proc/self/environ` shows the environment its ancestors were exec'd
with), forks a confined child per request (`child/bootstrap.py` runs in the forks), hands the
trusted side a pidfd for it, reaps it as a child subreaper and reports its exit status and
rusage. Its client, on the trusted side, is `trusted/launcher_client.py`.

Protocol over a SOCK_SEQPACKET pair (`wire.send_message`), one JSON object per message:
  trusted -> launcher  {"op": "spawn", "id": N, "fds": [names]} + fds
                       (the plan is one of the fds, a memfd only the child reads: the
                       launcher's memory, which every later fork inherits, never holds one)
  launcher -> trusted  {"op": "spawned", "id": N, "pid": P, "pid_namespace": B}
                       + [pidfd] or [pidfd, CPU clock of the tree]
                       {"op": "failed", "id": N, "error": "..."}
                       {"op": "exited", "id": N, "status": S, "cpu_seconds": C, "maxrss_kb": R}
End of file on the socket (the trusted side closed it or died) kills every live child and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from typing import Any

from ..child.bootstrap import report, run_setup_fork
from ..linux.cpu_clock import open_tree_clock
from ..linux.namespaces import userns_usable
from ..linux.syscalls import prctl
from ..wire import read_to_end, receive_message, send_message

PR_SET_CHILD_SUBREAPER = 36


def spawn(fds: dict[str, int], *, use_userns: bool) -> tuple[int, str | None, int | None]:
    """Fork the confined child; return (its host pid, or 0, the setup error if any, and the
    tree's CPU clock, or None where perf counters are refused).

    `fds` holds "plan", "stdin", "stdout", "stderr" and for Python runs "control" and
    "payload". The fork's side is `run_setup_fork`, which reads the plan; the
    launcher reaps both forks (it is a child subreaper). The setup fork waits until the clock
    is on it, so that the clock follows every process of the tree from the first.
    """
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    setup_pid = os.fork()
    if setup_pid == 0:
        try:
            os.close(status_r)
            os.close(go_w)
            os.read(go_r, 1)
            os.close(go_r)
            run_setup_fork(fds, status_w, use_userns)
        except BaseException as exc:  # noqa: BLE001 - reported to the launcher, then exit
            report(status_w, f"error setup: {type(exc).__name__}: {exc}")
        os._exit(0)
    os.close(status_w)
    os.close(go_r)
    clock = open_tree_clock(setup_pid)
    os.write(go_w, b"g")
    os.close(go_w)
    status = read_to_end(status_r)
    os.waitpid(setup_pid, 0)  # it exits right after forking; its child is now ours to reap
    pid, error = 0, None
    for line in status.decode(errors="replace").splitlines():
        if line.startswith("pid "):
            pid = int(line.split()[1])
        elif line.startswith("error "):
            error = error or line[6:]
    return pid, error, clock


class Launcher:
    """The fork server's state and its steps: wait, reap, start a child, shut down.

    It owns every descriptor a request brings until `_start_child` returns (each is closed
    there, whatever happens); a pidfd it opens is closed once sent.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.use_userns = userns_usable()
        # Without a user namespace only root can make the others (PID one included).
        self.pid_namespaces = self.use_userns or os.geteuid() == 0
        self.live: dict[int, int] = {}  # child pid -> request id
        self.wake_r = -1

    def serve(self) -> None:
        """Answer requests until the trusted side hangs up, then kill what is left."""
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        self._watch_signals()
        try:
            while True:
                ready = self._wait()
                if self.wake_r in ready:
                    self._drain_wakeups()
                    self._reap()
                if self.sock in ready and not self._handle_request():
                    break
        finally:
            self._shut_down()

    def _watch_signals(self) -> None:
        """SIGCHLD wakes the select loop through a pipe; the Jupyter kernel's interrupt is not ours."""
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _wait(self) -> list[Any]:
        while True:
            try:
                ready, _, _ = select.select([self.sock, self.wake_r], [], [])
                return ready
            except InterruptedError:
                continue

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _send(self, message: dict[str, Any], fds: list[int] = ()) -> None:
        try:
            send_message(self.sock, message, fds)
        except OSError:
            pass  # the trusted side is gone: its end of file ends the loop

    def _reap(self) -> None:
        """Report every child that ended; without PID namespaces, kill what it left behind."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.live:
                continue  # a setup fork or an orphan reparented to us
            self._send({"op": "exited", "id": self.live.pop(pid),
                        "status": os.waitstatus_to_exitcode(status),
                        "cpu_seconds": usage.ru_utime + usage.ru_stime,
                        "maxrss_kb": usage.ru_maxrss})
            if not self.pid_namespaces:
                kill_orphans(set(self.live))

    def _handle_request(self) -> bool:
        """Serve one message; False once the trusted side has hung up."""
        data, fds = receive_message(self.sock)
        if not data:
            return False
        request_id, pid, error, clock = self._start_child(data, fds)
        try:
            self._answer_spawn(request_id, pid, error, clock)
        finally:
            if clock is not None:
                os.close(clock)
        return True

    def _answer_spawn(self, request_id: Any, pid: int, error: str | None, clock: int | None
                      ) -> None:
        """Tell the trusted side the child runs, with its pidfd (and CPU clock), or why not."""
        if error or not pid:
            if pid:  # started but unusable: end it now, and reap it here, not in _reap()
                kill_quietly(pid)
                os.waitpid(pid, 0)
            self._send({"op": "failed", "id": request_id, "error": error or "no child started"})
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            kill_quietly(pid)
            os.waitpid(pid, 0)
            self._send({"op": "failed", "id": request_id, "error": f"pidfd_open: {exc}"})
            return
        self.live[pid] = request_id
        self._send({"op": "spawned", "id": request_id, "pid": pid,
                    "pid_namespace": self.pid_namespaces},
                   [pidfd] if clock is None else [pidfd, clock])
        os.close(pidfd)

    def _start_child(self, data: bytes, fds: list[int]) -> tuple[Any, int, str | None, int | None]:
        """(the request's id, the child's pid or 0, the error, its CPU clock); closes every
        received fd."""
        request_id = None
        try:
            request = json.loads(data)
            request_id = request.get("id") if isinstance(request, dict) else None
            names = request["fds"]
            if len(names) != len(fds):
                raise ValueError("descriptor count does not match")
            pid, error, clock = spawn(dict(zip(names, fds)), use_userns=self.use_userns)
            return request_id, pid, error, clock
        except Exception as exc:  # noqa: BLE001 - a bad request fails alone
            return request_id, 0, f"{type(exc).__name__}: {exc}", None
        finally:
            for fd in fds:
                os.close(fd)

    def _shut_down(self) -> None:
        """Kill every live child and whatever was reparented to us, then reap them all."""
        for pid in list(self.live):
            kill_quietly(pid)
        kill_orphans(set())
        while True:
            try:
                os.wait()
            except ChildProcessError:
                break


def kill_orphans(keep: set[int]) -> None:
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
            kill_quietly(int(entry))


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    """Entry point of the exec'd launcher: argv[1] is its end of the socket pair."""
    from ..child import cell, session  # noqa: F401 - loaded here once, not by every child

    sock = socket.socket(fileno=int(sys.argv[1]))
    # Nothing of ours belongs on stdout; a fork's buffered copy of it would be written twice.
    Launcher(sock).serve()


if __name__ == "__main__":
    main()
