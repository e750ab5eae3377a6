"""The approval widget: asks the person at the notebook, in the cell that is running.

Clicks reach the kernel while that cell is still busy through a subshell the kernel owns
(see kernel_routing), so the same responder serves a `%%sandbox` cell (the runner's
approval thread asks while the magic waits), a plain synchronous `FileSystemToolset` call
(the main thread itself asks and waits) and an async agent run. In async code, call the
toolset through `await asyncio.to_thread(...)` (the PydanticAI adapter already does) so
the wait blocks a worker thread, never the event loop.

Nobody looking means nobody can answer: when the client said so (`allow_stdin` false, as
nbclient and papermill do) or no frontend confirms it rendered the widget within
`render_timeout`, the headless responder decides and the reason is printed in the cell.
This module decides nothing itself: every answer is a person's click, the timeout's
denial, or the configured headless decision.
"""

from __future__ import annotations

import html
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import anywidget
import ipywidgets as widgets
from IPython.display import DisplayHandle, display

from ..approval.request import ApprovalDecision, ApprovalRequest, Decision
from ..approval.responders import (
    ApprovalResponder,
    HeadlessResponder,
    TerminalResponder,
    printable,
)
from ..policy.wording import byte_count
from ..runner.trusted.display import NO_TYPESETTING
from .assets import js_asset
from .kernel_routing import (
    CellParent,
    CellTracker,
    ClickDelivery,
    RoutingUnavailable,
    SubshellRouter,
    adopt_cell_parent,
    click_delivery,
    output_to,
    restore_default_parent,
)
from .shell_pump import ShellPump
from .widget_tree import close_tree

_logger = logging.getLogger(__name__)

# The one message the frontend sends unasked: proof that a view exists, i.e. that someone
# can see the buttons. It is what anywidget's `model.send` puts on the wire:
# {"method": "custom", "content": {"event": "rendered"}} on the acknowledging widget's comm
# (js/render_ack.js).
RENDERED_EVENT = "rendered"
# How often a cell that reads its own clicks (ipykernel 6.x) looks at the shell socket, and
# one whose render acknowledgement came through the frontend's subshell (7.1-7.3) looks
# whether it must take its parent back.
PUMP_INTERVAL = 0.05

_OUTCOME = {
    Decision.allow_once: "Approved once",
    Decision.allow_session: "Approved for this session",
    Decision.deny: "Denied",
}
_CLICK_REASON = {
    Decision.allow_once: "approved once in the notebook",
    Decision.allow_session: "approved in the notebook for the rest of this session",
    Decision.deny: "refused in the notebook",
}
CLICKED_BY = "the person at the notebook"  # `decided_by` of an answer given with a button
# Disabled buttons are dimmed; the one that decided stays legible (it is the record).
_CHOSEN_CLASS = "skx-approval-chosen"
_CHOSEN_STYLE = f"<style>.{_CHOSEN_CLASS}:disabled {{ opacity: 1 !important; }}</style>"
# The decided button in a saved record, in the colour the live widget gives it.
_RECORD_BUTTON = {
    Decision.allow_once: "background:#4caf50;color:#fff;border:1px solid #4caf50",
    Decision.allow_session: "background:#ff9800;color:#fff;border:1px solid #ff9800",
    Decision.deny: "background:#f44336;color:#fff;border:1px solid #f44336",
}
_ALWAYS_TIP = {  # the broker lets a write grant cover reads of the same path
    "read": "Allow reads of this path until the kernel restarts",
    "write": "Allow writes, and reads, of this path until the kernel restarts",
}


class RenderAck(anywidget.AnyWidget):
    """Invisible; its view's first act is to tell the kernel that it was rendered."""

    _esm = js_asset("render_ack.js")

    def __init__(self, on_rendered: Callable[[], None]) -> None:
        super().__init__(layout=widgets.Layout(display="none"))
        self._on_rendered = on_rendered
        self.on_msg(self._handle_ack)

    def _handle_ack(self, _widget: object, content: Any, _buffers: object) -> None:
        if isinstance(content, dict) and content.get("event") == RENDERED_EVENT:
            self._on_rendered()


def _size(request: ApprovalRequest) -> str:
    if request.size is None:
        return ""
    return f" ({byte_count(request.size)})"


