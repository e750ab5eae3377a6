"""IPython's syntax in a confined session: magics, `!cmd`, `x = !cmd`, `obj?`, run inside.

Runs in the confined child. The kernel's IPython turns a cell that is not plain Python into
calls on `get_ipython()` (`%timeit x` becomes `get_ipython().run_line_magic('timeit', 'x')`)
before the cell crosses; a session's namespace has a `get_ipython` that answers them here,
without loading IPython: each magic below does in the sandbox what IPython's does in the
kernel, with IPython's output format. A magic that needs the kernel (or that this list does
not have) fails with one line naming it and the way forward.
"""

from __future__ import annotations

import ast
import getopt
import inspect
import math
import os
import pydoc
import re
import shlex
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

from . import display
from .cell import flush_streams

__all__ = ["ChildShell", "UsageError"]


class UsageError(Exception):
    """A magic used wrongly, or one a sandboxed cell cannot run (shown as one line)."""


class LineList(list):
    """What `x = !cmd` gives: the output's lines, with IPython's `SList` shorthands."""

    @property
    def s(self) -> str:
        return " ".join(self)

    @property
    def n(self) -> str:
        return "\n".join(self)

    @property
    def l(self) -> list[str]:  # noqa: E743 - IPython's name
        return list(self)

    def grep(self, pattern: str, prune: bool = False) -> LineList:
        match = re.compile(pattern).search
        return LineList(line for line in self if bool(match(line)) != prune)


class TimeitResult:
    """What `%timeit -o` returns, with the attributes IPython's result has."""

    def __init__(self, loops: int, repeat: int, all_runs: list[float]) -> None:
        self.loops, self.repeat, self.all_runs = loops, repeat, all_runs
        self.timings = [run / loops for run in all_runs]
        self.best, self.worst = min(self.timings), max(self.timings)
        self.average = math.fsum(self.timings) / len(self.timings)
        self.stdev = math.sqrt(math.fsum((t - self.average) ** 2 for t in self.timings)
                               / len(self.timings))

    def __str__(self) -> str:
        runs = "run" if self.repeat == 1 else "runs"
        loops = "loop" if self.loops == 1 else "loops"
        return (f"{format_time(self.average)} ± {format_time(self.stdev)} per loop (mean ± "
                f"std. dev. of {self.repeat} {runs}, {self.loops:,} {loops} each)")

    def __repr__(self) -> str:
        return f"<TimeitResult : {self}>"


def format_time(seconds: float, precision: int = 3) -> str:
    """A duration as IPython shows one: 3 significant digits, in s, ms, µs or ns."""
    if seconds >= 60.0:
        minutes, rest = divmod(seconds, 60.0)
        hours, minutes = divmod(minutes, 60.0)
        parts = [(hours, "h"), (minutes, "min"), (rest, "s")]
        return " ".join(f"{value:.0f}{unit}" for value, unit in parts if value)
    for factor, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "µs"), (1e9, "ns")):
        if seconds * factor >= 1.0 or unit == "ns":
            return f"{seconds * factor:.{precision}g} {unit}"
    return f"{seconds:.{precision}g} s"


_NEEDS_KERNEL = ("load_ext", "unload_ext", "reload_ext", "config", "gui", "qtconsole",
                 "connect_info", "autoreload", "aimport", "debug", "pdb", "sandbox",
                 "autosave", "edit", "notebook", "logstart", "logon", "logoff", "store",
                 "sx", "system", "alias", "unalias", "rehashx", "colors", "xmode", "autocall",
                 "automagic", "doctest_mode", "history", "recall", "rerun", "macro", "save",
                 "load", "paste", "cpaste", "javascript", "js", "capture", "prun", "lprun",
                 "mprun", "memit", "tb", "killbgscripts", "reset", "reset_selective")


