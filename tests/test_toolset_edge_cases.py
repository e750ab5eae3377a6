"""Ways around the file toolset, and its edge cases: grants across roots, overlapping roots,
locks held while a person decides, bad input."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandbox_kernel_ext import (
    ApprovalBroker,
    ApprovalDeniedError,
    CallbackResponder,
    ConfigurationError,
    Decision,
    FileLimits,
    FilesystemError,
    FileSystemToolset,
    FilesystemTool,
    PathConfig,
    PathNotFoundError,
    Sandbox,
    SandboxConfig,
    ToolError,
)
from sandbox_kernel_ext.files import toolset as toolset_module


def _toolset(root: Path, broker: ApprovalBroker, **limits) -> FileSystemToolset:
    root.mkdir(exist_ok=True)
    config = SandboxConfig(paths={"data": PathConfig(root=str(root), mode="rw", write_approval=True)})
    return FileSystemToolset(Sandbox(config), broker=broker, limits=FileLimits(**limits))


def test_session_grant_for_one_folder_does_not_cover_another_with_the_same_virtual_name(tmp_path):
    answers = iter([Decision.allow_session])
    asked = []

    def person(request):
        asked.append(request.path)
        return next(answers, Decision.deny)

    broker = ApprovalBroker(CallbackResponder(person))
    scratch = _toolset(tmp_path / "scratch", broker)
    precious = _toolset(tmp_path / "precious", broker)
    (tmp_path / "precious" / "x.txt").write_text("keep me")
    scratch.write("/data/x.txt", "scratch")
    with pytest.raises(ApprovalDeniedError):
        precious.write("/data/x.txt", "overwritten")
    assert (tmp_path / "precious" / "x.txt").read_text() == "keep me"
    assert asked == ["data/x.txt", "data/x.txt"]  # the second toolset's request was asked
    scratch.write("/data/x.txt", "again")  # while the first one's grant still holds
    assert len(asked) == 2


def test_overlapping_roots_are_refused(tmp_path):
    (tmp_path / "vault").mkdir()
    config = SandboxConfig(
        paths={
            "work": PathConfig(root=str(tmp_path), mode="rw", write_approval=False),
            "vault": PathConfig(root=str(tmp_path / "vault"), mode="rw", read_approval=True),
        }
    )
    with pytest.raises(ConfigurationError, match="'work' and 'vault' overlap") as info:
        Sandbox(config)
    assert str(tmp_path) not in str(info.value)


def test_filesystem_tool_with_nested_directories_has_one_root_and_one_quota(tmp_path):
    (tmp_path / "child").mkdir()
    tool = FilesystemTool([str(tmp_path), str(tmp_path / "child")], limits=FileLimits(max_total_bytes=1000))
    assert tool.allowed_directories == [os.path.realpath(tmp_path)]
    asyncio.run(tool.execute(action="write", path=str(tmp_path / "a.txt"), content="x" * 600))
    with pytest.raises(ToolError, match="storage quota"):
        asyncio.run(tool.execute(action="write", path=str(tmp_path / "child" / "b.txt"), content="y" * 600))


def test_no_path_lock_is_held_while_a_person_decides(tmp_path):
    held = []

    def person(request):
        held.append([i for i, lock in enumerate(toolset_module._stripes) if lock.locked()])
        return Decision.allow_once

    tools = _toolset(tmp_path / "d", ApprovalBroker(CallbackResponder(person)))
    (tmp_path / "d" / "old.txt").write_text("hello world")
    tools.write("/data/a.txt", "x")
    tools.edit("/data/old.txt", "world", "there")
    tools.copy("/data/a.txt", "/data/b.txt")
    tools.move("/data/b.txt", "/data/c.txt")
    tools.delete("/data/c.txt")
    assert len(held) >= 5 and all(h == [] for h in held)


def test_edit_refuses_when_the_file_changed_while_waiting_for_approval(tmp_path):
    target = tmp_path / "d" / "f.txt"

    def person(request):
        target.write_text("someone else wrote this first")
        return Decision.allow_once

    tools = _toolset(tmp_path / "d", ApprovalBroker(CallbackResponder(person)))
    target.write_text("original text")
    with pytest.raises(FilesystemError, match="changed while the edit waited"):
        tools.edit("/data/f.txt", "original", "edited")
    assert target.read_text() == "someone else wrote this first"


@pytest.fixture
def open_tools(tmp_path):
    (tmp_path / "d").mkdir()
    return FileSystemToolset.create_default(tmp_path / "d")


def test_bad_glob_is_a_sandbox_error(open_tools):
    with pytest.raises(FilesystemError, match="not a valid glob"):
        open_tools.list_files("/data", "[z-a]")


def test_huge_offset_in_a_binary_file_reads_nothing(open_tools, tmp_path):
    (tmp_path / "d" / "b.bin").write_bytes(b"\0\1\2")
    result = open_tools.read("/data/b.bin", offset=2**64)
    assert (result.content, result.chars_read, result.truncated) == ("", 0, False)


def test_lone_surrogates_and_wrong_types_are_clear_errors(open_tools, tmp_path):
    (tmp_path / "d" / "t.txt").write_text("abc")
    with pytest.raises(FilesystemError, match="not valid Unicode"):
        open_tools.edit("/data/t.txt", "b", "\udcff")
    with pytest.raises(FilesystemError, match="not valid Unicode"):
        open_tools.write("/data/u.txt", "\ud800")
    with pytest.raises(TypeError, match="content must be str or bytes"):
        open_tools.write("/data/n.txt", 5)  # bytes(5) would have written five NULs
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["t.txt"]


def test_root_that_is_a_file_names_only_the_virtual_root(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    tools = FileSystemToolset.create_default(afile)
    for call in (lambda: tools.storage_used("/data"), lambda: tools.read("/data/x")):
        with pytest.raises(PathNotFoundError) as info:
            call()
        assert str(tmp_path) not in str(info.value) and "'data'" in str(info.value)


def test_read_is_capped_before_decoding_not_after(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "big.txt").write_text("é" * 300_000)
    tools = FileSystemToolset(
        FileSystemToolset.create_default(tmp_path / "d").sandbox, limits=FileLimits(max_read_bytes=1000)
    )
    result = tools.read("/data/big.txt", max_chars=10**9)
    assert len(result.content.encode()) <= 1000 and result.truncated
    assert result.model_dump()["summary"].startswith("Read characters 0-")


def test_filesystem_tool_accepts_paths_through_a_symlinked_directory_and_speaks_host_paths(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "ws").symlink_to(real)
    tool = FilesystemTool([str(tmp_path / "ws")])
    asyncio.run(tool.execute(action="write", path=str(tmp_path / "ws" / "a.txt"), content="hi"))
    assert (real / "a.txt").read_text() == "hi"
    with pytest.raises(ToolError) as info:
        asyncio.run(tool.execute(action="read", path=str(tmp_path / "ws" / "nope.txt")))
    assert "/d0" not in str(info.value) and str(real) in str(info.value)
    with pytest.raises(ToolError, match="not valid Unicode"):
        asyncio.run(tool.execute(action="write", path=str(real / "s.txt"), content="\ud800"))


def test_a_path_is_taken_as_written_spaces_included(tmp_path) -> None:
    """`read("data/notes.md ")` once returned `notes.md` (the path was stripped), and a
    write of `new.md ` created `new.md`."""
    from sandbox_kernel_ext import FileSystemToolset

    (tmp_path / "notes.md").write_text("plain\n")
    (tmp_path / "notes.md ").write_text("spaced\n")
    with FileSystemToolset.create_default(tmp_path) as tools:
        assert tools.read("/data/notes.md ").content == "spaced\n"
        assert tools.read("/data/notes.md").content == "plain\n"
        tools.write("/data/new.md ", "x")
    assert (tmp_path / "new.md ").read_text() == "x" and not (tmp_path / "new.md").exists()
