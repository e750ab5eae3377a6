"""Every frame a child sends on the control channel is hostile: whatever it sends, the
trusted side's call returns a result (killed, with the reason) or raises a SandboxError,
never anything else (issue 13, section 3).

The attack first, through a real confined child, then the decoder fuzzed with hypothesis:
arbitrary bytes and arbitrary JSON objects of every frame type, fed in arbitrary pieces.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager
from sandbox_kernel_ext.runner.trusted.control import CellEvents, ControlChannel

HUGE = "1" + "0" * 400  # a 401-digit integer: JSON allows it, a float cannot hold it


@pytest.mark.parametrize("frame", [
    f'{{"type": "usage", "tokens": 1, "cost": {HUGE}}}',
    f'{{"type": "usage", "tokens": {HUGE}, "cost": 0}}',
    '{"type": "usage", "tokens": 1, "cost": 1e400}',
    f'{{"type": "usage", "tokens": -{HUGE}, "cost": -{HUGE}}}',
])
def test_a_usage_frame_with_numbers_out_of_range_ends_the_run_with_a_reason(
    manager: SandboxManager, frame: str
) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    code = f"import os\nos.write(3, {(frame + chr(10)).encode()!r})\nx = 1"
    result = manager.run_python(sid, code, outputs=["x"])
    assert result.exit_code == -1 and result.variables == {}
    assert "broke its control protocol (a usage report needs" in (result.killed or "")


# -- the decoder, fuzzed ------------------------------------------------------------------------

_TYPES = ["usage", "variables", "open", "commit", "input", "display", "result",
          "clear_output", "done", "other", 7, None]
_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 500), max_value=10 ** 500)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_frames = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(_TYPES),
    st.dictionaries(st.sampled_from(["tokens", "cost", "values", "id", "data", "metadata",
                                     "display_id", "path", "mode", "prompt", "password",
                                     "ok", "error", "kind", "transient", "x"]), _json, max_size=5),
)


def _encode(frame: dict[str, Any]) -> bytes:
    # JSON has no NaN or Infinity; Python writes them anyway, as a child's json.dumps would.
    return json.dumps(frame).encode() + b"\n"


def _feed(pieces: list[bytes]) -> list[str]:
    """Feed `pieces` to a channel as the pump would; what it reported as malformed."""
    parent, child = socket.socketpair()
    crashed: list[BaseException] = []  # the channel's worker thread must not raise either
    previous_hook = threading.excepthook
    threading.excepthook = lambda args: crashed.append(args.exc_value)
    broken: list[str] = []
    usage: list[tuple[int, float]] = []
    channel = ControlChannel(parent, None, on_usage=lambda t, c: usage.append((t, c)),
                             on_malformed=broken.append, events=CellEvents())
    try:
        for piece in pieces:
            channel.feed(piece)  # must never raise
        channel.finish()
    finally:
        channel.close()
        parent.close()
        child.close()
        threading.excepthook = previous_hook
    assert crashed == []
    for tokens, cost in usage:  # what reached the monitor is in range
        assert isinstance(tokens, int) and tokens >= 0 and cost >= 0 and cost == cost
    return broken


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_frames, max_size=6), st.data())
def test_any_sequence_of_frames_is_decoded_or_refused_never_raised(
    frames: list[dict[str, Any]], data: st.DataObject
) -> None:
    stream = b"".join(_encode(frame) for frame in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    _feed(pieces)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_any_bytes_are_decoded_or_refused_never_raised(junk: bytes) -> None:
    _feed([junk, b"\n"])
