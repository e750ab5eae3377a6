"""The package's layers import only downwards: policy < approval < files < runner < notebook.

Read from the source (every `import`/`from` of this package, relative or absolute, at module
level or inside functions), so a lazy import inside a function cannot hide an upward one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sandbox_kernel_ext"
ORDER = ["policy", "approval", "files", "runner", "notebook"]


def _layer_imports(path: Path) -> set[str]:
    """The layers `path` imports from."""
    here = path.relative_to(PACKAGE.parent).with_suffix("").parts  # ('sandbox_kernel_ext', ...)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[tuple[str, ...]] = []
        if isinstance(node, ast.Import):
            names = [tuple(alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level] if node.level else ()
            module = tuple(node.module.split(".")) if node.module else ()
            names = [base + module] if module else [base + (a.name,) for a in node.names]
        for name in names:
            if len(name) > 1 and name[0] == "sandbox_kernel_ext" and name[1] in ORDER:
                found.add(name[1])
    return found


@pytest.mark.parametrize("layer", ORDER)
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    allowed = set(ORDER[: ORDER.index(layer) + 1])
    upward = {
        str(path.relative_to(PACKAGE)): sorted(_layer_imports(path) - allowed)
        for path in sorted((PACKAGE / layer).rglob("*.py"))
    }
    assert {file: above for file, above in upward.items() if above} == {}


def test_the_check_sees_relative_and_lazy_imports() -> None:
    """The checker itself: an upward import hidden in a function is still found."""
    probe = PACKAGE / "files" / "toolset.py"
    assert "approval" in _layer_imports(probe)  # `from ..approval.broker import ...`
    assert "runner" in _layer_imports(PACKAGE / "notebook" / "magics.py")  # lazy, in methods
