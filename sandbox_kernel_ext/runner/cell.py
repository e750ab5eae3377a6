"""Running a Python cell inside the confined child, and the data that crosses back.

The cell and its input variables arrive pickled on a memfd written by the trusted side (so
unpickling them here is safe, and they never sit in the launcher's memory, where a later
child could find them). Output variables go back as JSON only: the parent never unpickles
anything a sandboxed process wrote.
"""

from __future__ import annotations

import base64
import builtins
import io
import json
import linecache
import os
import pickle
import sys
import traceback
import types
from typing import Any

from . import inside
from .child import ChildPlan

__all__ = ["run_cell", "encode_value", "decode_value", "CELL_FILENAME", "MAX_VARIABLES_BYTES"]

CELL_FILENAME = "<sandbox-cell>"
_BYTES_TAG = "__sandbox_bytes__"
# Output variables are parsed in the kernel: 4 MiB of JSON can cost ~100x that as Python
# objects in the worst case, so the cap stays small. Larger results belong in a file.
MAX_VARIABLES_BYTES = 4 * 1024 * 1024
_MAX_DEPTH = 64


def encode_value(value: Any, name: str, depth: int = 0) -> Any:
    """JSON-safe data: None, bool, int, float, str, bytes, lists/tuples and str-keyed dicts."""
    if depth > _MAX_DEPTH:
        raise TypeError(f"output variable {name!r} is nested more than {_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES_TAG: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [encode_value(item, name, depth + 1) for item in value]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"output variable {name!r} has a non-string key {key!r}")
            out[key] = encode_value(item, name, depth + 1)
        return out
    raise TypeError(
        f"output variable {name!r} is a {type(value).__name__}; only JSON-safe data "
        "(None, bool, numbers, str, bytes, lists and str-keyed dicts) leaves a sandbox"
    )


def decode_value(value: Any) -> Any:
    """The parent's side of `encode_value`: only the bytes tag means anything."""
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if isinstance(value, dict):
        if set(value) == {_BYTES_TAG} and isinstance(value[_BYTES_TAG], str):
            return base64.b64decode(value[_BYTES_TAG], validate=True)
        return {key: decode_value(item) for key, item in value.items()}
    return value


def _stream(fd: int, mode: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, mode, closefd=False)
    buffered = io.BufferedWriter(raw) if "w" in mode else io.BufferedReader(raw)
    return io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace",
                            write_through=True, line_buffering="w" in mode)


def run_cell(plan: ChildPlan) -> int:
    """Run the cell; return the exit code (0, 1 after an exception, or SystemExit's code)."""
    from .child import CONTROL_FD, PAYLOAD_FD, read_to_end

    sys.stdin, sys.stdout, sys.stderr = _stream(0, "r"), _stream(1, "w"), _stream(2, "w")
    os.environ.clear()
    os.environ.update(plan.env)
    payload = pickle.loads(read_to_end(PAYLOAD_FD))
    inside.install(CONTROL_FD, payload.get("policy") or {})
    code_text: str = payload["code"]
    sys.argv = [CELL_FILENAME]
    # A real __main__ module, so functions defined in the cell pickle (multiprocessing).
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    namespace: dict[str, Any] = main.__dict__
    namespace.update(pickle.loads(payload["inputs"]))
    linecache.cache[CELL_FILENAME] = (len(code_text), None, code_text.splitlines(True), CELL_FILENAME)
    exit_code = 0
    try:
        exec(compile(code_text, CELL_FILENAME, "exec"), namespace)  # noqa: S102 - confined
        values = {name: encode_value(namespace[name], name) for name in payload.get("outputs", ())
                  if name in namespace}
        missing = [name for name in payload.get("outputs", ()) if name not in namespace]
        if missing:
            raise NameError(f"output variable(s) not defined by the cell: {', '.join(missing)}")
        size = len(json.dumps(values))
        if size > MAX_VARIABLES_BYTES:
            raise ValueError(
                f"output variables are {size} bytes as JSON; the cap is {MAX_VARIABLES_BYTES} "
                "(write large results to a file in a writable root instead)"
            )
        unwritten = inside.finish()
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
        # Drop our own frame so the traceback starts in the cell.
        traceback.print_exception(exc_type, exc, tb.tb_next if tb else None, file=sys.stderr)
        exit_code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    return exit_code