class ChildShell:
    """The `get_ipython()` of a sandboxed cell: magics and shell commands over the
    session's namespace, run by the cell's own (confined) process."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.user_ns = namespace
        self._previous_dir: str | None = None
        self._line: dict[str, Callable[[str], Any]] = {
            "time": self._time, "timeit": self._timeit, "matplotlib": self._matplotlib,
            "env": self._env, "pwd": lambda line: os.getcwd(), "cd": self._cd,
            "pip": self._pip, "conda": self._conda, "pinfo": self._pinfo,
            "pinfo2": lambda line: self._pinfo(line, source=True), "who": self._who,
            "run": self._run, "psource": lambda line: self._pinfo(line, source=True, only=True),
            "pdoc": lambda line: self._pinfo(line, only=True),
        }
        self._cell: dict[str, Callable[[str, str], Any]] = {
            "time": lambda line, cell: self._time(cell), "timeit": self._timeit_cell,
            "writefile": self._writefile, "bash": self._script("bash"),
            "sh": self._script("sh"), "script": self._script(None),
            "html": self._show("text/html"), "HTML": self._show("text/html"),
            "markdown": self._show("text/markdown"), "latex": self._show("text/latex"),
            "svg": self._show("image/svg+xml"),
        }

    # -- what IPython's transformed cells call --------------------------------------------------
    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> Any:
        handler = self._line.get(name)
        if handler is None:
            raise UsageError(_unavailable("%" + name))
        return handler(line if name in ("time", "timeit", "pinfo", "pinfo2") else
                       self.expand(line))

    def run_cell_magic(self, name: str, line: str, cell: str) -> Any:
        handler = self._cell.get(name)
        if handler is None:
            raise UsageError(_unavailable("%%" + name))
        return handler(self.expand(line), cell)

    def system(self, command: str) -> None:
        """`!cmd`: run by /bin/sh in the sandbox, its output streamed as the cell's."""
        flush_streams()
        done = subprocess.run(self.expand(command), shell=True, check=False)
        self.user_ns["_exit_code"] = done.returncode

    def getoutput(self, command: str, split: bool = True, depth: int = 0) -> Any:
        """`x = !cmd`: the command's output (its errors too, as IPython gives them)."""
        flush_streams()
        done = subprocess.run(self.expand(command), shell=True, check=False,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.user_ns["_exit_code"] = done.returncode
        text = done.stdout.decode("utf-8", "replace")
        return LineList(text.splitlines()) if split else text

    def expand(self, text: str) -> str:
        """IPython's expansion: `{expression}` and `$name` from the namespace; `{{`, `}}`
        and `$$` stand for themselves. What cannot be evaluated is left as written."""
        def braces(match: re.Match[str]) -> str:
            if match.group(0) in ("{{", "}}"):
                return match.group(0)[0]
            try:
                return str(eval(match.group(1), self.user_ns))  # noqa: S307 - the cell's own
            except Exception:  # noqa: BLE001
                return match.group(0)

        def dollars(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name = match.group(1) or match.group(2)
            return str(self.user_ns[name]) if name in self.user_ns else match.group(0)

        text = re.sub(r"\{\{|\}\}|\{([^{}]+)\}", braces, text)
        return re.sub(r"\$\$|\$\{(\w+)\}|\$(\w+)", dollars, text)

    # -- timing ---------------------------------------------------------------------------------
    def _time(self, code: str) -> Any:
        """`%time` and `%%time`: run once, print the CPU and wall time, give the value of a
        last expression."""
        tree = ast.parse(code, "<sandbox-time>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        before, wall = os.times(), time.perf_counter()
        exec(compile(tree, "<sandbox-time>", "exec"), self.user_ns)  # noqa: S102 - confined
        value = None
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<sandbox-time>", "eval"),  # noqa: S307
                         self.user_ns)
        wall, after = time.perf_counter() - wall, os.times()
        user, system = after.user - before.user, after.system - before.system
        print(f"CPU times: user {format_time(user)}, sys: {format_time(system)}, "
              f"total: {format_time(user + system)}\nWall time: {format_time(wall)}")
        return value

    def _timeit(self, line: str) -> Any:
        options, statement = _timeit_options(line)
        return self._measure(statement or "pass", "pass", options)

    def _timeit_cell(self, line: str, cell: str) -> Any:
        options, setup = _timeit_options(line)
        return self._measure(cell, setup or "pass", options)

    def _measure(self, statement: str, setup: str, options: dict[str, str]) -> Any:
        timer = timeit.Timer(statement, setup, timer=time.perf_counter, globals=self.user_ns)
        repeat = int(options.get("-r", 7))
        number = int(options.get("-n", 0))
        if number <= 0:  # as IPython: the first power of ten that takes 0.2 s
            number = 1
            for power in range(10):
                number = 10 ** power
                if timer.timeit(number) >= 0.2:
                    break
        result = TimeitResult(number, repeat, timer.repeat(repeat, number))
        if "-q" not in options:
            print(result)
        return result if "-o" in options else None

    # -- environment ----------------------------------------------------------------------------
    def _matplotlib(self, line: str) -> None:
        backend = line.strip().split()[0] if line.strip() else ""
        if backend in ("", "inline"):
            if not backend:
                print("Using matplotlib backend: inline (a sandboxed cell's figures show as images)")
            return
        raise UsageError(f"%matplotlib {backend} cannot run in a sandboxed cell: its figures "
                         "show as images (inline); run the cell without %%sandbox for "
                         "interactive figures")

    def _env(self, line: str) -> Any:
        line = line.strip()
        if not line:
            return dict(os.environ)
        name, sep, value = line.partition("=")
        if not sep:
            name, _, value = line.partition(" ")
            if not value:
                return os.environ.get(name, "")
        os.environ[name.strip()] = value.strip()
        print(f"env: {name.strip()}={value.strip()}")
        return None

    def _cd(self, line: str) -> None:
        target = line.strip() or os.path.expanduser("~")
        if target == "-":
            if self._previous_dir is None:
                raise UsageError("%cd -: no previous folder")
            target = self._previous_dir
        previous = os.getcwd()
        try:
            os.chdir(os.path.expanduser(target))
        except OSError as exc:
            raise UsageError(f"%cd {target}: {exc.strerror}") from None
        self._previous_dir = previous
        print(os.getcwd())

    def _pip(self, line: str) -> None:
        """`%pip install ...` into the sandbox's home (the kernel's packages stay as they
        are), through the sandbox's egress rules."""
        words = shlex.split(line)
        if words[:1] == ["install"] and not os.environ.get("HTTPS_PROXY"):
            raise UsageError("%pip install needs the network, and this sandbox has none: add "
                             "pypi.org and files.pythonhosted.org to the policy's egress rules")
        if words[:1] == ["install"]:
            target = os.path.join(os.path.expanduser("~"), ".sandbox-packages")
            words[1:1] = ["--target", target, "--no-warn-script-location"]
            if target not in sys.path:
                sys.path.insert(1, target)
            print(f"[sandbox] installing into {target}, for this sandbox only", flush=True)
        flush_streams()
        done = subprocess.run([sys.executable, "-m", "pip", *words], check=False)
        self.user_ns["_exit_code"] = done.returncode
        if words[:1] == ["install"] and done.returncode == 0:
            import importlib

            importlib.invalidate_caches()

    def _conda(self, line: str) -> None:
        raise UsageError("%conda cannot install into a sandbox (it changes the kernel's "
                         "environment); use %pip install, which installs for this sandbox only")

    def _who(self, line: str) -> None:
        names = sorted(name for name, value in self.user_ns.items()
                       if not name.startswith("_") and name not in ("get_ipython", "In", "Out",
                                                                    "exit", "quit")
                       and not inspect.ismodule(value))
        print("\t".join(names) if names else "Interactive namespace is empty.")

    def _run(self, line: str) -> None:
        """`%run script.py args`: the script as `__main__`, its names left in the namespace."""
        words = shlex.split(line)
        if not words:
            raise UsageError("%run needs a file name")
        if words[0].startswith("-"):
            raise UsageError(f"%run {words[0]}: options are not available in a sandboxed cell")
        path = words[0]
        with open(path, encoding="utf-8") as source:
            code = compile(source.read(), path, "exec")
        saved = sys.argv
        sys.argv = words
        scope = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
        try:
            exec(code, scope)  # noqa: S102 - confined
        finally:
            sys.argv = saved
        self.user_ns.update({k: v for k, v in scope.items() if not k.startswith("__")})

    # -- help -----------------------------------------------------------------------------------
    def _pinfo(self, line: str, *, source: bool = False, only: bool = False) -> None:
        """`obj?` (signature, type, docstring) and `obj??` (its source where there is one)."""
        name = line.strip().lstrip("*")
        try:
            obj = eval(name, self.user_ns)  # noqa: S307 - the cell's own expression
        except Exception:  # noqa: BLE001
            print(f"Object `{name}` not found.")
            return
        if only:
            text = _source(obj) if source else (inspect.getdoc(obj) or "")
            print(text or "No documentation found.")
            return
        parts = []
        try:
            parts.append(("Signature", f"{name}{inspect.signature(obj)}"))
        except (TypeError, ValueError):
            pass
        code = _source(obj) if source else None
        if code:
            parts.append(("Source", "\n" + code))
        else:
            doc = inspect.getdoc(obj) or pydoc.describe(obj)
            parts.append(("Docstring", doc if "\n" not in doc else "\n" + doc))
        where = inspect.getsourcefile(obj) if _has_source(obj) else None
        if where:
            parts.append(("File", where))
        parts.append(("Type", type(obj).__name__))
        print("\n".join(f"{label}:{' ' * max(1, 10 - len(label))}{text}" for label, text in parts))

    # -- cell magics ----------------------------------------------------------------------------
    def _writefile(self, line: str, cell: str) -> None:
        words = shlex.split(line)
        append = "-a" in words or "--append" in words
        names = [word for word in words if not word.startswith("-")]
        if len(names) != 1:
            raise UsageError("%%writefile needs one file name")
        exists = os.path.exists(names[0])
        with open(names[0], "a" if append else "w", encoding="utf-8") as out:
            out.write(cell)
        print(("Appending to " if append else "Overwriting " if exists else "Writing ")
              + names[0])

    def _script(self, program: str | None) -> Callable[[str, str], None]:
        def run(line: str, cell: str) -> None:
            words = shlex.split(line)
            command = [program, *words] if program else words
            if not command:
                raise UsageError("%%script needs a program, as in %%script python3")
            flush_streams()
            done = subprocess.run(command, input=cell.encode(), check=False)
            self.user_ns["_exit_code"] = done.returncode
        return run

    @staticmethod
    def _show(mime: str) -> Callable[[str, str], None]:
        def show(line: str, cell: str) -> None:
            display.display({mime: cell}, raw=True)
        return show


def _timeit_options(line: str) -> tuple[dict[str, str], str]:
    try:
        options, rest = getopt.getopt(shlex.split(line, posix=False), "n:r:tcp:qo")
    except getopt.GetoptError as exc:
        raise UsageError(f"%timeit: {exc}") from None
    return dict(options), " ".join(rest)


def _unavailable(magic: str) -> str:
    if magic.lstrip("%") in _NEEDS_KERNEL:
        return (f"{magic} needs the kernel and cannot run in a sandboxed cell; run it in a "
                "cell without %%sandbox")
    return (f"{magic} is not available in a sandboxed cell (it runs: %time, %timeit, "
            "%matplotlib inline, %env, %pwd, %cd, %pip install, %run, %who, obj?, !cmd, "
            "%%writefile, %%bash, %%html, %%markdown); run it in a cell without %%sandbox")


def _has_source(obj: Any) -> bool:
    return inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isfunction(obj) \
        or inspect.ismethod(obj)


def _source(obj: Any) -> str | None:
    if not _has_source(obj):
        return None
    try:
        return inspect.getsource(obj).rstrip("\n")
    except (OSError, TypeError):
        return None
