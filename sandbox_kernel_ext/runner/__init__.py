"""Run code and commands under confinement that the operating system enforces.

`SandboxManager` (seed 003) runs them; `ResourceMonitor` watches a process tree's budgets;
`TerminalTool` (seed 004) is an agent's shell; `isolation_report()` says what this host
enforces. Importing this package is safe on any OS.
"""

from .isolation import isolation_report, missing_layers
from .manager import SandboxManager
from .monitor import ResourceMonitor


def __getattr__(name: str) -> object:  # the terminal tool pulls in the file layer's Tool base
    if name in {"DEFAULT_BLACKLIST", "TerminalTool", "command_words"}:
        from . import terminal

        return getattr(terminal, name)
    raise AttributeError(name)

__all__ = [
    "DEFAULT_BLACKLIST", "ResourceMonitor", "SandboxManager", "TerminalTool", "command_words",
    "isolation_report", "missing_layers",
]
