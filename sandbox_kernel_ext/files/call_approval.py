"""A tool call's approval as an approval wrapper around a toolset asks for it.

PydanticAI users often wrap a toolset in a blocking-approval wrapper (such as
pydantic-ai-blocking-approval's `ApprovalToolset`): before each call it asks the inner toolset
`needs_approval(name, tool_args, ctx)` -- blocked, pre-approved or needs approval -- and
`get_approval_description(...)`, asks the person itself, and only then calls the inner
toolset. `FileSystemToolset` answers those questions from its policy, and a call the wrapper
let through is not asked about a second time by the toolset's own broker: `needs_approval`
leaves a ticket for exactly that call (tool name and arguments, in the caller's context), and
the call that follows takes it.

Limit, stated: the ticket says "the wrapper asked" only because the wrapper's protocol calls
`needs_approval` and then, if the person approved, the tool. Trusted code in the same context
that calls `needs_approval` itself and then the tool with the same arguments skips the
toolset's own question too; a model cannot, since it only names tools and arguments.
"""

from __future__ import annotations

import json
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
_ticket: ContextVar[_Key | None] = ContextVar("sandbox_kernel_ext_wrapper_ticket", default=None)


def call_key(owner: object, name: str, tool_args: Any) -> _Key:
    """Which call a ticket is for: the toolset, the tool and its arguments as JSON."""
    try:
        args = json.dumps(tool_args, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        args = repr(tool_args)
    return id(owner), name, args


def leave_ticket(key: _Key | None) -> None:
    """Set (or, with None, clear) the ticket of the current context."""
    _ticket.set(key)


def take_ticket(key: _Key) -> bool:
    """True, once, when the current context holds the ticket for exactly this call."""
    if _ticket.get() != key:
        return False
    _ticket.set(None)
    return True
