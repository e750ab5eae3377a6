"""filesystem-sandbox's users' own kind of tests, run against sandbox_kernel_ext.

Written the way that library's users write theirs: pytest classes over `tmp_path`, the
library's names imported under an alias, paths in its spelling (`data/a.txt`), built-in
exception types in `pytest.raises`, message phrases in `match=`, and approvals through the
blocking-approval wrapper PydanticAI users put around a toolset. Nothing here is adapted to
this package's own conventions: if one of these fails, a user's existing test would too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import sandbox_kernel_ext as fs_sandbox  # the alias a user's `import ... as` would give
from sandbox_kernel_ext import (
    ApprovalBroker,
    ApprovalDeniedError,
    CallbackResponder,
    EditError,
    FileSystemToolset,
    FileTooLargeError,
    PathConfig,
    PathNotInSandboxError,
    PathNotWritableError,
    RootSandboxConfig,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPermissionEscalationError,
    SuffixNotAllowedError,
    set_default_responder,
)


_made: list[FileSystemToolset] = []


@pytest.fixture(autouse=True)
def close_toolsets() -> Any:
    """Each toolset holds its roots' directory descriptors until closed: close them here,
    so no later test sees a descriptor this module left to the garbage collector."""
    yield
    while _made:
        _made.pop().close()
    leave_ticket(None)  # no test leaves another a ticket


def two_roots(tmp_path: Path, **output: Any) -> FileSystemToolset:
    """`input` (read-only, two files) and `output` (read-write) in multi-path mode."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "in" / "a.txt").write_text("alpha", encoding="utf-8")
    (tmp_path / "in" / "sub" / "b.md").write_text("beta", encoding="utf-8")
    config = SandboxConfig(paths={
        "input": PathConfig(root=str(tmp_path / "in"), mode="ro"),
        "output": PathConfig(root=str(tmp_path / "out"), mode="rw",
                             **{"write_approval": False, **output}),
    })
    _made.append(FileSystemToolset(Sandbox(config)))
    return _made[-1]


