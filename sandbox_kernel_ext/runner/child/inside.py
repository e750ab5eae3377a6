"""What sandboxed Python sees of the policy: `report_usage`, approval-gated opens, and
refusals that say what the policy allows.

Runs inside the confined child, installed before the cell's first line. None of it is a
security boundary (the cell could undo it): Landlock's and seccomp's rules are. It makes the boundary
usable: `open()` of an approval-gated path asks the trusted side over the control channel and gets
a descriptor back once someone approves, and a refused open names the virtual path and what
is allowed instead of a bare EACCES.
"""

from __future__ import annotations

import builtins
import collections
import errno
import gc
import getpass
import io
import json
import os
import socket
import sys
import threading
import weakref
from typing import Any

from ...policy.paths import is_within, virtual_path

__all__ = ["report_usage", "install", "send_frame", "next_command", "ask_input"]

_channel: _Channel | None = None
_open = io.open  # the real ones, kept before anything is wrapped
_os_open = os.open
_os_close = os.close


class _Channel:
    """The child's end of the control socket: one request at a time, answers in order.

    In a session the trusted side also sends commands (a cell to run); a frame that is not
    the reply being waited for is kept for `next_command`, whoever read it."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.set_inheritable(False)
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending = b""
        self._commands: collections.deque[dict[str, Any]] = collections.deque()

    def send(self, frame: dict[str, Any]) -> None:
        data = (json.dumps(frame) + "\n").encode()
        with self._lock:
            self._sock.sendall(data)

    def _read_frame(self) -> tuple[dict[str, Any] | None, list[int]]:
        """The next frame and its descriptors; (None, []) at end of file. Holds the lock."""
        fds: list[int] = []
        while b"\n" not in self._pending:
            data, more, _flags, _addr = socket.recv_fds(self._sock, 65536, 4)
            fds += more
            if not data:
                return None, fds
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line), fds

    def ask(self, frame: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        with self._lock:
            self._next_id += 1
            frame["id"] = self._next_id
            self._sock.sendall((json.dumps(frame) + "\n").encode())
            while True:
                reply, fds = self._read_frame()
                if reply is None:
                    raise PermissionError(errno.EACCES,
                                          "the trusted side closed the control channel")
                if reply.get("type") != "reply":
                    self._commands.append(reply)
                elif reply.get("id") == frame["id"]:
                    return reply, fds
                else:  # the answer to a request an interrupt abandoned: not this one's
                    for fd in fds:
                        _os_close(fd)

    def next_command(self) -> dict[str, Any] | None:
        """The trusted side's next command (blocks); None once it hung up."""
        with self._lock:
            while not self._commands:
                frame, _ = self._read_frame()
                if frame is None:
                    return None
                if frame.get("type") != "reply":  # a reply nobody waits for is dropped
                    self._commands.append(frame)
            return self._commands.popleft()


def send_frame(frame: dict[str, Any]) -> None:
    if _channel is None:
        raise RuntimeError("not inside a sandboxed cell")
    _channel.send(frame)


def next_command() -> dict[str, Any] | None:
    """A session's next command from the trusted side; None once it hung up."""
    if _channel is None:
        raise RuntimeError("not inside a sandboxed cell")
    return _channel.next_command()


MAX_PROMPT_CHARS = 4096


def ask_input(prompt: Any = "", password: bool = False) -> str:
    """`input()` inside a sandbox: the trusted side asks a person (the notebook's stdin, a
    terminal) or says why nobody can answer, which raises EOFError with that reason."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    if _channel is None:
        raise EOFError("input() has no one to ask: not inside a sandboxed cell")
    reply, fds = _channel.ask({"type": "input", "prompt": str(prompt)[:MAX_PROMPT_CHARS],
                               "password": bool(password)})
    for fd in fds:
        _os_close(fd)
    value = reply.get("value")
    if not reply.get("ok") or not isinstance(value, str):
        raise EOFError(str(reply.get("error") or "no input"))
    return value


def _input(prompt: Any = "") -> str:
    return ask_input(prompt)


def _getpass(prompt: str = "Password: ", stream: Any = None) -> str:
    return ask_input(prompt, password=True)


def report_usage(tokens: int = 0, cost: float = 0.0) -> None:
    """Count model spend against this sandbox's token and cost budgets (a breach ends it)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a whole number from 0, got {tokens!r}")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost >= 0:
        raise ValueError(f"cost must be a number from 0, got {cost!r}")
    if _channel is None:
        raise RuntimeError(
            "report_usage works inside a sandboxed cell; outside a sandbox, use "
            "SandboxManager.record_usage(sandbox_id, tokens=..., cost_usd=...)"
        )
    send_frame({"type": "usage", "tokens": tokens, "cost": float(cost)})


