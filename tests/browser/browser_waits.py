"""The browser tests' one way to wait: poll until something holds, with a liveness bound.

A module of its own, imported by name (`from browser_waits import ...`): the tests here never
import `conftest` by name, which tests/notebook has too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

WAIT_S = 60.0  # liveness bound of every wait here; never a measure of speed


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)
