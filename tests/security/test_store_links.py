"""Credential stores stay out of reach however a policy or a planted link points at them,
and the runner and the file toolset hide the same stores for the same policy.

A home under /home holds `.ssh` and `.aws` with secrets; a project folder beside it holds
links into them. Each way in is tried, and judged on the host (the secret's bytes, the
file's contents afterwards), next to a control that shows the same way works for a file
that is not a store's.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import (
    CapabilityDeclaration,
    FileSystemToolset,
    SandboxError,
    SandboxManager,
)

from interfaces import RUNNERS, run_code

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

SECRET = "SECRET-KEY-BYTES"


@pytest.fixture
def home_and_project() -> Iterator[tuple[Path, Path]]:
    """A world-readable home with stores, and a world-readable project with links."""
    home = Path("/home") / f"sbxlink-{uuid.uuid4().hex[:8]}"
    (home / ".ssh").mkdir(parents=True)
    (home / ".aws").mkdir()
    (home / ".ssh" / "config").write_text(f"Host x # {SECRET}\n")
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    (home / ".aws" / "credentials").write_text(SECRET)
    (home / "notes.txt").write_text("public notes\n")
    top = Path(tempfile.mkdtemp(prefix="sbxlink-"))
    project = top / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "table.csv").write_text("a,b\n")
    os.symlink(home / ".ssh" / "config", project / "data" / "settings")
    os.symlink(home / ".ssh" / "id_rsa", project / "data" / "key")
    os.symlink(home / ".aws", project / "data" / "cloud")
    os.symlink(home / "notes.txt", project / "data" / "notes-link")  # the control
    for folder in (home, top):
        for root, dirs, files in os.walk(folder):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o666)
    try:
        yield home, project
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


def _policy(readable: list[str], writable: list[str] = (), **extra: object) -> CapabilityDeclaration:
    return CapabilityDeclaration.model_validate({"filesystem_config": {
        "mode": "read_write" if writable else "read_only",
        "writable_paths": list(writable), "readable_paths": readable}, **extra})


@pytest.mark.parametrize("name,writable", [("settings", True), ("key", False), ("cloud", False)])
def test_a_policy_path_through_a_link_into_a_store_is_refused(home_and_project, name: str,
                                                              writable: bool) -> None:
    """`writable_paths: [data/settings]` with `settings -> ~/.ssh/config` once let a cell
    append a ProxyCommand line to the host's real ~/.ssh/config."""
    home, project = home_and_project
    link = str(project / "data" / name)
    policy = _policy([], [link]) if writable else _policy([link])
    with SandboxManager() as manager:
        with pytest.raises(SandboxError, match=r"credential|no sandbox reads") as refused:
            manager.create_sandbox(policy)
        assert link.split("/")[-1] in str(refused.value)
        # the control: the same kind of link to a plain file is granted and works
        control = str(project / "data" / "notes-link")
        sid = manager.create_sandbox(_policy([], [control]) if writable else _policy([control]))
        result = manager.execute(sid, ["cat", control])
    assert result.stdout == "public notes\n", result
    assert (home / ".ssh" / "config").read_text() == f"Host x # {SECRET}\n"


READ_THROUGH_LINKS = """
import os, sys
seen = []
for name in ('key', 'settings', 'cloud/credentials', 'notes-link'):
    path = os.path.join(DATA, name)
    try:
        seen.append(name + '=' + open(path).read().strip())
    except OSError as exc:
        seen.append(name + '!' + type(exc).__name__)
for name in ('settings', 'cloud/credentials'):
    try:
        with open(os.path.join(DATA, name), 'a') as out:
            out.write('ProxyCommand evil\\n')
        seen.append(name + ' appended')
    except OSError as exc:
        seen.append(name + ' not appended')
print('|'.join(seen))
"""


@pytest.mark.parametrize("interface", RUNNERS)
@pytest.mark.parametrize("grant", ["project", "project and home"])
def test_links_inside_a_granted_folder_do_not_reach_a_store(home_and_project, interface: str,
                                                            grant: str) -> None:
    home, project = home_and_project
    data = str(project / "data")
    writable = [str(project)]
    readable = [str(home)] if grant == "project and home" else []
    code = f"DATA = {data!r}\n" + READ_THROUGH_LINKS
    with SandboxManager() as manager:
        sid = manager.create_sandbox(_policy(readable, writable))
        result = run_code(manager, sid, interface, code)
    assert SECRET not in result.stdout, result.stdout
    # the control: a link to a plain file the policy grants is followed, one it does not is not
    control = "notes-link=public notes" if readable else "notes-link!PermissionError"
    assert control in result.stdout, result
    assert "settings not appended" in result.stdout, result.stdout
    assert "credentials not appended" in result.stdout, result.stdout
    assert (home / ".ssh" / "config").read_text() == f"Host x # {SECRET}\n"
    assert (home / ".aws" / "credentials").read_text() == SECRET


def _toolset(root: Path, mode: str = "rw") -> FileSystemToolset:
    return FileSystemToolset.from_policy(CapabilityDeclaration.model_validate({"paths": {
        "h": {"root": str(root), "mode": mode, "write_approval": False}}}))


