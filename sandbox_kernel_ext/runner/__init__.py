"""Run code and commands under confinement that the operating system enforces.

`SandboxManager` (seed 003) runs them; `ResourceMonitor` watches a process tree's budgets;
`TerminalTool` (seed 004) is an agent's shell; `isolation_report()` says what this host
enforces. Importing this package is safe on any OS, and cheap: each name loads its module
on first use (the primitives `landlock` and `seccomp` stay importable on their own).
"""

from __future__ import annotations

import importlib

_HOMES = {
    "SandboxManager": "manager",
    "ResourceMonitor": "monitor",
    "TerminalTool": "terminal",
    "DEFAULT_BLACKLIST": "terminal",
    "command_words": "terminal",
    "isolation_report": "isolation",
    "missing_layers": "isolation",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
