"""ipykernel 6.x: a widget's clicks read by the busy cell itself, while it waits for them.

ipykernel 6 reads the shell socket only on the main thread's event loop, which a running
cell holds, so a click on a widget that cell shows arrives after the cell ends. A cell that
asks from the main thread (a file toolset's call written in the cell) can read the socket
itself while it waits: `ShellPump.pump` takes what the socket holds, hands the messages for
the approval widget's own comms to the kernel's comm handler at once, and keeps everything
else (the next cells' execute requests, other widgets' messages) in its turn, which
`release` gives back ahead of anything newer.

What a pumped message does is kept to the comm handler: not the kernel's dispatch, whose
hooks would swap the SIGINT handler the kernel restores when idle (an interrupt then killed
an idle kernel) and whose busy/idle status would be sent for it. SIGINT waits while the
queue is being sorted, so no request is lost half-way; the cell's parent (where its output
goes) is put back after each message.

Nothing here runs on another thread: the socket and the queue belong to the main thread,
and a thread that is not the cell's is denied at once instead (`kernel_routing`).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_logger = logging.getLogger(__name__)

__all__ = ["ShellPump"]


@contextmanager
def _sigint_held() -> Iterator[None]:
    """A SIGINT during the block is noted, and raised again for the handler it was meant
    for once the block ends (main thread only; a mask would not do: another thread of the
    kernel would take the signal)."""
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)


class ShellPump:
    """One waiting cell's reader of the shell socket (ipykernel 6.x, main thread only), for
    the comms `comm_ids()` names (the pending widget's)."""

    def __init__(self, kernel: Any, comm_ids: Callable[[], set[str]]) -> None:
        self.kernel = kernel
        self.comm_ids = comm_ids
        self._held: list[Any] = []

    @staticmethod
    def possible(kernel: Any) -> bool:
        """Whether this kernel queues shell messages where the main thread can read them
        (ipykernel 6.x), the calling thread is the main one, and no coroutine of the
        kernel waits on the queue (it would take the next message before we could look)."""
        queue = getattr(kernel, "msg_queue", None)
        return (threading.current_thread() is threading.main_thread()
                and getattr(kernel, "shell_stream", None) is not None
                and queue is not None and hasattr(kernel, "shell_handlers")
                and not getattr(queue, "_getters", None)
                and not hasattr(kernel, "shell_channel_thread"))

    def pump(self) -> None:
        """Read what the socket holds; handle the widget's comm messages, hold the rest."""
        from tornado.queues import QueueEmpty

        with _sigint_held():
            self.kernel.shell_stream.flush()  # what arrived, into msg_queue (nothing runs)
            while True:
                try:
                    item = self.kernel.msg_queue.get_nowait()
                except QueueEmpty:
                    return
                self._held.append(item)  # first: an item is never out of both places
                if self._comm_id(item) in self.comm_ids():
                    self._held.pop()
                    self._handle(item)

    def release(self) -> None:
        """Give back what was held, ahead of whatever arrived since; idempotent."""
        from tornado.queues import QueueEmpty

        queue = self.kernel.msg_queue
        with _sigint_held():
            later = []
            while True:
                try:
                    later.append(queue.get_nowait())
                except QueueEmpty:
                    break
            held, self._held = self._held, []
            for item in [*held, *later]:
                queue.put_nowait(item)
        if held or later:
            self.kernel.io_loop.add_callback(lambda: None)  # wake the loop once the cell ends

    def _frames(self, item: Any) -> tuple[list[Any], list[Any]] | None:
        """(identities, message frames) of a queued shell message; None for anything else."""
        try:
            _, dispatch, args = item
            if dispatch != self.kernel.dispatch_shell:
                return None
            return self.kernel.session.feed_identities(args[0], copy=False)
        except Exception:  # noqa: BLE001 - not one we can read: it keeps its turn
            return None

    def _comm_id(self, item: Any) -> str | None:
        """The comm a queued comm_msg is for, read from its frames without deserializing
        them (which checks and records the signature: done once, when it is handled)."""
        found = self._frames(item)
        if found is None:
            return None
        try:
            header, content = (json.loads(getattr(frame, "bytes", frame))
                               for frame in (found[1][1], found[1][4]))
            return content.get("comm_id") if header.get("msg_type") == "comm_msg" else None
        except Exception:  # noqa: BLE001 - unreadable: it keeps its turn
            return None

    def _handle(self, item: Any) -> None:
        """The comm handler on one message, signature checked, as the kernel's own handling
        would call it; then the cell is the parent again."""
        kernel = self.kernel
        found = self._frames(item)
        if found is None:
            return
        idents, frames = found
        parent = kernel.get_parent("shell")
        ident = getattr(kernel, "_parent_ident", {}).get("shell", b"")
        try:
            msg = kernel.session.deserialize(frames, content=True, copy=False)
            kernel.set_parent(idents, msg, "shell")
            kernel.shell_handlers["comm_msg"](kernel.shell_stream, idents, msg)
        except Exception:  # noqa: BLE001 - a bad message, as the kernel would log it
            _logger.exception("a widget message read while the cell waited failed")
        finally:
            kernel.set_parent(ident, parent, "shell")
