"""The three ways Python code runs confined, behind one call, for tests that try the same
code through each: `execute` of the interpreter, `run_python`, and a session's cell."""

from __future__ import annotations

import sys

from sandbox_kernel_ext import SandboxManager, SandboxResult

RUNNERS = ("execute", "run_python", "session")


def run_code(manager: SandboxManager, sandbox_id: str, interface: str, code: str,
             timeout: float = 60) -> SandboxResult:
    """`code` run in the sandbox through `interface` (one of RUNNERS)."""
    if interface == "execute":
        return manager.execute(sandbox_id, [sys.executable, "-c", code], timeout=timeout)
    if interface == "run_python":
        return manager.run_python(sandbox_id, code, timeout=timeout)
    session = manager.start_session(sandbox_id)
    try:
        return session.run_cell(code, timeout=timeout)
    finally:
        session.close()