class TestPathSpelling:
    def test_list_files_returns_name_slash_relative(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        toolset.write("output/c.txt", "gamma")
        assert toolset.list_files() == ["input/a.txt", "input/sub/b.md", "output/c.txt"]
        assert toolset.list_files("input/sub") == ["input/sub/b.md"]
        assert toolset.list_files("input", "*.txt") == ["input/a.txt"]

    def test_roots_are_bare_names(self, tmp_path: Path) -> None:
        sandbox = two_roots(tmp_path).sandbox
        assert sandbox.readable_roots == ["input", "output"]
        assert sandbox.writable_roots == ["output"]

    def test_derived_sandbox_roots(self, tmp_path: Path) -> None:
        child = two_roots(tmp_path).sandbox.derive(allow_read="input/sub")
        assert child.readable_roots == ["input/sub"]
        assert child.writable_roots == []
        assert child.can_read("input/sub/b.md")
        assert not child.can_read("input/a.txt")

    def test_both_spellings_name_the_same_file(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        assert toolset.read("input/a.txt").content == toolset.read("/input/a.txt").content == "alpha"
        sandbox = toolset.sandbox
        assert sandbox.resolve("input/a.txt") == sandbox.resolve("/input/a.txt")
        assert sandbox.resolve("input/a.txt") == (tmp_path / "in" / "a.txt").resolve()

    def test_what_a_model_reads_uses_the_same_spelling(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        written = toolset.call("write_file", {"path": "/output/n.txt", "content": "x"})
        assert written["path"] == "output/n.txt"
        listed = toolset.call("list_files", {"path": "."})
        assert "output/n.txt" in listed["files"]
        with pytest.raises(FileNotFoundError, match="'output/missing.txt'"):
            toolset.call("read_file", {"path": "/output/missing.txt"})
        with pytest.raises(PathNotWritableError, match="'input/a.txt'"):
            toolset.write("/input/a.txt", "no")
        assert "Readable: input, output." in toolset.tool_definitions()[0]["function"]["description"]

    def test_root_mode_uses_slash_paths(self, tmp_path: Path) -> None:
        (tmp_path / "proj" / "src").mkdir(parents=True)
        (tmp_path / "proj" / "src" / "a.txt").write_text("hi", encoding="utf-8")
        config = SandboxConfig(root=RootSandboxConfig(root=tmp_path / "proj", readonly=False))
        toolset = FileSystemToolset(Sandbox(config, base_path=tmp_path))
        _made.append(toolset)
        assert toolset.sandbox.readable_roots == ["/"] and toolset.sandbox.writable_roots == ["/"]
        assert toolset.list_files(".") == ["/src/a.txt"]
        assert toolset.sandbox.resolve("src/a.txt") == toolset.sandbox.resolve("/src/a.txt")
        assert toolset.call("write_file", {"path": "new/n.txt", "content": "x"})["path"] == "/new/n.txt"
        derived = toolset.sandbox.derive(allow_read="/src", allow_write="/new")
        assert derived.readable_roots == ["/new", "/src"] and derived.writable_roots == ["/new"]


class TestBuiltinExceptions:
    @pytest.mark.parametrize("operation", ["read", "edit", "delete", "move", "copy"])
    def test_missing_file_is_file_not_found(self, tmp_path: Path, operation: str) -> None:
        toolset = two_roots(tmp_path)
        calls = {
            "read": lambda: toolset.read("output/nope.txt"),
            "edit": lambda: toolset.edit("output/nope.txt", "a", "b"),
            "delete": lambda: toolset.delete("output/nope.txt"),
            "move": lambda: toolset.move("output/nope.txt", "output/to.txt"),
            "copy": lambda: toolset.copy("output/nope.txt", "output/to.txt"),
        }
        with pytest.raises(FileNotFoundError, match="not found"):
            calls[operation]()
        with pytest.raises(SandboxError):  # the library's own base still catches it
            calls[operation]()

    @pytest.mark.parametrize("operation", ["move", "copy"])
    def test_existing_destination_is_file_exists(self, tmp_path: Path, operation: str) -> None:
        toolset = two_roots(tmp_path)
        toolset.write("output/from.txt", "one")
        toolset.write("output/to.txt", "two")
        with pytest.raises(FileExistsError, match="already exists"):
            getattr(toolset, operation)("output/from.txt", "output/to.txt")
        assert (tmp_path / "out" / "to.txt").read_text() == "two"

    def test_a_folder_is_not_a_file(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        with pytest.raises(IsADirectoryError):
            toolset.read("input/sub")
        (tmp_path / "out" / "dir").mkdir()
        with pytest.raises(IsADirectoryError):
            toolset.delete("output/dir")
        with pytest.raises(IsADirectoryError):
            toolset.copy("input/sub", "output/sub2")

    def test_refusals_are_permission_errors(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        with pytest.raises(PermissionError):
            toolset.read("../etc/passwd")
        with pytest.raises(PermissionError):
            toolset.write("input/x.txt", "no")


class TestMessagePhrases:
    def test_outside_sandbox(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        for path in ("unknown/x.txt", "input/../../etc/passwd", "/etc/passwd"):
            with pytest.raises(PathNotInSandboxError, match="outside sandbox"):
                toolset.read(path)

    def test_read_only(self, tmp_path: Path) -> None:
        with pytest.raises(PathNotWritableError, match="read-only"):
            two_roots(tmp_path).write("input/new.txt", "x")

    def test_edit_text_not_found(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        toolset.write("output/test.txt", "Hello World!")
        with pytest.raises(EditError, match="text not found"):
            toolset.edit("output/test.txt", "nonexistent", "replacement")

    def test_edit_found_n_times(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        toolset.write("output/test.txt", "ab ab ab")
        with pytest.raises(EditError, match="found 3 times"):
            toolset.edit("output/test.txt", "ab", "cd")

    def test_suffix_not_allowed(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path, suffixes=[".txt"])
        with pytest.raises(SuffixNotAllowedError, match="suffix '.png' not allowed"):
            toolset.write("output/picture.png", "x")
        with pytest.raises(SuffixNotAllowedError, match="Allowed suffixes: .txt"):
            toolset.write("output/picture.png", "x")

    def test_too_large(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path, max_file_bytes=4)
        with pytest.raises(FileTooLargeError, match="too large"):
            toolset.write("output/big.txt", "12345")

    def test_escalation(self, tmp_path: Path) -> None:
        sandbox = two_roots(tmp_path).sandbox
        with pytest.raises(SandboxPermissionEscalationError):
            sandbox.derive(allow_write="input")

    def test_messages_still_say_what_is_allowed(self, tmp_path: Path) -> None:
        with pytest.raises(PathNotInSandboxError) as caught:
            two_roots(tmp_path).read("unknown/x.txt")
        assert "Readable: input, output. Writable: output." in str(caught.value)
        assert str(tmp_path) not in str(caught.value)  # only virtual paths


# -- approvals outside a notebook ---------------------------------------------------------------


def gated(tmp_path: Path, broker: ApprovalBroker | None = None) -> FileSystemToolset:
    """The library's defaults: a `rw` path asks before each write (`write_approval: True`)."""
    (tmp_path / "data").mkdir(exist_ok=True)
    config = SandboxConfig(paths={"data": PathConfig(root=str(tmp_path / "data"), mode="rw")})
    _made.append(FileSystemToolset(Sandbox(config), broker=broker))
    return _made[-1]


class TestDefaultApprovals:
    def test_outside_ipython_fails_closed_and_names_the_line_to_add(self, tmp_path: Path) -> None:
        with pytest.raises(ApprovalDeniedError) as caught:
            gated(tmp_path).write("data/a.txt", "x")
        message = str(caught.value)
        assert "sandbox_kernel_ext.set_default_responder(" in message
        assert "TerminalResponder()" in message and "write_approval" in message
        assert not (tmp_path / "data" / "a.txt").exists()

    def test_the_installed_default_answers_a_toolset_built_without_a_broker(
        self, tmp_path: Path
    ) -> None:
        toolset = gated(tmp_path)  # built before the default is installed
        asked: list[str] = []
        undo = set_default_responder(CallbackResponder(lambda r: asked.append(r.path) or True))
        try:
            toolset.write("data/a.txt", "x")
            own = gated(tmp_path, ApprovalBroker(CallbackResponder(lambda r: False)))
            with pytest.raises(ApprovalDeniedError):  # a toolset given a broker keeps it
                own.write("data/b.txt", "x")
        finally:
            undo()
        assert asked == ["data/a.txt"]
        with pytest.raises(ApprovalDeniedError):
            toolset.write("data/c.txt", "x")

    def test_seed_tools_and_managers_follow_the_default(self, tmp_path: Path) -> None:
        assert fs_sandbox.FilesystemTool([str(tmp_path)]).toolset.broker.follows_default
        manager = fs_sandbox.SandboxManager()
        try:
            assert manager.broker.follows_default
        finally:
            manager.close()


# -- approvals through the blocking-approval wrapper ---------------------------------------------

import pydantic_ai_blocking_approval as approval  # noqa: E402  (the test extra installs it)
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402

from sandbox_kernel_ext.files.call_approval import leave_ticket  # noqa: E402
from sandbox_kernel_ext.files.pydantic_ai import as_pydantic_ai_toolset  # noqa: E402
from sandbox_kernel_ext.files.toolset import FileSystemToolset as PlainToolset  # noqa: E402


class Person:
    """The wrapper's approval callback: records each request and answers as told."""

    def __init__(self, approved: bool = True, remember: str = "none") -> None:
        self.approved = approved
        self.remember = remember
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append(request)
        return approval.ApprovalDecision(approved=self.approved, remember=self.remember)


def agent_calls(toolset: Any, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """A PydanticAI agent whose model makes `calls`, one per step, then says 'done'."""
    steps = iter(calls)

    def model(messages: Any, info: Any) -> ModelResponse:
        step = next(steps, None)
        if step is None:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart(step[0], step[1])])

    assert Agent(FunctionModel(model), toolsets=[toolset]).run_sync("go").output == "done"


@pytest.fixture
def nobody_else_asks() -> Any:
    """Fail any question that reaches the toolset's own broker: the wrapper asked already."""
    stray: list[str] = []
    undo = set_default_responder(CallbackResponder(lambda r: stray.append(r.path) or False))
    yield stray
    undo()


class TestApprovalWrapper:
    def test_the_toolset_is_a_pydantic_ai_toolset(self, tmp_path: Path) -> None:
        from pydantic_ai.toolsets import AbstractToolset

        toolset = two_roots(tmp_path)
        assert isinstance(toolset, AbstractToolset)
        agent_calls(toolset, [("write_file", {"path": "output/by_agent.txt", "content": "x"})])
        assert (tmp_path / "out" / "by_agent.txt").read_text() == "x"

    def test_needs_approval_follows_the_policy(self, tmp_path: Path) -> None:
        toolset = gated(tmp_path)
        assert isinstance(toolset, approval.SupportsNeedsApproval)
        assert isinstance(toolset, approval.SupportsApprovalDescription)
        result = toolset.needs_approval("write_file", {"path": "data/x.txt", "content": "abc"}, None)
        assert isinstance(result, approval.ApprovalResult) and result.is_needs_approval
        assert toolset.needs_approval("read_file", {"path": "data/x.txt"}, None).is_pre_approved
        assert toolset.needs_approval("list_files", {"path": "."}, None).is_pre_approved
        blocked = toolset.needs_approval("write_file", {"path": "etc/passwd", "content": ""}, None)
        assert blocked.is_blocked and "outside sandbox" in blocked.block_reason
        description = toolset.get_approval_description(
            "write_file", {"path": "/data/x.txt", "content": "abc"}, None)
        assert description == "Write 3 chars to data/x.txt"

    def test_read_only_paths_are_blocked(self, tmp_path: Path) -> None:
        toolset = two_roots(tmp_path)
        result = toolset.needs_approval("write_file", {"path": "input/a.txt", "content": ""}, None)
        assert result.is_blocked and "read-only" in result.block_reason
        moved = toolset.needs_approval("move_file", {"source": "input/a.txt",
                                                     "destination": "output/a.txt"}, None)
        assert moved.is_blocked

    def test_a_call_the_wrapper_approved_is_not_asked_twice(
        self, tmp_path: Path, nobody_else_asks: list[str]
    ) -> None:
        inner = gated(tmp_path)
        person = Person()
        wrapped = approval.ApprovalToolset(inner=inner, approval_callback=person)
        agent_calls(wrapped, [("write_file", {"path": "data/out.txt", "content": "hello"})])
        assert (tmp_path / "data" / "out.txt").read_text() == "hello"
        assert [r.description for r in person.requests] == ["Write 5 chars to data/out.txt"]
        assert nobody_else_asks == []
        # The toolset's own log still shows who approved the write.
        [record] = inner.broker.log
        assert record.request.path == "data/out.txt"
        assert record.decision.decided_by == "the approval wrapper"

    def test_a_denial_writes_nothing(self, tmp_path: Path, nobody_else_asks: list[str]) -> None:
        wrapped = approval.ApprovalToolset(inner=gated(tmp_path),
                                           approval_callback=Person(approved=False))
        with pytest.raises(PermissionError, match="denied"):
            asyncio.run(wrapped.call_tool("write_file", {"path": "data/no.txt", "content": "x"},
                                          None, None))
        assert not (tmp_path / "data" / "no.txt").exists()
        assert nobody_else_asks == []

    def test_remembered_for_the_session_asks_once(
        self, tmp_path: Path, nobody_else_asks: list[str]
    ) -> None:
        person = Person(remember="session")
        wrapped = approval.ApprovalToolset(inner=gated(tmp_path), approval_callback=person)
        call = ("delete_file", {"path": "data/x.txt"})
        for _ in range(2):
            (tmp_path / "data" / "x.txt").write_text("x")
            agent_calls(wrapped, [call])
            assert not (tmp_path / "data" / "x.txt").exists()
        assert len(person.requests) == 1 and nobody_else_asks == []

    def test_an_adapted_plain_toolset_speaks_the_same_protocol(
        self, tmp_path: Path, nobody_else_asks: list[str]
    ) -> None:
        """A toolset made by this package (session_toolset, from_policy on the plain class)
        goes to an agent through `as_pydantic_ai_toolset`, with the same approvals."""
        plain = PlainToolset(gated(tmp_path).sandbox)
        _made.append(plain)
        person = Person()
        wrapped = approval.ApprovalToolset(inner=as_pydantic_ai_toolset(plain),
                                           approval_callback=person)
        agent_calls(wrapped, [("write_file", {"path": "data/p.txt", "content": "x"})])
        assert (tmp_path / "data" / "p.txt").read_text() == "x"
        assert len(person.requests) == 1 and nobody_else_asks == []

    def test_a_direct_call_still_asks_the_toolsets_own_broker(
        self, tmp_path: Path, nobody_else_asks: list[str]
    ) -> None:
        """Approval through the wrapper covers the one call it asked about, nothing else:
        not another call, and not the same call made later by another task (an agent run
        copies the context the ticket was left in)."""
        toolset = gated(tmp_path)
        write_a = ("write_file", {"path": "data/a.txt", "content": "x"})
        toolset.needs_approval(*write_a, None)
        agent_calls(toolset, [("write_file", {"path": "data/b.txt", "content": "x"})])
        agent_calls(toolset, [write_a])
        agent_calls(toolset, [write_a])
        assert nobody_else_asks == ["data/b.txt", "data/a.txt", "data/a.txt"]
        assert not (tmp_path / "data" / "a.txt").exists()
        assert not (tmp_path / "data" / "b.txt").exists()

    def test_a_ticket_is_good_for_the_next_call_only(
        self, tmp_path: Path, nobody_else_asks: list[str]
    ) -> None:
        toolset = gated(tmp_path)
        write = {"path": "data/t.txt", "content": "x"}
        toolset.needs_approval("write_file", write, None)
        toolset.call("write_file", write)  # the call the "wrapper" approved
        assert nobody_else_asks == []
        with pytest.raises(ApprovalDeniedError):
            toolset.call("write_file", write)  # the same again: asked, and refused
        assert nobody_else_asks == ["data/t.txt"]
        toolset.needs_approval("write_file", write, None)
        with pytest.raises(ApprovalDeniedError):  # another call first voids the ticket
            toolset.call("delete_file", {"path": "data/t.txt"})
        with pytest.raises(ApprovalDeniedError):
            toolset.call("write_file", write)

    def test_the_description_cannot_redraw_the_prompt(self, tmp_path: Path) -> None:
        toolset = gated(tmp_path)
        for path in ("data/run.sh\x1b[2K\rRead from data/notes.txt", "data/\u202etxt.hs"):
            description = toolset.get_approval_description(
                "write_file", {"path": path, "content": "x"}, None)
            assert "\x1b" not in description and "\r" not in description
            assert "\u202e" not in description

    def test_every_toolset_of_the_package_is_a_file_system_toolset(self, tmp_path: Path) -> None:
        plain = PlainToolset(gated(tmp_path).sandbox)
        _made.append(plain)
        assert isinstance(plain, FileSystemToolset)
        assert isinstance(fs_sandbox.FilesystemTool([str(tmp_path)]).toolset, FileSystemToolset)
        assert not isinstance(object(), FileSystemToolset)


def test_importing_the_package_does_not_import_pydantic_ai() -> None:
    """PydanticAI's import costs a few hundred milliseconds: only code that asks for
    `FileSystemToolset` by the package's name pays it (the notebook layer never does)."""
    import subprocess
    import sys

    code = ("import sys, sandbox_kernel_ext, sandbox_kernel_ext.notebook.magics; "
            "print('pydantic_ai' in sys.modules); "
            "from sandbox_kernel_ext import FileSystemToolset; "
            "print('pydantic_ai' in sys.modules, FileSystemToolset.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "sandbox_kernel_ext.files.pydantic_ai"]
