"""`%%sandbox` and `%sandbox`: run a cell under the session's policy, and look at the session.

This module renders and forwards. What a cell may ask for is decided by the policy layer
(`policy.narrowing`), what a child may do by the runner, who approves by the approval broker;
here we parse options, stream output, feed the gauges and turn a `SandboxResult` into what the
cell shows.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import math
import os
import re
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from traitlets import Bool, Enum, Float, TraitError, Unicode, observe, validate

from ..approval import (
    ApprovalBroker,
    ApprovalResponder,
    Decision,
    HeadlessResponder,
    set_default_responder,
)
from ..policy.errors import (
    CapabilityParseError, ConfigurationError, SandboxError, ToolError, UnreadableWorkdirError)
from ..policy.examples import EXAMPLES, example_policy
from ..policy.write_protected import kernel_workdirs
from ..policy.models import CapabilityDeclaration, SandboxResult
from ..policy.narrowing import Narrowing, NarrowingError, lower_only, narrow
from ..policy.parser import CapabilityParser
from ..runner.linux.remove_tree import remove_tree
from .kernel_routing import shell_click_delivery
from .table import Table

__all__ = ["SandboxCellError", "SandboxMagics", "Table"]

_logger = logging.getLogger(__name__)

SUBCOMMANDS = ("status", "policy", "list", "log", "reset", "restart", "examples")
# The `%%sandbox` option that carries each field a NarrowingError names.
_OPTION_OF = {
    "max_memory_mb": "--memory", "max_cpu_seconds": "--cpu", "timeout": "--timeout",
    "allow_read": "--allow-read", "allow_write": "--allow-write", "allow_net": "--allow-net",
}
# Where a policy grants what each option can only narrow, with an example line.
_WIDENED_BY = {
    "allow_read": "filesystem_config.readable_paths (readable_paths: [data, /srv/shared])",
    "allow_write": "filesystem_config.writable_paths (writable_paths: [out])",
    "allow_net": "network_egress_rules (network_egress_rules: [{domain: pypi.org, ports: [443]}])",
    "max_memory_mb": "resource_limits.max_memory_mb (max_memory_mb: 2048)",
    "max_cpu_seconds": "resource_limits.max_cpu_seconds (max_cpu_seconds: 120)",
}
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*\Z")
# The log's decision column speaks one language for approvals and egress.
_DECIDED = {Decision.allow_once: "approved once",
            Decision.allow_session: "approved for session", Decision.deny: "denied"}


class SandboxCellError(Exception):
    """A sandboxed cell failed or was killed. Shown as the sandboxed code's own traceback (a
    session's cell), else as one line: a one-shot child's traceback is already in the cell's
    output, and the kernel-side frames would only hide the reason."""

    def __init__(self, message: str, result: SandboxResult | None = None,
                 traceback: list[str] | None = None) -> None:
        super().__init__(message)
        self.result = result
        self.traceback = traceback

    def _render_traceback_(self) -> list[str]:
        # IPython shows this list instead of a traceback (as it does for its own errors).
        if self.traceback:
            return list(self.traceback)
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class SandboxValue:
    """A session cell's last expression's value, as the kernel shows it (`Out[n]`): the
    bundle the sandbox sent, already made safe by the runner. The object itself stays in
    the sandbox; bring data back with -o."""

    def __init__(self, result: SandboxResult) -> None:
        found = [o for o in result.outputs if o.get("kind") == "result"]
        self.data: dict[str, Any] = found[-1]["data"] if found else {}
        self.metadata: dict[str, Any] = found[-1].get("metadata", {}) if found else {}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        return dict(self.data), dict(self.metadata)

    def __repr__(self) -> str:
        return str(self.data.get("text/plain", ""))


def publish(output: Any) -> None:
    """Show one display of a sandboxed cell (already made safe by the runner) in this
    kernel's output; the cell's result waits for the end of the cell, to be its Out[n]."""
    from IPython.display import clear_output, publish_display_data

    if output.kind == "clear":
        clear_output(wait=output.wait)
    elif output.kind in ("display", "update"):
        transient = {"display_id": output.display_id} if output.display_id else None
        publish_display_data(output.data, output.metadata, transient=transient,
                             update=output.kind == "update")


def ask_person(prompt: str, password: bool) -> str:
    """`input()`/`getpass()` of a sandboxed cell, asked the way this kernel asks: the
    notebook's stdin channel (ipykernel puts it behind `input`), or the terminal. The prompt
    comes as the runner made it (`crossing_text.prompt_line`: one line, cleaned, after the
    "[sandbox]" marker), and is asked as it is."""
    import getpass

    from IPython.core.error import StdinNotImplementedError

    try:
        return getpass.getpass(prompt) if password else input(prompt)
    except StdinNotImplementedError:
        raise EOFError("input() in a sandboxed cell cannot be answered here: this frontend "
                       "takes no input (as under nbclient or papermill)") from None


@dataclass
class _Current:
    """A sandbox and the policy it was made from: the one one-shot cells (--shell, --fresh)
    run in, or a session's."""

    sandbox_id: str
    key: str
    policy: CapabilityDeclaration
    source: str
    narrowing: str = ""  # the cell options that made this policy, as the user wrote them