# -- the policy as the child knows it ---------------------------------------------------------
class _Policy:
    def __init__(self, view: dict[str, Any]) -> None:
        self.roots: list[dict[str, Any]] = view.get("roots", [])
        self.readable: list[str] = view.get("readable", [])
        self.writable: list[str] = view.get("writable", [])
        self.denied: list[str] = view.get("denied", [])
        self.home: str | None = view.get("home")
        self.closed: list[str] = view.get("closed", [])  # where Python imports from first
        self.egress: list[str] | None = view.get("egress")  # the domains the proxy lets out

    def no_names(self) -> str:
        """Why a name lookup fails in this sandbox."""
        if not self.egress:
            return "the sandbox has no network (its policy lists no egress rules)"
        shown = ", ".join(self.egress[:8]) + (", ..." if len(self.egress) > 8 else "")
        return ("the sandbox resolves no names itself: its one way out is the proxy named in "
                f"HTTPS_PROXY and HTTP_PROXY, to {shown}")

    def root_of(self, path: str) -> tuple[dict[str, Any], str] | None:
        for root in self.roots:
            virtual = virtual_path(path, root["host"], root["virtual"])
            if virtual is not None:
                return root, virtual
        return None

    def gated(self, path: str, write: bool) -> bool:
        found = self.root_of(path)
        if found is None:
            return False
        root = found[0]
        return root["read_approval"] or (write and root["writable"] and root["write_approval"])

    def explain(self, path: str, write: bool) -> str | None:
        """Why the policy refuses this access, or None if it allows it (then a refusal is the
        file's own permissions, and the system's message is the right one)."""
        access = "write to" if write else "read of"
        if write and self.closed:
            full = os.path.abspath(path)
            if os.path.realpath(os.path.dirname(full)) in self.closed and not os.path.lexists(full):
                return (f"creating {path} denied by the sandbox policy: its folder is where the "
                        "kernel imports from first (or on the way to it), which takes no new "
                        "file from a sandbox (a module there would run outside it); write new "
                        "files in a subfolder")
        found = self.root_of(path)
        if found is not None:
            root, virtual = found
            if write and not root["writable"]:
                writable = [f"{r['virtual']} = {r['host']}" for r in self.roots if r["writable"]]
                return (f"{access} {virtual} denied by the sandbox policy: {root['virtual']} is "
                        f"read-only (writable: {', '.join(writable) or 'nothing'})")
            return None
        if any(is_within(path, folder) for folder in self.denied):
            return (f"{access} {path} denied by the sandbox policy: it holds credentials, which "
                    "no sandbox may read")
        granted = self.writable if write else self.readable + self.writable
        if any(is_within(path, folder) for folder in [*granted, *filter(None, [self.home])]):
            return None
        shown = [f"{r['virtual']} = {r['host']}" + ("" if r["writable"] else " (read-only)")
                 for r in self.roots if r["writable"] or not write]
        shown += [*granted, "the sandbox's home folder ($HOME)"]
        allowed = ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "")
        return (f"{access} {path} denied by the sandbox policy: it is outside the "
                f"{'writable' if write else 'readable'} paths (allowed: {allowed or 'nothing'})")


_policy = _Policy({})
_staged: dict[int, str] = {}  # descriptor -> commit handle, for os.open() callers
_inside_wrapper = threading.local()


def _path_text(file: Any) -> str | None:
    if isinstance(file, int) or not isinstance(file, (str, bytes, os.PathLike)):
        return None
    path = os.fsdecode(os.fspath(file))
    if not os.path.isabs(path):
        try:
            path = os.path.join(os.getcwd(), path)
        except OSError:  # a working folder past PATH_MAX: the kernel's rules alone decide
            return None
    # normpath keeps exactly two leading slashes (POSIX leaves `//` to the system), which
    # Linux reads as one: `//srv/gated.md` is `/srv/gated.md`
    return "/" + os.path.normpath(path).lstrip("/")


