"""Approval-gated files and usage reports from inside a real confined Python cell.

The kernel's rules leave gated roots out of the child's reach; the child asks over its control
channel and the broker decides. These tests are the person (a responder they control), and
they also play the hostile cell: forged frames, replays, bypasses.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sandbox_kernel_ext import (
    ApprovalBroker,
    ApprovalDecision,
    ApprovalRequest,
    CapabilityDeclaration,
    Decision,
    SandboxError,
    SandboxManager,
)
from leftovers import is_spare
from sandbox_kernel_ext.files.host_backend import TEMP_SUFFIX


class Person:
    """A responder the test drives: each request waits until the test answers it."""

    def __init__(self) -> None:
        self.asked: list[ApprovalRequest] = []
        self.answers: dict[str, Decision] = {}
        self._cond = threading.Condition()

    def __call__(self, request: ApprovalRequest, timeout: float | None) -> ApprovalDecision:
        with self._cond:
            self.asked.append(request)
            self._cond.notify_all()
            ok = self._cond.wait_for(lambda: request.path in self.answers, timeout=timeout)
            if not ok:
                return ApprovalDecision(decision=Decision.deny, decided_by="timeout",
                                        reason="nobody answered in time")
            return ApprovalDecision(decision=self.answers.pop(request.path), decided_by="test")

    def wait_for_question(self, path: str) -> ApprovalRequest:
        with self._cond:
            assert self._cond.wait_for(lambda: any(r.path == path for r in self.asked), timeout=60)
            return next(r for r in self.asked if r.path == path)

    def answer(self, path: str, decision: Decision) -> None:
        with self._cond:
            self.answers[path] = decision
            self._cond.notify_all()


@pytest.fixture
def roots(shared_dir: Path) -> Path:
    for name in ("data", "secret", "docs"):
        (shared_dir / name).mkdir(mode=0o777)
        os.chmod(shared_dir / name, 0o777)
    (shared_dir / "secret" / "key.txt").write_text("the secret\n")
    (shared_dir / "docs" / "guide.md").write_text("# guide\n")
    return shared_dir


def _policy(base: Path, **limits: object) -> CapabilityDeclaration:
    return CapabilityDeclaration.model_validate({
        "paths": {
            "data": {"root": str(base / "data"), "mode": "rw"},  # writes need approval
            "secret": {"root": str(base / "secret"), "mode": "ro", "read_approval": True},
            "docs": {"root": str(base / "docs"), "mode": "ro", "write_approval": False},
        },
        "resource_limits": limits,
    })


@pytest.fixture
def person() -> Person:
    return Person()


@pytest.fixture
def gated(person: Person) -> Iterator[SandboxManager]:
    with SandboxManager(broker=ApprovalBroker(person, timeout=60)) as manager:
        yield manager


def _in_background(fn: Callable[[], object]) -> tuple[threading.Thread, list]:
    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    return thread, box


def _temp_files(folder: Path) -> list[str]:
    return [name for name in os.listdir(folder) if name.endswith(TEMP_SUFFIX)]


def _wait_for_control_threads() -> None:
    """A worker still asking when its run ended finishes once answered (and then writes
    nothing); wait for it so the folder is looked at afterwards."""
    for thread in threading.enumerate():
        if thread.name == "sandbox-control":
            thread.join(timeout=30)
            assert not thread.is_alive()


def _sandbox_processes(manager: SandboxManager) -> list[psutil.Process]:
    """Sandbox-uid processes this test's manager started: its launcher's descendants (the
    launcher is a child subreaper, so one the runner failed to kill stays among them). Not
    every process of that uid on the host: another sandbox may be running beside the tests."""
    if manager.launcher_pid is None:
        return []
    try:
        tree = psutil.Process(manager.launcher_pid).children(recursive=True)
    except psutil.Error:
        return []
    uid = manager.child_uid if manager.child_uid is not None else os.getuid()
    found = []
    for process in tree:
        try:
            if process.uids().real == uid and not is_spare(process):
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_a_gated_write_waits_for_the_answer_then_lands_whole(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    target = roots / "data" / "out.csv"
    code = f"with open({str(target)!r}, 'w') as f:\n    f.write('a,b\\n1,2\\n')\nprint('written')"
    thread, box = _in_background(lambda: gated.run_python(sid, code, timeout=30))
    request = person.wait_for_question("data/out.csv")
    assert request.operation == "write" and request.size == 8 and "1,2" in request.summary
    assert os.listdir(roots / "data") == []  # staged elsewhere: nothing here before the yes
    assert gated.status(sid).value == "running"
    person.answer("data/out.csv", Decision.allow_once)
    thread.join()
    result = box[0]
    assert result.exit_code == 0 and result.stdout == "written\n", result.stderr
    assert target.read_text() == "a,b\n1,2\n" and not _temp_files(roots / "data")


def test_a_denied_write_leaves_nothing_and_says_why(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    person.answer("data/x.csv", Decision.deny)
    result = gated.run_python(sid, f"open({str(roots / 'data' / 'x.csv')!r}, 'w').close()")
    assert result.exit_code == 1
    assert "PermissionError" in result.stderr and "'data/x.csv'" in result.stderr
    assert "was not approved" in result.stderr
    assert os.listdir(roots / "data") == []


def test_gated_reads_ask_and_other_roots_do_not(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    person.answer("secret/key.txt", Decision.allow_once)
    code = (f"secret = open({str(roots / 'secret' / 'key.txt')!r}).read()\n"
            f"guide = open({str(roots / 'docs' / 'guide.md')!r}).read()")
    result = gated.run_python(sid, code, outputs=["secret", "guide"])
    assert result.variables == {"secret": "the secret\n", "guide": "# guide\n"}, result.stderr
    assert [r.path for r in person.asked] == ["secret/key.txt"]
    person.answer("secret/key.txt", Decision.deny)
    denied = gated.run_python(sid, f"open({str(roots / 'secret' / 'key.txt')!r}).read()")
    assert denied.exit_code == 1 and "read of 'secret/key.txt' was not approved" in denied.stderr


def test_a_file_left_open_is_committed_at_the_end_of_the_cell(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    person.answer("data/open.txt", Decision.allow_once)
    result = gated.run_python(sid, f"f = open({str(roots / 'data' / 'open.txt')!r}, 'w')\n"
                                   "f.write('kept')")
    assert result.exit_code == 0, result.stderr
    assert (roots / "data" / "open.txt").read_text() == "kept"


def test_always_covers_later_runs_and_append_keeps_the_old_content(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    path = str(roots / "data" / "log.txt")
    person.answer("data/log.txt", Decision.allow_session)
    assert gated.run_python(sid, f"open({path!r}, 'w').write('one\\n')").exit_code == 0
    again = gated.run_python(sid, f"with open({path!r}, 'a') as f: f.write('two\\n')")
    assert again.exit_code == 0, again.stderr
    assert Path(path).read_text() == "one\ntwo\n"
    assert len(person.asked) == 1  # the second came under the session grant


def test_refusals_name_the_virtual_path_and_what_is_allowed(gated, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    result = gated.run_python(sid, f"""
for path, mode in [({str(roots / 'docs' / 'new.md')!r}, 'w'), ('/usr/evil', 'w')]:
    try:
        open(path, mode)
    except PermissionError as exc:
        print(exc)