@dataclass
class _Session:
    """A named confined session under one effective policy (made on first use)."""

    name: str
    sandbox: _Current
    session: Any = None  # the PythonSession while it lives


class _Resources:
    """What a `SandboxMagics` starts and must stop: the manager (made on first use), the
    current sandbox, the workspace folder, and the approval responder's hooks on the kernel.

    Kept apart from the magics so that the finalizer which closes them (when the magics are
    collected, or at interpreter exit) holds no reference to the magics themselves.
    """

    def __init__(self, broker: ApprovalBroker, headless_decision: str) -> None:
        self.broker = broker
        self.headless_decision = headless_decision  # the responder a closed session leaves
        self.manager: Any = None
        self.current: _Current | None = None
        self.sessions: dict[tuple[str, str], _Session] = {}
        self.workspace: str | None = None
        self.egress_history: list[dict[str, Any]] = []  # of sandboxes already destroyed
        # Every broker made without a responder of its own (a user's toolset, tool, handler
        # or manager) asks whoever this session's broker asks, until `close`.
        self.undo_default_responder = set_default_responder(partial(_ask_through, broker))

    def egress_of(self, sandbox_id: str) -> list[dict[str, Any]]:
        if self.manager is None:
            return []
        try:
            return self.manager.egress_log(sandbox_id)
        except SandboxError:  # destroyed already
            return []

    def drop_sandbox(self) -> None:
        if self.current is None:
            return
        sandbox_id, self.current = self.current.sandbox_id, None
        self.destroy(sandbox_id)

    def destroy(self, sandbox_id: str) -> None:
        self.egress_history += self.egress_of(sandbox_id)
        self.manager.destroy(sandbox_id)

    def drop_sessions(self) -> None:
        """End every session and destroy its sandbox."""
        for entry in self.sessions.values():
            self.destroy(entry.sandbox.sandbox_id)
        self.sessions.clear()

    def end_sessions(self, name: str | None = None) -> list[str]:
        """End the processes of the sessions called `name` (all when None); their sandboxes
        (home folder, egress history) stay for the next cell's new session. Their names."""
        ended = []
        for entry in self.sessions.values():
            if (name is None or entry.name == name) and entry.session is not None:
                if entry.session.alive:
                    ended.append(entry.name)
                entry.session.close("restarted")
                entry.session = None
        return ended

    def close(self) -> None:
        """Stop every sandbox, the launcher and the monitors; remove the workspace; let the
        approval responder take its hooks off the kernel; give the process its previous
        default responder back."""
        self.undo_default_responder()
        try:
            if self.manager is not None:
                try:
                    self.drop_sessions()
                    self.drop_sandbox()
                finally:
                    manager, self.manager = self.manager, None
                    manager.close()
        finally:
            _close(self.broker.responder)
            self.broker.responder = HeadlessResponder(self.headless_decision)
        if self.workspace is not None:
            remove_tree(self.workspace)
            self.workspace = None


def _ask_through(broker: ApprovalBroker, request: Any, timeout: float | None) -> Any:
    """Answer as `broker`'s own responder would, with its timeout (the session's settings
    hold for every broker that follows the default), never through the default it may
    follow, which would be this function again."""
    responder = HeadlessResponder() if broker.follows_default else broker.responder
    return responder(request, broker.timeout)


