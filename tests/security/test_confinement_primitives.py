"""Attacks on the confinement primitives: what the read set takes in, keystrokes pushed into
a terminal, the thread check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_kernel_ext.runner.linux import landlock, seccomp
from sandbox_kernel_ext.runner.trusted import host_reads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _child(code: str, *, cwd: Path | None = None, env: dict[str, str] | None = None) -> dict:
    """Run `code` in a fresh (single-threaded) interpreter; it prints one JSON object."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_read_set_leaves_out_the_working_directory_and_pythonpath(tmp_path: Path) -> None:
    home, extra = tmp_path / "home", tmp_path / "pythonpath"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE-KEY")
    extra.mkdir()
    env = {**os.environ, "PYTHONPATH": str(extra)}
    # `-c` puts '' (the cwd) on sys.path; python -m would put the absolute cwd there.
    code = (
        "import json, os, sys; sys.path.insert(0, os.getcwd());"
        "from sandbox_kernel_ext.runner.trusted.host_reads import python_read_set;"
        "print(json.dumps({'set': python_read_set(), 'path': sys.path}))"
    )
    out = _child(code, cwd=home, env=env)
    assert str(home) in out["path"] and str(extra) in out["path"]  # the bait was on sys.path
    for granted in out["set"]:
        for private in (home, extra):
            assert not (str(private) + "/").startswith(granted.rstrip("/") + "/"), granted


def test_read_set_takes_what_the_caller_names(tmp_path: Path) -> None:
    assert str(tmp_path) in host_reads.python_read_set(extra=[str(tmp_path)])


@pytest.mark.skipif(not seccomp.seccomp_available(), reason="no seccomp filter")
def test_keystrokes_cannot_be_pushed_into_an_inherited_terminal() -> None:
    code = """
import errno, fcntl, json, os, termios
from sandbox_kernel_ext.runner.linux.seccomp import SeccompFilter
leader, follower = os.openpty()
def push():
    try:
        fcntl.ioctl(follower, termios.TIOCSTI, b"x")
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
before = push()
SeccompFilter().install()
after = push()
size = fcntl.ioctl(follower, termios.TIOCGWINSZ, b"\\0" * 8)  # ordinary ioctls still work
print(json.dumps({"before": before, "after": after, "winsz": len(size)}))
"""
    out = _child(code)
    assert out["after"] == "EPERM"
    assert out["winsz"] == 8
    assert out["before"] in ("ok", "EIO", "EPERM")  # EPERM only where the host disables TIOCSTI


@pytest.mark.skipif(landlock.landlock_abi() < 1, reason="no Landlock on this kernel")
def test_thread_check_fails_closed_when_proc_cannot_tell(tmp_path: Path) -> None:
    code = f"""
import json
from sandbox_kernel_ext.runner.linux.syscalls import thread_count
from sandbox_kernel_ext.runner.linux.landlock import LandlockRuleset
from sandbox_kernel_ext.runner.trusted.host_reads import python_read_set
rules = LandlockRuleset()
for path in python_read_set():
    if path != "/proc":
        rules.allow_read(path)
rules.allow_write({str(tmp_path)!r})
rules.restrict_self()
try:
    print(json.dumps({{"threads": thread_count()}}))
except RuntimeError as exc:
    print(json.dumps({{"refused": str(exc)}}))
"""
    out = _child(code)
    assert "refusing to confine only one of them" in out.get("refused", ""), out
