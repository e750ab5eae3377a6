"""The three ways Python code runs confined, behind one call, for tests that try the same
code through each: `execute` of the interpreter, `run_python`, and a session's cell; and a
session in a sandbox of its own, for tests that drive one."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager, SandboxResult
from sandbox_kernel_ext.runner.trusted.session import PythonSession

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


@contextlib.contextmanager
def sandbox_session(manager: SandboxManager, policy: CapabilityDeclaration | None = None
                    ) -> Iterator[PythonSession]:
    """A session in a new sandbox of `policy` (the default policy by default), closed and its
    sandbox destroyed at the end."""
    sid = manager.create_sandbox(policy if policy is not None else CapabilityDeclaration())
    session = manager.start_session(sid)
    try:
        yield session
    finally:
        session.close()
        manager.destroy(sid)