def _positive_seconds(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise TraitError(
            f"SandboxMagics.{name} must be a positive number of seconds, got {value!r}")
    return value


def _names(groups: list[list[str]] | None, option: str) -> list[str]:
    """Variable names from `-i a,b -i c d`; each must be a Python identifier."""
    names = [n for group in groups or () for item in group for n in re.split(r"[,\s]+", item) if n]
    for name in names:
        if not _IDENTIFIER.match(name):
            raise UsageError(f"{option}: {name!r} is not a variable name")
    return list(dict.fromkeys(names))


def _way_to_widen(field: str, source: str) -> str:
    """What to change for a cell to get more: options only narrow the session's policy."""
    if field == "timeout":
        return "; to raise the ceiling: %config SandboxMagics.timeout = 120"
    where = _WIDENED_BY.get(field)
    if where is None:
        return ""
    if os.path.isfile(source):
        return f"; to allow it, add it to {where} in {source}"
    return (f"; to allow it, write a policy file with {where} and load it: "
            "%config SandboxMagics.policy = 'policy.yaml'")


def _unquoted(text: str) -> str:
    """IPython splits a magic's line keeping quotes (`"/my data"` stays one word, quotes and
    all): a path or domain in matching quotes means what is inside them."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _narrowing_text(args: Any) -> str:
    """The options that narrowed a cell's policy, as a person would write them (not its
    --timeout: that is the cell's, not the session's)."""
    parts = [f"--{name} {value:g}" for name, value in
             (("memory", args.memory), ("cpu", args.cpu)) if value is not None]
    for option in ("allow_read", "allow_write", "allow_net"):
        parts += [f"--{option.replace('_', '-')} {value}" for value in getattr(args, option)]
    return " ".join(parts)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds // 60 % 60} min"


def _clock(timestamp: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(timestamp)) if timestamp else ""


@magics_class
class SandboxMagics(Magics):
    """Run cells in a kernel-confined sandbox. A `Magics` is a traitlets `Configurable` and
    registers itself in `shell.configurables`, so `%config SandboxMagics.policy = "p.yaml"` and
    profile config (`c.SandboxMagics.policy`) both set these traits."""

    policy = Unicode(
        "", help="Policy file (YAML) every %%sandbox cell runs under; '' means the built-in "
        "default: no network, and one fresh writable workspace folder as the only file access",
    ).tag(config=True)
    allow_policy_override = Bool(
        False, help="Whether a cell may name its own policy file with --policy (which then "
        "replaces the session's policy as the ceiling; off, so that cells only narrow)",
    ).tag(config=True)
    headless_decision = Enum(
        ["allow_once", "deny"], default_value="deny",
        help="Answer to approval requests when no frontend can show the approval widget",
    ).tag(config=True)
    approval_timeout = Float(120.0, help="Seconds an approval may wait for a click; then it "
                             "is denied").tag(config=True)
    render_timeout = Float(5.0, help="Seconds to wait for a frontend to show the approval "
                           "widget before the headless decision applies").tag(config=True)
    gauge_interval = Float(0.25, help="Seconds between samples of a running cell (gauges and "
                           "memory/CPU checks)").tag(config=True)
    timeout = Float(60.0, help="Wall-clock seconds a sandboxed cell may run; --timeout may "
                    "only lower it").tag(config=True)

    def __init__(self, shell: Any) -> None:
        self._configured = False  # loading config fires the observers: they wait for this
        try:
            super().__init__(shell=shell)  # registers in shell.configurables, then loads config
        except Exception:
            if self in getattr(shell, "configurables", ()):
                shell.configurables.remove(self)  # a bad setting must not leave a half-made one
            raise
        self.broker = ApprovalBroker(self._responder(), timeout=self.approval_timeout)
        self._resources = _Resources(self.broker, self.headless_decision)
        # Closes them when these magics are collected, and at interpreter exit (a kernel that
        # exits without %unload_ext leaves nothing); `close` runs it sooner. It holds the
        # resources, not `self`, so it does not keep these magics alive.
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._configured = True
        self.last_result: SandboxResult | None = None
        self._sandboxes_seen: list[str] = []
        self._ceilings: dict[tuple[Any, ...], tuple[CapabilityDeclaration, str, str]] = {}
        self._narrowed: dict[tuple[Any, ...], CapabilityDeclaration] = {}
        self._keys: dict[int, tuple[CapabilityDeclaration, str]] = {}
        self._parsed: dict[str, Any] = {}

    # -- settings ---------------------------------------------------------------------------------
    @validate("approval_timeout", "render_timeout", "gauge_interval", "timeout")
    def _check_seconds(self, proposal: Any) -> float:
        return _positive_seconds(proposal["trait"].name, proposal["value"])

    @validate("policy")
    def _check_policy(self, proposal: Any) -> str:
        value = proposal["value"]
        if not value:
            return ""
        if value in EXAMPLES:  # an example policy, by name (`%sandbox examples`)
            try:
                example_policy(value, kernel_workdirs()[0], tempfile.gettempdir())
            except (CapabilityParseError, ConfigurationError) as exc:
                raise TraitError(f"SandboxMagics.policy: {exc}") from None
            return value
        # The file itself, not a link to it: a link inside a folder a sandbox may write
        # could be pointed elsewhere, and the policy is read again when its file changes
        path = os.path.realpath(os.path.expanduser(value))
        try:
            CapabilityParser.from_file(path)
        except CapabilityParseError as exc:
            raise TraitError(f"SandboxMagics.policy: {exc}") from None
        return path

    @observe("headless_decision", "render_timeout")
    def _responder_changed(self, change: Any) -> None:
        if self._configured:
            old, self.broker.responder = self.broker.responder, self._responder()
            _close(old)
            self._resources.headless_decision = self.headless_decision

    @observe("approval_timeout")
    def _approval_timeout_changed(self, change: Any) -> None:
        if self._configured:
            self.broker.timeout = change["new"]

    def _responder(self) -> ApprovalResponder:
        from .approval_widget import responder_for

        return responder_for(self.shell, headless_decision=self.headless_decision,
                             render_timeout=self.render_timeout)

    # -- the session's manager, workspace and sandbox ---------------------------------------------
    @property
    def manager(self) -> Any:
        """The session's SandboxManager, made on first use (its launcher starts on first run)."""
        resources = self._resources
        if resources.manager is None:
            from ..runner.trusted.manager import SandboxManager

            resources.manager = SandboxManager(monitor_interval=self.gauge_interval,
                                               broker=self.broker)
        resources.manager.monitor_interval = self.gauge_interval  # read at each run
        return resources.manager

    @property
    def workspace(self) -> str:
        """The default policy's writable folder: made once per session, removed on unload."""
        if self._resources.workspace is None:
            folder = tempfile.mkdtemp(prefix="sandbox-workspace-")
            uid = self.manager.child_uid
            if uid is not None:  # as root, children run as this unprivileged uid
                os.chown(folder, uid, uid)
            self._resources.workspace = folder
        return self._resources.workspace

    def session_policy(self, path: str | None = None) -> tuple[CapabilityDeclaration, str]:
        """(policy, where it came from): `path`, else the configured file or example,
        else the default."""
        path = path or self.policy
        if path in EXAMPLES:
            notebook = kernel_workdirs()[0]  # where the kernel started, whatever %cd did since
            return (example_policy(path, notebook, self.workspace),
                    f"example {path} (notebook folder {notebook}, workspace {self.workspace})")
        if path:
            return CapabilityParser.from_file(path), path
        return (CapabilityDeclaration.workspace_only(self.workspace),
                f"built-in default (workspace {self.workspace})")

    def _policy_key(self, policy: CapabilityDeclaration) -> str:
        """What makes two effective policies the same (their sessions too); remembered per
        policy object, since the cached ones come back cell after cell."""
        known = self._keys.get(id(policy))
        if known is not None and known[0] is policy:
            return known[1]
        key = json.dumps([policy.model_dump(mode="json"), str(policy.base_path),
                          [rule.rate_windows for rule in policy.network_egress_rules]],
                         sort_keys=True)
        if len(self._keys) >= 256:
            self._keys.clear()
        self._keys[id(policy)] = (policy, key)
        return key

    def _new_sandbox(self, policy: CapabilityDeclaration, source: str,
                     narrowing: str) -> _Current:
        key = self._policy_key(policy)
        sandbox_id = self.manager.create_sandbox(policy)
        self._sandboxes_seen.append(sandbox_id)
        return _Current(sandbox_id, key, policy, source, narrowing)

    def _sandbox_for(self, policy: CapabilityDeclaration, source: str, narrowing: str = "") -> str:
        """The one-shot cells' sandbox, re-made when the effective policy changes."""
        resources = self._resources
        if resources.current is not None and resources.current.key == self._policy_key(policy):
            return resources.current.sandbox_id
        resources.drop_sandbox()
        resources.current = self._new_sandbox(policy, source, narrowing)
        return resources.current.sandbox_id

    def _session_for(self, name: str, policy: CapabilityDeclaration, source: str,
                     narrowing: str) -> Any:
        """The live session `name` under this effective policy, started if needed (a new
        one after the last ended)."""
        key = (name, self._policy_key(policy))
        entry = self._resources.sessions.get(key)
        if entry is None:
            entry = _Session(name, self._new_sandbox(policy, source, narrowing))
            self._resources.sessions[key] = entry
        if entry.session is None or not entry.session.alive:
            if entry.session is not None:
                ended = entry.session
                ended.close()
                print(f"[sandbox] session {name!r} had ended ({ended.end_reason}); this cell "
                      "starts a new one, without its variables", file=sys.stderr)
            entry.session = self._start_session(entry.sandbox.sandbox_id)
        return entry.session

    def _start_session(self, sandbox_id: str) -> Any:
        """A session in the notebook's folder where its policy lets it read it (a relative
        path then means in a cell what it means in the notebook), else in the runner's
        default (the first writable folder)."""
        try:
            return self.manager.start_session(sandbox_id, cwd=os.getcwd())
        except UnreadableWorkdirError:
            return self.manager.start_session(sandbox_id)

    def close(self) -> None:
        """Stop every sandbox, the launcher and the monitors; remove the workspace; let the
        approval responder take its hooks off the kernel. The finalizer does this (once: a
        second call, or the collection of these magics later, does nothing)."""
        self._resources.headless_decision = self.headless_decision
        self._finalizer()

    def toolset(self, policy: CapabilityDeclaration | None = None, **kwargs: Any) -> Any:
        """A FileSystemToolset for code in the kernel that shares this session's approvals."""
        from ..files.toolset import FileSystemToolset

        return FileSystemToolset.from_policy(policy or self.session_policy()[0],
                                             broker=self.broker, **kwargs)

    # -- %%sandbox --------------------------------------------------------------------------------
    # Groups, as `%%sandbox?` shows them: each `argument_group` takes the arguments below it.
    @magic_arguments.magic_arguments(name="%sandbox")  # the usage line reads "%%sandbox"
    @magic_arguments.argument_group("Cell")
    @magic_arguments.argument("--policy", metavar="FILE",
                              help="Policy file for this cell instead of SandboxMagics.policy "
                              "(only if SandboxMagics.allow_policy_override is True).")
    @magic_arguments.argument("--shell", action="store_true",
                              help="Run the cell as a /bin/sh script instead of Python.")
    @magic_arguments.argument("--session", metavar="NAME", default="default",
                              help="Run in the named session (each name is an independent "
                              "process with its own variables; default: 'default').")
    @magic_arguments.argument("--fresh", action="store_true",
                              help="Run this cell alone in a new process that ends with it "
                              "(no variables from or for other cells).")
    @magic_arguments.argument_group("Narrowing (options only narrow the session's policy)")
    @magic_arguments.argument("--timeout", type=float, metavar="S",
                              help="Wall-clock limit in seconds (only lower than "
                              "SandboxMagics.timeout).")
    @magic_arguments.argument("--memory", type=int, metavar="MB",
                              help="Memory limit of the whole process tree (only lower).")
    @magic_arguments.argument("--cpu", type=float, metavar="S",
                              help="CPU seconds of the whole process tree (only lower).")
    @magic_arguments.argument("--allow-read", action="append", default=[], metavar="PATH",
                              help="Read only these paths (repeatable); each must be readable "
                              "under the policy.")
    @magic_arguments.argument("--allow-write", action="append", default=[], metavar="PATH",
                              help="Write only these paths (repeatable); each must be writable "
                              "under the policy.")
    @magic_arguments.argument("--allow-net", action="append", default=[], metavar="DOMAIN[:PORT]",
                              help="Reach only these destinations (repeatable); each must be "
                              "allowed by the policy's egress rules.")
    @magic_arguments.argument_group("Variables (Python cells only)")
    @magic_arguments.argument("-i", "--input", action="append", nargs="+", metavar="VARS",
                              help="Kernel variables to pass in (comma or space separated).")
    @magic_arguments.argument("-o", "--output", action="append", nargs="+", metavar="VARS",
                              help="Cell variables to bring back (JSON-safe data, bytes too).")
    @magic_arguments.argument_group("Output")
    @magic_arguments.argument("--out", metavar="VAR",
                              help="Store stdout in this variable instead of printing it.")
    @magic_arguments.argument("--err", metavar="VAR",
                              help="Store stderr in this variable instead of printing it.")
    @magic_arguments.argument("--no-raise-error", action="store_false", dest="raise_error",
                              help="Do not raise SandboxCellError when the cell fails or is "
                              "killed.")
    @magic_arguments.argument("--quiet", action="store_true", help="Do not show the gauges.")
    @no_var_expand
    @cell_magic("sandbox")
    def sandbox_cell(self, line: str, cell: str) -> None:
        """Run the cell's Python (or, with --shell, its shell script) in a sandbox that the
        operating system confines to the session's policy.

        Options may only narrow that policy: lower budgets, fewer paths, fewer destinations.
        Output streams live; a failure or a kill raises SandboxCellError with the reason.
        """
        args = self._parse(line)
        inputs, outputs = self._variables(args)
        if args.shell and (args.fresh or args.session != "default"):
            raise UsageError("--session and --fresh are for Python cells; a --shell cell "
                             "always runs on its own")
        policy, source, timeout = self._effective(args)
        narrowing = _narrowing_text(args)
        if args.shell:
            self._check_shell(cell)
        run = _Run(self, args, None if args.quiet else policy, timeout)
        hooks = run.start()
        try:
            if args.shell:
                sandbox_id = self._one_shot_sandbox(policy, source, narrowing)
                result = self.manager.execute(sandbox_id, ["/bin/sh", "-c", cell], timeout,
                                              on_output=run.on_output, **hooks)
            else:
                result = self._run_python(args, cell, policy, source, narrowing, inputs,
                                          outputs, timeout, run, hooks)
        except KeyboardInterrupt:
            run.finish(None, "interrupted")
            message = "interrupted: the sandboxed cell and all its processes were killed"
            if args.raise_error:
                raise SandboxCellError(message) from None
            print(f"[sandbox] {message}", file=sys.stderr)
            return None
        except SandboxError as exc:
            run.finish(None, f"failed: {exc}")
            raise SandboxCellError(str(exc)) from None
        except BaseException as exc:  # a bug of ours: the gauges still stop, the error shows
            run.finish(None, f"failed: {type(exc).__name__}")
            raise
        self.last_result = result
        run.finish(result, _outcome(result))
        if result.exit_code == 0 and result.killed is None:
            # Only the names this cell's -o asked for, whatever the result carries.
            self.shell.user_ns.update({name: result.variables[name] for name in outputs
                                       if name in result.variables})
            return None if result.result is None else SandboxValue(result)
        message = _failure(result, shell=args.shell)
        traceback = (result.error or {}).get("traceback")
        if args.raise_error:
            raise SandboxCellError(message, result, traceback)
        if traceback:
            print("\n".join(traceback), file=sys.stderr)
        elif result.killed is not None and not args.err:
            print(f"[sandbox] killed: {result.killed}", file=sys.stderr)
        return None

    def _one_shot_sandbox(self, policy: CapabilityDeclaration, source: str, narrowing: str) -> str:
        try:
            return self._sandbox_for(policy, source, narrowing)
        except SandboxError as exc:
            raise SandboxCellError(f"cannot create the sandbox: {exc}") from None

    def _run_python(self, args: Any, cell: str, policy: CapabilityDeclaration, source: str,
                    narrowing: str, inputs: dict[str, Any], outputs: list[str], timeout: float,
                    run: _Run, hooks: dict[str, Any]) -> SandboxResult:
        """In the cell's session (started if needed), or with --fresh in a session of its own
        that ends with the cell."""
        # The running cell's number, as its In[n] (IPython 9 counts the next cell already).
        options = dict(inputs=inputs, outputs=outputs, timeout=timeout,
                       cell=self.shell.displayhook.prompt_count, on_output=run.on_output,
                       on_display=run.publish, on_input=ask_person, **hooks)
        try:
            if args.fresh:
                session = self._start_session(self._one_shot_sandbox(policy, source, narrowing))
            else:
                session = self._session_for(args.session, policy, source, narrowing)
        except SandboxError as exc:
            raise SandboxCellError(f"cannot start the session: {exc}") from None
        try:
            return session.run_cell(self._as_python(cell), **options)
        finally:
            if args.fresh:
                session.close()

    def _as_python(self, cell: str) -> str:
        """The cell as the session runs it: plain Python as written; IPython's syntax
        (`%timeit`, `!ls`, `obj?`) as the kernel's IPython transforms it, into calls the
        session's `get_ipython()` answers inside the sandbox. Below an empty first line, so
        a traceback's line numbers are the editor's (its first line is `%%sandbox`)."""
        try:
            ast.parse(cell)
            return "\n" + cell
        except (SyntaxError, ValueError):
            pass
        try:
            return "\n" + self.shell.transform_cell(cell)
        except Exception:  # noqa: BLE001 - the session reports the cell's own syntax error
            return "\n" + cell

    def _parse(self, line: str) -> Any:
        """The options of a `%%sandbox` line, parsed once per distinct line (a notebook
        repeats its lines; argparse would be a tenth of a quick cell's cost)."""
        parsed = self._parsed.get(line)
        if parsed is None:
            parsed = magic_arguments.parse_argstring(self.sandbox_cell, line)
            if len(self._parsed) >= 256:
                self._parsed.clear()
            self._parsed[line] = parsed
        return argparse.Namespace(**{key: list(value) if isinstance(value, list) else value
                                     for key, value in vars(parsed).items()})

    def _variables(self, args: Any) -> tuple[dict[str, Any], list[str]]:
        inputs = _names(args.input, "-i/--input")
        outputs = _names(args.output, "-o/--output")
        if args.shell and (inputs or outputs):
            raise UsageError("-i/--input and -o/--output work with Python cells, not with --shell")
        for var in (args.out, args.err):
            if var is not None and not _IDENTIFIER.match(var):
                raise UsageError(f"--out/--err: {var!r} is not a variable name")
        missing = [name for name in inputs if name not in self.shell.user_ns]
        if missing:
            raise UsageError(f"-i/--input: no kernel variable named {', '.join(missing)}")
        return {name: self.shell.user_ns[name] for name in inputs}, outputs

    def _effective(self, args: Any) -> tuple[CapabilityDeclaration, str, float]:
        """The cell's policy and timeout: the ceiling narrowed by the options, or UsageError."""
        if args.policy:
            args.policy = _unquoted(args.policy)
        if args.policy and not self.allow_policy_override:
            raise UsageError("--policy: this session does not let a cell choose its policy "
                             "(SandboxMagics.allow_policy_override is False)")
        try:
            ceiling, source, ceiling_key = self._ceiling(args.policy)
        except CapabilityParseError as exc:
            raise UsageError(f"--policy: {exc}" if args.policy else str(exc)) from None
        timeout = self.timeout if args.timeout is None else None
        # Budgets and destinations narrow the same way every time; paths are resolved anew.
        reused = (ceiling_key, args.memory, args.cpu, tuple(args.allow_net))
        if not (args.allow_read or args.allow_write) and reused in self._narrowed:
            policy = self._narrowed[reused]
            try:
                if timeout is None:
                    timeout = lower_only("timeout", args.timeout, self.timeout, " s")
            except NarrowingError as exc:
                raise UsageError(f"{_OPTION_OF.get(exc.field, exc.field)}: {exc}"
                                 f"{_way_to_widen(exc.field, source)}") from None
            return policy, source, timeout
        from ..runner.trusted.plan import withheld_from_everywhere

        request = Narrowing(
            max_memory_mb=args.memory, max_cpu_seconds=args.cpu,
            allow_read=tuple(map(_unquoted, args.allow_read)),
            allow_write=tuple(map(_unquoted, args.allow_write)),
            allow_net=tuple(map(_unquoted, args.allow_net)),
        )
        try:
            # The credential list walks every home folder: only paths being named need it.
            denied = withheld_from_everywhere() if args.allow_read or args.allow_write else ()
            policy = narrow(ceiling, request, denied=denied)
            if timeout is None:
                timeout = lower_only("timeout", args.timeout, self.timeout, " s")
        except NarrowingError as exc:
            raise UsageError(f"{_OPTION_OF.get(exc.field, exc.field)}: {exc}"
                             f"{_way_to_widen(exc.field, source)}") from None
        if not (args.allow_read or args.allow_write):
            if len(self._narrowed) >= 64:
                self._narrowed.clear()
            self._narrowed[reused] = policy
        return policy, source, timeout

    def _ceiling(self, path: str | None) -> tuple[CapabilityDeclaration, str, str]:
        """(policy, source, key) of the session's policy, parsed again only when its file
        changed (a YAML parse per cell would be most of a quick cell's cost)."""
        path = path or self.policy
        try:
            info = os.stat(path) if path and path not in EXAMPLES else None
        except OSError:
            info = None  # the parser says what is wrong with it
        signature = ((path, info.st_mtime_ns, info.st_size, info.st_ino) if info is not None
                     else (path, self.workspace) if path in EXAMPLES
                     else (path, self.workspace if not path else None))
        cached = (self._ceilings.get(signature)
                  if info is not None or not path or path in EXAMPLES else None)
        if cached is None:
            policy, source = self.session_policy(path)
            cached = (policy, source, self._policy_key(policy))
            if len(self._ceilings) >= 16:
                self._ceilings.clear()
            self._ceilings[signature] = cached
        return cached

    @staticmethod
    def _check_shell(script: str) -> None:
        """The terminal tool's blacklist, before anything runs (the confinement still applies
        to everything it cannot see)."""
        from ..tools.terminal import TerminalTool

        try:
            TerminalTool().check(script)
        except ToolError as exc:
            raise SandboxCellError(f"refused before running: {exc}") from None

    # -- %sandbox ---------------------------------------------------------------------------------
    @line_magic("sandbox")
    def sandbox_line(self, line: str) -> Any:
        """%sandbox status | policy | list | log | reset | restart [NAME] | examples

        status: which confinement layers this host enforces. policy: the session's policy.
        list: the confined sessions (policy, uptime, cells run, memory, state). log: approvals
        and egress decisions of this session. reset: forget the approvals given "for this
        session". restart [NAME]: end the sessions called NAME (all without one); the next
        cell starts afresh. examples: the policies for the common cases, chosen by name.
        """
        words = line.split()
        if words[:1] == ["restart"] and len(words) <= 2:
            return self._restart(words[1] if len(words) == 2 else None)
        if len(words) != 1 or words[0] not in SUBCOMMANDS or words[0] == "restart":
            raise UsageError(f"%sandbox takes one of: {', '.join(SUBCOMMANDS)} "
                             f"(got {line.strip()!r}); run %%sandbox? for the cell magic")
        return getattr(self, f"_show_{words[0]}")()

    def _restart(self, name: str | None) -> None:
        known = {entry.name for entry in self._resources.sessions.values()}
        if name is not None and name not in known:
            raise UsageError(f"%sandbox restart: no session called {name!r} "
                             f"(sessions: {', '.join(sorted(known)) or 'none yet'})")
        ended = self._resources.end_sessions(name) if self._resources.manager else []
        what = ", ".join(sorted(set(ended))) or "none were running"
        print(f"Ended {len(ended)} session(s) ({what}); the next %%sandbox cell starts afresh.")

    def _show_examples(self) -> Table:
        """The example policies, with how to choose one and where it would point now."""
        return Table("Example policies", ["example", "what it grants"],
                     [[name, what] for name, (what, _) in EXAMPLES.items()],
                     [f'choose one with %config SandboxMagics.policy = "NAME" (the notebook\'s '
                      f"folder is where the kernel started, {kernel_workdirs()[0]}); %sandbox "
                      "policy then shows it in full, to copy into a policy file of your own"])

    def _show_status(self) -> Table:
        from ..runner.trusted.isolation import isolation_report

        report = isolation_report()
        rows = [[name.replace("_", " "), "enforced" if on else "MISSING"]
                for name, on in report["layers"].items()]
        notes = [f"Host: {report['platform']}, Python {report['python']}, "
                 f"Landlock ABI {report['landlock_abi']}.",
                 f"Sandboxed children run as {report['child_identity']}.",
                 f"Sandbox homes: {report['home_space']}."]
        delivery = shell_click_delivery(self.shell)
        if delivery is not None:
            notes.append(f"Approval clicks: {delivery.detail}.")
        if report["missing"]:
            notes.append("Missing: " + "; ".join(report["missing"]))
        notes += [f"Tier {tier}: {state}" for tier, state in report["tiers"].items()]
        return Table("Isolation on this host", ["layer", "state"], rows, notes)

    def _show_policy(self) -> None:
        import yaml

        try:
            policy, source = self.session_policy()
        except CapabilityParseError as exc:
            raise UsageError(str(exc)) from None
        print(f"# Session policy: {source}")
        current = self._resources.current
        if current is not None and current.policy != policy:
            print("# (the last cell ran narrower: see its options)")
        print(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False).rstrip())

    def _show_list(self) -> Table:
        rows = []
        for entry in self._resources.sessions.values():
            session = entry.session
            info = session.info() if session is not None else {}
            state = info.get("state", "restarted: starts with the next cell")
            if state == "ended" and info.get("end_reason"):
                state += f" ({info['end_reason']})"
            policy = entry.sandbox.source + (f"; {entry.sandbox.narrowing}"
                                             if entry.sandbox.narrowing else "")
            rows.append([entry.name, policy, _duration(info.get("uptime_seconds", 0)),
                         str(info.get("cells_run", 0)), f"{info.get('memory_mb', 0.0):.1f} MB",
                         state])
        return Table("Confined sessions", ["session", "policy", "uptime", "cells", "memory",
                                           "state"], rows,
                     ["A cell runs in the session named by --session (default 'default') under "
                      "its effective policy; --fresh and --shell cells run on their own."])

    def _show_log(self) -> Table:
        from .approval_widget import CLICKED_BY, asker

        rows: list[tuple[float, list[str]]] = []
        for record in self.broker.log:
            request, decision = record.request, record.decision
            what = f"{request.operation} {request.path}"
            why = decision.decided_by
            if why != CLICKED_BY:  # a click's reason only repeats the decision
                why += f": {decision.reason}"
            rows.append((decision.decided_at, [_clock(decision.decided_at), "approval",
                                               asker(request.source), what,
                                               _DECIDED[decision.decision], why]))
        live = [e for sid in self._sandboxes_seen for e in self._resources.egress_of(sid)]
        for entry in [*self._resources.egress_history, *live]:
            port = f":{entry.get('port')}" if entry.get("port") else ""
            what = f"{entry.get('method', '')} {entry.get('host', '')}{port}".strip()
            stamp = float(entry.get("time") or 0)
            source = asker(f"sandbox:{str(entry.get('sandbox_id'))[:8]}")
            rows.append((stamp, [_clock(stamp), "egress", source, what,
                                 "allowed" if entry.get("allowed") else "denied",
                                 str(entry.get("reason", ""))]))
        rows.sort(key=lambda item: item[0])
        return Table("Approvals and egress decisions of this session",
                     ["time", "kind", "source", "what", "decision", "why"], [r for _, r in rows])

    def _show_reset(self) -> None:
        forgotten = len(self.broker.grants)
        self.broker.reset()
        print(f"Forgot {forgotten} session approval(s); the log is kept.")


