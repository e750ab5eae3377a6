"""Removing a folder a sandbox wrote in (`runner/linux/remove_tree.py`): gone however deep
and whatever its modes, and nothing outside it touched through a link."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext.runner.linux.remove_tree import remove_tree


def _nest(top: Path, depth: int) -> None:
    """`depth` folders one in the other (deeper than PATH_MAX and than Python's recursion
    limit, which made shutil.rmtree raise RecursionError), a file at the bottom."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("dd", dir_fd=fd)
        inner = os.open("dd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
        f.write("deep")
    os.close(fd)


def test_a_tree_deeper_than_path_max_and_the_recursion_limit_goes(tmp_path: Path) -> None:
    top = tmp_path / "workspace"
    top.mkdir()
    _nest(top, 3000)
    assert remove_tree(str(top)) and not top.exists()


def test_folders_made_unreadable_go_and_links_are_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("outside")
    top = tmp_path / "home"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("x")
    (top / "link-dir").symlink_to(victim)
    (top / "a" / "link-file").symlink_to(victim / "keep.txt")
    os.mkfifo(top / "a" / "fifo")
    os.chmod(top / "a" / "b", 0)
    os.chmod(top / "a", 0)
    os.chmod(top, 0)
    assert remove_tree(str(top)) and not os.path.lexists(top)
    assert (victim / "keep.txt").read_text() == "outside"


def test_a_link_given_as_the_folder_is_neither_followed_nor_removed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("outside")
    link = tmp_path / "workspace"
    link.symlink_to(victim)
    assert not remove_tree(str(link))
    assert link.is_symlink() and (victim / "keep.txt").exists()
    assert remove_tree(str(tmp_path / "absent"))


names = st.text(st.characters(blacklist_characters="/\0", blacklist_categories=["Cs"]),
                min_size=1, max_size=12).filter(lambda n: n not in (".", ".."))
trees = st.recursive(
    st.sampled_from(["file", "link"]),
    lambda inner: st.dictionaries(names, inner, max_size=4), max_leaves=20)


def _build(at: Path, tree: object, victim: Path) -> None:
    if tree == "file":
        at.write_text("x")
    elif tree == "link":
        at.symlink_to(victim)
    else:
        at.mkdir()
        for name, sub in tree.items():  # type: ignore[union-attr]
            _build(at / name, sub, victim)


@settings(max_examples=60, deadline=None)
@given(tree=st.dictionaries(names, trees, max_size=5), modes=st.booleans())
def test_any_tree_goes_and_what_its_links_name_stays(tmp_path_factory, tree: dict,
                                                      modes: bool) -> None:
    base = tmp_path_factory.mktemp("tree")
    victim = base / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("outside")
    top = base / "top"
    _build(top, tree, victim)
    if modes:
        for folder, dirs, _ in os.walk(top, topdown=False):
            os.chmod(folder, 0o100)
    assert remove_tree(str(top)) and not os.path.lexists(top)
    assert sorted(os.listdir(victim)) == ["keep.txt"]


def test_a_link_in_a_folders_place_is_not_followed_when_modes_are_given_back(
        tmp_path: Path) -> None:
    """The owner's bits go to the folder itself, through a descriptor of it: a link there
    (a live process could swap one in) leaves what it names as it was."""
    from sandbox_kernel_ext.runner.linux.remove_tree import _owner_bits

    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    os.chmod(victim, 0o755)
    (tmp_path / "swapped").symlink_to(victim)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _owner_bits(fd, "swapped")
    finally:
        os.close(fd)
    assert victim.stat().st_mode & 0o777 == 0o755
    closed = tmp_path / "closed"
    closed.mkdir()
    os.chmod(closed, 0)
    _owner_bits(None, str(closed))
    assert closed.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the removal as another uid")
def test_as_a_non_root_owner_closed_folders_go_too() -> None:
    """Not root (a non-root kernel removing its sandbox's tree): folders the sandbox closed,
    one named like the removal's own, still go."""
    base = Path(tempfile.mkdtemp())  # in the temporary folder, which every uid can reach
    try:
        _remove_as_nobody(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _remove_as_nobody(base: Path) -> None:
    top = base / "home"
    (top / ".removing-x" / "deep").mkdir(parents=True)
    (top / ".removing-x" / "f").write_text("x")
    (top / "a").mkdir()
    for folder in (top / ".removing-x" / "deep", top / ".removing-x", top / "a", top):
        os.chmod(folder, 0)
    os.chmod(base, 0o777)
    subprocess.run(["chown", "-R", "65534:65534", str(top)], check=True)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            os._exit(0 if remove_tree(str(top)) else 1)
        except BaseException:  # noqa: BLE001
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and not os.path.lexists(top)
