"""Running a Python cell, in the confined child after its confinement is in place.

The cell and its input variables arrive pickled on a memfd written by the trusted side (so
unpickling them here is safe, and they never sit in the launcher's memory, where a later
child could find them). Output variables go back as JSON only (`wire.encode_value`): the
trusted side never unpickles anything a sandboxed process wrote.
"""

from __future__ import annotations

import builtins
import io
import json
import linecache
import os
import pickle
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any

from .array_values import encode_array_value
from ..wire import CONTROL_FD, MAX_VARIABLES_BYTES, PAYLOAD_FD, ChildPlan, encode_value, read_to_end
from . import inside

__all__ = ["run_cell", "begin", "open_streams", "output_values", "CELL_FILENAME"]

CELL_FILENAME = "<sandbox-cell>"
# This package's code in the child: never a frame of a traceback a cell shows.
OWN_FILES = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _stream(fd: int, mode: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, mode, closefd=False)
    buffered = io.BufferedWriter(raw) if "w" in mode else io.BufferedReader(raw)
    return io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace",
                            write_through=True, line_buffering="w" in mode)


def open_streams() -> None:
    """sys.stdin/stdout/stderr on the child's descriptors 0-2: UTF-8, unbuffered writes."""
    sys.stdin, sys.stdout, sys.stderr = _stream(0, "r"), _stream(1, "w"), _stream(2, "w")


def output_values(namespace: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
    """The cell's output variables as JSON-safe data, within the size the trusted side takes."""
    if not outputs:
        return {}
    missing = [name for name in outputs if name not in namespace]
    if missing:
        raise NameError(f"output variable(s) not defined by the cell: {', '.join(missing)}")
    values = {name: encode_value(namespace[name], name, other=encode_array_value)
              for name in outputs}
    size = len(json.dumps(values))
    if size > MAX_VARIABLES_BYTES:
        raise ValueError(
            f"output variables are {size} bytes as JSON; the cap is {MAX_VARIABLES_BYTES} "
            "(write large results to a file in a writable root instead)"
        )
    return values


def begin(plan: ChildPlan, streams: Callable[[], None] = open_streams
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a Python child does first, a one-shot cell or a session: its streams, its
    environment, the payload from the trusted side, the `inside` hooks, and a real
    `__main__` module (so functions defined in a cell pickle, for multiprocessing). Returns
    (the payload, the namespace cells run in)."""
    streams()
    os.environ.clear()
    os.environ.update(plan.env)
    payload = pickle.loads(read_to_end(PAYLOAD_FD))
    inside.install(CONTROL_FD, {**(payload.get("policy") or {}), "closed": plan.closed_folders})
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return payload, main.__dict__


def run_cell(plan: ChildPlan) -> int:
    """Run the cell; return the exit code (0, 1 after an exception, or SystemExit's code)."""
    payload, namespace = begin(plan)
    code_text: str = payload["code"]
    sys.argv = [CELL_FILENAME]
    namespace.update(pickle.loads(payload["inputs"]))
    linecache.cache[CELL_FILENAME] = (len(code_text), None, code_text.splitlines(True), CELL_FILENAME)
    exit_code = 0
    try:
        exec(compile(code_text, CELL_FILENAME, "exec"), namespace)  # noqa: S102 - confined
        try:
            values = output_values(namespace, list(payload.get("outputs", ())))
            unwritten = inside.finish()
        except (TypeError, ValueError, NameError) as exc:  # ours to say, in one line
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return _flushed(1)
        if unwritten:
            raise PermissionError("; ".join(unwritten) + " (the file was never closed by the "
                                  "cell, so this could not be raised where it was written)")
        inside.send_frame({"type": "variables", "values": values})
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the cell's own error, shown like Python shows it
        exc_type, exc, tb = sys.exc_info()
        report = traceback.TracebackException(exc_type, exc, tb)
        report.stack = traceback.StackSummary.from_list(  # the cell's frames, not ours
            [frame for frame in report.stack if not frame.filename.startswith(OWN_FILES)])
        print("".join(report.format()), end="", file=sys.stderr)
        exit_code = 1
    return _flushed(exit_code)


def _flushed(exit_code: int) -> int:
    flush_streams()
    return exit_code


def flush_streams() -> None:
    """Write out what the cell printed (a stream the cell broke is left as it is)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
