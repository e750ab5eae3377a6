"""Getting a widget's comm messages into a busy kernel, and output into the asking cell.

While a cell runs synchronously, ipykernel 7.4 queues every shell message for the main
shell behind it, so a click on a widget shown by that cell would arrive only after the cell
ends. ipykernel 7.4 runs each kernel subshell (JEP 91) on its own thread and, before it
forwards a `comm_msg`, asks the target comm where its reply belongs
(`comm._reply_subshell_for(data, default) -> subshell_id`, in
`Kernel.shell_channel_thread_main`). So the kernel itself can start a subshell and point a
widget's comms at it: the click is then handled on that thread whatever the main thread is
doing (blocked in a synchronous cell, awaiting in an async one, or idle), and whatever the
frontend's `commsOverSubshells` setting is, because the kernel decides the route.

What this relies on, all present in ipykernel 7.4.x and checked by `check_support`:
`kernel.shell_channel_thread` (its `io_loop` and `manager`), the subshell manager's
`_create_subshell` / `_delete_subshell` (they must run on the shell-channel thread), the
comm hook `_reply_subshell_for`, and the kernel's `_shell_parent` / `_shell_parent_ident`
context variables (to restore the cell as the default parent after a routed message).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_IPYKERNEL = (7, 4)  # the series whose private routing API this module uses


class RoutingUnavailable(RuntimeError):
    """This kernel cannot deliver widget messages while a cell is busy."""


def check_support(kernel: Any) -> None:
    """Raise RoutingUnavailable naming what is missing; return quietly if routing can work."""
    try:
        import ipykernel
        from ipykernel.comm.comm import BaseComm
    except ImportError as exc:
        raise RoutingUnavailable(f"ipykernel is not importable ({exc})") from None
    version = tuple(getattr(ipykernel, "version_info", ())[:2])
    if version != SUPPORTED_IPYKERNEL:
        raise RoutingUnavailable(
            f"ipykernel {ipykernel.__version__} is not the "
            f"{'.'.join(map(str, SUPPORTED_IPYKERNEL))}.x series whose subshell routing this "
            "extension uses; install ipykernel>=7.4,<7.5"
        )
    channel = getattr(kernel, "shell_channel_thread", None)
    if channel is None:
        raise RoutingUnavailable(
            f"{type(kernel).__name__} has no shell channel thread (kernel subshells are off, "
            "e.g. an in-process kernel)"
        )
    manager = getattr(channel, "_manager", None)
    missing = [
        name
        for name, present in (
            ("shell_channel_thread.io_loop", hasattr(channel, "io_loop")),
            ("shell_channel_thread.manager", manager is not None),
            ("SubshellManager._create_subshell", hasattr(manager, "_create_subshell")),
            ("SubshellManager._delete_subshell", hasattr(manager, "_delete_subshell")),
            ("BaseComm._reply_subshell_for", hasattr(BaseComm, "_reply_subshell_for")),
            ("Kernel._shell_parent", hasattr(kernel, "_shell_parent")),
            ("Kernel._shell_parent_ident", hasattr(kernel, "_shell_parent_ident")),
        )
        if not present
    ]
    if missing:
        raise RoutingUnavailable("this ipykernel lacks " + ", ".join(missing))


@dataclass(frozen=True)
class CellParent:
    """The request a cell is answering: where its output and its input prompts belong."""

    ident: Any
    message: dict[str, Any]
    thread_id: int = field(default_factory=threading.get_ident)

    @property
    def msg_id(self) -> str | None:
        return self.message.get("header", {}).get("msg_id")

    @property
    def allow_stdin(self) -> bool:
        """False when the client said nobody can answer (nbclient and papermill say so)."""
        content = self.message.get("content") or {}
        return bool(content.get("allow_stdin", True))

    @classmethod
    def of_current_context(cls, kernel: Any) -> CellParent:
        """The parent the kernel would use for output sent from the calling thread now."""
        # Runs on every cell (pre_run_cell): tolerate a kernel without these internals;
        # check_support reports them when routing is actually needed.
        ident_var = getattr(kernel, "_shell_parent_ident", None)
        lookup = getattr(kernel, "_get_shell_context_var", None)
        ident: Any = lookup(ident_var) if ident_var is not None and lookup is not None else b""
        return cls(ident=ident, message=kernel.get_parent("shell") or {})


class CellTracker:
    """Remembers which cell each thread is running, from IPython's run-cell events.

    A request made from a background thread (a sandbox's approval thread, a worker of
    `asyncio.to_thread`) belongs to the cell the kernel is running, not to whatever request
    the kernel saw last: a comm message handled meanwhile changes the latter.
    """

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel
        self._shell = kernel.shell
        self._lock = threading.Lock()
        self._running: dict[int, CellParent] = {}
        self._main_thread = threading.main_thread().ident
        self._shell.events.register("pre_run_cell", self._started)
        self._shell.events.register("post_run_cell", self._finished)

    def close(self) -> None:
        for event, callback in (("pre_run_cell", self._started), ("post_run_cell", self._finished)):
            with contextlib.suppress(ValueError):
                self._shell.events.unregister(event, callback)

    def _started(self, info: object = None) -> None:
        cell = CellParent.of_current_context(self._kernel)
        with self._lock:
            self._running[cell.thread_id] = cell

    def _finished(self, result: object = None) -> None:
        with self._lock:
            self._running.pop(threading.get_ident(), None)

    def current(self) -> CellParent:
        """The calling thread's own cell, else the main shell's running cell, else what the
        kernel would use as parent from this thread."""
        with self._lock:
            cell = self._running.get(threading.get_ident()) or self._running.get(self._main_thread)
        return cell if cell is not None else CellParent.of_current_context(self._kernel)

    def is_running(self, cell: CellParent) -> bool:
        with self._lock:
            return self._running.get(cell.thread_id) is cell


@contextlib.contextmanager
def output_to(shell: Any, cell: CellParent) -> Iterator[None]:
    """Send display and print output of the calling thread to `cell`, whichever thread
    this is (ZMQInteractiveShell.set_thread_parent, public since ipykernel 6.27)."""
    set_thread_parent = getattr(shell, "set_thread_parent", None)
    if set_thread_parent is None or not cell.message:
        yield
        return
    tokens = set_thread_parent(cell.message)
    try:
        yield
    finally:
        shell.reset_thread_parent(tokens)


def restore_default_parent(kernel: Any, cell: CellParent) -> None:
    """Make `cell` the kernel's default parent again after routed messages were handled.

    Handling a comm message on a subshell calls `kernel.set_parent(message)`, which also
    sets the *default* parent used by threads that never set their own; until the cell ends,
    their prints and displays would be addressed to the click. This undoes that, in a copied
    context so the calling thread's own parent is left alone.
    """
    if cell.message:
        contextvars.copy_context().run(kernel.set_parent, cell.ident, cell.message, "shell")


RouteActive = Callable[[], bool]


class SubshellRouter:
    """A subshell the kernel owns, on which routed widgets' comm messages are handled.

    Started on first use and kept for the session (one thread); `close()` deletes it.
    """

    def __init__(self, kernel: Any, *, start_timeout: float = 5.0) -> None:
        self._kernel = kernel
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._subshell_id: str | None = None

    @property
    def subshell_id(self) -> str | None:
        return self._subshell_id

    def start(self) -> str:
        """The subshell's id, creating it on the shell-channel thread if needed."""
        with self._lock:
            if self._subshell_id is None:
                check_support(self._kernel)
                manager = self._kernel.shell_channel_thread.manager
                try:
                    self._subshell_id = self._on_channel_thread(manager._create_subshell)
                except RoutingUnavailable:
                    raise
                except Exception as exc:
                    raise RoutingUnavailable(
                        f"the kernel could not start a subshell ({type(exc).__name__}: {exc})"
                    ) from exc
            return self._subshell_id

    def on_subshell_thread(self) -> bool:
        """True when called by the subshell's own thread, which cannot wait for itself."""
        subshell_id = self._subshell_id
        return subshell_id is not None and threading.current_thread().name == (
            f"subshell-{subshell_id}"
        )

    def route(self, comm: Any, active: RouteActive) -> None:
        """Handle `comm`'s incoming messages on the subshell while `active()` is true; after,
        on whichever shell the frontend addressed (the default route)."""
        subshell_id = self.start()

        def reply_subshell_for(data: object, default: str | None) -> str | None:
            # Called on the shell-channel thread for every comm_msg to this comm: keep it
            # cheap. After close() the subshell is gone, so never name it then.
            return subshell_id if self._subshell_id == subshell_id and active() else default

        comm._reply_subshell_for = reply_subshell_for

    def close(self) -> None:
        with self._lock:
            subshell_id, self._subshell_id = self._subshell_id, None
        if subshell_id is None:
            return
        manager = self._kernel.shell_channel_thread.manager
        with contextlib.suppress(Exception):  # the kernel may be shutting down already
            self._on_channel_thread(lambda: manager._delete_subshell(subshell_id))

    def _on_channel_thread(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the shell-channel thread (the subshell manager insists) and wait."""
        channel = self._kernel.shell_channel_thread
        if threading.current_thread() is channel:
            return fn()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the waiting thread
                done.set_exception(exc)

        channel.io_loop.add_callback(run)
        try:
            return done.result(timeout=self._start_timeout)
        except concurrent.futures.TimeoutError:
            raise RoutingUnavailable(
                f"the kernel's shell channel did not answer within {self._start_timeout:g} s"
            ) from None
