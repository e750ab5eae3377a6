"""A kernel that dies without its clean-up leaves no folder of its sandboxes behind.

ipykernel ends by `os._exit` when the Jupyter server it belongs to is gone (what JupyterHub's
stop of a user's server does: seen in the multi-user test), and a kernel can be killed: no
`atexit`, no finalizer runs. The launcher, which sees its socket close, removes what the
trusted side gave it (sandbox homes, a session's workspace) once every child is dead; after an
orderly close it leaves them to the trusted side's own clean-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# A process holding a manager with a session (its home), a folder it owns (a workspace),
# and a running child; it prints where they are, then ends as `how` says.
HOLDER = """
import json, os, signal, sys, tempfile, time
from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager
manager = SandboxManager()
sid = manager.create_sandbox(CapabilityDeclaration())
session = manager.start_session(sid)
session.run_cell("x = 1")
workspace = tempfile.mkdtemp(prefix="sandbox-workspace-")
open(os.path.join(workspace, "notes.txt"), "w").write("kept until the end")
manager.own_folder(workspace)
if sys.argv[1] == "kill-deep":  # deeper than shutil.rmtree's recursion reaches (3.11)
    fd = os.open(workspace, os.O_RDONLY)
    for _ in range(2000):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
print(json.dumps({"home": manager._get(sid).home, "workspace": workspace,
                  "launcher": manager.launcher_pid}), flush=True)
how = sys.argv[1]
if how == "exit":
    os._exit(1)
if how.startswith("kill"):
    os.kill(os.getpid(), signal.SIGKILL)
manager.close()
print(json.dumps({"workspace_after_close": os.path.exists(workspace)}), flush=True)
"""


def _hold(how: str) -> tuple[dict, list[dict], int]:
    done = subprocess.run([sys.executable, "-c", HOLDER, how], capture_output=True, text=True,
                          timeout=120, cwd=tempfile.gettempdir())
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-3000:]
    return lines[0], lines[1:], done.returncode


def _gone(path: str, launcher: int) -> bool:
    """Whether `path` is gone once the launcher has ended (bounded: it ends at once)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(launcher, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    return not os.path.exists(path)


@pytest.mark.parametrize("how", ["exit", "kill", "kill-deep"])
def test_a_kernel_that_dies_leaves_no_home_or_workspace(how: str) -> None:
    where, _, code = _hold(how)
    assert code == (1 if how == "exit" else -signal.SIGKILL)
    assert _gone(where["home"], where["launcher"]), where
    assert _gone(where["workspace"], where["launcher"]), where


def test_an_orderly_close_leaves_the_owned_folder_to_its_owner() -> None:
    """`close()` removes the homes itself; a workspace it owns stays until its owner (the
    notebook layer) removes it, as it did before the launcher knew of it."""
    where, after, code = _hold("close")
    assert code == 0 and after == [{"workspace_after_close": True}], after
    assert not Path(where["home"]).exists()
    Path(where["workspace"], "notes.txt").unlink()
    os.rmdir(where["workspace"])