def _mode_flags(mode: str) -> int:
    plus = "+" in mode
    if "r" in mode:
        return os.O_RDWR if plus else os.O_RDONLY
    base = os.O_RDWR if plus else os.O_WRONLY
    if "w" in mode:
        return base | os.O_CREAT | os.O_TRUNC
    if "a" in mode:
        return base | os.O_CREAT | os.O_APPEND
    if "x" in mode:
        return base | os.O_CREAT | os.O_EXCL
    raise ValueError(f"invalid mode: {mode!r}")


def _is_write(flags: int) -> bool:
    return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))


def _ask_open(path: str, flags: int) -> tuple[int, str | None]:
    if _channel is None:
        raise PermissionError(errno.EACCES, "no control channel to ask for approval", path)
    reply, fds = _channel.ask({"type": "open", "path": path, "flags": flags})
    if not reply.get("ok") or len(fds) != 1:
        for fd in fds:
            _os_close(fd)
        raise _refused(reply, path)
    return fds[0], reply.get("handle")


def _commit(handle: str, path: str) -> None:
    assert _channel is not None
    reply, fds = _channel.ask({"type": "commit", "handle": handle})
    for fd in fds:
        _os_close(fd)
    if not reply.get("ok"):
        raise _refused(reply, path)


def _refused(reply: dict, path: str) -> PermissionError:
    # PermissionError appends ": 'path'" to the message, so the trusted side's sentence loses its stop.
    reason = str(reply.get("error") or "refused").rstrip(".")
    return PermissionError(reply.get("errno", errno.EACCES), reason, path)


class _CommitsWhenClosed:
    """For the outermost object open() returns over a staged write. Closing it commits; when
    the garbage collector closes it, nobody can catch the refusal, so it is kept for the end
    of the cell (which then fails, saying which file was not written)."""

    def __del__(self) -> None:
        if self.closed:
            return
        try:
            self.close()
        except OSError as exc:
            _unseen_refusals.append(exc)


class _StagedFileIO(_CommitsWhenClosed, io.FileIO):
    def __init__(self, fd: int, mode: str, handle: str, path: str) -> None:
        super().__init__(fd, mode, closefd=True)
        self._handle, self._path = handle, path

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        _commit(self._handle, self._path)


class _StagedWriter(_CommitsWhenClosed, io.BufferedWriter):
    pass


class _StagedRandom(_CommitsWhenClosed, io.BufferedRandom):
    pass


class _StagedText(_CommitsWhenClosed, io.TextIOWrapper):
    pass


_unseen_refusals: list[OSError] = []
_open_staged: weakref.WeakSet[Any] = weakref.WeakSet()


def _wrap(fd: int, handle: str | None, path: str, mode: str, buffering: int,
          encoding: str | None, errors: str | None, newline: str | None) -> Any:
    """What io.open would build around a descriptor, with committing classes for a staged
    write."""
    kind = "r" if "r" in mode else "a" if "a" in mode else "w"  # x: the commit is exclusive
    raw_mode = kind + ("+" if "+" in mode else "")
    try:
        raw = (_StagedFileIO(fd, raw_mode, handle, path) if handle
               else io.FileIO(fd, raw_mode, closefd=True))
    except BaseException:
        _os_close(fd)
        raise
    raw.name = path
    if "a" in mode:
        raw.seek(0, os.SEEK_END)
    staged = handle is not None
    outer: Any = raw
    if not (buffering == 0 and "b" in mode):
        size = io.DEFAULT_BUFFER_SIZE if buffering in (-1, 1) else buffering
        if raw.readable() and raw.writable():
            outer = (_StagedRandom if staged else io.BufferedRandom)(raw, size)
        elif raw.writable():
            outer = (_StagedWriter if staged else io.BufferedWriter)(raw, size)
        else:
            outer = io.BufferedReader(raw, size)
        if "b" not in mode:
            outer = (_StagedText if staged else io.TextIOWrapper)(
                outer, encoding, errors, newline, line_buffering=buffering == 1)
            outer.mode = mode
    if staged:
        _open_staged.add(outer)
    return outer