def _describe(request: ApprovalRequest) -> str:
    return f"{request.operation} '{request.path}'{_size(request)}"


def asker(source: str) -> str:
    """Who asks, in a person's words: `sandbox:<id>` (a sandbox's egress), the runner's
    `toolset:sandbox:<id>` (a sandboxed cell's gated files), a toolset's own `toolset:<id>`;
    anything else is shown as is."""
    if source.startswith(("sandbox:", "toolset:sandbox:")):
        return f"the sandboxed cell (sandbox {source.rsplit(':', 1)[1]})"
    kind, _, name = source.partition(":")
    if kind != "toolset":
        return source
    return "the file toolset" if name == "filesystem" else f"the file toolset '{name}'"


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


class ApprovalWidget(widgets.VBox):
    """One request, its three answers and a countdown; afterwards a disabled record.

    Path and summary come from untrusted code: they are escaped wherever they are shown.
    Clicks are handled on whatever thread the kernel delivers them (the router's
    subshell); the first one wins, later ones (or clicks after the record) are ignored.
    """

    def __init__(self, request: ApprovalRequest, timeout: float | None) -> None:
        self.request = request
        self.answer: Decision | None = None
        self.timeout = timeout
        self.rendered = threading.Event()
        self.answered = threading.Event()
        self.decision: ApprovalDecision | None = None
        self._lock = threading.Lock()
        fits = widgets.Layout(width="auto")  # the default width cuts "Always for this session"
        self.approve_button = widgets.Button(
            description="Approve once", button_style="success", icon="check",
            tooltip="Allow this one operation", layout=fits,
        )
        self.always_button = widgets.Button(
            description="Always for this session", button_style="warning", icon="check-double",
            tooltip=_ALWAYS_TIP[request.access], layout=fits,
        )
        self.deny_button = widgets.Button(
            description="Deny", button_style="danger", icon="times",
            tooltip="Refuse; the operation fails with ApprovalDeniedError", layout=fits,
        )
        self.status = widgets.Label(self._waiting_text(timeout))
        self.render_ack = RenderAck(self.rendered.set)
        self.header = widgets.HTML(_CHOSEN_STYLE + self._header_html())
        children: list[widgets.Widget] = [self.header]
        if request.location:
            location = html.escape(printable(request.location))
            children.append(widgets.HTML(f"<small>File on this machine: <code>{location}</code>"
                                         "</small>"))
        if request.summary:
            summary = html.escape(printable(request.summary, keep="\n\t"))
            children.append(
                widgets.HTML(  # wrapped: nothing may hide beyond the right edge
                    "<pre style='max-height:14em;overflow:auto;margin:0.3em 0;"
                    f"white-space:pre-wrap;overflow-wrap:anywhere'>{summary}</pre>"
                )
            )
        children += [
            widgets.HBox([self.approve_button, self.always_button, self.deny_button]),
            self.status,
            self.render_ack,
        ]
        super().__init__(children, layout=widgets.Layout(border="1px solid #d0a000", padding="4px"))
        for button, decision in self._buttons():
            button.on_click(partial(self._click, decision))

    def _header_html(self) -> str:
        request = self.request
        who = html.escape(printable(asker(request.source)))
        operation = html.escape(request.operation)
        path = html.escape(printable(request.path))
        if self.decision is None:
            state, verb = "Approval needed", "wants"
        else:
            state, verb = _OUTCOME[self.decision.decision], "asked"
        return (f"<b>{state}</b> &middot; {who} {verb} to <b>{operation}</b> "
                f"<code>{path}</code>{_size(request)}")

    def _buttons(self) -> Iterator[tuple[widgets.Button, Decision]]:
        yield self.approve_button, Decision.allow_once
        yield self.always_button, Decision.allow_session
        yield self.deny_button, Decision.deny

    @property
    def pending(self) -> bool:
        return not self.answered.is_set()

    @property
    def awaiting_render(self) -> bool:
        return self.pending and not self.rendered.is_set()

    def routes(self) -> Iterator[tuple[Any, Callable[[], bool]]]:
        """(comm, active) pairs: which comms must reach a busy kernel, and while when."""
        for button, _ in self._buttons():
            yield button.comm, lambda: self.pending
        yield self.render_ack.comm, lambda: self.awaiting_render

    def _click(self, decision: Decision, _button: object) -> None:
        with self._lock:
            if not self.pending:
                return
            self.answer = decision
            self.rendered.set()  # a click is the surest sign someone saw it
            self.answered.set()

    def show_countdown(self, remaining: float | None) -> None:
        text = self._waiting_text(remaining)
        if self.status.value != text:
            self.status.value = text

    @staticmethod
    def _waiting_text(remaining: float | None) -> str:
        if remaining is None:
            return "Waiting for your answer (no time limit)."
        return f"Waiting for your answer; denies in {max(0, int(remaining + 0.999))} s."

    def record(self, decision: ApprovalDecision) -> None:
        """Freeze into the record of `decision`: buttons disabled, who/what/when shown."""
        with self._lock:
            self.decision = decision
            self.answered.set()
        clicked = decision.decided_by == CLICKED_BY
        for button, answer in self._buttons():
            with button.hold_sync():  # one message a button: the asking code is waiting
                button.disabled = True
                if clicked and answer is decision.decision:
                    button.add_class(_CHOSEN_CLASS)
                else:
                    button.button_style = ""  # only the button that decided keeps its colour
        self.header.value = _CHOSEN_STYLE + self._header_html()
        self.status.value = self.outcome_text()
        if self.render_ack in self.children:  # saved notebooks need no anywidget to show it
            self.children = tuple(c for c in self.children if c is not self.render_ack)
            close_tree(self.render_ack)

    def outcome_text(self) -> str:
        decision = self.decision
        if decision is None:
            return self._waiting_text(self.timeout)
        when = _when(decision.decided_at)
        text = f"{_OUTCOME[decision.decision]} by {decision.decided_by} at {when}"
        if decision.decided_by == CLICKED_BY:  # the reason would only repeat the button
            return text + "."
        return f"{text}: {printable(decision.reason)}"

    def as_text(self) -> str:
        """What nbconvert, GitHub and a notebook without widget state show."""
        request = self.request
        lines = [f"Approval: {printable(asker(request.source))} asks to "
                 f"{printable(_describe(request))}"]
        if request.location:
            lines.append(f"  file on this machine: {printable(request.location)}")
        lines += [f"  | {line}" for line in printable(request.summary, "\n\t").splitlines()]
        if self.decision is None:
            lines.append("[Approve once] [Always for this session] [Deny]  " + self.outcome_text())
        else:
            lines.append(self.outcome_text())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<ApprovalWidget {printable(_describe(self.request))!s}: {self.outcome_text()}>"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.as_text()
        return bundle

    def record_bundle(self) -> dict[str, str]:
        """The decided widget as static HTML and text, with no widget in it: what a saved
        notebook keeps (the audit trail: who asked, what, the decision, who decided, when)
        and shows without the kernel, trusted or not."""
        request, decision = self.request, self.decision
        parts = [f"<div>{self._header_html()}</div>"]
        if request.location:
            parts.append("<div><small>File on this machine: <code>"
                         f"{html.escape(printable(request.location))}</code></small></div>")
        if request.summary:
            summary = html.escape(printable(request.summary, keep="\n\t"))
            parts.append("<pre style='max-height:14em;overflow:auto;margin:0.3em 0;"
                         f"white-space:pre-wrap;overflow-wrap:anywhere'>{summary}</pre>")
        chosen = (decision.decision if decision is not None
                  and decision.decided_by == CLICKED_BY else None)
        buttons = "".join(
            f'<button type="button" disabled style="margin-right:4px;padding:2px 8px;'
            f'{_RECORD_BUTTON[answer] if answer is chosen else "opacity:0.6"}">'
            f"{html.escape(button.description)}</button>"
            for button, answer in self._buttons())
        parts += [f"<div>{buttons}</div>",
                  f'<div role="status">{html.escape(self.outcome_text())}</div>']
        return {"text/plain": self.as_text(),
                "text/html": (f'<div class="skx-approval-record {NO_TYPESETTING}" '
                              'style="border:1px solid #d0a000;padding:4px">'
                              f'{"".join(parts)}</div>')}


