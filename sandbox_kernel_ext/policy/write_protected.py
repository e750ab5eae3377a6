"""What stays read-only inside a sandbox's writable folders: the policy that confines it, and
what programs outside any sandbox run on their own.

A cell that may write the notebook's folder could otherwise rewrite its own policy, or plant
code that an unconfined process runs later: a shell reading its rc file, git running a hook,
Python reading a `.pth` file, a kernel starting in that folder (`python -m` imports from the
working directory first), Jupyter loading a config file from it, a person running a notebook.
Each such path that exists when a run starts is made read-only for the run (a read-only
mount, or without mounts Landlock rules that leave it out), and cannot be renamed away.
A policy that names one of these paths itself in `writable_paths` (or as an `rw` root) opts
in to writing it.

Neither Landlock nor mounts can refuse one new name and allow the rest, so the folders Python
imports from by name first (the kernel's working directory and its `sys.path` folders, where a
writable folder holds them, and the folders on the way to them) are closed instead
(`import_folders`; Landlock's in-place rights, `child/bootstrap.py` `rules_for`): their files
can be written and their subfolders stay writable, but no name can be made, removed or moved
in them, where a planted `ipykernel_launcher.py` or `pandas.py` would be imported. Elsewhere a
file of a protected name that does not exist yet can still be created; the policy reference
says so.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import time
from collections.abc import Iterable
from typing import Any

from .credential_stores import home_folders
from .paths import is_within, outermost, within_any

__all__ = ["write_protection", "import_folders", "kernel_workdirs", "WriteGuard",
           "HOME_STARTUP_PATHS", "FOLDER_STARTUP_PATHS"]

# Beneath a home folder: what a login, a shell, an editor or git runs or reads commands from.
HOME_STARTUP_PATHS = (
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".bash_aliases", ".profile",
    ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".zlogout", ".cshrc", ".tcshrc", ".kshrc",
    ".mkshrc", ".config/fish", ".xprofile", ".xinitrc", ".xsession", ".xsessionrc",
    ".pam_environment", ".config/autostart", ".config/systemd", ".config/environment.d",
    ".gitconfig", ".config/git", ".vimrc", ".vim", ".config/nvim", ".emacs", ".emacs.d",
    ".config/Code/User", ".local/bin", ".local/lib", ".pythonstartup", ".pdbrc", ".direnvrc",
    ".config/direnv",
)
# Directly in each writable folder and the kernel's working directory: a repository (whole,
# as Codex keeps it: hooks, config with its fsmonitor and filters, submodules' own),
# per-folder tool settings that run commands, Jupyter and IPython config files (Jupyter
# reads them from the working directory too).
FOLDER_STARTUP_PATHS = (
    ".git", ".envrc", ".vscode", ".idea", ".pre-commit-config.yaml",
    "jupyter_server_config.py", "jupyter_notebook_config.py", "jupyter_lab_config.py",
    "jupyter_config.py", "ipython_config.py", "ipython_kernel_config.py",
    "sitecustomize.py", "usercustomize.py",
    # run by a tool the person starts in the folder: pdb (and IPython's %debug) reads
    # `.pdbrc`; VS Code loads `.env` into the kernels it starts; test runners and build tools
    # take plugins and commands from their settings
    ".pdbrc", ".env", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "conftest.py",
    "noxfile.py", "Makefile", "makefile", "GNUmakefile", "justfile",
    # Jupyter's own copies of the notebooks, which "Revert to checkpoint" puts back
    ".ipynb_checkpoints",
)
# Where tools put a project's virtual environment.
_ENVIRONMENT_NAMES = (".venv", "venv", "env", ".env", "virtualenv", ".virtualenv", ".conda",
                      ".pixi", ".tox", ".nox")
_FOLDER_STARTUP, _ENVIRONMENTS = frozenset(FOLDER_STARTUP_PATHS), frozenset(_ENVIRONMENT_NAMES)
# In the kernel's working directory: what `import NAME` finds there before anything else.
_IMPORTABLE_SUFFIXES = (".py", ".pyc", ".pth", ".so", ".pyd", ".ipynb")


def write_protection(writable: Iterable[str], workdirs: Iterable[str],
                     policy_file: str | None, named: Iterable[str]
                     ) -> tuple[list[str], list[str]]:
    """(the real paths inside the `writable` folders that a run may not change, the folders
    in them closed to new names: `import_folders`). Protected: the policy file, the startup
    files of homes inside them, each folder's startup files above, the Python and Jupyter
    folders this kernel reads at start, and in each of `workdirs` (where a kernel starts)
    every importable name and notebook. Only what exists now and is reached without a
    symlink; none that the policy `named` itself; outermost first. One listing of each
    writable folder (kept while the folder is unchanged) serves its names."""
    writable = [path for path in dict.fromkeys(writable) if os.path.isdir(path)]
    if not writable:
        return [], []
    roots = set(writable)

    def inside(path: str) -> bool:
        return within_any(path, roots) is not None

    site_folders = _python_and_jupyter_folders(tuple(sys.path), _cwd())[0]
    by_name = import_folders(writable, workdirs)
    found: list[str] = []
    for folder in dict.fromkeys([*writable, *by_name]):
        # a link's target may lie anywhere: only one inside a writable folder needs keeping
        found += [path for path in _protected_in(folder, importable=folder in by_name)
                  if inside(path)]
    others = [resolved(policy_file) or policy_file] if policy_file else []
    for home in _homes():
        if inside(home):
            others += [os.path.join(home, name) for name in HOME_STARTUP_PATHS]
    others += site_folders
    prefixes = tuple("/" if root == "/" else root + "/" for root in roots)
    others += [path for path in _imported_paths() if path.startswith(prefixes)]
    found += [path for path in others if inside(path) and _reached_without_links(path)]
    named = set(named)
    return outermost([path for path in dict.fromkeys(found)
                      if path not in named and path not in roots]), by_name


def _cwd() -> str | None:
    try:
        return os.path.realpath(os.getcwd())
    except OSError:
        return None


_STARTED_IN = _cwd()  # this package is loaded as the kernel starts, before any %cd


def kernel_workdirs() -> list[str]:
    """Where a kernel or Python started by the person would import from first: the folder
    this process started in (a restarted kernel starts there again, whatever `%cd` did
    since) and its working directory now."""
    return [folder for folder in dict.fromkeys([_STARTED_IN, _cwd()]) if folder]


class WriteGuard:
    """The same rules for the file toolset's writes, judged by name at each change (the
    toolset writes as the kernel, so no mount holds it): nothing inside a protected path
    changes, and nothing that could run is made directly in a folder Python imports from
    first. The toolset sees each name, so it may make a report there where a run, which
    Landlock can only let make everything or nothing, may not."""

    # How long one look at what is protected serves the writes after it: an agent's burst
    # of writes pays for one (a look lists folders and the kernel's modules).
    FRESH_FOR = 0.5

    def __init__(self, writable: Iterable[str], policy_file: str | None,
                 named: Iterable[str] = ()) -> None:
        self.writable = list(dict.fromkeys(writable))
        self.policy_file = policy_file
        self.named = list(named)
        self._seen: tuple[float, list[str], list[str]] | None = None

    def _paths(self) -> tuple[list[str], list[str]]:
        """(the protected paths, the folders where Python imports from first), as they
        were at most FRESH_FOR seconds ago."""
        seen = self._seen
        if seen is not None and time.monotonic() - seen[0] < self.FRESH_FOR:
            return seen[1], seen[2]
        protected, closed = write_protection(self.writable, kernel_workdirs(), self.policy_file,
                                             self.named)
        self._seen = (time.monotonic(), protected, closed)
        return protected, closed

    def refusal(self, folder: str, name: str, *, creates: bool, is_folder: bool = False) -> str | None:
        """Why `name` in the real `folder` may not be changed (`creates`: made anew, a
        folder with `is_folder`), or None. The reason names no host path."""
        path = os.path.join(folder, name)
        protected, closed = self._paths()
        if any(is_within(path, outer) for outer in protected):
            return ("it is write-protected: the policy file, or something programs outside any "
                    "sandbox run (a repository's .git, startup and tool settings files, a Python "
                    "environment, a module where the kernel imports first); a policy that names "
                    "it allows writing it")
        if creates and _runs_there(name, is_folder) and folder in closed:
            return ("this folder is where the kernel imports from first, and a new module, "
                    "package, notebook or tool settings file there would run outside any "
                    "sandbox; write it in a subfolder")
        return None


def _runs_there(name: str, is_folder: bool) -> bool:
    """Whether a new entry of this name where Python imports from first could be run: a
    module, a notebook, a settings file a tool started there reads, a folder of a module's
    name (a package, or a part of a namespace package such as `google`)."""
    return (name.endswith(_IMPORTABLE_SUFFIXES) or name in FOLDER_STARTUP_PATHS
            or name in HOME_STARTUP_PATHS
            or (is_folder and (name == "__pycache__" or name in module_names())))


def resolved(path: str) -> str | None:
    """`os.path.realpath(path)`, or None when the path changes while it is followed."""
    try:
        return os.path.realpath(path)
    except OSError:
        return None


def import_folders(writable: Iterable[str], workdirs: Iterable[str]) -> list[str]:
    """The folders inside `writable` ones that `import NAME` searches before anything
    installed: `workdirs` (where a kernel or a Python started by the person begins) and the
    rest of this kernel's `sys.path`; for one that does not exist yet, the folder it would
    be made in; and the folder of each symlink on the way to one as it is spelled (Jupyter
    restarts a kernel by the folder's name, Python imports by `sys.path`'s). A run may not
    add, remove or move a name in them."""
    roots = {path for path in writable if os.path.isdir(path)}
    by_name = _python_and_jupyter_folders(tuple(sys.path), _cwd())[1]
    # a home's user site and scripts, not made yet: where they would be made takes no name
    missing = [path for home in _homes() if within_any(home, roots) is not None
               for path in (os.path.join(home, ".local", "lib"), os.path.join(home, ".local", "bin"))
               if not os.path.lexists(path)]
    found = []
    for folder in dict.fromkeys([*workdirs, *by_name, *_link_folders(roots), *missing]):
        while not os.path.isdir(folder) and folder != os.path.dirname(folder):
            folder = os.path.dirname(folder)  # where a sandbox would make it
        if within_any(folder, roots) is not None:
            found.append(folder)
    return list(dict.fromkeys(found))


def _link_folders(roots: set[str]) -> list[str]:
    """The real folders, inside `roots`, of the symlinks on the way to this kernel's
    working directory as `PWD` spells it and to each `sys.path` entry as written."""
    spelled = [entry for entry in sys.path if entry and os.path.isabs(entry)]
    pwd = os.environ.get("PWD", "")
    if os.path.isabs(pwd) and resolved(pwd) in kernel_workdirs():
        spelled.append(pwd)
    found = []
    for path in spelled:
        if resolved(path) == os.path.normpath(path):
            continue  # no link on the way
        parts = os.path.normpath(path).split("/")
        for depth in range(2, len(parts) + 1):
            step = "/".join(parts[:depth])
            if os.path.islink(step):
                folder = resolved(os.path.dirname(step))
                if folder and within_any(folder, roots) is not None:
                    found.append(folder)
    return found


_PROTECTED: dict[tuple[str, bool], tuple[object, list[str]]] = {}


def _protected_in(folder: str, *, importable: bool) -> list[str]:
    """The protected entries directly in `folder`: startup names, Python environments,
    notebooks, and with `importable` every module, package and `.pth` file. Kept with the
    folder's listing (a folder of thousands of data files is looked through once)."""
    listing = _listing(folder)
    cached = _PROTECTED.get((folder, importable))
    if cached is not None and cached[0] is listing:
        return cached[1]
    found = _protected_among(folder, listing, importable)
    if len(_PROTECTED) >= _LISTINGS_MAX:
        _PROTECTED.clear()
    _PROTECTED[(folder, importable)] = (listing, found)
    return found


