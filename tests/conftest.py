"""Fixtures the runner's tests share."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the sandbox's unprivileged uid may write (what a user would chown). Under
    /tmp, because pytest's own tmp_path sits in a folder only root may enter."""
    path = Path(tempfile.mkdtemp(prefix="sbx-test-", dir="/tmp"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def manager() -> Iterator[object]:
    """One SandboxManager per test module (its launcher starts once), closed at the end."""
    from sandbox_kernel_ext import SandboxManager

    with SandboxManager() as m:
        yield m


@pytest.fixture(autouse=True)
def interrupts_reach_python() -> Iterator[None]:
    """Tests that interrupt themselves (SIGINT, `_thread.interrupt_main`) need Python's own
    handler, which a shell does not give a job it starts in the background (SIGINT ignored
    there, so Python leaves it so): the suite run from a script beside other work then
    failed them. Each test gets the handler a terminal's Python has, and the old one back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, signal.SIG_DFL):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
