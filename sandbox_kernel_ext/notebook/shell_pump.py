"""ipykernel 6.x: a widget's clicks read by the busy cell itself, while it waits for them.

ipykernel 6 reads the shell socket only on the main thread's event loop, which a running
cell holds, so a click on a widget that cell shows arrives after the cell ends. A cell that
asks from the main thread (a file toolset's call written in the cell) can read the socket
itself while it waits: `ShellPump.pump` takes what the socket holds, handles the comm
messages among it at once, and keeps everything else (the next cells' execute requests
above all) in its turn, which `release` gives back ahead of anything newer. The cell's
parent (where its output goes) is put back after each handled message.

Nothing here runs on another thread: the socket and the queue belong to the main thread,
and a thread that is not the cell's is denied at once instead (`kernel_routing`).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

_logger = logging.getLogger(__name__)

__all__ = ["ShellPump"]

HANDLED = frozenset({"comm_msg"})  # what a widget's view sends: clicks, render acks


class ShellPump:
    """One waiting cell's reader of the shell socket (ipykernel 6.x, main thread only)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self._held: list[Any] = []

    @staticmethod
    def possible(kernel: Any) -> bool:
        """Whether this kernel queues shell messages where the main thread can read them
        (ipykernel 6.x), and the calling thread is the main one."""
        return (threading.current_thread() is threading.main_thread()
                and getattr(kernel, "shell_stream", None) is not None
                and hasattr(kernel, "msg_queue") and hasattr(kernel, "dispatch_shell")
                and not hasattr(kernel, "shell_channel_thread"))

    def pump(self) -> None:
        """Read what the socket holds; handle the comm messages, hold the rest in order."""
        from tornado.queues import QueueEmpty

        self.kernel.shell_stream.flush()  # what arrived, into msg_queue (nothing runs yet)
        while True:
            try:
                item = self.kernel.msg_queue.get_nowait()
            except QueueEmpty:
                return
            if self._msg_type(item) in HANDLED:
                self._handle(item)
            else:
                self._held.append(item)

    def release(self) -> None:
        """Give back what was held, ahead of whatever arrived since; idempotent."""
        from tornado.queues import QueueEmpty

        queue = self.kernel.msg_queue
        later = []
        while True:
            try:
                later.append(queue.get_nowait())
            except QueueEmpty:
                break
        for item in [*self._held, *later]:
            queue.put_nowait(item)
        self._held = []
        if later or queue.qsize():
            self.kernel.io_loop.add_callback(lambda: None)  # wake the loop once the cell ends

    def _msg_type(self, item: Any) -> str | None:
        """The shell message's type, read from its header frame without deserializing it
        (which would record its signature: the real dispatch would then refuse it)."""
        try:
            _, dispatch, args = item
            if dispatch != self.kernel.dispatch_shell:
                return None
            _, frames = self.kernel.session.feed_identities(args[0], copy=False)
            header = frames[1]
            return json.loads(getattr(header, "bytes", header)).get("msg_type")
        except Exception:  # noqa: BLE001 - not one we can read: it keeps its turn
            return None

    def _handle(self, item: Any) -> None:
        """Dispatch one comm message now, as the kernel's loop would have, then make the
        cell the parent again (dispatching made the message the parent of all output)."""
        kernel = self.kernel
        parent = kernel.get_parent("shell")
        ident = getattr(kernel, "_parent_ident", {}).get("shell", b"")
        _, dispatch, args = item
        step = dispatch(*args)
        try:
            step.send(None)  # a comm message's handler is synchronous: this runs it through
        except StopIteration:
            pass
        else:
            step.close()
            _logger.warning("a comm message's handler awaited something; it was dropped")
        finally:
            kernel.set_parent(ident, parent, "shell")