def _protected_among(folder: str, listing: list[tuple[str, bool, bool]], importable: bool
                     ) -> list[str]:
    found = []
    names = {name for name, _, _ in listing}
    if names & {"pyvenv.cfg", "conda-meta"}:
        return [folder]  # an environment: whole
    if "lib" in names:
        found += _python_libs(os.path.join(folder, "lib"))
    for name, is_dir, is_link in listing:
        path = os.path.join(folder, name)
        if is_link:
            # a link protects nothing (what it points at is not the path), but one Python
            # imports through (`helper.py -> src/helper.py`) makes its target a module
            target = resolved(path) if importable and _importable_name(name) else None
            if target:
                found.append(target)
            continue
        if name in _FOLDER_STARTUP or name.endswith(".ipynb"):
            found.append(path)
        elif name in _ENVIRONMENTS and is_dir:
            found += _environment(path)
        elif importable and (name.endswith(_IMPORTABLE_SUFFIXES) or (is_dir and (
                name == "__pycache__" or name in module_names()
                or os.path.lexists(os.path.join(path, "__init__.py"))))):
            found.append(path)
    return found


def _importable_name(name: str) -> bool:
    """A name `import` finds: a module file, or a folder (a package) of a valid name."""
    return name.endswith(_IMPORTABLE_SUFFIXES) or name.isidentifier()


