"""The one place approval decisions are made, remembered and recorded.

Every gated operation (toolset or sandboxed cell) goes through one broker, so a grant
given in one place covers the other, and every answer lands in one log the UI can show.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from ..policy.errors import ApprovalDeniedError, ConfigurationError
from .request import Access, ApprovalDecision, ApprovalRequest, Decision
from .responders import ApprovalResponder, default_responder

_logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionGrant:
    """An "always for this session" answer: covers `access` on exactly `path` within
    `scope`."""

    scope: str
    path: str
    access: Access
    granted_by: str
    granted_at: float
    request_id: str


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One log entry: what was asked and what was answered."""

    request: ApprovalRequest
    decision: ApprovalDecision


Subscriber = Callable[[ApprovalRecord], None]


class ApprovalBroker:
    """Decides approval requests: session grants first, then the responder (its own, or the
    process default of `set_default_responder` when it was given none).

    Thread-safe. The responder runs outside the broker's lock, so a slow person holds up
    only requests for the same path: those wait for the pending answer and then re-check
    the grants, so one "always" covers everyone who was queued behind it (and a terminal
    never shows two prompts for one path at once). Requests for other paths are asked
    concurrently. Request ids are single-use: a request seen before is denied unasked.
    """

    _seen_limit = 100_000  # ids remembered for replay checks; older ones via a watermark

    def __init__(
        self,
        responder: ApprovalResponder | None = None,
        *,
        timeout: float | None = 120.0,
        log_limit: int = 1_000,
    ) -> None:
        if log_limit < 1:
            raise ConfigurationError(f"approval log_limit must be at least 1, got {log_limit!r}")
        self.responder = responder
        self.timeout = timeout
        self._cond = threading.Condition()
        self._grants: dict[tuple[str, str, Access], SessionGrant] = {}
        self._log: deque[ApprovalRecord] = deque(maxlen=log_limit)
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._seen_watermark = float("-inf")
        self._pending: set[tuple[str, str]] = set()
        self._subscribers: dict[object, Subscriber] = {}

    @property
    def responder(self) -> ApprovalResponder:
        """This broker's own responder, or (when it has none) the process default at the
        moment of asking: a toolset made before `%load_ext` still asks through the widget."""
        return self._responder if self._responder is not None else default_responder()

    @responder.setter
    def responder(self, value: ApprovalResponder | None) -> None:
        # None follows the process default, which denies until someone installs one.
        self._responder = value

    @property
    def follows_default(self) -> bool:
        """True when this broker has no responder of its own."""
        return self._responder is None

    @property
    def timeout(self) -> float | None:
        """Passed to the responder: how long it may wait for a person."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        if value is not None and not value > 0:
            raise ConfigurationError(f"approval timeout must be positive or None, got {value!r}")
        self._timeout = value

    @property
    def grants(self) -> tuple[SessionGrant, ...]:
        with self._cond:
            return tuple(self._grants.values())

    @property
    def log(self) -> list[ApprovalRecord]:
        with self._cond:
            return list(self._log)

    def reset(self) -> None:
        """Forget session grants; the log and the used ids stay (ids remain single-use)."""
        with self._cond:
            self._grants.clear()

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback(record)` after every decision; returns the unsubscribe function."""
        token = object()
        with self._cond:
            self._subscribers[token] = callback

        def unsubscribe() -> None:
            with self._cond:
                self._subscribers.pop(token, None)

        return unsubscribe

    def check(self, request: ApprovalRequest) -> None:
        decision = self.request(request)
        if not decision.allowed:
            raise ApprovalDeniedError(request.operation, request.path, decision.reason)

    def request(self, request: ApprovalRequest) -> ApprovalDecision:
        if not isinstance(request, ApprovalRequest):
            raise TypeError(f"expected an ApprovalRequest, got {type(request).__name__}")
        decision = self._answer_without_asking(request)
        if decision is None:
            decision = self._ask(request)
        self._record(request, decision)
        return decision

    def record_approved_elsewhere(self, request: ApprovalRequest, decided_by: str) -> None:
        """Log `request` as approved once by someone who asked before it got here (an
        approval wrapper around a toolset), so the log shows every gated operation. The id
        is used up like any other; a replayed one raises ApprovalDeniedError."""
        with self._cond:
            fresh = self._claim_id(request)
        if not fresh:
            self.check(request)  # the broker's own replay denial, logged and raised
        self._record(request, ApprovalDecision(
            decision=Decision.allow_once, decided_by=decided_by,
            reason=f"approved by {decided_by} before the call reached the toolset"))

    def _record(self, request: ApprovalRequest, decision: ApprovalDecision) -> None:
        record = ApprovalRecord(request, decision)
        with self._cond:
            self._log.append(record)
            subscribers = list(self._subscribers.values())
        for callback in subscribers:
            try:
                callback(record)
            except Exception:  # an observer must never change or block a decision
                _logger.exception("approval subscriber %r failed", callback)

    def _answer_without_asking(self, request: ApprovalRequest) -> ApprovalDecision | None:
        """A replay denial or a session grant; None means the path is now ours to ask about."""
        with self._cond:
            if not self._claim_id(request):
                return ApprovalDecision(
                    decision=Decision.deny,
                    decided_by="broker",
                    reason=f"approval request {request.id} was already answered; "
                    "each request can be decided once, so make a new request",
                )
            while (request.scope, request.path) in self._pending:
                self._cond.wait()
            grant = self._grant_for(request)
            if grant is not None:
                return ApprovalDecision(
                    decision=Decision.allow_session,
                    decided_by="session grant",
                    reason=f"{grant.access} access to '{grant.path}' was approved for this "
                    f"session (by {grant.granted_by})",
                )
            self._pending.add((request.scope, request.path))
            return None

    def _ask(self, request: ApprovalRequest) -> ApprovalDecision:
        decision: ApprovalDecision | None = None
        try:
            decision = self._call_responder(request)
        finally:  # even on KeyboardInterrupt, release the path for whoever waits on it
            with self._cond:
                self._pending.discard((request.scope, request.path))
                if decision is not None and decision.decision is Decision.allow_session:
                    self._grants[(request.scope, request.path, request.access)] = SessionGrant(
                        scope=request.scope,
                        path=request.path,
                        access=request.access,
                        granted_by=decision.decided_by,
                        granted_at=decision.decided_at,
                        request_id=request.id,
                    )
                self._cond.notify_all()
        return decision

    def _call_responder(self, request: ApprovalRequest) -> ApprovalDecision:
        responder = self.responder
        try:
            decision = responder(request, self.timeout)
        except Exception as exc:  # never allow on error
            return ApprovalDecision(
                decision=Decision.deny,
                decided_by="broker",
                reason=f"the approval responder failed ({type(exc).__name__}: {exc})",
            )
        if not isinstance(decision, ApprovalDecision):
            return ApprovalDecision(
                decision=Decision.deny,
                decided_by="broker",
                reason=f"the approval responder returned {type(decision).__name__}, not an "
                "ApprovalDecision (wrap plain functions in CallbackResponder)",
            )
        return decision

    def _grant_for(self, request: ApprovalRequest) -> SessionGrant | None:
        exact = self._grants.get((request.scope, request.path, request.access))
        if exact is not None or request.access == "write":
            return exact
        return self._grants.get((request.scope, request.path, "write"))  # a write grant covers reads

    def _claim_id(self, request: ApprovalRequest) -> bool:
        """Mark the id used; False if it was used before (or is too old to tell)."""
        if request.id in self._seen or request.created_at <= self._seen_watermark:
            return False
        self._seen[request.id] = request.created_at
        if len(self._seen) > self._seen_limit:
            _, created_at = self._seen.popitem(last=False)
            self._seen_watermark = max(self._seen_watermark, created_at)
        return True
