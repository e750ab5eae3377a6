"""Fixtures the runner's tests share."""

from __future__ import annotations

import os
import shutil
import tempfile
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