@functools.lru_cache(maxsize=1)
def module_names() -> frozenset[str]:
    """Top-level names Python has modules for: the standard library's, the installed
    distributions', what is imported now and what the kernel's `sys.path` holds. A folder
    of such a name where Python imports first would shadow the module once an `__init__.py`
    is put in it (`json/`, `logging/`: a kernel's start imports them), so it is kept whole."""
    names = set(getattr(sys, "stdlib_module_names", ()))
    names.update(name for name in sys.modules if "." not in name)
    try:
        from importlib.metadata import packages_distributions

        names.update(packages_distributions())
    except Exception:  # noqa: BLE001 - a broken distribution's metadata: the rest still count
        pass
    try:
        import pkgutil

        # what the kernel's sys.path holds, installed or not (a project's own package)
        names.update(module.name for module in pkgutil.iter_modules())
    except Exception:  # noqa: BLE001 - an unreadable folder on the path: the rest still count
        pass
    return frozenset(name for name in names if name.isidentifier())


_LISTINGS: dict[str, tuple[tuple[int, int, int], list[tuple[str, bool, bool]]]] = {}
_LISTINGS_MAX = 4096
_SETTLED_NS = 2_000_000_000


def _listing(folder: str) -> list[tuple[str, bool, bool]]:
    """(name, is a folder, is a link) of each entry, kept while the folder's inode and times
    are the same; a listing read within two seconds of a change is not kept (a change in
    the same timestamp tick would not show)."""
    try:
        info = os.stat(folder)
    except OSError:
        return []
    version = (info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
    cached = _LISTINGS.get(folder)
    if cached is not None and cached[0] == version:
        return cached[1]
    try:
        with os.scandir(folder) as entries:
            listing = [(entry.name, entry.is_dir(follow_symlinks=False), entry.is_symlink())
                       for entry in entries]
    except OSError:
        return []
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > _SETTLED_NS:
        if len(_LISTINGS) >= _LISTINGS_MAX:
            _LISTINGS.clear()
        _LISTINGS[folder] = (version, listing)
    return listing


_HOMES: dict[tuple[object, ...], list[str]] = {}


def _homes() -> list[str]:
    """`home_folders()`, asked again only when the account database or /home changed (it
    reads every account: most of this module's cost at each run)."""
    key = tuple(_version(path) for path in ("/etc/passwd", "/home", "/root"))
    if key not in _HOMES:
        _HOMES.clear()
        _HOMES[key] = sorted({home for home in map(resolved, home_folders()) if home})
    return _HOMES[key]


def _version(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_ctime_ns


def _environment(path: str) -> list[str]:
    """`path` whole if it is a Python environment (a `pyvenv.cfg` or `conda-meta`: its
    interpreter link, `bin/` scripts, `.pth` files and modules run when anyone uses it),
    else the `lib/python3*` of a prefix without a marker (`pip install --prefix`)."""
    if any(os.path.lexists(os.path.join(path, marker)) for marker in ("pyvenv.cfg", "conda-meta")):
        return [path]
    return _python_libs(os.path.join(path, "lib"))


def _python_libs(lib: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(lib)
                if entry.name.startswith("python3") and entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


@functools.lru_cache(maxsize=4)
def _python_and_jupyter_folders(path: tuple[str, ...] = (), cwd: str | None = None
                                ) -> tuple[list[str], list[str]]:
    """(folders read whole at start: site-packages with their `.pth` files, Jupyter's config
    and data folders with their kernel specs; folders Python imports from by name: the rest
    of this kernel's `sys.path`)."""
    # the environment this kernel runs from, its interpreter included
    whole: list[str] = [sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)]
    try:
        whole += site.getsitepackages()
        whole.append(site.getusersitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    by_name = []
    for entry in sys.path:
        entry = os.path.join(cwd, entry) if cwd and entry else entry  # `..`, `../src`
        if not entry or not os.path.isabs(entry):
            continue
        # a zip, egg or wheel on the path is code as a whole
        (whole if os.path.basename(entry) in ("site-packages", "dist-packages")
         or os.path.isfile(entry) else by_name).append(entry)
    for name in ("IPYTHONDIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "PYTHONSTARTUP"):
        if os.environ.get(name):
            whole.append(os.environ[name])
    try:
        from jupyter_core.paths import jupyter_config_path, jupyter_path

        whole += [*jupyter_config_path(), *jupyter_path()]
    except Exception:  # jupyter_core is optional for the runner
        pass
    return _real_folders(whole), _real_folders(by_name)


_IMPORTED: dict[str, Any] = {"modules": None, "paths": []}


def _imported_paths() -> list[str]:
    """What this kernel has imported from files (a package's folder whole), and the folders
    an editable install maps its packages to (setuptools' `__editable__..._finder`, which
    puts nothing on `sys.path`): real paths, found again only when the modules changed (a
    kernel has thousands; the file toolset asks at every write)."""
    modules = tuple(map(id, list(sys.modules.values())))
    if _IMPORTED["modules"] == modules:
        return _IMPORTED["paths"]
    found = []
    for name, module in list(sys.modules.items()):
        if name.startswith("__editable__") and isinstance(getattr(module, "MAPPING", None), dict):
            found += [str(path) for path in module.MAPPING.values()]
        package = getattr(module, "__path__", None)
        if isinstance(package, list):
            found += [str(path) for path in package]
        elif isinstance(getattr(module, "__file__", None), str):
            found.append(module.__file__)
    folders = {folder: resolved(folder) for folder in {os.path.dirname(path) for path in found}}
    paths = list(dict.fromkeys(os.path.join(folders[os.path.dirname(path)] or "", os.path.basename(path))
                               for path in found if folders.get(os.path.dirname(path))))
    _IMPORTED.update(modules=modules, paths=paths)
    return paths


def _real_folders(paths: list[str]) -> list[str]:
    return list(dict.fromkeys(real for real in map(resolved, paths) if real))


def _reached_without_links(path: str) -> bool:
    """Whether `path` exists and no component of it is a symlink (what the child can bind)."""
    if not os.path.lexists(path):
        return False
    return resolved(path) == os.path.normpath(path)
