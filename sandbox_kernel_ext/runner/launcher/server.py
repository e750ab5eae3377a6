"""The fork server: one single-threaded process per `SandboxManager`, started by exec.

Landlock and seccomp confine only the calling thread, and a Jupyter kernel has many threads,
so no confinement ever happens in the Jupyter kernel's process. The launcher is exec'd with a scrubbed
environment (a child's `/proc/self/environ` shows the environment its ancestors were exec'd
with), keeps the next run's child ready (a `Spare`: forked, in its namespaces, waiting) and a
few more that hold a sandbox's view prepared for its next run, hands a run's descriptors to one
of them when a run is asked for, gives the trusted side a pidfd for it, reaps it as a child
subreaper and reports its exit status and rusage. `child/bootstrap.py` runs in the forks; the
launcher's client, on the trusted side, is `trusted/launcher_client.py`.

Protocol over a SOCK_SEQPACKET pair (`wire.send_message`), one JSON object per message:
  trusted -> launcher  {"op": "spawn", "id": N, "fds": [names], "key": K or null} + fds
                       (the plan is one of the fds, a memfd only the child reads: the
                       launcher's memory, which every later fork inherits, never holds one;
                       K names the view prepared for this run, if any)
                       {"op": "prepare", "key": K, "fds": [names]} + fds (a plan's memfd and
                       root's folders: a spare makes that view now, for the run that names K)
                       {"op": "discard", "key": K} (that view is stale, or its sandbox gone)
                       {"op": "home", "id": N, "size": S, "inodes": I} (a sandbox's home tmpfs)
  launcher -> trusted  {"op": "spawned", "id": N, "pid": P, "pid_namespace": B}
                       + [pidfd] or [pidfd, CPU clock of the tree]
                       {"op": "failed", "id": N, "error": "..."}
                       {"op": "exited", "id": N, "status": S, "cpu_seconds": C, "maxrss_kb": R}
                       {"op": "home", "id": N} + [its mount] or {"op": "home", "id": N,
                       "error": "..."}
End of file on the socket (the trusted side closed it or died) kills every live child and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from ..child.bootstrap import TAKEN, report, run_setup_fork
from ..linux.cpu_clock import open_tree_clock
from ..linux.namespaces import PR_SET_CHILD_SUBREAPER, userns_usable
from ..linux.syscalls import no_core_dumps, prctl, process_name, set_process_name
from ..linux.tasks import SPARE_NAME
from .sized_home import make_sized_home
from ..wire import read_to_end, receive_message, send_message

# The next spare is made once the launcher has had nothing to do for this long: not while a
# quick run is still being reported (its forks would compete with it for the CPUs), yet long
# before a person or an agent asks for the next run. A request that finds none makes one.
SPARE_AFTER_IDLE = 0.002
# How long a spare may take to take a run it was handed (it answers at once unless stopped
# or starved), and the child to be running after that (its confinement takes milliseconds).
TAKE_TIMEOUT = 2.0
START_TIMEOUT = 30.0
# Spares that hold a sandbox's prepared view (its mounts, covers and Landlock rules, made from
# the plan of its last run, by key); past this many, the oldest is ended.
PREPARED_MAX = 4


class Spare:
    """The next run's child, made before the run is asked for: two forks (the setup fork
    enters the namespaces, its child is PID 1 there and waits on `handoff`) are most of a
    run's start, and no plan is needed for them. The tree's CPU clock is opened on the setup
    fork before it forks anything, so it follows every process of the tree from the first."""

    def __init__(self, *, use_userns: bool, uid: int | None, seen_uid: int | None) -> None:
        self.pid = 0  # PID 1 of the spare's namespace, as the host sees it, once known
        self.setup_reaped = False
        self.error: str | None = None
        handoff, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        name = process_name()
        try:
            self.setup_pid = os.fork()
        except BaseException:
            for fd in (status_r, status_w, go_r, go_w):
                os.close(fd)
            handoff.close()
            child_end.close()
            raise
        if self.setup_pid == 0:
            set_process_name(SPARE_NAME)  # first: never a nameless process of the child's uid
            try:
                handoff.detach()  # the launcher's end: closed below with the rest
                os.close(go_w)
                os.read(go_r, 1)
                os.close(go_r)
                run_setup_fork(child_end.detach(), status_w, name=name, use_userns=use_userns,
                               uid=uid, seen_uid=seen_uid)
            except BaseException as exc:  # noqa: BLE001 - reported to the launcher, then exit
                report(status_w, f"error setup: {type(exc).__name__}: {exc}")
            os._exit(0)
        child_end.close()
        os.close(status_w)
        os.close(go_r)
        self.handoff = handoff
        self.status_r: int | None = status_r  # until the setup fork has said how it went
        self.clock = open_tree_clock(self.setup_pid)
        os.write(go_w, b"g")
        os.close(go_w)

    def settle(self) -> None:
        """Read what the setup fork said (it ends right after): the spare's pid or the error."""
        if self.status_r is None:
            return
        status_r, self.status_r = self.status_r, None
        data, _ = _read_status(status_r, rest=0.0)  # its one line is all it has to say
        lines = data.decode(errors="replace").splitlines()
        # Its work is done (or it is stuck: a process of its uid can stop it): ended here,
        # its child is ours to reap (we are a subreaper).
        if not self.setup_reaped:  # by `Launcher._reap`: its pid may be another's by now
            kill_quietly(self.setup_pid)
            _reap_quietly(self.setup_pid)
            self.setup_reaped = True
        for line in lines:
            if line.startswith("pid "):
                self.pid = int(line.split()[1])
            elif line.startswith("error "):
                self.error = self.error or line[6:]
        if not self.pid and not self.error:
            self.error = "the setup fork ended without a child"

    def prepare(self, names: list[str], fds: list[int]) -> bool:
        """Have the waiting child make a view ahead of its run (from the plan of the same
        sandbox's last run); False if it is gone. Nothing comes back: a child whose view
        failed, or does not fit the run, leaves the run untaken to another spare."""
        self.settle()
        if self.error:
            return False
        try:
            send_message(self.handoff, {"prepare": True, "fds": names}, fds)
        except OSError:
            return False
        return True

    def start_run(self, fds: dict[str, int]) -> tuple[bool, str | None]:
        """Hand the run's descriptors to the waiting child and wait until it runs (its
        status pipe closes at exec, or once the cell starts): (whether the child took the
        run, the error if it did not start). A spare that died waiting never took it, and its
        descriptors are untouched: another spare can take them."""
        self.settle()
        if self.error:
            return False, self.error
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            send_message(self.handoff, {"fds": [*fds, "status"]}, [*fds.values(), status_w])
        except OSError as exc:
            os.close(status_r)
            return False, f"the child made for this run is gone ({exc.strerror})"
        finally:
            os.close(status_w)
        data, timed_out = _read_status(status_r, close=False)
        try:
            if timed_out:
                # Ended before it can start later, unwatched; then what it said by then is
                # read whole, so a run it took at the last moment fails instead of running
                # twice (here and in the next spare).
                kill_quietly(self.pid)
                data += read_to_end(status_r)
                status_r = -1
        finally:
            if status_r >= 0:
                os.close(status_r)
        lines = data.decode(errors="replace").splitlines()
        errors = [line[6:] for line in lines if line.startswith("error ")]
        if TAKEN not in lines:
            return False, errors[0] if errors else (
                f"the child made for this run did not take it within {TAKE_TIMEOUT:g} s"
                if timed_out else "the child made for this run ended first")
        if timed_out:
            return True, f"the child did not start within {TAKE_TIMEOUT + START_TIMEOUT:g} s"
        return True, errors[0] if errors else None

    def close(self) -> None:
        """Release the launcher's ends (the clock goes to the trusted side first, if used)."""
        self.handoff.close()
        if self.status_r is not None:
            os.close(self.status_r)
            self.status_r = None
        if self.clock is not None:
            os.close(self.clock)
            self.clock = None


