"""Where the anywidget view modules of `js/` are, in a source checkout and in the wheel."""

from __future__ import annotations

from pathlib import Path

__all__ = ["js_asset"]


def js_asset(name: str) -> Path:
    """Path of a view module from `js/`: inside the wheel it ships as `sandbox_kernel_ext/js/`
    (pyproject's force-include), in a source checkout it is the repository's top-level `js/`."""
    package = Path(__file__).resolve().parent.parent
    for folder in (package / "js", package.parent / "js"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"view module {name!r} is in neither {package / 'js'} "
                            f"nor {package.parent / 'js'}; reinstall sandbox_kernel_ext")
