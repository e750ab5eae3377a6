"""The descriptors of one run and the reading of them, on the trusted side.

`Plumbing` holds each descriptor a run needs with one owner at a time; `pump` reads the
child's output pipes and its control channel until they end (or until a session's cell says
it is done); `OutputStream` keeps what a pipe said, up to a cap.
"""

from __future__ import annotations

import codecs
import os
import select
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..wire import ChildPlan
from .crossing_text import stream_text

if TYPE_CHECKING:
    from .control import ControlChannel

__all__ = ["OutputStream", "Plumbing", "pump", "drain", "memfd"]

OutputCallback = Callable[[str, str], None]  # (stream name "stdout"/"stderr", text)
_READ_CHUNK = 65536


class OutputStream:
    """One output pipe: keeps at most `cap` bytes, counts the rest, decodes for callbacks.
    The text it gives is a sandbox's: escape sequences but colours and control characters
    but newlines, tabs and carriage returns are removed (`crossing_text.stream_text`)."""

    def __init__(self, name: str, cap: int, callback: OutputCallback | None) -> None:
        self.name, self.cap, self.callback = name, cap, callback
        self.kept = bytearray()
        self.dropped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes) -> None:
        room = self.cap - len(self.kept)
        kept, extra = data[:max(room, 0)], data[max(room, 0):]
        if kept:
            self.kept += kept
            if self.callback is not None:
                self.callback(self.name, stream_text(self._decoder.decode(kept)))
        if extra:
            if self.dropped == 0 and self.callback is not None:
                self.callback(self.name, self._decoder.decode(b"", final=True)
                              + f"\n[sandbox] {self.name} capped at {self.cap} bytes\n")
            self.dropped += len(extra)

    def text(self) -> str:
        text = stream_text(self.kept.decode("utf-8", errors="replace"))
        if self.dropped:
            text += f"\n[sandbox] {self.dropped} more bytes of {self.name} dropped (cap {self.cap} bytes)\n"
        return text


class Plumbing:
    """The descriptors of one run, each with one owner at a time.

    The child's ends (`child_ends`, by the names the launcher expects) are ours until the
    launcher has duplicated them into the child; the trusted ends (the output pipes, the
    control socket, the egress hand-off) are ours until the run is collected, except the
    control socket, which `take_control` hands to the control channel. `close()` closes
    whatever is still held, and is safe to call more than once.
    """

    def __init__(self) -> None:
        self.child_ends: dict[str, int] = {}
        self.stdout = self.stderr = -1
        self.control: socket.socket | None = None
        self.handoff: socket.socket | None = None

    @classmethod
    def open(cls, plan: ChildPlan, stdin: bytes | None, payload: bytes | None) -> Plumbing:
        plumbing = cls()
        try:
            plumbing.stdout, plumbing.child_ends["stdout"] = os.pipe2(os.O_CLOEXEC)
            plumbing.stderr, plumbing.child_ends["stderr"] = os.pipe2(os.O_CLOEXEC)
            # Empty input is an empty memfd, not the host's /dev/null: a descriptor handed in
            # is not behind the child's read-only view, and futimens(0) would touch the host's.
            plumbing.child_ends["stdin"] = memfd("sandbox-stdin", stdin or b"")
            if payload is not None:
                plumbing.control, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                plumbing.child_ends["control"] = child_end.detach()
                plumbing.child_ends["payload"] = memfd("sandbox-cell", payload)
            if plan.proxy_port is not None:
                plumbing.handoff, child_end = socket.socketpair(socket.AF_UNIX,
                                                                socket.SOCK_SEQPACKET)
                plumbing.child_ends["egress"] = child_end.detach()
        except BaseException:
            plumbing.close()
            raise
        return plumbing

    def take_control(self) -> socket.socket:
        sock, self.control = self.control, None
        assert sock is not None
        return sock

    def close_child_ends(self) -> None:
        ends, self.child_ends = self.child_ends, {}
        for fd in ends.values():
            os.close(fd)

    def close_handoff(self) -> None:
        if self.handoff is not None:
            self.handoff.close()
            self.handoff = None

    def close(self) -> None:
        self.close_child_ends()
        self.close_handoff()
        for name in ("stdout", "stderr"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
        if self.control is not None:
            self.control.close()
            self.control = None


def memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    written = 0
    view = memoryview(data)
    while written < len(view):
        written += os.write(fd, view[written:])
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def pump(streams: dict[int, OutputStream], control: ControlChannel | None, *,
         tick: Callable[[], float], until: Callable[[], bool] | None = None) -> None:
    """Read the pipes and the control channel as they have data, until every one reached end
    of file or `until()` holds (then what the pipes already hold is read too). `tick()` runs
    each round and says how long to wait for data. (`poll`, not epoll: it makes no kernel
    object, and a session's quick cell pumps twice.)"""
    poller = select.poll()
    watched = set(streams) | ({control.fileno()} if control is not None else set())
    for fd in watched:
        poller.register(fd, select.POLLIN)
    while watched and not (until is not None and until()):
        # Pipes first: text a cell printed before a display comes before it.
        ready = sorted((fd for fd, _ in poller.poll(tick() * 1000)),
                       key=lambda fd: fd not in streams)
        for fd in ready:
            try:
                data = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                continue  # woken for nothing (a non-blocking socket)
            except OSError:  # reset, or closed under us (ended from another thread)
                data = b""
            if fd in streams:
                if data:
                    streams[fd].feed(data)
            elif control is not None:
                if data:
                    control.feed(data)
                else:
                    control.finish()
            if not data:
                poller.unregister(fd)
                watched.discard(fd)
    if until is not None and until():
        drain(streams)


def drain(streams: dict[int, OutputStream]) -> None:
    """Read what the pipes hold now, without waiting for more."""
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    while ready := poller.poll(0):
        for fd, event in ready:
            try:
                data = os.read(fd, _READ_CHUNK) if not event & select.POLLNVAL else b""
            except OSError:  # closed under us: nothing more to read there
                data = b""
            if not data:
                poller.unregister(fd)
                continue
            streams[fd].feed(data)
