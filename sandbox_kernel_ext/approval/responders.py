"""Whoever answers an approval request: nobody (headless), code, or a person at a terminal.

The notebook layer adds a widget responder; all of them share one call signature so the
broker can swap them without knowing which kind it holds.
"""

from __future__ import annotations

import sys
import threading
import unicodedata
from collections.abc import Callable
from typing import Protocol, TextIO, runtime_checkable

from ..policy.wording import byte_count
from .request import ApprovalDecision, ApprovalRequest, Decision


@runtime_checkable
class ApprovalResponder(Protocol):
    """Answers one request; `timeout` is how long it may wait for a person (None: no limit)."""

    def __call__(
        self, request: ApprovalRequest, timeout: float | None
    ) -> ApprovalDecision: ...


class HeadlessResponder:
    """The answer when nobody can be asked (nbclient, papermill, scripts, CI)."""

    def __init__(self, decision: Decision | str = Decision.deny, reason: str | None = None) -> None:
        self.decision = Decision(decision)
        self.reason = reason

    def __call__(self, request: ApprovalRequest, timeout: float | None) -> ApprovalDecision:
        return ApprovalDecision(
            decision=self.decision, decided_by="headless policy", reason=self._reason(request)
        )

    def _reason(self, request: ApprovalRequest) -> str:
        if self.reason is not None:
            return self.reason
        if self.decision is not Decision.deny:
            return "the headless policy approves it (no interactive responder is attached)"
        # Read by an LLM as well as a person: say why, and what would make it work.
        return (
            "nobody can approve it here (no interactive responder is attached; the headless "
            "decision is deny). Ask the user to approve it in a notebook, or configure the "
            f"path without {request.access}_approval"
        )

    def __repr__(self) -> str:
        return f"HeadlessResponder(decision={self.decision.value!r})"


class _NoResponder(HeadlessResponder):
    """The process default until someone installs a responder: deny, and say which one line
    would let a person or code decide (outside IPython nobody else can)."""

    def _reason(self, request: ApprovalRequest) -> str:
        return (
            "nobody can approve it here (no approval responder is set up in this process, so "
            "approval-gated calls fail closed). To decide, add one line before the call: "
            "`sandbox_kernel_ext.set_default_responder(sandbox_kernel_ext.TerminalResponder())` "
            "to be asked at this terminal, or `...(CallbackResponder(your_function))` to decide "
            "in code; in a notebook, `%load_ext sandbox_kernel_ext` shows an approval widget; "
            f"or configure the path without {request.access}_approval"
        )


_NOBODY = _NoResponder()
_installed: list[tuple[object, ApprovalResponder]] = []  # (token, responder), latest last
_installed_lock = threading.Lock()


def default_responder() -> ApprovalResponder:
    """Who answers for a broker made without a responder: the latest one installed with
    `set_default_responder` (the notebook's widget once the extension is loaded), else a
    refusal that says how to set one."""
    with _installed_lock:
        return _installed[-1][1] if _installed else _NOBODY


def set_default_responder(responder: ApprovalResponder) -> Callable[[], None]:
    """Make `responder` answer every approval a broker without its own responder asks
    (toolsets, tools, handlers and managers built with no broker named). Returns the undo,
    which restores whatever answered before, in whatever order undos are called."""
    if not callable(responder):
        raise TypeError(f"expected an approval responder, got {type(responder).__name__}")
    token = object()  # the same responder may be installed twice: undo removes this one
    with _installed_lock:
        _installed.append((token, responder))

    def undo() -> None:
        with _installed_lock:
            _installed[:] = [entry for entry in _installed if entry[0] is not token]

    return undo


CallbackResult = bool | Decision | ApprovalDecision


class CallbackResponder:
    """Lets tests and embedding code decide with a plain function of the request."""

    def __init__(
        self, fn: Callable[[ApprovalRequest], CallbackResult], *, name: str = "callback"
    ) -> None:
        self.fn = fn
        self.name = name

    def __call__(self, request: ApprovalRequest, timeout: float | None) -> ApprovalDecision:
        result = self.fn(request)
        if isinstance(result, ApprovalDecision):
            return result
        if isinstance(result, bool):
            result = Decision.allow_once if result else Decision.deny
        if not isinstance(result, Decision):
            # Fail closed: a truthy string or None must not read as an answer.
            raise TypeError(
                f"{self.name} returned {result!r}; expected bool, Decision or ApprovalDecision"
            )
        verb = "refused" if result is Decision.deny else "approved"
        return ApprovalDecision(
            decision=result, decided_by=self.name, reason=f"{verb} by {self.name}"
        )


_ANSWERS = {
    "y": Decision.allow_once,
    "yes": Decision.allow_once,
    "a": Decision.allow_session,
    "always": Decision.allow_session,
}
_REASONS = {
    Decision.allow_once: "approved at the terminal",
    Decision.allow_session: "approved at the terminal for the rest of this session",
    Decision.deny: "refused at the terminal",
}


def printable(text: str, keep: str = "") -> str:
    """Escape control and format characters: path and summary come from untrusted code,
    and raw ANSI or bidi sequences could repaint the prompt the person is answering."""
    return "".join(
        ch
        if ch in keep or unicodedata.category(ch) not in ("Cc", "Cf")
        else ascii(ch)[1:-1]
        for ch in text
    )


class TerminalResponder:
    """Asks on the terminal (terminal IPython has no Jupyter kernel to host a widget).

    `timeout` is ignored: `input()` cannot be bounded portably, and a person is by
    definition at the prompt. End of input and Ctrl-C both deny without re-raising, so the
    caller sees one ApprovalDeniedError rather than a KeyboardInterrupt from deep inside a
    file operation; the refused operation stops either way.
    """

    def __init__(
        self, input_fn: Callable[[str], str] = input, output: TextIO | None = None
    ) -> None:
        self.input_fn = input_fn
        # None means "sys.stderr at call time": IPython and pytest replace it after import.
        self.output = output

    def __call__(self, request: ApprovalRequest, timeout: float | None) -> ApprovalDecision:
        out = self.output if self.output is not None else sys.stderr
        out.write(self._describe(request))
        out.flush()
        try:
            answer = self.input_fn("Allow? [y]es / [a]lways for this session / [N]o: ")
        except EOFError:
            return self._deny("no answer at the terminal (end of input)")
        except KeyboardInterrupt:
            return self._deny("interrupted at the terminal")
        reply = answer.strip().lower()
        if reply in _ANSWERS:
            decision = _ANSWERS[reply]
            return ApprovalDecision(
                decision=decision, decided_by="terminal", reason=_REASONS[decision]
            )
        if reply in ("", "n", "no"):
            return self._deny(_REASONS[Decision.deny])
        # Anything unclear denies, but say so: a typo should not read as a deliberate "no".
        return self._deny(
            f"unclear answer {answer.strip()[:40]!r} at the terminal (only y or a approve)"
        )

    @staticmethod
    def _deny(reason: str) -> ApprovalDecision:
        return ApprovalDecision(decision=Decision.deny, decided_by="terminal", reason=reason)

    @staticmethod
    def _describe(request: ApprovalRequest) -> str:
        size = "" if request.size is None else f" ({byte_count(request.size)})"
        lines = [
            f"\nApproval needed ({printable(request.source)}): "
            f"{request.operation} '{printable(request.path)}'{size}"
        ]
        if request.location:
            lines.append(f"  file on this machine: {printable(request.location)}")
        # A fixed gutter keeps summary lines from passing as our own prompt text.
        lines += [f"  | {line}" for line in printable(request.summary, keep="\n\t").splitlines()]
        return "\n".join(lines) + "\n"
