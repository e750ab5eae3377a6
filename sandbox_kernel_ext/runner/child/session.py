"""A confined Python session: cells run one after another in one namespace, like a kernel's.

Runs in the confined child, after its confinement is in place (`bootstrap.py`). The trusted
side sends `{"type": "run", ...}` commands over the control channel; each cell's output goes
to the stdout/stderr pipes, its displays and last expression's value go back as frames
(`display.py`), and it ends with a `done` frame. A SIGINT from the trusted side raises
KeyboardInterrupt in the running cell and leaves the namespace as it is.

Child -> trusted, per cell: {"type": "display", ...}, {"type": "clear_output", "wait": b},
  {"type": "result", "data": {...}, "metadata": {...}}  (the last expression's value)
  {"type": "done", "cell": n, "status": "ok"|"error", "values": {...}, "error": {...}|null}
"""

from __future__ import annotations

import ast
import base64
import fcntl
import io
import linecache
import os
import pickle
import re
import signal
import struct
import sys
import termios
import threading
import time
import traceback
from typing import Any

from ..wire import CONTROL_FD, ChildPlan
from . import display, inside
from .cell import OWN_FILES, begin, flush_streams, output_values

__all__ = ["run_session", "cell_filename"]

_CELL_NAME = re.compile(r"<sandbox-cell-(\d+)>\Z")
# Frames never shown besides ours (`cell.OWN_FILES`): what timing a statement runs it through
# (`%timeit`'s generated function), and the parser.
_MACHINERY = frozenset({os.path.join(os.path.dirname(ast.__file__), "timeit.py"),  # unloaded
                        "<timeit-src>", ast.__file__})
_CONTEXT = 2  # source lines shown before and after a traceback's line
_MAX_FRAMES = 40


def cell_filename(number: int) -> str:
    """The name a cell's code is compiled under: tracebacks point at `Cell In[n]`."""
    return f"<sandbox-cell-{number}>"


FLUSH_INTERVAL = 0.05  # the most printed text waits before the trusted side sees it


class _SessionStream(io.TextIOWrapper):
    """stdout/stderr of a session: written at each line's end (so a line stays before what a
    subprocess prints after it), flushed before every frame (text stays before the display
    it preceded) and, for a line not yet ended, by a flusher thread within FLUSH_INTERVAL."""

    def write(self, text: str) -> int:
        written = super().write(text)
        _flusher.wake()
        return written


class _Flusher:
    """One daemon thread, started by the first write of the session, that flushes the
    streams every FLUSH_INTERVAL while they are written to, and parks after a second
    without writes (a write then wakes it; while it runs, writes wake nothing)."""

    IDLE_ROUNDS = 20

    def __init__(self) -> None:
        self._wanted = threading.Event()
        self._dirty = False
        self._parked = True
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._dirty = True
        if self._parked:
            self._parked = False
            self._wanted.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sandbox-flush",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        idle = 0
        while True:
            if idle >= self.IDLE_ROUNDS:
                self._wanted.clear()
                self._parked = True
                if not self._dirty:  # a write between the two lines above is not lost
                    self._wanted.wait()
                self._parked = False
                idle = 0
            time.sleep(FLUSH_INTERVAL)
            if self._dirty:
                self._dirty = False
                flush_streams()
                idle = 0
            else:
                idle += 1


_flusher = _Flusher()


def _open_streams() -> None:
    def stream(fd: int) -> io.TextIOWrapper:
        raw = io.BufferedWriter(io.FileIO(fd, "w", closefd=False), buffer_size=1 << 16)
        return _SessionStream(raw, encoding="utf-8", errors="backslashreplace",
                              line_buffering=True)

    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding="utf-8")
    sys.stdout, sys.stderr = stream(1), stream(2)


ORDER_WAIT = 0.5  # the most a display waits for the trusted side to read what it must


