"""`%%sandbox` and `%sandbox`: run a cell under the session's policy, and look at the session.

This module renders and forwards. What a cell may ask for is decided by the policy layer
(`policy.narrowing`), what a child may do by the runner, who approves by the approval broker;
here we parse options, stream output, feed the gauges and turn a `SandboxResult` into what the
cell shows.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from traitlets import Bool, Enum, Float, TraitError, Unicode, observe, validate

from ..approval import ApprovalBroker, ApprovalResponder, Decision, HeadlessResponder
from ..policy.errors import CapabilityParseError, SandboxError, ToolError
from ..policy.models import CapabilityDeclaration, SandboxResult
from ..policy.narrowing import Narrowing, NarrowingError, lower_only, narrow
from ..policy.parser import CapabilityParser

__all__ = ["SandboxCellError", "SandboxMagics", "Table"]

SUBCOMMANDS = ("status", "policy", "list", "log", "reset")
# The `%%sandbox` option that carries each field a NarrowingError names.
_OPTION_OF = {
    "max_memory_mb": "--memory", "max_cpu_seconds": "--cpu", "timeout": "--timeout",
    "allow_read": "--allow-read", "allow_write": "--allow-write", "allow_net": "--allow-net",
}
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*\Z")
# The log's decision column speaks one language for approvals and egress.
_DECIDED = {Decision.allow_once: "approved once",
            Decision.allow_session: "approved for session", Decision.deny: "denied"}


class SandboxCellError(Exception):
    """A sandboxed cell failed or was killed. Shown as one line: the child's own traceback is
    already in the cell's output, and the kernel-side frames would only hide the reason."""

    def __init__(self, message: str, result: SandboxResult | None = None) -> None:
        super().__init__(message)
        self.result = result

    def _render_traceback_(self) -> list[str]:
        # IPython shows this list instead of a traceback (as it does for its own errors).
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


@dataclass
class Table:
    """A small table that shows as HTML in a notebook and as aligned text anywhere else."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        widths = [max([len(c), *(len(r[i]) for r in self.rows)])
                  for i, c in enumerate(self.columns)]
        widths[-1] = len(self.columns[-1])  # the last column runs on, unpadded
        line = "  ".join
        out = [self.title, line(c.ljust(w) for c, w in zip(self.columns, widths)),
               line("-" * w for w in widths)]
        out += [line(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in self.rows]
        if not self.rows:
            out.append("(none)")
        return "\n".join([*out, *self.notes])

    def html(self) -> str:
        def cell(tag: str, value: str) -> str:
            return f"<{tag} style='text-align:left'>{html.escape(value)}</{tag}>"

        head = "".join(cell("th", c) for c in self.columns)
        body = "".join("<tr>" + "".join(cell("td", v) for v in row) + "</tr>" for row in self.rows)
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes)
        return (f"<p><b>{html.escape(self.title)}</b></p><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>{notes}")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def __repr__(self) -> str:
        return self.text()


@dataclass
class _Current:
    """The session's one sandbox and the policy it was made from."""

    sandbox_id: str
    key: str
    policy: CapabilityDeclaration
    source: str


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
        self.workspace: str | None = None
        self.egress_history: list[dict[str, Any]] = []  # of sandboxes already destroyed

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
        self.egress_history += self.egress_of(sandbox_id)
        self.manager.destroy(sandbox_id)

    def close(self) -> None:
        """Stop every sandbox, the launcher and the monitors; remove the workspace; let the
        approval responder take its hooks off the kernel."""
        try:
            if self.manager is not None:
                try:
                    self.drop_sandbox()
                finally:
                    manager, self.manager = self.manager, None
                    manager.close()
        finally:
            _close(self.broker.responder)
            self.broker.responder = HeadlessResponder(self.headless_decision)
        if self.workspace is not None:
            shutil.rmtree(self.workspace, ignore_errors=True)
            self.workspace = None


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


