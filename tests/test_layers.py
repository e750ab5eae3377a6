"""The package's layers import only downwards: policy < approval < files < runner < tools <
notebook; and inside the runner, no process's code imports code that runs in another.

Read from the source (every `import`/`from` of this package, relative or absolute, at module
level or inside functions), so a lazy import inside a function cannot hide an upward one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sandbox_kernel_ext"
ORDER = ["policy", "approval", "files", "runner", "tools", "notebook"]
RUNNER = PACKAGE / "runner"

# Inside the runner, by the process a module runs in: what each part may import besides
# itself. `wire` is what crosses between the processes and imports none of them; `linux`
# binds Linux kernel interfaces and decides nothing; the confined child and the launcher
# never import the trusted side (whose objects do not exist in their processes), and the
# trusted side names the launcher only in the command line it execs.
RUNNER_SIDES: dict[str, set[str]] = {
    "wire": set(),
    "linux": set(),
    "child": {"wire", "linux"},
    "launcher": {"wire", "linux", "child"},
    "trusted": {"wire", "linux"},
}


def _imports(path: Path) -> set[tuple[str, ...]]:
    """Every module of this package that `path` imports, as name parts."""
    here = path.relative_to(PACKAGE.parent).with_suffix("").parts  # ('sandbox_kernel_ext', ...)
    if path.name == "__init__.py":
        here = here[:-1] + ("__init__",)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[tuple[str, ...]] = []
        if isinstance(node, ast.Import):
            names = [tuple(alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level] if node.level else ()
            module = tuple(node.module.split(".")) if node.module else ()
            names = [base + module] if module else [base + (a.name,) for a in node.names]
        found.update(name for name in names if name and name[0] == "sandbox_kernel_ext")
    return found


def _layer_imports(path: Path) -> set[str]:
    """The layers `path` imports from."""
    return {name[1] for name in _imports(path) if len(name) > 1 and name[1] in ORDER}


def _side_of(parts: tuple[str, ...]) -> str | None:
    """The runner part ('wire', 'linux', 'child', ...) a module name belongs to, if any."""
    if len(parts) > 2 and parts[1] == "runner":
        side = parts[2].removesuffix(".py")
        return side if side in RUNNER_SIDES else None
    return None


def _side_imports(path: Path) -> set[str]:
    """The runner parts `path` imports from."""
    return {side for name in _imports(path) if (side := _side_of(name)) is not None}


@pytest.mark.parametrize("layer", ORDER)
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    allowed = set(ORDER[: ORDER.index(layer) + 1])
    upward = {
        str(path.relative_to(PACKAGE)): sorted(_layer_imports(path) - allowed)
        for path in sorted((PACKAGE / layer).rglob("*.py"))
    }
    assert {file: above for file, above in upward.items() if above} == {}


@pytest.mark.parametrize("side", sorted(RUNNER_SIDES))
def test_runner_code_imports_no_code_of_another_process(side: str) -> None:
    files = [RUNNER / "wire.py"] if side == "wire" else sorted((RUNNER / side).rglob("*.py"))
    assert files, f"runner/{side} has no modules"
    allowed = RUNNER_SIDES[side] | {side}
    crossing = {
        str(path.relative_to(PACKAGE)): sorted(_side_imports(path) - allowed) for path in files
    }
    assert {file: sides for file, sides in crossing.items() if sides} == {}


def test_every_runner_module_belongs_to_one_side() -> None:
    """A new module at the top of runner/ would escape the check above."""
    loose = sorted(
        path.name for path in RUNNER.iterdir()
        if path.suffix == ".py" and path.name not in ("__init__.py", "wire.py")
    )
    folders = sorted(path.name for path in RUNNER.iterdir()
                     if path.is_dir() and path.name != "__pycache__")
    assert loose == [] and folders == sorted(set(RUNNER_SIDES) - {"wire"})


def test_the_check_sees_relative_and_lazy_imports() -> None:
    """The checker itself: an upward import hidden in a function is still found."""
    probe = PACKAGE / "files" / "toolset.py"
    assert "approval" in _layer_imports(probe)  # `from ..approval.broker import ...`
    assert "runner" in _layer_imports(PACKAGE / "notebook" / "magics.py")  # lazy, in methods
    # `from ..wire import ...` in a child module, and `from ...policy.paths import ...`
    assert _side_imports(RUNNER / "child" / "cell.py") == {"wire", "child"}
    assert "launcher" not in _side_imports(RUNNER / "trusted" / "launcher_client.py")
    assert _side_of(("sandbox_kernel_ext", "runner", "trusted", "plan")) == "trusted"


def test_every_public_name_is_listed_by_dir() -> None:
    """Code that imports every public name by iterating dir() once missed the lazy
    FileSystemToolset."""
    import subprocess
    import sys

    code = ("import sandbox_kernel_ext as m\n"
            "names = [n for n in dir(m) if not n.startswith('_')]\n"
            "assert 'FileSystemToolset' in names, names\n"
            "assert set(m.__all__) <= set(names), set(m.__all__) - set(names)\n"
            "[getattr(m, n) for n in m.__all__]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
