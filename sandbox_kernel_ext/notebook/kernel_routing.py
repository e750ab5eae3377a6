"""Getting a widget's comm messages into a busy kernel, and output into the asking cell.

`click_delivery` says which way a click can take on the running kernel: the route below
(ipykernel 7.4 and later), the frontend's own subshells (7.1 to 7.3), the asking cell's own
reading of the shell socket (6.x, `shell_pump.py`), or none (7.0).

While a cell runs synchronously, ipykernel 7.4 queues every shell message for the main
shell behind it, so a click on a widget shown by that cell would arrive only after the cell
ends. ipykernel 7.4 runs each kernel subshell (JEP 91) on its own thread and, before it
forwards a `comm_msg`, asks the target comm where its reply belongs
(`comm._reply_subshell_for(data, default) -> subshell_id`, in
`Kernel.shell_channel_thread_main`). So the kernel itself can start a subshell and point a
widget's comms at it: the click is then handled on that thread whatever the main thread is
doing (blocked in a synchronous cell, awaiting in an async one, or idle), and whatever the
frontend's `commsOverSubshells` setting is, because the kernel decides the route.

What this relies on, present from ipykernel 7.4 on and checked by `check_support`:
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

ROUTING_SINCE = (7, 4)  # the first ipykernel whose comms can name their reply's subshell


class RoutingUnavailable(RuntimeError):
    """This kernel cannot deliver widget messages while a cell is busy."""


def ipykernel_version() -> tuple[int, ...]:
    """The running ipykernel's (major, minor), () if it is not importable."""
    try:
        import ipykernel
    except ImportError:
        return ()
    return tuple(getattr(ipykernel, "version_info", ())[:2])


