"""The glob of `FileSystemToolset.list_files` / `find_files` over '/'-separated paths.

No wildcard and no bracket class matches the separator '/': only `**` (globstar) crosses
folders. A negated class (`[!x]`, `[^x]`), a class naming '/' and a range that spans it
(`[--0]`, `[.-0]`) all stay inside one path segment. Everything else keeps its meaning:
`*` and `?` match within a segment, `**/` matches zero or more folders, a class still
matches its ordinary characters, and `[[]` is how a literal '[' is written.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import FileLimits, FileSystemToolset, PathConfig, Sandbox, SandboxConfig
from sandbox_kernel_ext.files.glob_pattern import glob_matcher


def matches(pattern: str, path: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pattern the regex engine finds ambiguous is a bug too
        return glob_matcher(pattern)(path) is not None


# ------------------------------------------------------------ the separator
@pytest.mark.parametrize("pattern", ["a[!x]b", "a[^x]b", "a[!a-z]b", "a[!]]b", "a[^]]b"])
def test_a_negated_class_does_not_match_the_separator(pattern: str) -> None:
    assert not matches(pattern, "a/b")


@pytest.mark.parametrize("pattern", ["a[/]b", "a[c/]b", "a[/c]b", "a[!x/]b"])
def test_a_class_naming_the_separator_does_not_match_it(pattern: str) -> None:
    assert not matches(pattern, "a/b")


@pytest.mark.parametrize("pattern", ["a[--0]b", "a[.-0]b", "a[!-.]b", "a[ -~]b", "a[!a-z]b"])
def test_a_range_that_spans_the_separator_does_not_match_it(pattern: str) -> None:
    assert not matches(pattern, "a/b")


def test_a_range_that_spans_the_separator_still_matches_its_other_characters() -> None:
    assert matches("a[--0]b", "a-b") and matches("a[--0]b", "a.b") and matches("a[--0]b", "a0b")
    assert matches("a[.-0]b", "a.b") and matches("a[ -~]b", "a~b")
    assert not matches("a[--0]b", "acb")


def test_a_class_cannot_stand_for_a_folder_in_the_middle_of_a_path() -> None:
    assert not matches("sub[!x]deep/f.txt", "sub/deep/f.txt")
    assert not matches("**/x[!y]z", "top/x/z")
    assert matches("**/x[!y]z", "top/xaz")


def test_star_and_question_mark_stay_within_one_folder() -> None:
    assert not matches("a*b", "a/b") and not matches("a*b", "ax/yb")
    assert not matches("a?b", "a/b")
    assert not matches("*", "x/y") and not matches("*.md", "sub/x.md")
    assert matches("a*b", "ab") and matches("a*b", "axyzb") and matches("a?b", "acb")
    assert matches("*.md", "x.md") and matches("*/*.md", "sub/x.md")


# --------------------------------------------------------------- globstar
def test_globstar_crosses_any_number_of_folders_including_none() -> None:
    for path in ("x.md", "a/x.md", "a/b/c/x.md"):
        assert matches("**/*.md", path)
    for path in ("a/b", "a/x/b", "a/x/y/b"):
        assert matches("a/**/b", path)
    assert matches("**", "a/b/c") and matches("sub/**", "sub/deep/f.txt")
    assert not matches("**/*.md", "a/x.txt") and not matches("a/**/b", "c/x/b")


# ------------------------------------------------ classes, otherwise unchanged
@pytest.mark.parametrize("pattern", ["a[!x]b", "a[^x]b"])
def test_a_negated_class_still_matches_ordinary_characters(pattern: str) -> None:
    assert matches(pattern, "acb") and matches(pattern, "a.b") and matches(pattern, "a-b")
    assert not matches(pattern, "axb") and not matches(pattern, "ab")


def test_a_class_matches_its_members_and_ranges() -> None:
    assert matches("f[12].txt", "f1.txt") and matches("f[12].txt", "f2.txt")
    assert not matches("f[12].txt", "f3.txt")
    assert matches("f[a-c].txt", "fb.txt") and not matches("f[a-c].txt", "fd.txt")


def test_a_closing_bracket_first_in_a_class_is_a_member() -> None:
    assert matches("[]]", "]") and matches("x[]a]", "xa") and not matches("x[]a]", "xb")
    assert matches("a[!]]b", "acb") and not matches("a[!]]b", "a]b")
    assert matches("a[^]]b", "acb") and not matches("a[^]]b", "a]b")


def test_an_opening_bracket_is_written_as_a_class_of_its_own() -> None:
    assert matches("[[]x]", "[x]") and not matches("[[]x]", "x]")
    assert matches("a[[]b", "a[b") and matches("a[![]b", "acb") and not matches("a[![]b", "a[b")


def test_a_bracket_without_a_closing_one_is_literal() -> None:
    assert matches("a[b", "a[b") and not matches("a[b", "ab")
    assert matches("a[!", "a[!")


def test_a_backslash_inside_a_class_is_a_member_not_an_escape() -> None:
    assert matches("a[\\]b", "a\\b") and matches("a[\\x]b", "axb") and not matches("a[\\]b", "a/b")


# --------------------------------------------------- through list_files itself
@pytest.fixture(params=["host", "store"])
def toolset(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FileSystemToolset]:
    for name in ("ws", "other"):
        (tmp_path / name).mkdir()
    config = SandboxConfig(paths={
        name: PathConfig(root=str(tmp_path / name), mode="rw", write_approval=False) for name in ("ws", "other")
    })
    ts = FileSystemToolset(Sandbox(config), limits=FileLimits(backend=request.param))
    for path in ("a/b", "acb", "a.b", "a-b", "sub/a/b", "sub/acb", "sub/deep/f.txt"):
        ts.write(f"/ws/{path}", path)
    yield ts
    ts.close()


def test_list_files_never_lets_a_bracket_class_match_a_folder_separator(toolset: FileSystemToolset) -> None:
    assert set(toolset.list_files("/ws", "**/a[!x]b")) == {"ws/acb", "ws/a.b", "ws/a-b", "ws/sub/acb"}
    assert set(toolset.list_files("/ws", "**/a[^x]b")) == {"ws/acb", "ws/a.b", "ws/a-b", "ws/sub/acb"}
    assert set(toolset.list_files("/ws", "**/a[--0]b")) == {"ws/a.b", "ws/a-b"}
    assert toolset.list_files("/ws", "**/a[/]b") == []
    assert toolset.list_files("/ws", "sub/a[!x]b") == ["ws/sub/acb"]
    assert toolset.list_files("/ws", "sub[!x]deep/*") == []
    assert toolset.list_files(".", "ws[!x]a[!x]b") == []


def test_list_files_still_finds_those_files_through_the_separator_itself(toolset: FileSystemToolset) -> None:
    assert set(toolset.list_files("/ws", "**/a/b")) == {"ws/a/b", "ws/sub/a/b"}
    assert toolset.list_files("/ws", "sub/*/f.txt") == ["ws/sub/deep/f.txt"]
    assert set(toolset.list_files("/ws", "**/*b")) == {"ws/a/b", "ws/acb", "ws/a.b", "ws/a-b",
                                                       "ws/sub/a/b", "ws/sub/acb"}
