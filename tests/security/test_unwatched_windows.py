"""Budgets hold from a run's first instant, whatever the trusted side is busy with.

Each test is a window in which nothing watched the child before: a program that closes its
output at once (the pump ends, and the wait for the child's end had no limit), and a cell
whose `input()` or display the caller is still handling when the memory grows (the watch
began only when the pump got back to it). The child here is hostile and does exactly that;
the test then waits for what the budget should do, never for a fixed time.
"""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from sandbox_kernel_ext import CapabilityDeclaration, ResourceLimits, SandboxManager
from sandbox_kernel_ext.runner.linux import landlock

from interfaces import sandbox_session

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or landlock.landlock_abi() < 1, reason="needs Landlock"
)

# Longest the test waits for the kill it expects; the child itself would run longer (its
# own end is what an unwatched run reaches instead).
PATIENCE = 60.0
# Three processes of 160 MB each: every one is under its address-space limit, the tree is
# well over its memory budget.
HOGS = textwrap.dedent("""\
    import subprocess, sys
    HOG = "b = b'x' * (160 << 20)\\nimport time\\ntime.sleep(120)"
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(3)]
""")


@pytest.fixture(scope="module")
def manager() -> Iterator[SandboxManager]:
    with SandboxManager() as made:
        yield made


def _policy(**limits: Any) -> CapabilityDeclaration:
    return CapabilityDeclaration(resource_limits=ResourceLimits(**limits))


def _killed(result: Any) -> str:
    """The kill reason a run or a cell reports (the whole result when there is none)."""
    reason = getattr(result, "killed", None) or ""
    if not reason and "[sandbox] killed:" in (result.stderr or ""):
        reason = result.stderr.split("[sandbox] killed:", 1)[1]
    assert reason, result
    return reason.lower()


def test_a_run_that_closes_its_output_at_once_still_times_out(manager) -> None:
    sid = manager.create_sandbox(_policy())
    try:
        result = manager.execute(sid, ["sh", "-c", "exec 1>&- 2>&-; exec sleep 120"],
                                 timeout=2)
    finally:
        manager.destroy(sid)
    assert "timeout" in _killed(result)


def test_a_python_run_that_closes_every_descriptor_still_times_out(manager) -> None:
    sid = manager.create_sandbox(_policy())
    try:
        result = manager.run_python(sid, "import os, time\nos.closerange(0, 64)\ntime.sleep(120)",
                                    timeout=2)
    finally:
        manager.destroy(sid)
    assert "timeout" in _killed(result)


def test_memory_is_watched_after_the_output_closes(manager) -> None:
    sid = manager.create_sandbox(_policy(max_memory_mb=256))
    script = "import os\nos.closerange(0, 64)\n" + HOGS + "for h in hogs: h.wait()\n"
    try:
        result = manager.run_python(sid, script, timeout=PATIENCE)
    finally:
        manager.destroy(sid)
    assert "memory" in _killed(result)


def _until_gone(pid: int) -> None:
    """Hold the caller (a person reading a prompt, a display being drawn) until the
    process `pid` has ended, or `PATIENCE` has passed."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)


def test_memory_is_watched_while_the_caller_answers_an_input(manager) -> None:
    with sandbox_session(manager, _policy(max_memory_mb=256)) as session:
        def person(prompt: str, password: bool) -> str:
            _until_gone(session.pid)
            return ""

        result = session.run_cell(HOGS + "input('go')\n", on_input=person, timeout=PATIENCE)
    assert "memory" in _killed(result)


def test_memory_is_watched_while_the_caller_shows_a_display(manager) -> None:
    with sandbox_session(manager, _policy(max_memory_mb=256)) as session:
        result = session.run_cell(HOGS + "display('a chart')\n",
                                  on_display=lambda output: _until_gone(session.pid),
                                  timeout=PATIENCE)
    assert "memory" in _killed(result)
