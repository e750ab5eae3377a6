"""orbiter's `TerminalTool`: an agent's shell, run under the sandbox's confinement.

The seed checked only the first word of a command line against its blacklist, so
`env rm x`, `a; rm x`, `$(rm x)`, `sh -c 'rm x'` and `/bin/rm x` all went through. Here the
blacklist applies to every command word of the line (`shell_wrappers.command_words`).

A blacklist of names can never be a security boundary (a script file, `python -c`,
an alias defined on an earlier line or a copy of `rm` under another name all get
round it), so `TerminalTool` always runs the command under the confinement the Linux
kernel enforces through `SandboxManager`; the blacklist only refuses the obvious cases
early, with a clear message.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from ..policy.errors import ToolError
from .base import Tool
from .shell_wrappers import command_words
from .shell_words import DYNAMIC

if TYPE_CHECKING:
    from ..policy.models import CapabilityDeclaration
    from ..runner.trusted.manager import SandboxManager

__all__ = ["DEFAULT_BLACKLIST", "TerminalTool"]

DEFAULT_BLACKLIST: frozenset[str] = frozenset(
    {
        "rm", "rmdir", "mkfs", "dd", "shutdown", "reboot", "halt", "poweroff",
        "kill", "killall", "pkill", "format", "del", "erase", "rd",
    }
)


class TerminalTool(Tool):
    """Run a shell command (`/bin/sh -c`) inside a sandbox the Linux kernel confines.

    The sandbox (`SandboxManager` under the given `CapabilityDeclaration`, by default
    one that allows nothing extra) is what keeps the command in bounds. The blacklist
    is only a convenience on top of it, never instead of it: it refuses, before
    anything runs, a command line in which any command word (found by `command_words`,
    through pipes, substitutions, `sh -c`, `sudo`, `find -exec` and the like) is
    blacklisted or is computed at run time. A name matches in any letter case, and
    `NAME.suffix` matches NAME (`mkfs.ext4`). Scripts, interpreters (`python -c`) and
    renamed copies of a program are not seen by it; the confinement still applies.

    The sandbox is created on first use and kept for later calls; `close()` (or a
    `with` block) destroys it when this tool created the manager.
    """

    name = "terminal"
    description = "Execute a shell command in the sandbox."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "Shell command to execute."}},
        "required": ["command"],
    }

    def __init__(
        self,
        *,
        blacklist: frozenset[str] | None = None,
        timeout: float = 30.0,
        policy: CapabilityDeclaration | None = None,
        manager: SandboxManager | None = None,
        cwd: str | None = None,
    ) -> None:
        self.blacklist: frozenset[str] = DEFAULT_BLACKLIST if blacklist is None else frozenset(blacklist)
        self._blocked_names = frozenset(name.lower() for name in self.blacklist)
        self.timeout = timeout
        self.policy = policy
        self.cwd = cwd
        self._manager = manager
        self._owns_manager = manager is None
        self._sandbox_id: str | None = None
        self._lock = threading.Lock()

    @property
    def platform(self) -> str:
        return sys.platform

    def is_blocked(self, word: str) -> bool:
        """Whether a command word (as given by `command_words`) is on the blacklist."""
        lowered = word.lower()
        return lowered in self._blocked_names or lowered.split(".", 1)[0] in self._blocked_names

    def check(self, command: str) -> list[str]:
        """The command words of `command`; ToolError if the blacklist refuses it."""
        try:
            words = command_words(command)
        except ValueError as exc:
            raise ToolError(f"Cannot parse the command: {exc}") from exc
        for word in words:
            if word != DYNAMIC and self.is_blocked(word):
                raise ToolError(f"Command '{word}' is blocked")
        if DYNAMIC in words:
            raise ToolError(
                "A command word is computed at run time (from a variable, $(...), backquotes, "
                "a glob or a brace expansion), so it cannot be checked against the blacklist; "
                "write the command name literally."
            )
        return words

    async def execute(self, **kwargs: Any) -> dict[str, Any]:
        command = kwargs.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("'command' is required and must be a non-empty string.")
        self.check(command)
        manager, sandbox_id = await asyncio.to_thread(self._sandbox)
        result = await asyncio.to_thread(
            manager.execute, sandbox_id, ["/bin/sh", "-c", command], timeout=self.timeout, cwd=self.cwd
        )
        killed = getattr(result, "killed", None)
        if killed and str(killed).startswith("timeout"):
            raise ToolError(f"Command timed out after {self.timeout} s")
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "platform": self.platform,
        }

    def _sandbox(self) -> tuple[SandboxManager, str]:
        """The manager and sandbox, created on first use (once, even under concurrent calls)."""
        with self._lock:
            if self._manager is None:
                from ..runner.trusted.manager import SandboxManager

                self._manager = SandboxManager()
            if self._sandbox_id is None:
                if self.policy is None:
                    from ..policy.models import CapabilityDeclaration

                    self.policy = CapabilityDeclaration()
                self._sandbox_id = self._manager.create_sandbox(self.policy)
            return self._manager, self._sandbox_id

    def close(self) -> None:
        """Destroy the sandbox and stop the manager, if this tool created the manager
        (a caller's manager, and the sandboxes in it, stay the caller's to manage).
        A later `execute` starts afresh."""
        with self._lock:
            if not self._owns_manager or self._manager is None:
                return
            manager, sandbox_id = self._manager, self._sandbox_id
            self._manager = self._sandbox_id = None
            try:
                if sandbox_id is not None:
                    manager.destroy(sandbox_id)
            finally:
                manager.close()

    def __enter__(self) -> TerminalTool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