def _refusal(exc: OSError, path: str, write: bool) -> OSError:
    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
        return exc
    reason = _policy.explain(path, write)
    return exc if reason is None else PermissionError(exc.errno, reason, path)


def _sandbox_open(file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,
                  errors: str | None = None, newline: str | None = None, closefd: bool = True,
                  opener: Any = None) -> Any:
    path = _path_text(file) if opener is None and isinstance(mode, str) else None
    if path is None:
        return _open(file, mode, buffering, encoding, errors, newline, closefd, opener)
    flags = _mode_flags(mode)
    write = _is_write(flags)
    if _policy.gated(path, write):
        _inside_wrapper.active = True
        try:
            fd, handle = _ask_open(path, flags)
        finally:
            _inside_wrapper.active = False
        return _wrap(fd, handle, path, mode, buffering, encoding, errors, newline)
    try:
        return _open(file, mode, buffering, encoding, errors, newline, closefd, opener)
    except OSError as exc:
        raise _refusal(exc, path, write) from None


def _sandbox_os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
    full = _path_text(path) if dir_fd is None else None
    if full is not None and _policy.gated(full, _is_write(flags)):
        fd, handle = _ask_open(full, flags & ~os.O_CLOEXEC)
        if handle:
            _staged[fd] = handle
        return fd
    try:
        return _os_open(path, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise (exc if full is None else _refusal(exc, full, _is_write(flags))) from None


def _sandbox_os_close(fd: int) -> None:
    _os_close(fd)
    handle = _staged.pop(fd, None)
    if handle is not None:
        _commit(handle, f"descriptor {fd}")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Opens that went around the wrappers (io.FileIO directly, a saved os.open): refuse a
    gated one with the reason, instead of Landlock's bare EACCES."""
    if event != "open" or getattr(_inside_wrapper, "active", False):
        return
    path = _path_text(args[0]) if args else None
    if path is None:
        return
    mode, flags = args[1], args[2]
    write = _is_write(flags) if isinstance(flags, int) and flags else (
        isinstance(mode, str) and any(ch in mode for ch in "wax+"))
    if _policy.gated(path, write):
        found = _policy.root_of(path)
        virtual = found[1] if found else path
        raise PermissionError(
            errno.EACCES,
            f"{'write to' if write else 'read of'} {virtual} needs approval: open it with "
            "open() or os.open(), which ask the trusted side for it",
            path,
        )


_getaddrinfo = socket.getaddrinfo


def _sandbox_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    """`socket.getaddrinfo`, whose failure says why there is no answer here (it was
    "Temporary failure in name resolution", as on a host whose network is down)."""
    try:
        return _getaddrinfo(host, *args, **kwargs)
    except socket.gaierror as exc:
        raise socket.gaierror(exc.errno, f"{exc.strerror} for {host!r}: {_policy.no_names()}"
                              ) from None


def install(control_fd: int, view: dict[str, Any]) -> None:
    """Connect to the trusted side and put the wrappers in place (before the cell's first line)."""
    global _channel, _policy
    _channel = _Channel(control_fd)
    _policy = _Policy(view)
    package = sys.modules.get("sandbox_kernel_ext")
    if package is not None:
        package.report_usage = report_usage  # type: ignore[attr-defined]
    builtins.input = _input
    getpass.getpass = _getpass
    if "egress" in view:
        socket.getaddrinfo = _sandbox_getaddrinfo
    if _policy.roots or _policy.readable or _policy.writable:
        builtins.open = _sandbox_open
        io.open = _sandbox_open
        os.open = _sandbox_os_open
        os.close = _sandbox_os_close
        sys.addaudithook(_audit)


def finish() -> list[str]:
    """At the end of the cell, as an interpreter's exit would: close what is still open over
    a staged write (committing it). Returns the refusals no code could have caught, once:
    they belong to this cell, not to every cell after it."""
    if _open_staged:
        gc.collect()  # a file only a reference cycle still holds is closed in its own cell
    for file in list(_open_staged):
        try:
            file.close()
        except OSError as exc:
            _unseen_refusals.append(exc)
    for fd in list(_staged):
        try:
            _sandbox_os_close(fd)
        except OSError as exc:
            _unseen_refusals.append(exc)
    refusals = [f"{exc.filename} was not written: {exc.strerror}" for exc in _unseen_refusals]
    _unseen_refusals.clear()
    return refusals