def _read_status(status_r: int, *, rest: float = START_TIMEOUT,
                 close: bool = True) -> tuple[bytes, bool]:
    """What comes on `status_r` until it closes (then closed, if `close`), and whether a
    deadline passed first: `TAKE_TIMEOUT` for the first line, `rest` more seconds for the
    others (with none, the first line is all). A spare or its setup fork can be stopped
    (SIGSTOP) by any process of its uid; the launcher, which serves every run of its manager
    in turn, must not wait on one for ever."""
    data = b""
    start = time.monotonic()
    try:
        while True:
            if b"\n" in data and rest <= 0:
                return data, False
            limit = TAKE_TIMEOUT if b"\n" not in data else TAKE_TIMEOUT + rest
            left = start + limit - time.monotonic()
            if left <= 0 or not select.select([status_r], [], [], left)[0]:
                return data, True
            chunk = os.read(status_r, 65536)
            if not chunk:
                return data, False
            data += chunk
    finally:
        if close:
            os.close(status_r)


def _reap_quietly(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class Launcher:
    """The fork server's state and its steps: wait, reap, start a child, shut down.

    It owns every descriptor a request brings until `_start_child` returns (each is closed
    there, whatever happens); a pidfd it opens is closed once sent.
    """

    def __init__(self, sock: socket.socket, uid: int | None = None,
                 seen_uid: int | None = None) -> None:
        self.sock = sock
        self.use_userns = userns_usable()
        self.uid = uid  # a root launcher's children run as this uid
        self.seen_uid = seen_uid  # and see themselves as this one in their user namespace
        # Without a user namespace only root can make the others (PID one included).
        self.pid_namespaces = self.use_userns or os.geteuid() == 0
        self.live: dict[int, int] = {}  # child pid -> request id
        self.spare: Spare | None = None
        self.prepared: dict[str, Spare] = {}  # by the key the trusted side gave its view
        self.spare_due = 0.0  # when to make the next spare, while there is none
        self.wake_r = -1

    def serve(self) -> None:
        """Answer requests until the trusted side hangs up, then kill what is left."""
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        self._watch_signals()
        try:
            while True:
                ready = self._wait()
                if not ready and self.spare is None:
                    self._make_spare()
                if self.wake_r in ready:
                    self._drain_wakeups()
                    self._reap()
                if self.spare is not None and self.spare.status_r in ready:
                    self.spare.settle()
                if self.sock in ready and not self._handle_request():
                    break
        finally:
            self._shut_down()

    def _make_spare(self) -> None:
        try:
            self.spare = Spare(use_userns=self.use_userns, uid=self.uid, seen_uid=self.seen_uid)
        except OSError:
            self.spare = None  # out of processes or descriptors: the next request tries again

    def _watch_signals(self) -> None:
        """SIGCHLD wakes the select loop through a pipe; the Jupyter kernel's interrupt is not ours."""
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _wait(self) -> list[Any]:
        """What is ready to be read; nothing once it is time to make the next spare."""
        watched = [self.sock, self.wake_r]
        if self.spare is not None and self.spare.status_r is not None:
            watched.append(self.spare.status_r)
        while True:
            timeout = None
            if self.spare is None:
                timeout = max(0.0, self.spare_due - time.monotonic())
            try:
                ready, _, _ = select.select(watched, [], [], timeout)
            except InterruptedError:
                continue
            if self.spare is None:  # any message or exit puts it off: there is work now
                self.spare_due = time.monotonic() + SPARE_AFTER_IDLE
            return ready

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
        """Report every child that ended; without PID namespaces, kill what it left behind,
        again each time an orphan of it ends: the orphan's own children are ours now (a
        fork bomb's tree comes up to us a generation at a time)."""
        orphan_ended = False
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            for spare in (self.spare, *self.prepared.values()):
                if spare is not None and pid == spare.setup_pid:
                    spare.setup_reaped = True
            if self.spare is not None and pid == self.spare.pid:
                self.spare.close()  # it died waiting: another is made when all is quiet
                self.spare = None
                self.spare_due = time.monotonic() + SPARE_AFTER_IDLE
                continue
            for key, spare in list(self.prepared.items()):
                if spare.pid == pid:  # a prepared one died waiting: its run takes another
                    self.prepared.pop(key).close()
            if pid not in self.live:
                orphan_ended = orphan_ended or not self._is_setup_fork(pid)
                continue  # a setup fork or an orphan reparented to us
            self._send({"op": "exited", "id": self.live.pop(pid),
                        "status": os.waitstatus_to_exitcode(status),
                        "cpu_seconds": usage.ru_utime + usage.ru_stime,
                        "maxrss_kb": usage.ru_maxrss})
            if not self.pid_namespaces:
                kill_orphans(self._ours())
        if orphan_ended and not self.pid_namespaces:
            kill_orphans(self._ours())

    def _is_setup_fork(self, pid: int) -> bool:
        return any(spare is not None and spare.setup_pid == pid
                   for spare in (self.spare, *self.prepared.values()))

    def _ours(self) -> set[int]:
        """The children that are not orphans: the live runs and the spares."""
        spares = [*self.prepared.values(), *([self.spare] if self.spare is not None else [])]
        return set(self.live) | {pid for spare in spares for pid in (
            spare.pid, 0 if spare.setup_reaped else spare.setup_pid) if pid}

    def _handle_request(self) -> bool:
        """Serve one message; False once the trusted side has hung up."""
        data, fds = receive_message(self.sock)
        if not data:
            return False
        try:
            request = json.loads(data)
        except ValueError as exc:
            request = f"{type(exc).__name__}: {exc}"  # not a request: the spawn path says so
        op = request.get("op") if isinstance(request, dict) else None
        if op == "home":
            for fd in fds:
                os.close(fd)
            self._answer_home(request)
            return True
        if op in ("prepare", "discard"):
            try:
                if op == "prepare":
                    self._prepare(str(request.get("key")), request.get("fds"), fds)
                else:
                    self._discard(str(request.get("key")))
            finally:
                for fd in fds:
                    os.close(fd)
            return True
        request_id, spare, error = self._start_child(request, fds)
        try:
            self._answer_spawn(request_id, spare, error)
        finally:
            if spare is not None:
                spare.close()
        return True

    def _answer_spawn(self, request_id: Any, spare: Spare | None, error: str | None) -> None:
        """Tell the trusted side the child runs, with its pidfd (and CPU clock), or why not."""
        pid = spare.pid if spare is not None else 0
        if error or not pid:
            if pid:  # started but unusable: end it now, and reap it here, not in _reap()
                kill_quietly(pid)
                _reap_quietly(pid)
            self._send({"op": "failed", "id": request_id, "error": error or "no child started"})
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            kill_quietly(pid)
            _reap_quietly(pid)
            self._send({"op": "failed", "id": request_id, "error": f"pidfd_open: {exc}"})
            return
        self.live[pid] = request_id
        clock = spare.clock
        self._send({"op": "spawned", "id": request_id, "pid": pid,
                    "pid_namespace": self.pid_namespaces},
                   [pidfd] if clock is None else [pidfd, clock])
        os.close(pidfd)

    def _answer_home(self, request: dict[str, Any]) -> None:
        """Make a sandbox's home tmpfs (`sized_home.py`) and send it, or why it cannot be."""
        try:
            size, inodes = request.get("size"), request.get("inodes")
            for name, number in (("size", size), ("inodes", inodes)):
                if not isinstance(number, int) or isinstance(number, bool) or number < 1:
                    raise ValueError(f"not a {name}: {number!r}")
            home = make_sized_home(size, inodes, uid=self.uid)
        except (OSError, ValueError) as exc:
            self._send({"op": "home", "id": request.get("id"), "error": str(exc)})
            return
        try:
            self._send({"op": "home", "id": request.get("id")}, [home])
        finally:
            os.close(home)

    def _prepare(self, key: str, names: Any, fds: list[int]) -> None:
        """Give the waiting spare a sandbox's view to make, kept under `key` for its next run."""
        if not isinstance(names, list) or len(names) != len(fds):
            return
        self._discard(key)
        spare = self._take_spare()
        if spare is None:
            return
        if not spare.prepare(names, fds):
            self._end(spare)
            return
        while len(self.prepared) >= PREPARED_MAX:
            self._end(self.prepared.pop(next(iter(self.prepared))))
        self.prepared[key] = spare

    def _discard(self, key: str) -> None:
        if key in self.prepared:
            self._end(self.prepared.pop(key))

    def _take_spare(self) -> Spare | None:
        """The waiting spare (made now if there is none); the next is made when all is quiet."""
        if self.spare is None:
            self._make_spare()
        spare, self.spare = self.spare, None
        self.spare_due = time.monotonic() + SPARE_AFTER_IDLE
        return spare

    @staticmethod
    def _end(spare: Spare) -> None:
        """Kill a spare no run will take (it is reaped as any other child of ours)."""
        spare.settle()
        if spare.pid:
            kill_quietly(spare.pid)
        spare.close()

    def _start_child(self, request: Any, fds: list[int]) -> tuple[Any, Spare | None, str | None]:
        """(the request's id, the spare that took the run or None, the error); closes every
        received fd. The spare prepared for the request's key goes first; a spare that did
        not take the run (gone, or prepared for another view) is ended, and a fresh one
        tried, once."""
        request_id = None
        try:
            if not isinstance(request, dict):
                raise ValueError(f"not a request: {request}")
            request_id = request.get("id")
            names = request["fds"]
            if len(names) != len(fds):
                raise ValueError("descriptor count does not match")
            error = None
            prepared = self.prepared.pop(str(request.get("key")), None)
            for attempt in range(3 if prepared is not None else 2):
                spare = prepared if attempt == 0 and prepared is not None else self._take_spare()
                if spare is None:
                    return request_id, None, "the launcher could not fork"
                taken, error = spare.start_run(dict(zip(names, fds)))
                if taken:
                    return request_id, spare, error
                self._end(spare)
            return request_id, None, error
        except Exception as exc:  # noqa: BLE001 - a bad request fails alone
            return request_id, None, f"{type(exc).__name__}: {exc}"
        finally:
            for fd in fds:
                os.close(fd)

    def _shut_down(self) -> None:
        """Kill every live child, the spare and whatever was reparented to us, then reap them all."""
        for pid in [*self.live, *self._ours()]:
            if pid:
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
    """Entry point of the exec'd launcher: argv[1] is its end of the socket pair, argv[2] the
    uid a root launcher's children run as and the uid they see themselves as ("UID:SEEN",
    "" for none)."""
    from ..child import cell, session  # noqa: F401 - loaded here once, not by every child

    sock = socket.socket(fileno=int(sys.argv[1]))
    uid = seen = None
    if len(sys.argv) > 2 and sys.argv[2]:
        uid, seen = (int(part) for part in sys.argv[2].split(":"))
    # No core file of the launcher, ever (each fork sets its own RLIMIT_CORE, 0 as well). It
    # stays dumpable: the kernel's process, of its uid, reads its /proc entries.
    no_core_dumps(for_good=True)
    # Nothing of ours belongs on stdout; a fork's buffered copy of it would be written twice.
    Launcher(sock, uid, seen).serve()


if __name__ == "__main__":
    main()