def _unquoted(text: str) -> str:
    """IPython splits a magic's line keeping quotes (`"/my data"` stays one word, quotes and
    all): a path or domain in matching quotes means what is inside them."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


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

    # -- settings ---------------------------------------------------------------------------------
    @validate("approval_timeout", "render_timeout", "gauge_interval", "timeout")
    def _check_seconds(self, proposal: Any) -> float:
        return _positive_seconds(proposal["trait"].name, proposal["value"])

    @validate("policy")
    def _check_policy(self, proposal: Any) -> str:
        value = proposal["value"]
        if not value:
            return ""
        path = os.path.abspath(os.path.expanduser(value))
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
        """(policy, where it came from): `path`, else the configured file, else the default."""
        path = path or self.policy
        if path:
            return CapabilityParser.from_file(path), path
        return (CapabilityDeclaration.workspace_only(self.workspace),
                f"built-in default (workspace {self.workspace})")

    def _sandbox_for(self, policy: CapabilityDeclaration, source: str) -> str:
        """The session's sandbox, re-made when the effective policy changes."""
        key = json.dumps([policy.model_dump(mode="json"), str(policy.base_path),
                          [rule.rate_windows for rule in policy.network_egress_rules]],
                         sort_keys=True)
        resources = self._resources
        if resources.current is not None and resources.current.key == key:
            return resources.current.sandbox_id
        resources.drop_sandbox()
        sandbox_id = self.manager.create_sandbox(policy)
        resources.current = _Current(sandbox_id, key, policy, source)
        self._sandboxes_seen.append(sandbox_id)
        return sandbox_id

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
        args = magic_arguments.parse_argstring(self.sandbox_cell, line)
        inputs, outputs = self._variables(args)
        policy, source, timeout = self._effective(args)
        try:
            sandbox_id = self._sandbox_for(policy, source)
        except SandboxError as exc:
            raise SandboxCellError(f"cannot create the sandbox: {exc}") from None
        if args.shell:
            self._check_shell(cell)
        run = _Run(self, args, sandbox_id, None if args.quiet else policy, timeout)
        hooks = run.start()
        try:
            if args.shell:
                result = self.manager.execute(sandbox_id, ["/bin/sh", "-c", cell], timeout,
                                              on_output=run.on_output, **hooks)
            else:
                result = self.manager.run_python(
                    sandbox_id, cell, inputs=inputs, outputs=outputs, timeout=timeout,
                    on_output=run.on_output, **hooks)
        except KeyboardInterrupt:
            run.finish(None, "interrupted")
            message = "interrupted: the sandboxed cell and all its processes were killed"
            if args.raise_error:
                raise SandboxCellError(message) from None
            print(f"[sandbox] {message}", file=sys.stderr)
            return
        except SandboxError as exc:
            run.finish(None, f"failed: {exc}")
            raise SandboxCellError(str(exc)) from None
        except BaseException as exc:  # a bug of ours: the gauges still stop, the error shows
            run.finish(None, f"failed: {type(exc).__name__}")
            raise
        self.last_result = result
        run.finish(result, _outcome(result))
        if result.exit_code == 0 and result.killed is None:
            self.shell.user_ns.update(result.variables)
            return
        message = _failure(result, shell=args.shell)
        if args.raise_error:
            raise SandboxCellError(message, result)
        if result.killed is not None and not args.err:
            print(f"[sandbox] killed: {result.killed}", file=sys.stderr)

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
            ceiling, source = self.session_policy(args.policy)
        except CapabilityParseError as exc:
            raise UsageError(f"--policy: {exc}" if args.policy else str(exc)) from None
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
            timeout = self.timeout if args.timeout is None else lower_only(
                "timeout", args.timeout, self.timeout, " s")
        except NarrowingError as exc:
            raise UsageError(f"{_OPTION_OF.get(exc.field, exc.field)}: {exc}") from None
        return policy, source, timeout

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
        """%sandbox status | policy | list | log | reset

        status: which confinement layers this host enforces. policy: the session's policy.
        list: the session's sandboxes. log: approvals and egress decisions of this session.
        reset: forget the approvals given "for this session".
        """
        words = line.split()
        if len(words) != 1 or words[0] not in SUBCOMMANDS:
            raise UsageError(f"%sandbox takes one of: {', '.join(SUBCOMMANDS)} "
                             f"(got {line.strip()!r}); run %%sandbox? for the cell magic")
        return getattr(self, f"_show_{words[0]}")()

    def _show_status(self) -> Table:
        from ..runner.trusted.isolation import isolation_report

        report = isolation_report()
        rows = [[name.replace("_", " "), "enforced" if on else "MISSING"]
                for name, on in report["layers"].items()]
        notes = [f"Host: {report['platform']}, Python {report['python']}, "
                 f"Landlock ABI {report['landlock_abi']}.",
                 f"Sandboxed children run as {report['child_identity']}."]
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
        manager, current = self._resources.manager, self._resources.current
        if manager is not None:
            for entry in manager.list_sandboxes():
                sid = entry["sandbox_id"]
                rows.append([sid[:8], getattr(entry["status"], "value", str(entry["status"])),
                             str(entry["runs"]), str(entry["pid"] or ""),
                             current.source if current and sid == current.sandbox_id else ""])
        return Table("Sandboxes of this session", ["sandbox", "state", "runs", "pid", "policy"],
                     rows)

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

    def __init__(self, magics: SandboxMagics, args: Any, sandbox_id: str,
                 gauged: CapabilityDeclaration | None, timeout: float) -> None:
        """`gauged`: the policy whose limits the gauges show; None shows no gauges."""
        self.magics, self.args, self.sandbox_id = magics, args, sandbox_id
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
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write(text)
        out.flush()

    def finish(self, result: SandboxResult | None, outcome: str) -> None:
        """Stop feeding the gauges, freeze them, and fill the --out/--err variables."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.panel is not None:
            usage = result.resource_usage if result is not None else self.last_snapshot
            self.panel.freeze(usage, outcome=outcome)
        for stream, var in (("stdout", self.args.out), ("stderr", self.args.err)):
            if var is None:
                continue
            if result is not None:
                text = result.stdout if stream == "stdout" else result.stderr
            else:
                text = "".join(self.captured[stream] or ())
            self.magics.shell.user_ns[var] = text


def _gauge_panel(policy: CapabilityDeclaration, timeout: float) -> Any:
    from .gauges import GaugePanel, gauge_limits

    return GaugePanel(limits=gauge_limits(policy.resource_limits, timeout))


def _close(responder: Any) -> None:
    close = getattr(responder, "close", None)
    if close is not None:
        close()


def _outcome(result: SandboxResult) -> str:
    if result.killed is not None:
        return f"killed: {result.killed}"
    return "finished" if result.exit_code == 0 else f"failed: exit code {result.exit_code}"


def _failure(result: SandboxResult, *, shell: bool) -> str:
    """One line: the kill reason, else the exit code and the last line the child wrote."""
    if result.killed is not None:
        return f"sandboxed cell killed: {result.killed}"
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
