"""The control channel between a sandboxed Python child and the trusted side: JSON lines on a unix
stream socket (the child's fd 3), with descriptors passed back for approved opens.

The child speaks first and the parent only answers, so nothing the child writes can grant
anything: its frames are requests (open, commit), reports (usage, variables), or malformed,
and a malformed frame ends the run with the reason. Ids must increase and commit handles are
the parent's own single-use random tokens, so replays and forgeries are refused by shape.

Child -> parent: {"type": "open", "id": n, "path": host path, "flags": os flags}
                 {"type": "commit", "id": n, "handle": h}
                 {"type": "input", "id": n, "prompt": str, "password": bool}
                 {"type": "usage", "tokens": int, "cost": float}
                 {"type": "variables", "values": {...}}       (once, at the end of a run)
  in a session:  {"type": "display", "data": {...}, "metadata": {...}, "display_id": str|null,
                  "update": bool}, {"type": "clear_output", "wait": bool},
                 {"type": "result", "data": {...}, "metadata": {...}}   (once per cell)
                 {"type": "done", "cell": n, "status": "ok"|"error", "values": {...},
                  "error": {...}|null}                                    (ends a cell)
Parent -> child: {"type": "reply", "id": n, "ok": bool, "handle": h|null, "errno": int,
                 "error": str, "value": str} (+ the descriptor, for an open that was granted)
  in a session:  {"type": "run", "cell": n, "code": str, "inputs": base64 pickle,
                  "outputs": [names]}

Only the output variables the caller named cross (`CellEvents.outputs`); any other name a
frame carries is dropped. Displays are checked and made safe here (`display.py`); the text of
prompts and variables by `crossing_text.py`'s rules, before any callback or caller sees it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

from ..wire import MAX_VARIABLES_BYTES, decode_value
from .array_values import decode_array_value
from .crossing_text import prompt_line, variable_value
from .display import (
    MAX_BUNDLE_BYTES,
    DisplayOutput,
    bundle_size,
    check_bundle,
    format_error,
    namespaced_display_id,
    safe_bundle,
)
from .gated_files import GatedFiles

__all__ = ["CellEvents", "ControlChannel", "MalformedFrame", "MAX_FRAME_BYTES",
           "MAX_TOKENS_PER_REPORT"]

_logger = logging.getLogger(__name__)

MAX_FRAME_BYTES = 64 * 1024  # any frame but the variables one
MAX_TOKENS_PER_REPORT = 10**12
MAX_COST_PER_REPORT = 10.0**9
MAX_PENDING_REQUESTS = 16
MAX_DISPLAY_BYTES_PER_CELL = 64 * 1024 * 1024  # beyond it, a cell's displays are dropped
SEND_TIMEOUT = 2.0  # the most a send may wait for the child to read (it asked: it reads)
# The largest frame of each kind: the variables with their envelope, one display's bundle.
_FRAME_CAPS = {"variables": MAX_VARIABLES_BYTES + MAX_FRAME_BYTES,
               "done": MAX_VARIABLES_BYTES + MAX_FRAME_BYTES,
               "display": MAX_BUNDLE_BYTES + MAX_FRAME_BYTES,
               "result": MAX_BUNDLE_BYTES + MAX_FRAME_BYTES}
_LINE_CAP = max(_FRAME_CAPS.values()) + 1024
# (prompt, password) -> the answer; EOFError: none. The prompt is one line, cleaned, after
# the "[sandbox] " marker (`crossing_text.prompt_line`): show it as it is.
InputCallback = Callable[[str, bool], str]


class MalformedFrame(ValueError):
    """The child broke the protocol: the run ends with this as the reason."""


class CellEvents:
    """One cell's side of the channel: which output variables may cross, where its displays
    and input requests go, and what it left (displays in order, variables, error, done).
    `session` names the display-id space the cell's displays live in."""

    def __init__(self, outputs: Any = (), *, on_display: Callable[[DisplayOutput], None] | None = None,
                 on_input: InputCallback | None = None, session: str = "", cell: int = 0) -> None:
        self.outputs = frozenset(outputs)
        self.on_display = on_display
        self.on_input = on_input
        self.session = session
        self.cell = cell
        self.displays: list[DisplayOutput] = []
        self.display_bytes = 0
        self.dropped_displays = 0
        self.variables: dict[str, Any] | None = None
        self.error: tuple[str, str, list[str]] | None = None
        self.has_result = False
        self.done = threading.Event()