def test_the_toolset_hides_the_stores_a_cell_cannot_see(home_and_project) -> None:
    """A `paths` root that holds `.ssh` and `.aws` once served them to an agent's read_file
    while a cell over the same policy could not see them: one policy, one answer."""
    home, _ = home_and_project
    with _toolset(home) as tools:
        assert tools.read("/h/notes.txt").content == "public notes\n"  # the control
        listed = tools.list_files("/h")
        assert any("notes.txt" in entry for entry in listed)
        assert not [entry for entry in listed if ".ssh" in entry or ".aws" in entry], listed
        names = [entry.name for entry in tools.list_directory("/h")]
        assert "notes.txt" in names and ".ssh" not in names and ".aws" not in names
        for path in ("/h/.ssh/id_rsa", "/h/.ssh/config", "/h/.aws/credentials", "/h/.ssh"):
            with pytest.raises(Exception) as refused:
                tools.read(path)
            assert SECRET not in str(refused.value)
        with pytest.raises(Exception):
            tools.write("/h/.ssh/authorized_keys", "ssh-ed25519 AAAA evil\n")
        with pytest.raises(Exception):
            tools.move("/h/.aws", "/h/moved-aws")
        with pytest.raises(Exception):
            tools.delete("/h/.ssh/config")
    assert not (home / ".ssh" / "authorized_keys").exists()
    assert (home / ".ssh" / "config").exists() and (home / ".aws").is_dir()
    policy = CapabilityDeclaration.model_validate({"paths": {
        "h": {"root": str(home), "mode": "ro"}}})
    with SandboxManager() as manager:  # the same policy through the runner: the same answer
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, f"""
import os
for path in ('.ssh/id_rsa', '.aws/credentials', 'notes.txt'):
    try:
        print(path, open(os.path.join({str(home)!r}, path)).read())
    except OSError as exc:
        print(path, type(exc).__name__)
""")
    assert SECRET not in result.stdout and "public notes" in result.stdout, result


def test_a_link_inside_a_toolset_root_does_not_reach_a_store(home_and_project) -> None:
    home, _ = home_and_project
    os.symlink(".ssh/id_rsa", home / "innocent.txt")
    os.symlink(".aws", home / "cloud")
    with _toolset(home) as tools:
        for path in ("/h/innocent.txt", "/h/cloud/credentials"):
            with pytest.raises(Exception) as refused:
                tools.read(path)
            assert SECRET not in str(refused.value)
        with pytest.raises(Exception):
            tools.write("/h/cloud/config", "[default]\n")
    assert not (home / ".aws" / "config").exists()


@pytest.mark.parametrize("mode", ["read_only", "read_write"])
def test_a_write_to_a_hidden_file_fails_loudly(home_and_project, mode: str) -> None:
    """A hidden credential file once accepted writes and discarded them (its cover was
    /dev/null, which a child may write), even in read_only mode."""
    home, project = home_and_project
    (home / ".netrc").write_text(SECRET)
    os.chmod(home / ".netrc", 0o666)
    writable = [str(project)] if mode == "read_write" else []
    with SandboxManager() as manager:
        sid = manager.create_sandbox(_policy(None, writable))
        result = manager.run_python(sid, f"""
for path in ({str(home / '.netrc')!r}, {str(home / '.ssh' / 'config')!r}):
    try:
        print(repr(open(path).read()))
        with open(path, 'a') as out:
            out.write('machine evil login x password y\\n')
        print('written')
    except OSError as exc:
        print('refused', type(exc).__name__)
""")
    assert result.exit_code == 0, result
    assert SECRET not in result.stdout and "written" not in result.stdout, result.stdout
    assert result.stdout.count("refused") == 2, result.stdout
    assert (home / ".netrc").read_text() == SECRET


def test_a_toolset_root_through_a_link_into_a_store_is_refused(home_and_project) -> None:
    """Found in review: the runner refused a `paths` root that is a link into ~/.ssh, the
    toolset served it."""
    from sandbox_kernel_ext import ConfigurationError

    home, project = home_and_project
    os.symlink(home / ".ssh", project / "keys")
    policy = CapabilityDeclaration.model_validate({"paths": {
        "k": {"root": str(project / "keys"), "mode": "ro"}}})
    with pytest.raises(ConfigurationError, match="no sandbox reads"):
        FileSystemToolset.from_policy(policy).read("/k/id_rsa")


def test_a_toolset_root_swapped_after_the_policy_was_read_is_refused(home_and_project) -> None:
    """Found in review: a cell renamed the folder above a toolset root and linked the
    root's name to ~/.ssh before the toolset first used it; the toolset served the key."""
    home, project = home_and_project
    policy = CapabilityDeclaration.model_validate({"paths": {
        "d": {"root": str(project / "data"), "mode": "rw", "write_approval": False}}})
    tools = FileSystemToolset.from_policy(policy)
    os.rename(project / "data", project / "data.old")  # what the cell did, from outside
    os.symlink(home / ".ssh", project / "data")
    with tools:
        for action in (lambda: tools.read("/d/id_rsa"), lambda: tools.list_files("/d"),
                       lambda: tools.write("/d/authorized_keys", "evil")):
            with pytest.raises(Exception) as refused:
                action()
            assert SECRET not in str(refused.value)
            assert "replaced by a symlink" in str(refused.value), refused.value
    assert sorted(os.listdir(home / ".ssh")) == ["config", "id_rsa"]


def test_a_refused_write_leaves_no_store_folder_behind(home_and_project) -> None:
    home, _ = home_and_project
    with _toolset(home) as tools, pytest.raises(Exception):
        tools.write("/h/.gnupg/pubring.kbx", "x")
    assert not (home / ".gnupg").exists()