""")
    lines = result.stdout.splitlines()
    assert "write to docs/new.md denied by the sandbox policy: docs is read-only" in lines[0]
    assert f"writable: data = {roots / 'data'}" in lines[0]
    assert "write to /usr/evil denied by the sandbox policy" in lines[1]


def test_approvals_cannot_open_more_than_the_policy_gates(gated, person, roots, tmp_path) -> None:
    """The kernel's rules stay the ceiling: a forged open for a path outside the gated roots,
    a symlink planted in a gated root, and going around the hooks all fail."""
    os.symlink("/etc/shadow", roots / "secret" / "link.txt")
    person.answer("secret/link.txt", Decision.allow_once)
    sid = gated.create_sandbox(_policy(roots))
    result = gated.run_python(sid, f"""
import ctypes, io, os
from sandbox_kernel_ext.runner.child import inside
out = {{}}
def attempt(name, fn):
    try:
        fn()
        out[name] = "opened"
    except OSError as exc:
        out[name] = str(exc)
attempt("forged", lambda: inside._ask_open("/etc/shadow", os.O_RDONLY))
attempt("forged write", lambda: inside._ask_open("/usr/bin/evil", os.O_WRONLY | os.O_CREAT))
attempt("symlink", lambda: open({str(roots / 'secret' / 'link.txt')!r}).read())
attempt("fileio", lambda: io.FileIO({str(roots / 'data' / 'a.txt')!r}, "w"))
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.open({str(roots / 'data' / 'b.txt')!r}.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
out["ctypes"] = "opened" if fd >= 0 else os.strerror(ctypes.get_errno())
""", outputs=["out"])
    out = result.variables["out"]
    assert "opened" not in out.values(), out
    assert "not an approval-gated path" in out["forged"]
    assert "needs approval" in out["fileio"]
    # The read-only view of the host (Landlock where there is none), below every hook.
    assert out["ctypes"] in ("Read-only file system", "Permission denied")
    assert os.listdir(roots / "data") == []


@pytest.mark.parametrize("frame, reason", [
    ('{"type": "reply", "id": 1, "ok": true}', "unknown frame type 'reply'"),
    ('{"type": "commit", "id": 1, "handle": "00ff"}', "never gave out"),
    ('{"type": "usage", "tokens": -5, "cost": 0}', "a usage report needs"),
    ('{"type": "open", "id": 0, "path": "/x", "flags": 0}', "not larger than the last"),
    ('{"type": "variables", "values": {}}\\n{"type": "variables", "values": {}}', "sent twice"),
    ('{"type": "open", "id": 1, "path": "' + "x" * 70000 + '", "flags": 0}', "over 65536 bytes"),
])
def test_forged_frames_end_the_run_with_a_reason(gated, roots, frame, reason) -> None:
    sid = gated.create_sandbox(_policy(roots))
    code = f"import os, time\nos.write(3, b'{frame}\\n')\ntime.sleep(60)"
    result = gated.run_python(sid, code, timeout=120)
    assert result.exit_code == -1
    assert "broke its control protocol" in (result.killed or "") and reason in result.killed
    assert gated.status(sid).value == "stopped"


def test_a_replayed_request_id_ends_the_run(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    person.answer("secret/key.txt", Decision.allow_once)
    code = f"""
import time
from sandbox_kernel_ext.runner.child import inside
open({str(roots / 'secret' / 'key.txt')!r}).close()
inside._channel._next_id = 0  # the next request reuses id 1
open({str(roots / 'secret' / 'key.txt')!r})
time.sleep(60)
"""
    result = gated.run_python(sid, code, timeout=120)
    assert "request id 1 is not larger than the last one" in (result.killed or ""), result.stderr


def test_a_timed_out_approval_denies_and_leaves_nothing(roots) -> None:
    person = Person()
    with SandboxManager(broker=ApprovalBroker(person, timeout=0.5)) as manager:
        sid = manager.create_sandbox(_policy(roots))
        path = str(roots / "data" / "t.txt")
        result = manager.run_python(sid, f"with open({path!r}, 'w') as f:\n    f.write('x')")
        # A file closed by the garbage collector, or never closed, cannot raise where it was
        # written: the cell fails at its end instead, naming the file.
        dropped = manager.run_python(sid, f"open({path!r}, 'w').write('x')")
        left_open = manager.run_python(sid, f"f = open({path!r}, 'w')\nf.write('x')")
    assert result.exit_code == 1 and "nobody answered in time" in result.stderr
    for run in (dropped, left_open):
        assert run.exit_code == 1 and "t.txt was not written: write of 'data/t.txt' was not " \
            "approved" in run.stderr, run.stderr
    assert os.listdir(roots / "data") == []


def test_waiting_for_a_person_does_not_count_against_the_timeout(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    code = f"open({str(roots / 'data' / 'slow.txt')!r}, 'w').write('x')\nprint('done')"
    thread, box = _in_background(lambda: gated.run_python(sid, code, timeout=1.0))
    person.wait_for_question("data/slow.txt")
    time.sleep(2.0)  # longer than the run's whole timeout
    person.answer("data/slow.txt", Decision.allow_once)
    thread.join()
    assert box[0].killed is None and box[0].stdout == "done\n", box[0].stderr
    assert box[0].resource_usage["elapsed_seconds"] < box[0].resource_usage["wall_seconds"]


def test_a_kill_while_an_approval_is_pending_leaves_nothing(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    code = f"with open({str(roots / 'data' / 'k.txt')!r}, 'w') as f:\n    f.write('partial')"
    thread, box = _in_background(lambda: gated.run_python(sid, code, timeout=60))
    person.wait_for_question("data/k.txt")
    gated.kill(sid, "stopped by the test")
    thread.join()
    assert box[0].killed == "stopped by the test"
    person.answer("data/k.txt", Decision.allow_once)  # too late: must write nothing
    _wait_for_control_threads()
    assert os.listdir(roots / "data") == []
    assert _sandbox_processes(gated) == []


def test_an_interrupted_parent_leaves_no_process_and_no_file(gated, person, roots) -> None:
    sid = gated.create_sandbox(_policy(roots))
    main = threading.get_ident()

    def interrupt() -> None:
        person.wait_for_question("data/i.txt")
        signal.pthread_kill(main, signal.SIGINT)

    helper = threading.Thread(target=interrupt)
    helper.start()
    with pytest.raises(KeyboardInterrupt):
        gated.run_python(sid, f"open({str(roots / 'data' / 'i.txt')!r}, 'w').write('x')", timeout=60)
    helper.join()
    person.answer("data/i.txt", Decision.allow_once)  # too late: must write nothing
    _wait_for_control_threads()
    assert _sandbox_processes(gated) == []
    assert os.listdir(roots / "data") == []
    assert gated.status(sid).value == "stopped"


def test_usage_reports_count_and_a_budget_breach_kills(gated, roots) -> None:
    sid = gated.create_sandbox(_policy(roots, max_tokens=1000, max_cost_usd=0.5))
    ok = gated.run_python(sid, """
import sandbox_kernel_ext
sandbox_kernel_ext.report_usage(tokens=300, cost=0.01)
sandbox_kernel_ext.report_usage(tokens=200)
try:
    sandbox_kernel_ext.report_usage(tokens=-1)
except ValueError as exc:
    print(exc)
""")
    assert ok.exit_code == 0 and "tokens must be a whole number" in ok.stdout
    assert ok.resource_usage["tokens_used"] == 500 and ok.resource_usage["cost_usd"] == 0.01
    over = gated.run_python(sid, """
import sandbox_kernel_ext, time
sandbox_kernel_ext.report_usage(tokens=5000)
time.sleep(60)
""", timeout=120)
    assert over.exit_code == -1 and "token" in (over.killed or "").lower()
    cost = gated.run_python(sid, """
from sandbox_kernel_ext import report_usage
import time
report_usage(cost=2.0)
time.sleep(60)
""", timeout=120)
    assert "cost limit exceeded" in (cost.killed or "").lower()


def test_a_gated_root_is_out_of_the_kernels_rules_whatever_reads_it(gated, person, roots) -> None:
    """Found in review: under "read everywhere" (the default) Landlock granted the gated root,
    so only the Python hook asked. Now the kernel's rules leave it out, or the child hides it
    under an empty mount: cat and a raw libc open find nothing, and nobody is asked."""
    sid = gated.create_sandbox(_policy(roots))
    key = str(roots / "secret" / "key.txt")
    result = gated.run_python(sid, f"""
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.open({key!r}.encode(), os.O_RDONLY)
raw = "opened" if fd >= 0 else os.strerror(ctypes.get_errno())
cat = subprocess.run(["cat", {key!r}], capture_output=True, text=True)
shell = [cat.returncode, cat.stdout]
""", outputs=["raw", "shell"])
    assert result.variables["raw"] in ("Permission denied", "No such file or directory"), result
    assert result.variables["shell"] == [1, ""], result.stderr
    assert person.asked == []


@pytest.mark.parametrize("config", [
    {"mode": "read_only", "readable_paths": ["{base}"]},
    {"mode": "read_only", "readable_paths": ["{base}/secret/inner"]},
    {"mode": "read_write", "writable_paths": ["{base}"]},
    {"mode": "read_write", "writable_paths": ["{base}/data"]},
])
def test_plain_grants_around_or_inside_a_gated_root_are_refused(gated, roots, config) -> None:
    (roots / "secret" / "inner").mkdir()
    data = _policy(roots).model_dump()
    data["filesystem_config"] = {
        key: ([p.format(base=roots) for p in value] if isinstance(value, list) else value)
        for key, value in config.items()}
    policy = CapabilityDeclaration.model_validate(data)
    with pytest.raises(SandboxError, match="overlaps the table root"):
        gated.create_sandbox(policy)


def test_a_committed_write_is_the_approved_snapshot(gated, person, roots) -> None:
    """Found in review: the child kept a descriptor of the staged file and rewrote it after
    the approval. Now the kernel copies what the person saw and writes only that."""
    sid = gated.create_sandbox(_policy(roots))
    person.answer("data/out.txt", Decision.allow_once)
    result = gated.run_python(sid, f"""
import os
f = open({str(roots / 'data' / 'out.txt')!r}, "w")
spare = os.dup(f.fileno())
f.write("harmless\\n")
f.close()
os.pwrite(spare, b"EVIL CONTENT written after approval" * 100, 0)
""")
    assert result.exit_code == 0, result.stderr
    assert (roots / "data" / "out.txt").read_text() == "harmless\n"
    assert "harmless" in person.asked[0].summary


def test_open_staged_writes_are_capped(gated, roots) -> None:
    """Found in review: each staged write held a descriptor in the kernel, without limit."""
    sid = gated.create_sandbox(_policy(roots))
    gated.run_python(sid, "pass")  # the launcher starts (its socket is a descriptor too)
    before = len(os.listdir("/proc/self/fd"))
    result = gated.run_python(sid, f"""
import errno, os
files = []
try:
    for i in range(100):
        files.append(open({str(roots / 'data')!r} + f"/f{{i}}.txt", "w"))
except OSError as exc:
    print(len(files), errno.errorcode[exc.errno], flush=True)
os._exit(0)  # leave them all uncommitted: the end of the run discards them
""")
    assert result.stdout == "16 EMFILE\n", result.stderr
    assert os.listdir(roots / "data") == []
    # what the run's end closes on other threads (its pidfd, its CPU clock) may still be on
    # its way there on a loaded machine: wait for it, then nothing may be left
    deadline = time.monotonic() + 30
    while len(os.listdir("/proc/self/fd")) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(os.listdir("/proc/self/fd")) == before, os.listdir("/proc/self/fd")


def test_waiting_for_people_stretches_the_timeout_by_one_approval_timeout_at_most(roots) -> None:
    """Found in review: a cell that keeps asking while nobody answers ran on for ever."""
    with SandboxManager(broker=ApprovalBroker(Person(), timeout=0.5)) as manager:
        sid = manager.create_sandbox(_policy(roots))
        result = manager.run_python(sid, f"""
for i in range(8):  # 8 unanswered questions: 4 s of waiting
    try:
        open({str(roots / 'data')!r} + f"/q{{i}}.txt", "w").close()
    except PermissionError:
        pass
print("asked them all")
""", timeout=1.0)
    assert result.killed == "timeout after 1 s" and "asked them all" not in result.stdout
    assert result.resource_usage["elapsed_seconds"] < result.resource_usage["wall_seconds"]


# -- sessions ---------------------------------------------------------------------------------

def test_an_answer_an_interrupt_abandoned_never_answers_a_later_request(gated, person, roots) -> None:
    """A session cell interrupted while it waits for a person: the answer that comes later
    is for that request alone. The next cell's own request gets its own answer (here a
    refusal), not the stale approval with its descriptor for the other file."""
    (roots / "secret" / "other.txt").write_text("the other secret\n")
    sid = gated.create_sandbox(_policy(roots))
    with gated.start_session(sid) as session:
        key, other = roots / "secret" / "key.txt", roots / "secret" / "other.txt"
        thread, box = _in_background(lambda: session.run_cell(
            f"print(open({str(key)!r}).read())", timeout=60))
        person.wait_for_question("secret/key.txt")
        session.interrupt()
        thread.join(timeout=60)
        assert box and box[0].error is not None and box[0].error["ename"] == "KeyboardInterrupt"
        # The next cell asks while the person still looks at the first question; the one
        # worker answers in order, so the late yes reaches the child while it waits for its
        # own answer.
        thread, box = _in_background(lambda: session.run_cell(
            f"try:\n    print(open({str(other)!r}).read())\n"
            f"except PermissionError as exc:\n    print('refused:', exc)", timeout=60))
        person.answer("secret/key.txt", Decision.allow_once)
        person.wait_for_question("secret/other.txt")
        person.answer("secret/other.txt", Decision.deny)
        thread.join(timeout=60)
        assert box and "refused:" in box[0].stdout, box[0].stdout + box[0].stderr
        assert "the secret" not in box[0].stdout


@pytest.mark.parametrize("spelling", ["//{}", "/.{}", "{}/../data/odd.csv", "///{}"])
def test_every_spelling_of_a_gated_path_asks(gated, person, roots, spelling: str) -> None:
    """`//srv/...` once was not recognised as gated (a bare EACCES, no question): Linux
    reads any run of slashes as one, and so must the gate."""
    target = str(roots / "data" / "odd.csv")
    spelled = spelling.format(target) if "{}/" not in spelling else spelling.format(str(roots / "data"))
    person.answer("data/odd.csv", Decision.allow_once)
    result = gated.run_python(sid := gated.create_sandbox(_policy(roots)),
                              f"open({spelled!r}, 'w').write('x')\nprint('written')")
    assert result.stdout == "written\n", (sid, result.stderr)
    assert (roots / "data" / "odd.csv").read_text() == "x"


def test_a_trailing_space_names_another_file(gated, person, roots) -> None:
    """Virtual and gated paths are taken as written: `notes.md ` is not `notes.md`."""
    (roots / "data" / "notes.md").write_text("plain\n")
    person.answer("data/notes.md ", Decision.allow_once)
    result = gated.run_python(gated.create_sandbox(_policy(roots)),
                              f"open({str(roots / 'data' / 'notes.md ')!r}, 'w').write('spaced')")
    assert result.exit_code == 0, result.stderr
    assert (roots / "data" / "notes.md").read_text() == "plain\n"
    assert (roots / "data" / "notes.md ").read_text() == "spaced"


def test_a_refused_write_is_reported_by_its_own_cell_only(gated: SandboxManager, roots: Path,
                                                          person: Person) -> None:
    """Found by a first-hour user: after `open(p, "w").write("x")` was refused (the file is
    closed by the garbage collector, where nothing can catch the refusal), every later cell
    of the session raised the same PermissionError, even `print('hello')`."""
    sid = gated.create_sandbox(_policy(roots))
    target = roots / "data" / "refused.txt"
    with gated.start_session(sid) as session:
        thread, box = _in_background(lambda: session.run_cell(
            f"open({str(target)!r}, 'w').write('x')", timeout=60))
        person.wait_for_question("data/refused.txt")
        person.answer("data/refused.txt", Decision.deny)
        thread.join(timeout=60)
        first = box[0]
        assert first.error is not None and "refused.txt was not written" in first.error["evalue"]
        second = session.run_cell("print('hello')")
        assert second.error is None and second.stdout == "hello\n", second
        thread, box = _in_background(lambda: session.run_cell(  # held by a reference cycle
            f"class Holder: pass\nh = Holder(); h.me = h; h.f = open({str(target)!r}, 'w')\n"
            "h.f.write('x'); del h", timeout=60))
        deadline = time.monotonic() + 60
        while len(person.asked) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        person.answer("data/refused.txt", Decision.deny)
        thread.join(timeout=60)
        assert "refused.txt was not written" in (box[0].error or {}).get("evalue", ""), box[0]
        after = session.run_cell("print('next')")
        assert after.error is None and after.stdout == "next\n", after
    assert not target.exists()