def _number_within(value: Any, high: float, *, whole: bool = False) -> bool:
    """A JSON number from 0 to `high`, compared without conversion: JSON integers have no
    size limit, and turning a 400-digit one into a float raises OverflowError."""
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return 0 <= value <= high


class ControlChannel:
    """The parent's end for one run. `feed()` takes bytes from the socket (the manager's
    pump reads it with the output pipes); requests that may wait for a person run on one
    worker thread in order, so the pump never blocks on an approval.

    `on_usage(tokens, cost)` counts model spend; `on_malformed(reason)` ends the run."""

    def __init__(
        self,
        sock: socket.socket,
        files: GatedFiles | None,
        *,
        on_usage: Callable[[int, float], None],
        on_malformed: Callable[[str], None],
        events: CellEvents | None = None,
    ) -> None:
        self._sock = sock
        sock.settimeout(SEND_TIMEOUT)  # sends only: the pump reads when select says so
        self.events = events if events is not None else CellEvents()
        self._files = files
        self._on_usage = on_usage
        self._on_malformed = on_malformed
        self._buffer = bytearray()
        self._last_id = 0
        self._broken: str | None = None
        self._requests: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._closed = threading.Event()

    @property
    def broken(self) -> str | None:
        return self._broken

    @property
    def variables(self) -> dict[str, Any] | None:
        """The current cell's output variables (only the names it was asked for)."""
        return self.events.variables

    def fileno(self) -> int:
        return self._sock.fileno()

    # -- from the child --------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self._broken is not None:
            return
        self._buffer += data
        try:
            while True:
                end = self._buffer.find(b"\n")
                if end < 0:
                    if len(self._buffer) > _LINE_CAP:
                        raise MalformedFrame(f"a control frame is over {_LINE_CAP} bytes")
                    return
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._handle(line)
        except MalformedFrame as exc:
            self._break(str(exc))

    def finish(self) -> None:
        """End of the child's output: a partial last frame is a broken one."""
        if self._buffer and self._broken is None:
            self._break("the last control frame is incomplete")

    def _break(self, reason: str) -> None:
        self._broken = reason
        self._buffer.clear()
        self._on_malformed(f"the sandbox broke its control protocol ({reason})")

    def _handle(self, line: bytes) -> None:
        try:
            frame = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise MalformedFrame(f"not JSON: {type(exc).__name__}") from None
        if not isinstance(frame, dict):
            raise MalformedFrame("a frame must be a JSON object")
        kind = frame.get("type")
        cap = _FRAME_CAPS.get(kind, MAX_FRAME_BYTES) if isinstance(kind, str) else MAX_FRAME_BYTES
        if len(line) > cap:
            raise MalformedFrame(f"a {str(kind)[:40]!r} frame is over {cap} bytes")
        if kind == "usage":
            self._usage(frame)
        elif kind == "variables":
            self._variables(frame)
        elif kind in ("open", "commit"):
            self._request(frame)
        elif kind == "input":
            self._input(frame)
        elif kind in ("display", "result", "clear_output"):
            self._display(frame, len(line))
        elif kind == "done":
            self._done(frame)
        else:
            raise MalformedFrame(f"unknown frame type {str(kind)[:40]!r}")

    def _usage(self, frame: dict[str, Any]) -> None:
        tokens, cost = frame.get("tokens", 0), frame.get("cost", 0.0)
        if (set(frame) - {"type", "tokens", "cost"}
                or not _number_within(tokens, MAX_TOKENS_PER_REPORT, whole=True)
                or not _number_within(cost, MAX_COST_PER_REPORT)):
            raise MalformedFrame("a usage report needs tokens (a whole number from 0) and cost "
                                 "(a finite number from 0)")
        self._on_usage(tokens, float(cost))

    def _variables(self, frame: dict[str, Any]) -> None:
        if self.events.variables is not None:
            raise MalformedFrame("output variables sent twice")
        values = frame.get("values")
        if set(frame) != {"type", "values"} or not isinstance(values, dict):
            raise MalformedFrame("a variables frame needs one object of values")
        self.events.variables = self._asked_for(values)

    def _asked_for(self, values: dict[str, Any]) -> dict[str, Any]:
        """The values of the names the caller asked for; any other name is dropped here, so
        a cell can never set a variable nobody asked it for. Their strings are made
        encodable here (`variable_value`), for every caller: the notebook, `run_python`."""
        try:
            return {name: variable_value(decode_value(value, decode_array_value))
                    for name, value in values.items() if name in self.events.outputs}
        except (ValueError, RecursionError, MemoryError) as exc:
            raise MalformedFrame(f"bad output variables: {type(exc).__name__}") from None

    def _display(self, frame: dict[str, Any], size: int) -> None:
        events = self.events
        kind = frame["type"]
        try:
            if kind == "clear_output":
                if set(frame) != {"type", "wait"} or not isinstance(frame["wait"], bool):
                    raise ValueError("clear_output needs wait (true or false)")
                output = DisplayOutput("clear", wait=frame["wait"])
            else:
                expected = ({"type", "data", "metadata"} if kind == "result"
                            else {"type", "data", "metadata", "display_id", "update"})
                if set(frame) != expected:
                    raise ValueError(f"a {kind} frame has the fields {sorted(expected)}")
                if kind == "result" and events.has_result:
                    raise ValueError("a cell has one result")
                data, metadata = safe_bundle(*check_bundle(frame["data"], frame["metadata"]))
                if kind == "result":
                    events.has_result = True
                    output = DisplayOutput("result", data, metadata)
                else:
                    update = frame["update"]
                    if not isinstance(update, bool):
                        raise ValueError("update must be true or false")
                    display_id = namespaced_display_id(events.session, frame["display_id"])
                    if update and display_id is None:
                        raise ValueError("an update names the display it updates")
                    output = DisplayOutput("update" if update else "display", data, metadata,
                                           display_id)
        except ValueError as exc:
            raise MalformedFrame(str(exc)) from None
        # Counted as made safe: escaping can make a bundle several times the frame it came in.
        size = max(size, bundle_size(output.data))
        if events.display_bytes + size > MAX_DISPLAY_BYTES_PER_CELL:
            events.dropped_displays += 1
            return
        events.display_bytes += size
        events.displays.append(output)
        if events.on_display is not None:
            events.on_display(output)

    def _done(self, frame: dict[str, Any]) -> None:
        events = self.events
        if events.done.is_set():
            raise MalformedFrame("a cell ended twice")
        values, error, status = frame.get("values"), frame.get("error"), frame.get("status")
        if (set(frame) != {"type", "cell", "status", "values", "error"}
                or frame.get("cell") != events.cell or status not in ("ok", "error")
                or not isinstance(values, dict) or (error is None) != (status == "ok")):
            raise MalformedFrame("a done frame needs this cell's number, a status, values and "
                                 "an error report exactly when the status is error")
        events.variables = self._asked_for(values)
        if error is not None:
            try:
                events.error = format_error(error)
            except ValueError as exc:
                raise MalformedFrame(f"bad error report: {exc}") from None
        events.done.set()

    def _input(self, frame: dict[str, Any]) -> None:
        """input() in the cell: asked here, on the pump's thread (a notebook's stdin channel
        belongs to the kernel's main thread), while the cell waits for the answer."""
        self._check_id(frame)
        prompt, password = frame.get("prompt"), frame.get("password")
        if (set(frame) != {"type", "id", "prompt", "password"} or not isinstance(prompt, str)
                or len(prompt) > 4096 or not isinstance(password, bool)):
            raise MalformedFrame("an input request needs prompt (text) and password (true or "
                                 "false)")
        reply: dict[str, Any] = {"type": "reply", "id": frame["id"], "ok": False, "handle": None}
        on_input = self.events.on_input
        try:
            if on_input is None:
                raise EOFError("input() has no one to answer it: this run has no input "
                               "callback (pass on_input to ask a person)")
            value = on_input(prompt_line(prompt), password)
            if not isinstance(value, str):
                raise EOFError("the answer to input() was not text")
            reply.update(ok=True, value=value)
        except EOFError as exc:
            reply.update(error=str(exc) or "end of input")
        self._reply(reply, None)

    def _check_id(self, frame: dict[str, Any]) -> None:
        request_id = frame.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            raise MalformedFrame("a request needs a whole-number id")
        if request_id <= self._last_id:
            raise MalformedFrame(f"request id {request_id} is not larger than the last one")
        self._last_id = request_id

    def send_command(self, command: dict[str, Any]) -> None:
        """A command to the session (the trusted side speaks first only here)."""
        data = (json.dumps(command) + "\n").encode()
        with self._send_lock:
            if self._closed.is_set():
                raise OSError("the control channel is closed")
            self._sock.sendall(data)

    def _request(self, frame: dict[str, Any]) -> None:
        self._check_id(frame)
        if frame["type"] == "open":
            if (set(frame) != {"type", "id", "path", "flags"} or not isinstance(frame["path"], str)
                    or isinstance(frame["flags"], bool) or not isinstance(frame["flags"], int)):
                raise MalformedFrame("an open request needs path (text) and flags (a number)")
        else:
            handle = frame.get("handle")
            if set(frame) != {"type", "id", "handle"} or not isinstance(handle, str):
                raise MalformedFrame("a commit request needs a handle")
            if self._files is None or not self._files.knows(handle):
                raise MalformedFrame("commit of a handle this run never gave out")
        if self._requests.qsize() >= MAX_PENDING_REQUESTS:
            raise MalformedFrame(f"more than {MAX_PENDING_REQUESTS} requests waiting")
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="sandbox-control",
                                            daemon=True)
            self._worker.start()
        self._requests.put(frame)

    # -- answers ---------------------------------------------------------------------------
    def _work(self) -> None:
        while (frame := self._requests.get()) is not None:
            if self._closed.is_set():
                continue
            reply, fd = self._answer(frame)
            try:
                self._reply(reply, fd)
            finally:
                if fd is not None:
                    os.close(fd)

    def _answer(self, frame: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        reply: dict[str, Any] = {"type": "reply", "id": frame["id"], "ok": False, "handle": None}
        try:
            if self._files is None:
                raise PermissionError(1, "this policy has no approval-gated paths")
            if frame["type"] == "open":
                answer = self._files.open(frame["path"], frame["flags"])
                reply.update(ok=True, handle=answer.handle)
                return reply, answer.fd
            reply.update(ok=True, summary=self._files.commit(frame["handle"]))
        except OSError as exc:
            reply.update(errno=exc.errno or 13, error=exc.strerror or str(exc))
        except Exception as exc:  # never let one request take the channel down
            _logger.exception("sandbox control request failed")
            reply.update(errno=5, error=f"{type(exc).__name__}: {exc}")
        return reply, None

    def _reply(self, reply: dict[str, Any], fd: int | None) -> None:
        data = (json.dumps(reply) + "\n").encode()
        with self._send_lock:
            if self._closed.is_set():
                return
            try:
                if fd is None:
                    self._sock.sendall(data)
                else:
                    socket.send_fds(self._sock, [data], [fd])
            except TimeoutError:
                # A child that asks and does not read would hold this thread (the kernel's
                # main thread, for input()) for ever: that is a broken protocol.
                self._break(f"it stopped reading its control channel for {SEND_TIMEOUT:g} s")
            except OSError:
                pass  # the child is gone; close() discards what it left staged

    def close(self) -> None:
        """The run is over: no more answers; staged writes not committed are discarded. A
        worker still waiting for a person finishes on its own, and its answer goes nowhere."""
        with self._send_lock:
            self._closed.set()
        self._requests.put(None)
        if self._files is not None:
            self._files.close()
        self._sock.close()