class WidgetResponder:
    """Asks with an ApprovalWidget in the running cell; see the module docstring.

    Thread-safe: the broker may call it from any thread, and requests for different paths
    may be pending at once (one widget each). `close()` (on `%unload_ext`) removes the
    kernel hooks and the subshell; later requests get the headless decision.
    """

    def __init__(
        self,
        kernel: Any,
        *,
        headless: ApprovalResponder | None = None,
        render_timeout: float = 5.0,
    ) -> None:
        if not render_timeout > 0:
            raise ValueError(f"render_timeout must be positive, got {render_timeout!r}")
        if getattr(kernel, "shell", None) is None:
            raise ValueError("WidgetResponder needs a kernel with a shell (ipykernel's kernel)")
        self.kernel = kernel
        self.shell = kernel.shell
        self.headless: ApprovalResponder = headless if headless is not None else HeadlessResponder()
        self.render_timeout = render_timeout
        self._cells = CellTracker(kernel)
        self._router = SubshellRouter(kernel)
        self.delivery: ClickDelivery = click_delivery(kernel)
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._cells.close()
        self._router.close()

    def __repr__(self) -> str:
        return (
            f"WidgetResponder(headless={self.headless!r}, render_timeout={self.render_timeout!r})"
        )

    def __call__(self, request: ApprovalRequest, timeout: float | None) -> ApprovalDecision:
        cell = self._cells.current()
        adopt_cell_parent(self.kernel, cell)
        widget = ApprovalWidget(request, timeout)
        handle: DisplayHandle | None = None
        decision: ApprovalDecision | None = None
        pump = self._pump(widget)
        try:
            why_not = self._why_nobody_can_answer(cell, widget, pump)
            self._restore_parent(cell)  # a message just handled on a subshell is not the cell
            handle = self._show(widget, cell)
            if why_not is None:
                decision, why_not = self._wait(widget, timeout, cell, pump)
            if decision is None:
                decision = self._headless(request, timeout, cell, why_not or "")
            return decision
        except BaseException as exc:  # KeyboardInterrupt (the stop button) included
            stopped = isinstance(exc, KeyboardInterrupt)
            decision = ApprovalDecision(
                decision=Decision.deny,
                decided_by="interruption" if stopped else "error",
                reason="the cell was stopped before anyone answered"
                if stopped
                else f"asking failed ({type(exc).__name__}: {exc})",
            )
            raise
        finally:
            if pump is not None:
                pump.release()
            self._restore_parent(cell)
            self._record(widget, handle, cell, decision)

    def _main_shell_busy(self) -> bool:
        """Whether the main shell is busy now (a click to it would wait): it runs a cell, or
        the main thread is the one asking (from a cell, or a callback of the kernel's)."""
        return threading.current_thread() is threading.main_thread() or self._cells.main_busy()

    def _pump(self, widget: ApprovalWidget) -> ShellPump | None:
        """The reader of the shell socket this wait needs and can have: ipykernel 6.x, the
        main thread asking while the kernel's loop is not waiting for messages, that is from
        a cell (`shell_pump.py`); else None."""
        if self.delivery.route != "pump" or not self._main_shell_busy():
            return None
        if not ShellPump.possible(self.kernel):
            return None
        return ShellPump(self.kernel, lambda: {comm.comm_id for comm, _ in widget.routes()})

    def _record(
        self,
        widget: ApprovalWidget,
        handle: DisplayHandle | None,
        cell: CellParent,
        decision: ApprovalDecision | None,
    ) -> None:
        """Leave the widget as the record of `decision`; the saved text repr too."""
        if decision is None:
            return
        try:
            widget.record(decision)
            if handle is not None:
                with output_to(self.shell, cell):
                    handle.update(widget.record_bundle(), raw=True)
        except Exception:  # the answer stands even if the kernel cannot show it any more
            _logger.exception("could not record the approval decision in the widget")
        finally:
            close_tree(widget)  # the record shows it now (or nothing could)

    def _why_nobody_can_answer(self, cell: CellParent, widget: ApprovalWidget,
                               pump: ShellPump | None) -> str | None:
        if self._closed:
            return "the sandbox extension was unloaded"
        if not cell.allow_stdin:
            return (
                "the client running this cell cannot answer (allow_stdin is false, as under "
                "nbclient or papermill)"
            )
        if self._router.on_subshell_thread():
            return "it was asked from the widget's own message thread, which cannot also click"
        if self.delivery.route in ("none", "pump") and pump is None and self._main_shell_busy():
            return f"clicks cannot reach this kernel while the cell is busy: {self.delivery.detail}"
        if self.delivery.route != "kernel":
            return None  # the frontend's subshells, the pump, or an idle main shell bring it
        try:
            for comm, active in widget.routes():
                self._router.route(comm, active)
        except RoutingUnavailable as exc:
            return f"clicks cannot reach this kernel while the cell is busy: {exc}"
        return None

    def _show(self, widget: ApprovalWidget, cell: CellParent) -> DisplayHandle | None:
        with output_to(self.shell, cell):
            handle = display(widget, display_id=True)
        return handle if isinstance(handle, DisplayHandle) else None

    def _wait(
        self, widget: ApprovalWidget, timeout: float | None, cell: CellParent,
        pump: ShellPump | None = None,
    ) -> tuple[ApprovalDecision | None, str | None]:
        """A click or the timeout's denial; (None, why) if no frontend rendered the widget."""
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        render_deadline = start + self.render_timeout
        restored_after_render = False
        while True:
            now = time.monotonic()
            if widget.answered.is_set():
                return self._clicked(widget), None
            if widget.rendered.is_set() and not restored_after_render:
                restored_after_render = True
                self._restore_parent(cell)
            elif not widget.rendered.is_set() and now >= render_deadline:
                return None, (
                    f"no frontend showed the approval widget within {self.render_timeout:g} s "
                    + ("(is JupyterLab's anywidget extension installed?)"
                       if self.delivery.route == "kernel" or not self._main_shell_busy() else
                       f"that this busy kernel heard of: {self.delivery.detail}")
                )
            if deadline is not None and now >= deadline:
                return (
                    ApprovalDecision(
                        decision=Decision.deny,
                        decided_by="timeout",
                        reason=f"nobody answered within {timeout:g} s",
                    ),
                    None,
                )
            widget.show_countdown(None if deadline is None else deadline - now)
            step = 1.0 if deadline is None else min(1.0, deadline - now)
            if not widget.rendered.is_set():
                step = min(step, render_deadline - now)
            if pump is not None:  # this thread is the one that reads the clicks
                pump.pump()
                step = min(step, PUMP_INTERVAL)
            elif not restored_after_render and self.delivery.route == "frontend":
                step = min(step, PUMP_INTERVAL)  # the ack took the parent: give it back soon
            widget.answered.wait(max(step, 0.0))

    @staticmethod
    def _clicked(widget: ApprovalWidget) -> ApprovalDecision:
        answer = widget.answer
        assert answer is not None
        return ApprovalDecision(decision=answer, decided_by=CLICKED_BY, reason=_CLICK_REASON[answer])

    def _headless(
        self, request: ApprovalRequest, timeout: float | None, cell: CellParent, why_not: str
    ) -> ApprovalDecision:
        decision = self.headless(request, timeout)
        with output_to(self.shell, cell):
            print(
                f"sandbox_kernel_ext: the headless decision ({decision.decision.value}) answered "
                f"{printable(_describe(request))} because {why_not}.",
                file=sys.stderr,
                flush=True,
            )
        reason = f"{why_not}; the headless decision is {decision.decision.value}"
        return decision.model_copy(update={"reason": reason})

    def _restore_parent(self, cell: CellParent) -> None:
        """Messages handled on a subshell (ours, or the frontend's) made themselves the
        kernel's default parent; if this cell still runs, make it the default again so
        threads' output keeps landing in it."""
        routed = self._router.subshell_id is not None or self.delivery.route == "frontend"
        if routed and self._cells.current().msg_id == cell.msg_id:
            restore_default_parent(self.kernel, cell)


def responder_for(
    shell: Any, *, headless_decision: str = "deny", render_timeout: float = 5.0
) -> ApprovalResponder:
    """The responder that can reach the person using `shell`: a widget inside a Jupyter
    kernel, a prompt in terminal IPython, else the headless decision."""
    headless = HeadlessResponder(headless_decision)
    kernel = getattr(shell, "kernel", None)
    if kernel is not None and getattr(kernel, "shell", None) is not None:
        return WidgetResponder(kernel, headless=headless, render_timeout=render_timeout)
    try:
        from IPython.terminal.interactiveshell import TerminalInteractiveShell
    except ImportError:  # pragma: no cover - IPython ships it
        return headless
    if isinstance(shell, TerminalInteractiveShell):
        return TerminalResponder()
    return headless
