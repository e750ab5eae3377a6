"""Jupyter face of sandbox_kernel_ext: magics, approval widget, gauges.

`%load_ext sandbox_kernel_ext` registers `%%sandbox`, `%sandbox` and the `SandboxMagics`
settings; `%unload_ext sandbox_kernel_ext` removes them and stops every sandbox, the launcher
and the monitors the session started. IPython is imported only when the extension loads, so
importing the package stays cheap outside Jupyter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..approval import ApprovalBroker
    from .magics import SandboxMagics

__all__ = ["load_ipython_extension", "session_broker", "session_magics", "session_toolset",
           "unload_ipython_extension"]

_MAGICS_NAME = "SandboxMagics"


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics on `ipython` (once, under whichever module name it is loaded)."""
    from .magics import SandboxMagics

    if ipython.magics_manager.registry.get(_MAGICS_NAME) is None:
        ipython.register_magics(SandboxMagics(ipython))
        from .kernel_routing import shell_click_delivery

        delivery = shell_click_delivery(ipython)
        if delivery is not None and delivery.route != "kernel":
            # Said before anyone is asked: on this kernel an approval may be denied unseen.
            print(f"sandbox_kernel_ext: approvals: {delivery.detail}")


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the magics and stop everything they started."""
    from .magics import unregister

    magics = ipython.magics_manager.registry.get(_MAGICS_NAME)
    if magics is None:
        return
    try:
        magics.close()
    finally:
        unregister(ipython, magics)


def session_magics() -> SandboxMagics:
    """The loaded `SandboxMagics` of the running IPython; RuntimeError if not loaded."""
    from IPython import get_ipython

    shell = get_ipython()
    magics = shell.magics_manager.registry.get(_MAGICS_NAME) if shell is not None else None
    if magics is None:
        raise RuntimeError(
            "sandbox_kernel_ext is not loaded here; run %load_ext sandbox_kernel_ext")
    return magics


def session_broker() -> ApprovalBroker:
    """The approval broker `%%sandbox` cells use: hand it to in-kernel toolsets so a grant
    given in one place covers the other, and `%sandbox log` shows both."""
    return session_magics().broker


def session_toolset(policy: Any = None, **kwargs: Any) -> Any:
    """A `FileSystemToolset` over `policy` (default: the session's) sharing the session broker."""
    return session_magics().toolset(policy, **kwargs)
