"""Run code and commands under confinement that the operating system enforces.

Laid out by the process each piece runs in:
- `trusted/`: the Jupyter kernel's side (or any Python caller's): `SandboxManager` (aumai-sandbox) and what
  it decides with (the plan, the host read set, gated files, the control channel, the egress
  proxy, the monitor, the isolation report, the launcher's client, `sandbox-run`);
- `launcher/`: the fork server, a single-threaded process of its own;
- `child/`: the confined child (its bootstrap in the launcher's forks, then the cell and the
  `inside` API the cell's code calls);
- `linux/`: bindings to Linux kernel interfaces (Landlock, seccomp, namespaces), no decisions;
- `wire.py`: what crosses between those processes.

Importing this package is safe on any OS, and cheap: each name loads its module on first use.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "SandboxManager": "trusted.manager",
    "ResourceMonitor": "trusted.monitor",
    "isolation_report": "trusted.isolation",
    "missing_layers": "trusted.isolation",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