def check_support(kernel: Any) -> None:
    """Raise RoutingUnavailable naming what is missing; return quietly if routing can work."""
    try:
        import ipykernel
        from ipykernel.comm.comm import BaseComm
    except ImportError as exc:
        raise RoutingUnavailable(f"ipykernel is not importable ({exc})") from None
    if ipykernel_version() < ROUTING_SINCE:
        raise RoutingUnavailable(
            f"ipykernel {ipykernel.__version__} cannot route a widget's messages to a subshell "
            f"(ipykernel {'.'.join(map(str, ROUTING_SINCE))} or later can)"
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
class ClickDelivery:
    """How a click on an approval widget reaches a cell that is busy waiting for it, on this
    kernel: "kernel" (the kernel routes the widget to a subshell of its own), "frontend"
    (only if the frontend sends comm messages over a subshell), "pump" (only when the cell
    asks on its own thread, which reads the shell socket while it waits: `shell_pump.py`),
    or "none" (it cannot: an approval is denied at once, saying why)."""

    route: str
    detail: str


def click_delivery(kernel: Any) -> ClickDelivery:
    """This kernel's `ClickDelivery`, judged from what it has (not from a list of versions)."""
    version = ".".join(map(str, ipykernel_version())) or "?"
    try:
        check_support(kernel)
    except RoutingUnavailable as exc:
        why = str(exc)
    else:
        return ClickDelivery("kernel", f"ipykernel {version} routes the widget's clicks to a "
                                       "subshell of its own: they reach a busy cell from any "
                                       "frontend")
    # 7.0 has subshells too, but its threads have no parent (`adopt_cell_parent`), and a
    # frontend's routing was not tried there: it is told it has none.
    if ipykernel_version() >= (7, 1) and getattr(kernel, "shell_channel_thread", None):
        return ClickDelivery(
            "frontend",
            f"ipykernel {version} handles comm messages on subshells: a click reaches a busy "
            "cell where the frontend sends it over one (JupyterLab 4.4 or later does, by "
            "default: commsOverSubshells); elsewhere the approval is denied when it times "
            f"out. ipykernel {'.'.join(map(str, ROUTING_SINCE))} or later needs no frontend's "
            "help")
    if ipykernel_version() < (7,) and hasattr(kernel, "msg_queue"):
        return ClickDelivery(
            "pump",
            f"ipykernel {version} queues a click behind the busy cell: a cell that asks on its "
            "own thread (a file toolset's call written in the cell) reads its widget's "
            "clicks while it waits, but an approval asked from another thread (every "
            "%%sandbox cell's, an agent's worker) is denied at once, saying why; ipykernel "
            f"{'.'.join(map(str, ROUTING_SINCE))} or later delivers every click (pip install "
            "-U ipykernel)")
    if ipykernel_version() >= ROUTING_SINCE:  # a kernel without subshells (in-process)
        return ClickDelivery("none", f"{why}: an approval asked while a cell runs is denied "
                                     "at once")
    return ClickDelivery(
        "none",
        f"ipykernel {version} queues a click behind the busy cell, so an approval asked while "
        "a cell runs is denied at once, saying why (answer it with a policy that does not "
        f"ask, or use ipykernel {'.'.join(map(str, ROUTING_SINCE))} or later: pip install -U "
        "ipykernel)")


def shell_click_delivery(shell: Any) -> ClickDelivery | None:
    """`click_delivery` of an IPython shell's kernel; None where it has none (a terminal)."""
    kernel = getattr(shell, "kernel", None)
    return None if kernel is None else click_delivery(kernel)


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
        try:
            if ident_var is not None and lookup is not None:
                ident: Any = lookup(ident_var)
            else:  # 6.x keeps it by channel; 7.0 in a context variable (where input() reads it)
                legacy = getattr(kernel, "_parent_ident", None)
                ident = (legacy.get("shell", b"") if isinstance(legacy, dict) else
                         ident_var.get() if ident_var is not None else b"")
            message = kernel.get_parent("shell") or {}
        except LookupError:  # ipykernel 7.0 leaves its variables unset outside a request
            ident, message = b"", {}
        return cls(ident=ident, message=message)


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
        self._last: CellParent | None = None  # the latest cell started, running or not
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
            self._last = cell

    def _finished(self, result: object = None) -> None:
        with self._lock:
            self._running.pop(threading.get_ident(), None)

    def current(self) -> CellParent:
        """The calling thread's own cell, else the main shell's running cell, else what the
        kernel would use as parent from this thread, else (a thread the kernel gives none,
        on ipykernel 7.0) the latest cell."""
        with self._lock:
            cell = self._running.get(threading.get_ident()) or self._running.get(self._main_thread)
            last = self._last
        if cell is not None:
            return cell
        cell = CellParent.of_current_context(self._kernel)
        return cell if cell.message or last is None else last

    def main_busy(self) -> bool:
        """Whether the main shell is running a cell (whose end a queued click waits for)."""
        with self._lock:
            return self._main_thread in self._running

    def is_running(self, cell: CellParent) -> bool:
        with self._lock:
            return self._running.get(cell.thread_id) is cell


@contextlib.contextmanager
def output_to(shell: Any, cell: CellParent) -> Iterator[None]:
    """Send display and print output of the calling thread to `cell`, whichever thread
    this is (ZMQInteractiveShell.set_thread_parent, ipykernel 7.4). On 6.x only prints are
    addressed per thread (`_stream_parents`): displays and comm messages follow the kernel's
    latest request, which is the waiting cell unless a click is being handled that moment.
    On 7.0-7.3 `adopt_cell_parent` and `restore_default_parent` keep the parent instead."""
    set_thread_parent = getattr(shell, "set_thread_parent", None)
    if not cell.message:
        yield
    elif set_thread_parent is not None:
        tokens = set_thread_parent(cell.message)
        try:
            yield
        finally:
            shell.reset_thread_parent(tokens)
    else:
        with _stream_parents(cell):
            yield


@contextlib.contextmanager
def _stream_parents(cell: CellParent) -> Iterator[None]:
    """ipykernel 6.x addresses a thread's prints to the cell that started the thread, for
    good: a thread that lives across cells (a session's, a pool's) printed an approval's
    note into an earlier cell. Its streams look first at a context variable of theirs,
    which is set here for the calling thread alone, then put back."""
    if ipykernel_version() >= (7,):
        yield
        return
    import sys

    from jupyter_client.session import extract_header

    header = extract_header(cell.message)
    tokens = []
    for stream in (sys.stdout, sys.stderr):
        variable = getattr(stream, "_parent_header", None)
        if isinstance(variable, contextvars.ContextVar):
            tokens.append((variable, variable.set(header)))
    try:
        yield
    finally:
        for variable, token in reversed(tokens):
            variable.reset(token)


def adopt_cell_parent(kernel: Any, cell: CellParent) -> None:
    """Give the calling thread `cell` as its parent where the kernel would not (7.0).

    ipykernel 7.0 keeps every parent (the kernel's, the shell's, its display publisher's and
    output streams') in context variables that a thread it did not start lacks, so every
    widget, display or comm message sent from such a thread (the approval widget from the
    runner's thread, the gauges from the monitor's) raised LookupError; and a thread that
    lives across cells (a session's) kept the first cell's. There, and only there,
    `set_parent` sets them in this thread's own context (7.0's streams also take it as the
    parent of threads that have none of their own: output nobody addressed)."""
    if (ipykernel_version() != (7, 0) or not cell.message
            or threading.current_thread() is threading.main_thread()):  # it has the kernel's
        return
    try:
        current = kernel.get_parent("shell") or {}
    except LookupError:
        current = {}
    if current.get("header", {}).get("msg_id") != cell.msg_id:
        kernel.set_parent(cell.ident, cell.message, "shell")


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