def _unread(fd: int, request: int) -> int:
    """Bytes written to `fd` that the trusted side has not read yet (FIONREAD of a pipe,
    TIOCOUTQ of a unix socket); 0 if the descriptor cannot say."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, request, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _read_by_trusted_side(*pending: tuple[int, int]) -> None:
    """Wait, at most ORDER_WAIT, until the trusted side has read what these hold (between
    cells nobody reads: then the display goes out of order rather than late)."""
    deadline, pause = 0.0, 0.0001
    while any(_unread(fd, request) for fd, request in pending):
        now = time.monotonic()
        if not deadline:
            deadline = now + ORDER_WAIT
        elif now >= deadline:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.005)


def _send_in_order(frame: dict[str, Any]) -> None:
    """A display's frame, in order with the text around it (the pipes and the socket are
    separate channels): the text printed before it (flushed already) has been read by the
    trusted side before the frame goes, and the frame has been read before the cell can
    write more. The trusted side reads them all on one thread, so it shows them in the order
    it read them."""
    _read_by_trusted_side((1, termios.FIONREAD), (2, termios.FIONREAD))
    inside.send_frame(frame)
    _read_by_trusted_side((CONTROL_FD, termios.TIOCOUTQ))


def run_session(plan: ChildPlan) -> int:
    """Serve cells until the trusted side hangs up; the exit code is 0."""
    _, namespace = begin(plan, _open_streams)
    namespace["get_ipython"] = _shell_for(namespace)
    namespace["Out"] = {}
    display.install(_send_in_order, flush_streams)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the stop button
    sys.argv = [""]
    while True:
        try:
            command = inside.next_command()
        except KeyboardInterrupt:
            continue  # an interrupt between cells has nothing to stop
        if command is None or command.get("type") != "run":
            return 0
        try:
            _run(command, namespace)
        except KeyboardInterrupt:  # arrived after the cell ended: its done frame went out
            pass


def _shell_for(namespace: dict[str, Any]) -> Any:
    """The cells' `get_ipython()`: what IPython's syntax turns into calls on (a cell the
    kernel's IPython transformed), loaded by the first cell that uses it."""
    made: list[Any] = []

    def get_ipython() -> Any:
        if not made:
            from .ipython_syntax import ChildShell

            made.append(ChildShell(namespace))
        return made[0]

    return get_ipython


def _run(command: dict[str, Any], namespace: dict[str, Any]) -> None:
    number = int(command.get("cell", 0))
    code: str = command.get("code", "")
    outputs: list[str] = list(command.get("outputs") or ())
    filename = cell_filename(number)
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    values: dict[str, Any] = {}
    error = None
    try:
        if command.get("inputs"):
            namespace.update(pickle.loads(base64.b64decode(command["inputs"])))
        _execute(code, filename, namespace, number)
        display.flush_figures()
        values = output_values(namespace, outputs)
        unwritten = inside.finish()
        if unwritten:
            raise PermissionError("; ".join(unwritten) + " (the file was never closed by the "
                                  "cell, so this could not be raised where it was written)")
    except SystemExit as exc:  # ends the cell, not the session, as in a kernel
        if exc.code not in (None, 0):
            error = error_report(exc)
    except BaseException as exc:  # noqa: BLE001 - the cell's error, shown as a kernel shows it
        error = error_report(exc)
        try:
            display.flush_figures()
        except BaseException:  # noqa: BLE001
            pass
    # An interrupt that comes as the cell ends waits until its end is sent (else the trusted
    # side would wait for it, and end the session); it then finds no cell to stop.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        flush_streams()
        inside.send_frame({"type": "done", "cell": number, "status": "error" if error else "ok",
                           "values": values, "error": error})
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _execute(code: str, filename: str, namespace: dict[str, Any], number: int = 0) -> None:
    """Run the cell; the last expression's value is shown, as a kernel shows `Out[n]`, and
    kept as one keeps it: `_`, `__`, `___`, `Out[n]`, `_n`."""
    tree = ast.parse(code, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 - confined
    if last is None:
        return
    expression = ast.Expression(last.value)
    ast.copy_location(expression, last)
    value = eval(compile(expression, filename, "eval"), namespace)  # noqa: S307 - confined
    if value is None:
        return
    namespace["___"], namespace["__"] = namespace.get("__", ""), namespace.get("_", "")
    namespace["_"] = value
    if isinstance(namespace.get("Out"), dict):
        namespace["Out"][number] = value
    namespace[f"_{number}"] = value
    data, metadata = display.mime_bundle(value)
    data = display.markdown_as_html(data)  # in the cell's time, not the kernel's
    flush_streams()
    inside.send_frame({"type": "result", "data": display.json_safe(data),
                       "metadata": display.json_safe(metadata)})


def error_report(exc: BaseException) -> dict[str, Any]:
    """The error as data: its type, message and frames (cell number or file, line, source
    around it). The trusted side formats it; nothing here is taken as text to show."""
    try:
        evalue = str(exc)
    except Exception:  # noqa: BLE001
        evalue = "<the exception's message could not be made>"
    frames = []
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        if filename.startswith(OWN_FILES) or filename in _MACHINERY:
            continue  # ours and the timing machinery: the traceback shows the cell's code
        frames.append(_frame(filename, lineno or 0, frame.f_code.co_name))
    if isinstance(exc, SyntaxError):
        frames = [_frame(exc.filename, exc.lineno or 0, None)] if exc.filename else []
    elif type(exc).__name__ == "UsageError" and type(exc).__module__.endswith("ipython_syntax"):
        frames = []  # a magic used wrongly, or one a sandbox cannot run: one line, as IPython
    return {"ename": type(exc).__name__, "evalue": evalue, "frames": frames[-_MAX_FRAMES:]}


def _frame(filename: str, lineno: int, name: str | None) -> dict[str, Any]:
    match = _CELL_NAME.match(filename)
    lines = []
    for number in range(max(1, lineno - _CONTEXT), lineno + _CONTEXT + 1):
        text = linecache.getline(filename, number)
        if not text and number > lineno:
            break
        lines.append([number, text.rstrip("\n")[:500]])
    return {"cell": int(match.group(1)) if match else None, "filename": filename,
            "lineno": lineno, "name": name, "lines": lines}