class _Run:
    """One run's output routing and gauges: what the cell shows while the child works."""

    def __init__(self, magics: SandboxMagics, args: Any,
                 gauged: CapabilityDeclaration | None, timeout: float) -> None:
        """`gauged`: the policy whose limits the gauges show; None shows no gauges."""
        self.magics, self.args = magics, args
        self.captured: dict[str, list[str] | None] = {
            "stdout": [] if args.out else None, "stderr": [] if args.err else None}
        self.panel = None if gauged is None else _gauge_panel(gauged, timeout)
        self.last_snapshot: dict[str, Any] = {}
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> dict[str, Any]:
        """Show the gauges; the keyword arguments that connect them to the run."""
        if self.panel is None:
            return {}
        self.panel.show()
        return {"on_start": self._watch}

    def _watch(self, monitor: Any) -> None:
        if self.panel is None or self._unsubscribe is not None:
            return
        panel = self.panel

        def feed(snapshot: dict[str, Any]) -> None:  # on the monitor thread
            self.last_snapshot = snapshot
            panel.update(snapshot)

        self._unsubscribe = monitor.subscribe(feed)

    def on_output(self, stream: str, text: str) -> None:
        kept = self.captured[stream]
        if kept is not None:
            kept.append(text)
            return
        # No flush here: the kernel's stream sends what it holds within its flush interval
        # (live enough), and before any display; a flush per chunk waits for its I/O thread.
        (sys.stdout if stream == "stdout" else sys.stderr).write(text)

    def publish(self, output: Any) -> None:
        """A display of the cell; after a clear (which takes the whole cell's output with
        it), the gauges are shown again."""
        publish(output)
        if output.kind == "clear" and self.panel is not None:
            self.panel.show()

    def finish(self, result: SandboxResult | None, outcome: str) -> None:
        """Stop feeding the gauges, freeze them, and fill the --out/--err variables."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.panel is not None:
            usage = result.resource_usage if result is not None else self.last_snapshot
            try:
                self.panel.freeze(usage, outcome=outcome)
            except Exception:  # the gauges only show the run: its result and variables stand
                _logger.exception("could not show the gauges' record")
        for stream, var in (("stdout", self.args.out), ("stderr", self.args.err)):
            if var is None:
                continue
            if result is not None:
                text = result.stdout if stream == "stdout" else result.stderr
            else:
                text = "".join(self.captured[stream] or ())
            self.magics.shell.user_ns[var] = text


def _gauge_panel(policy: CapabilityDeclaration, timeout: float) -> Any:
    from .gauges import CellGauges, gauge_limits

    return CellGauges(limits=gauge_limits(policy.resource_limits, timeout))


def _close(responder: Any) -> None:
    close = getattr(responder, "close", None)
    if close is not None:
        close()


def _outcome(result: SandboxResult) -> str:
    if result.killed is not None:
        return f"killed: {result.killed}"
    if result.error is not None:
        ename = result.error.get("ename", "error")
        return "interrupted" if ename == "KeyboardInterrupt" else f"failed: {ename}"
    return "finished" if result.exit_code == 0 else f"failed: exit code {result.exit_code}"


def _failure(result: SandboxResult, *, shell: bool) -> str:
    """One line: the kill reason, the error, else the exit code and the last line the child
    wrote."""
    if result.killed is not None:
        return f"sandboxed cell killed: {result.killed}"
    if result.error is not None:
        evalue = result.error.get("evalue", "")
        return f"{result.error.get('ename', 'error')}" + (f": {evalue}" if evalue else "")
    last = next((line.strip() for line in reversed(result.stderr.splitlines()) if line.strip()), "")
    what = "shell script" if shell else "cell"
    return f"sandboxed {what} failed (exit code {result.exit_code})" + (f": {last}" if last else "")


def unregister(shell: Any, magics: SandboxMagics) -> None:
    """Take the magics and the configurable off `shell`."""
    manager = shell.magics_manager
    for kind, name in (("cell", "sandbox"), ("line", "sandbox")):
        bound = manager.magics[kind].get(name)
        if getattr(bound, "__self__", None) is magics:
            del manager.magics[kind][name]
    if manager.registry.get(type(magics).__name__) is magics:
        del manager.registry[type(magics).__name__]
    if magics in shell.configurables:
        shell.configurables.remove(magics)
