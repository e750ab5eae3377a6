"""The approval layer: broker, session grants, responders."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sandbox_kernel_ext.approval import (
    MAX_SUMMARY_CHARS,
    ApprovalBroker,
    ApprovalDecision,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalResponder,
    CallbackResponder,
    Decision,
    HeadlessResponder,
    TerminalResponder,
    default_responder,
    set_default_responder,
)
from sandbox_kernel_ext.policy.errors import ApprovalDeniedError, SandboxViolationError


def req(path: str = "/data/out.csv", access: str = "write", **kw: object) -> ApprovalRequest:
    kw.setdefault("operation", access)
    kw.setdefault("source", "test")
    return ApprovalRequest(path=path, access=access, **kw)


class Counting:
    """Callback responder body that counts calls and answers with a fixed result."""

    def __init__(self, result: object, delay: float = 0.0) -> None:
        self.result = result
        self.delay = delay
        self.calls: list[ApprovalRequest] = []
        self._lock = threading.Lock()

    def __call__(self, request: ApprovalRequest) -> object:
        with self._lock:
            self.calls.append(request)
        time.sleep(self.delay)
        return self.result


def broker_with(result: object, **kw: object) -> tuple[ApprovalBroker, Counting]:
    fn = Counting(result, **kw)
    return ApprovalBroker(CallbackResponder(fn)), fn


# --- request / decision models ----------------------------------------------------------


def test_request_defaults_are_fresh_and_frozen() -> None:
    a, b = req(), req()
    assert a.id != b.id and len(a.id) == 32
    before = time.time()
    made = req()
    assert before <= made.created_at <= time.time()  # stamped when made
    with pytest.raises(ValidationError):
        a.path = "/elsewhere"  # type: ignore[misc]


@pytest.mark.parametrize(
    "bad",
    [
        {"operation": "chmod"},
        {"access": "execute"},
        {"path": ""},
        {"path": "   "},
        {"path": "a/../b"},
        {"path": "/a\0b"},
        {"size": -1},
        {"unexpected": 1},
    ],
)
def test_request_rejects_invalid_fields(bad: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "operation": "write",
        "path": "/data/x",
        "access": "write",
        "source": "t",
    }
    with pytest.raises(ValidationError):
        ApprovalRequest(**{**fields, **bad})


@given(st.text(max_size=3 * MAX_SUMMARY_CHARS))
def test_summary_is_capped_and_short_ones_kept(text: str) -> None:
    summary = req(summary=text).summary
    assert len(summary) <= MAX_SUMMARY_CHARS
    if len(text) <= MAX_SUMMARY_CHARS:
        assert summary == text
    else:
        assert summary.endswith("…") and text.startswith(summary[:-1])


@pytest.mark.parametrize("length", [MAX_SUMMARY_CHARS, MAX_SUMMARY_CHARS + 1, 50_000])
def test_summary_cap_at_the_boundary(length: int) -> None:
    summary = req(summary="x" * length).summary
    assert len(summary) == MAX_SUMMARY_CHARS
    assert summary.endswith("…") == (length > MAX_SUMMARY_CHARS)


def test_decision_allowed_property() -> None:
    assert ApprovalDecision(decision="allow_once", decided_by="x").allowed
    assert ApprovalDecision(decision=Decision.allow_session, decided_by="x").allowed
    assert not ApprovalDecision(decision=Decision.deny, decided_by="x").allowed


# --- headless and callback responders -----------------------------------------------------


def test_default_broker_is_headless_deny_with_clear_reason() -> None:
    broker = ApprovalBroker()
    assert isinstance(broker.responder, HeadlessResponder)
    decision = broker.request(req(access="write"))
    assert not decision.allowed
    assert decision.decided_by == "headless policy"
    assert "nobody can approve it here" in decision.reason
    # The refusal names the one line that would let someone decide.
    assert "sandbox_kernel_ext.set_default_responder(" in decision.reason
    assert "TerminalResponder()" in decision.reason
    assert "%load_ext sandbox_kernel_ext" in decision.reason
    assert "write_approval" in decision.reason
    read_decision = broker.request(req(access="read"))
    assert "read_approval" in read_decision.reason


def test_a_broker_without_a_responder_asks_the_default_installed_at_the_time_of_asking() -> None:
    broker = ApprovalBroker()  # made before any default is installed
    asked: list[str] = []
    undo = set_default_responder(CallbackResponder(lambda r: asked.append(r.path) or True))
    try:
        assert broker.follows_default
        assert broker.request(req(path="/data/a")).allowed
        assert asked == ["/data/a"]
        own, _ = broker_with(False)  # a broker with its own responder keeps it
        assert not own.request(req(path="/data/b")).allowed
        assert asked == ["/data/a"]
    finally:
        undo()
    assert not broker.request(req(path="/data/c")).allowed
    assert asked == ["/data/a"]


def test_undoing_default_responders_in_any_order_restores_the_one_before() -> None:
    first = HeadlessResponder(Decision.allow_once, reason="first")
    second = HeadlessResponder(Decision.allow_once, reason="second")
    nobody = default_responder()
    undo_first = set_default_responder(first)
    undo_second = set_default_responder(second)
    assert default_responder() is second
    undo_first()  # out of order: the later one still answers
    assert default_responder() is second
    undo_second()
    undo_second()  # twice is harmless
    assert default_responder() is nobody
    with pytest.raises(TypeError):
        set_default_responder("yes")  # type: ignore[arg-type]


def test_headless_can_be_configured_to_allow() -> None:
    broker = ApprovalBroker(HeadlessResponder(Decision.allow_once, reason="CI run"))
    decision = broker.request(req())
    assert decision.allowed and decision.reason == "CI run"
    assert broker.grants == ()


def test_setting_responder_to_none_follows_the_default_which_denies() -> None:
    broker, _ = broker_with(True)
    broker.responder = None
    assert broker.follows_default
    assert isinstance(broker.responder, HeadlessResponder)
    assert not broker.request(req()).allowed


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (True, Decision.allow_once),
        (False, Decision.deny),
        (Decision.allow_session, Decision.allow_session),
        (Decision.deny, Decision.deny),
    ],
)
def test_callback_results(result: object, expected: Decision) -> None:
    broker, fn = broker_with(result)
    decision = broker.request(req())
    assert decision.decision is expected
    assert decision.decided_by == "callback"
    assert len(fn.calls) == 1


def test_callback_may_return_full_decision() -> None:
    mine = ApprovalDecision(decision=Decision.allow_once, decided_by="reviewer bot", reason="ok")
    broker, _ = broker_with(mine)
    assert broker.request(req()) == mine


@pytest.mark.parametrize("result", ["yes", "allow_once", 1, None])
def test_callback_with_unexpected_result_fails_closed(result: object) -> None:
    broker, _ = broker_with(result)
    decision = broker.request(req())
    assert not decision.allowed
    assert "TypeError" in decision.reason


def test_builtin_responders_satisfy_protocol() -> None:
    for responder in (HeadlessResponder(), CallbackResponder(bool), TerminalResponder()):
        assert isinstance(responder, ApprovalResponder)


def test_responder_receives_broker_timeout() -> None:
    seen: list[float | None] = []

    def responder(request: ApprovalRequest, timeout: float | None) -> ApprovalDecision:
        seen.append(timeout)
        return ApprovalDecision(decision=Decision.deny, decided_by="t")

    broker = ApprovalBroker(responder, timeout=7.5)
    broker.request(req())
    broker.timeout = None
    broker.request(req())
    assert seen == [7.5, None]


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_timeout_must_be_positive(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        ApprovalBroker(timeout=timeout)


# --- broker: errors, grants, ids ----------------------------------------------------------


def test_responder_exception_denies_with_its_text() -> None:
    def boom(request: ApprovalRequest, timeout: float | None) -> ApprovalDecision:
        raise RuntimeError("widget comm closed")

    broker = ApprovalBroker(boom)
    decision = broker.request(req())
    assert not decision.allowed
    assert "widget comm closed" in decision.reason
    assert decision.decided_by == "broker"


def test_responder_returning_non_decision_denies() -> None:
    broker = ApprovalBroker(lambda request, timeout: True)  # type: ignore[arg-type,return-value]
    decision = broker.request(req())
    assert not decision.allowed and "CallbackResponder" in decision.reason


def test_session_grant_is_remembered_and_covers_reads() -> None:
    broker, fn = broker_with(Decision.allow_session)
    first = broker.request(req("/data/a", "write"))
    assert first.decision is Decision.allow_session and first.decided_by == "callback"

    fn.result = Decision.deny  # would refuse if asked again
    for access in ("write", "read"):
        again = broker.request(req("/data/a", access))
        assert again.allowed, access
        assert again.decided_by == "session grant"
        assert "/data/a" in again.reason
    assert len(fn.calls) == 1
    (grant,) = broker.grants
    assert (grant.path, grant.access, grant.granted_by) == ("/data/a", "write", "callback")


def test_read_grant_does_not_cover_write_or_other_paths() -> None:
    broker, fn = broker_with(Decision.allow_session)
    broker.request(req("/data/a", "read"))
    fn.result = Decision.deny
    assert broker.request(req("/data/a", "read")).decided_by == "session grant"
    assert not broker.request(req("/data/a", "write")).allowed
    assert not broker.request(req("/data/b", "read")).allowed
    assert not broker.request(req("/data/a/child", "read")).allowed
    assert len(fn.calls) == 4


def test_allow_once_is_not_remembered() -> None:
    broker, fn = broker_with(True)
    assert broker.request(req()).allowed
    fn.result = False
    assert not broker.request(req()).allowed
    assert broker.grants == ()
    assert len(fn.calls) == 2


def test_reset_forgets_grants_but_keeps_log() -> None:
    broker, fn = broker_with(Decision.allow_session)
    broker.request(req())
    assert broker.grants
    broker.reset()
    assert broker.grants == ()
    fn.result = False
    assert not broker.request(req()).allowed
    assert len(fn.calls) == 2
    assert len(broker.log) == 2


def test_grants_view_is_a_snapshot() -> None:
    broker, _ = broker_with(Decision.allow_session)
    broker.request(req())
    view = broker.grants
    broker.reset()
    assert len(view) == 1 and broker.grants == ()


def test_request_ids_are_single_use() -> None:
    broker, fn = broker_with(Decision.allow_once)
    once = req()
    assert broker.request(once).allowed
    replay = broker.request(once)
    assert not replay.allowed
    assert "already answered" in replay.reason
    assert len(fn.calls) == 1
    with pytest.raises(ApprovalDeniedError):
        broker.check(once)


def test_replay_is_denied_even_when_a_session_grant_exists() -> None:
    broker, _ = broker_with(Decision.allow_session)
    granted = req()
    broker.request(granted)
    assert not broker.request(granted).allowed
    assert broker.request(req()).decided_by == "session grant"


def test_forgotten_ids_are_still_refused_through_the_watermark() -> None:
    broker, _ = broker_with(True)
    broker._seen_limit = 3  # keep the test small; the default is large
    requests = [req() for _ in range(6)]
    for r in requests:
        assert broker.request(r).allowed
    assert len(broker._seen) == 3
    for r in requests:  # evicted or remembered, none may be answered twice
        assert not broker.request(r).allowed
    assert broker.request(req()).allowed  # fresh requests still work


def test_reset_does_not_reopen_used_ids() -> None:
    broker, _ = broker_with(True)
    used = req()
    broker.request(used)
    broker.reset()
    assert not broker.request(used).allowed


def test_check_raises_denied_error_naming_path_and_reason() -> None:
    broker = ApprovalBroker()
    with pytest.raises(ApprovalDeniedError) as info:
        broker.check(req("/data/secret.txt", "read", operation="open"))
    err = info.value
    assert isinstance(err, SandboxViolationError)
    assert err.path == "/data/secret.txt" and err.operation == "open"
    assert "'/data/secret.txt'" in str(err)
    assert "nobody can approve it here" in str(err)
    assert err.reason == broker.log[-1].decision.reason


def test_check_passes_when_allowed() -> None:
    broker, _ = broker_with(True)
    assert broker.check(req()) is None


def test_invalid_log_limit() -> None:
    with pytest.raises(ValueError):
        ApprovalBroker(log_limit=0)


def test_request_type_is_checked() -> None:
    with pytest.raises(TypeError):
        ApprovalBroker().request({"path": "/x"})  # type: ignore[arg-type]


# --- log and subscribers ------------------------------------------------------------------


def test_log_records_every_decision_in_order_and_is_bounded() -> None:
    broker = ApprovalBroker(CallbackResponder(lambda r: r.path.endswith("0")), log_limit=5)
    sent = [req(f"/data/f{i}") for i in range(12)]
    decisions = [broker.request(r) for r in sent]
    log = broker.log
    assert len(log) == 5
    assert [e.request for e in log] == sent[-5:]
    assert [e.decision for e in log] == decisions[-5:]
    assert all(isinstance(e, ApprovalRecord) for e in log)
    log.clear()  # a copy: the broker's log is untouched
    assert len(broker.log) == 5


def test_log_includes_grant_and_replay_decisions() -> None:
    broker, _ = broker_with(Decision.allow_session)
    first = req()
    broker.request(first)
    broker.request(req())
    broker.request(first)
    assert [e.decision.decided_by for e in broker.log] == ["callback", "session grant", "broker"]


def test_subscribe_and_unsubscribe() -> None:
    broker, _ = broker_with(True)
    seen: list[ApprovalRecord] = []
    unsubscribe = broker.subscribe(seen.append)
    decision = broker.request(r := req())
    assert seen == [ApprovalRecord(r, decision)]
    unsubscribe()
    unsubscribe()  # idempotent
    broker.request(req())
    assert len(seen) == 1


def test_same_callback_subscribed_twice_unsubscribes_separately() -> None:
    broker, _ = broker_with(True)
    seen: list[ApprovalRecord] = []
    first = broker.subscribe(seen.append)
    broker.subscribe(seen.append)
    first()
    broker.request(req())
    assert len(seen) == 1


def test_failing_subscriber_does_not_change_decision(caplog: pytest.LogCaptureFixture) -> None:
    broker, _ = broker_with(True)
    seen: list[ApprovalRecord] = []

    def bad(record: ApprovalRecord) -> None:
        raise ValueError("render failed")

    broker.subscribe(bad)
    broker.subscribe(seen.append)
    assert broker.request(req()).allowed
    assert len(seen) == 1
    assert "render failed" in caplog.text


def test_subscriber_may_call_back_into_broker() -> None:
    broker, _ = broker_with(Decision.allow_session)
    snapshots: list[int] = []
    broker.subscribe(lambda record: snapshots.append(len(broker.grants) + len(broker.log)))
    broker.request(req())
    assert snapshots == [2]


# --- terminal responder -------------------------------------------------------------------


def scripted(*answers: str | BaseException) -> Callable[[str], str]:
    queue = list(answers)

    def input_fn(prompt: str) -> str:
        assert "[y]es / [a]lways" in prompt and "[N]o" in prompt
        answer = queue.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return input_fn


@pytest.mark.parametrize(
    ("answer", "expected", "reason_part"),
    [
        ("y", Decision.allow_once, "approved"),
        ("Yes ", Decision.allow_once, "approved"),
        ("a", Decision.allow_session, "session"),
        ("ALWAYS", Decision.allow_session, "session"),
        ("n", Decision.deny, "refused"),
        ("no", Decision.deny, "refused"),
        ("", Decision.deny, "refused"),
        ("   ", Decision.deny, "refused"),
        ("yess", Decision.deny, "unclear answer 'yess'"),
        ("sure", Decision.deny, "unclear"),
        (EOFError(), Decision.deny, "end of input"),
        (KeyboardInterrupt(), Decision.deny, "interrupted"),
    ],
)
def test_terminal_answers(
    answer: str | BaseException, expected: Decision, reason_part: str
) -> None:
    out = io.StringIO()
    decision = TerminalResponder(scripted(answer), out)(req(), 30.0)
    assert decision.decision is expected
    assert decision.decided_by == "terminal"
    assert reason_part in decision.reason


def test_terminal_shows_operation_path_size_and_summary() -> None:
    out = io.StringIO()
    request = req(
        "/data/out.csv", operation="edit", size=1234, summary="- old\n+ new", source="toolset:notes"
    )
    TerminalResponder(scripted("n"), out)(request, None)
    text = out.getvalue()
    assert "edit '/data/out.csv'" in text
    assert "1,234 bytes" in text
    assert "toolset:notes" in text
    assert "  | - old\n  | + new" in text


def test_terminal_escapes_control_sequences_from_untrusted_text() -> None:
    out = io.StringIO()
    request = req("/data/\x1b[2Kevil\u202e.csv", summary="line\x1b]0;title\x07\ttab\nnext")
    TerminalResponder(scripted("n"), out)(request, None)
    text = out.getvalue()
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[2Kevil\\u202e.csv" in text
    assert "\ttab" in text and "  | next" in text


def test_terminal_output_defaults_to_current_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    TerminalResponder(scripted("y"))(req("/data/late-bound"), None)
    assert "/data/late-bound" in capsys.readouterr().err


def test_terminal_always_becomes_a_session_grant() -> None:
    broker = ApprovalBroker(TerminalResponder(scripted("a"), io.StringIO()))
    broker.request(req())
    # A second prompt would pop from an empty script and fail the test.
    assert broker.request(req(access="read")).decided_by == "session grant"


# --- concurrency --------------------------------------------------------------------------


def test_concurrent_requests_all_get_their_own_answer() -> None:
    def decide(request: ApprovalRequest) -> bool:
        time.sleep(0.01)
        return int(request.path.rsplit("f", 1)[1]) % 2 == 0

    broker = ApprovalBroker(CallbackResponder(decide))
    results: dict[int, ApprovalDecision] = {}
    start = threading.Barrier(20)

    def worker(i: int) -> None:
        start.wait()
        results[i] = broker.request(req(f"/data/f{i}"))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 20
    for i, decision in results.items():
        assert decision.allowed == (i % 2 == 0), i
    log = broker.log
    assert len(log) == 20
    assert sorted(e.request.path for e in log) == sorted(f"/data/f{i}" for i in range(20))
    assert all(e.decision.allowed == (int(e.request.path[7:]) % 2 == 0) for e in log)


def test_different_paths_are_asked_concurrently() -> None:
    both_inside = threading.Barrier(2, timeout=5)

    def decide(request: ApprovalRequest) -> bool:
        both_inside.wait()  # breaks (and denies) if the broker serialised the two asks
        return True

    broker = ApprovalBroker(CallbackResponder(decide))
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda p=p: results.append(broker.request(req(p)).allowed))
        for p in ("/data/a", "/data/b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [True, True]


def test_same_path_waits_for_pending_session_grant() -> None:
    calls: list[ApprovalRequest] = []
    second_result: list[ApprovalDecision] = []
    second = threading.Thread(
        target=lambda: second_result.append(broker.request(req(access="read")))
    )

    def decide(request: ApprovalRequest) -> Decision:
        calls.append(request)
        if len(calls) == 1:
            second.start()
            time.sleep(0.3)  # the second request arrives while this answer is pending
        return Decision.allow_session

    broker = ApprovalBroker(CallbackResponder(decide))
    first = broker.request(req())
    second.join(10)
    assert first.decided_by == "callback"
    assert second_result[0].decided_by == "session grant"
    assert len(calls) == 1


def test_same_path_after_pending_deny_is_asked_again() -> None:
    answers = iter([False, True])
    lock = threading.Lock()
    calls = 0
    gate = threading.Event()

    def decide(request: ApprovalRequest) -> bool:
        nonlocal calls
        with lock:
            calls += 1
        gate.wait(5)
        return next(answers)

    broker = ApprovalBroker(CallbackResponder(decide))
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(broker.request(req()).allowed))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert calls == 1  # the second waits behind the first instead of prompting alongside it
    gate.set()
    for t in threads:
        t.join(10)
    assert sorted(results) == [False, True]
    assert calls == 2


def test_pending_path_is_released_when_responder_raises_base_exception() -> None:
    class Stop(BaseException):
        pass

    def responder(request: ApprovalRequest, timeout: float | None) -> ApprovalDecision:
        raise Stop

    broker = ApprovalBroker(responder)
    with pytest.raises(Stop):
        broker.request(req())
    broker.responder = CallbackResponder(lambda r: True)
    done = threading.Event()
    threading.Thread(target=lambda: (broker.request(req()), done.set()), daemon=True).start()
    assert done.wait(5), "the path stayed pending after the responder escaped"
