"""A tool call's approval as an approval wrapper around a toolset asks for it.

PydanticAI users often wrap a toolset in a blocking-approval wrapper (such as
pydantic-ai-blocking-approval's `ApprovalToolset`): before each call it asks the inner toolset
`needs_approval(name, tool_args, ctx)` -- blocked, pre-approved or needs approval -- and
`get_approval_description(...)`, asks the person itself, and only then calls the inner
toolset. `FileSystemToolset` answers those questions from its policy, and a call the wrapper
let through is not asked about a second time by the toolset's own broker: `needs_approval`
leaves a ticket for exactly that call (tool name and arguments, in the caller's context), and
the call that follows takes it.

A ticket is good for one tool call (`call`, or the PydanticAI `call_tool`), the very next one
this toolset is given in the same asyncio task (or thread), with the same tool and arguments;
any other tool call first, or a new `needs_approval`, voids it, in every copy of the context
(tasks and worker threads copy it). Direct method calls (`write`, `read`...) neither take
nor void it: they ask the broker as always.

Limit, stated: the ticket says "the wrapper asked" only because the wrapper's protocol calls
`needs_approval` and then, if the person approved, the tool. Trusted code that calls
`needs_approval` itself and then makes that same call next, in the same task, skips the
toolset's own question too; a model cannot, since it only names tools and arguments.
"""

from __future__ import annotations

import json
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["blocked", "pre_approved", "needs_approval"]


@dataclass(frozen=True)
class CallApproval:
    """What a call needs before it may run (the shape approval wrappers read:
    `status`, `block_reason` and the `is_*` properties)."""

    status: Status
    block_reason: str | None = None

    @classmethod
    def blocked(cls, reason: str) -> CallApproval:
        return cls("blocked", reason)

    @classmethod
    def pre_approved(cls) -> CallApproval:
        return cls("pre_approved")

    @classmethod
    def needs_approval(cls) -> CallApproval:
        return cls("needs_approval")

    @property
    def is_blocked(self) -> bool:
        return self.status == "blocked"

    @property
    def is_pre_approved(self) -> bool:
        return self.status == "pre_approved"

    @property
    def is_needs_approval(self) -> bool:
        return self.status == "needs_approval"

    def for_wrapper(self) -> Any:
        """The wrapper library's own `ApprovalResult` when it is installed (code that checks
        its type then works), else this object, which reads the same."""
        try:
            from pydantic_ai_blocking_approval import ApprovalResult
        except ImportError:
            return self
        return ApprovalResult(status=self.status, block_reason=self.block_reason)


_Key = tuple[int, str, str]


@dataclass
class _Ticket:
    """One call's ticket: its key and the task (or thread) that asked. Mutable, so that the
    copies of a context that tasks and worker threads make all share it: taken once, it is
    gone for every copy."""

    key: _Key | None
    asker: object


_ticket: ContextVar[_Ticket | None] = ContextVar("sandbox_kernel_ext_wrapper_ticket", default=None)


def _asker() -> object:
    """The asyncio task running now, or else the thread: the wrapper asks `needs_approval`
    and makes the call in one task, and nothing else shares that."""
    try:
        import asyncio

        task = asyncio.current_task()
    except RuntimeError:  # no running event loop in this thread
        task = None
    return task if task is not None else threading.get_ident()


def call_key(owner: object, name: str, tool_args: Any) -> _Key:
    """Which call a ticket is for: the toolset, the tool and its arguments as JSON."""
    try:
        args = json.dumps(tool_args, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        args = repr(tool_args)
    return id(owner), name, args


def leave_ticket(key: _Key | None) -> None:
    """Leave a ticket for the call `key` names, made next by this task (None: no ticket).
    Whatever ticket was left before is void from now on, in every copy of the context."""
    previous = _ticket.get()
    if previous is not None:
        previous.key = None
    _ticket.set(_Ticket(key, _asker()) if key is not None else None)


def take_ticket(key: _Key) -> bool:
    """True, once, when this task holds the ticket for exactly this call."""
    ticket = _ticket.get()
    if ticket is None or ticket.key is None:
        return False
    if ticket.key != key or ticket.asker != _asker():
        ticket.key = None  # any other call first: the wrapper's call did not come next
        return False
    ticket.key = None
    return True
