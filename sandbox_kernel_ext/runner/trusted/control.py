"""The control channel between a sandboxed Python child and the trusted side: JSON lines on a unix
stream socket (the child's fd 3), with descriptors passed back for approved opens.

The child speaks first and the parent only answers, so nothing the child writes can grant
anything: its frames are requests (open, commit), reports (usage, variables), or malformed,
and a malformed frame ends the run with the reason. Ids must increase and commit handles are
the parent's own single-use random tokens, so replays and forgeries are refused by shape.

Child -> parent: {"type": "open", "id": n, "path": host path, "flags": os flags}
                 {"type": "commit", "id": n, "handle": h}
                 {"type": "usage", "tokens": int, "cost": float}
                 {"type": "variables", "values": {...}}       (once, at the end)
Parent -> child: {"type": "reply", "id": n, "ok": bool, "handle": h|null, "errno": int,
                 "error": str} (+ the descriptor, for an open that was granted)
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
from .gated_files import GatedFiles

__all__ = ["ControlChannel", "MalformedFrame", "MAX_FRAME_BYTES", "MAX_TOKENS_PER_REPORT"]

_logger = logging.getLogger(__name__)

MAX_FRAME_BYTES = 64 * 1024  # any frame but the variables one
MAX_TOKENS_PER_REPORT = 10**12
MAX_COST_PER_REPORT = 10.0**9
MAX_PENDING_REQUESTS = 16


class MalformedFrame(ValueError):
    """The child broke the protocol: the run ends with this as the reason."""


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
    ) -> None:
        self._sock = sock
        self._files = files
        self._on_usage = on_usage
        self._on_malformed = on_malformed
        self._buffer = bytearray()
        self._last_id = 0
        self._broken: str | None = None
        self.variables: dict[str, Any] | None = None
        self._requests: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._closed = threading.Event()

    @property
    def broken(self) -> str | None:
        return self._broken

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
                    if len(self._buffer) > MAX_VARIABLES_BYTES + 1024:
                        raise MalformedFrame(f"a control frame is over {MAX_VARIABLES_BYTES + 1024} "
                                             "bytes")
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
        if kind != "variables" and len(line) > MAX_FRAME_BYTES:
            raise MalformedFrame(f"a {kind!r} frame is over {MAX_FRAME_BYTES} bytes")
        if kind == "usage":
            self._usage(frame)
        elif kind == "variables":
            self._variables(frame)
        elif kind in ("open", "commit"):
            self._request(frame)
        else:
            raise MalformedFrame(f"unknown frame type {str(kind)[:40]!r}")

    def _usage(self, frame: dict[str, Any]) -> None:
        tokens, cost = frame.get("tokens", 0), frame.get("cost", 0.0)
        if (set(frame) - {"type", "tokens", "cost"} or isinstance(tokens, bool)
                or not isinstance(tokens, int) or not 0 <= tokens <= MAX_TOKENS_PER_REPORT
                or isinstance(cost, bool) or not isinstance(cost, (int, float))
                or not math.isfinite(cost) or not 0 <= cost <= MAX_COST_PER_REPORT):
            raise MalformedFrame("a usage report needs tokens (a whole number from 0) and cost "
                                 "(a finite number from 0)")
        self._on_usage(tokens, float(cost))

    def _variables(self, frame: dict[str, Any]) -> None:
        if self.variables is not None:
            raise MalformedFrame("output variables sent twice")
        values = frame.get("values")
        if set(frame) != {"type", "values"} or not isinstance(values, dict):
            raise MalformedFrame("a variables frame needs one object of values")
        try:
            self.variables = {str(name): decode_value(value) for name, value in values.items()}
        except (ValueError, RecursionError, MemoryError) as exc:
            raise MalformedFrame(f"bad output variables: {type(exc).__name__}") from None

    def _request(self, frame: dict[str, Any]) -> None:
        request_id = frame.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            raise MalformedFrame("a request needs a whole-number id")
        if request_id <= self._last_id:
            raise MalformedFrame(f"request id {request_id} is not larger than the last one")
        self._last_id = request_id
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
