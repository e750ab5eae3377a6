"""Who decides approval-gated operations: a broker, session grants and responders."""

from __future__ import annotations

from .broker import ApprovalBroker, ApprovalRecord, SessionGrant
from .request import (
    MAX_SUMMARY_CHARS,
    Access,
    ApprovalDecision,
    ApprovalRequest,
    Decision,
    Operation,
)
from .responders import (
    ApprovalResponder,
    CallbackResponder,
    HeadlessResponder,
    TerminalResponder,
    default_responder,
    set_default_responder,
)

__all__ = [
    "MAX_SUMMARY_CHARS",
    "Access",
    "ApprovalBroker",
    "ApprovalDecision",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalResponder",
    "CallbackResponder",
    "Decision",
    "HeadlessResponder",
    "Operation",
    "SessionGrant",
    "TerminalResponder",
    "default_responder",
    "set_default_responder",
]
