"""Policies of the size people write: hundreds of folders, of several owners, in every mode.

Each granted folder root owns costs a root kernel's child one descriptor (its owner-mapped
copy); a launcher message once carried at most twelve, so six root folders stopped every
Python cell. These tests grant 200 readable and 100 writable folders, root's and another
user's, and run through `execute`, `run_python` and a session, with and without egress
rules, with and without a mount namespace; each folder is read (and each writable one
written) from inside, and judged on the host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, SandboxError, SandboxManager
from sandbox_kernel_ext.runner.trusted.plan import hidden_by_mounts

from interfaces import RUNNERS, run_code

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

READABLE, WRITABLE = 200, 100
OTHER_UID = 1000  # a volume's files in a container: the common other owner


@pytest.fixture(scope="module")
def many_folders() -> Iterator[tuple[Path, list[Path], list[Path]]]:
    """READABLE + WRITABLE folders with a file each: as root, two in three root's (0700 or
    0755) and the rest another user's (writable ones 0777, so its modes let anyone write)."""
    top = Path(tempfile.mkdtemp(prefix="sbx-shapes-"))
    os.chmod(top, 0o755)
    readable, writable = [], []
    for index in range(READABLE + WRITABLE):
        is_writable = index >= READABLE
        folder = top / f"{'w' if is_writable else 'r'} {index:03d} dañs -x"
        folder.mkdir()
        (folder / "probe.txt").write_text(f"content {index}\n")
        if os.geteuid() == 0:
            if index % 3 == 2:
                os.chown(folder, OTHER_UID, OTHER_UID)
                os.chown(folder / "probe.txt", OTHER_UID, OTHER_UID)
                os.chmod(folder, 0o777 if is_writable else 0o755)
                os.chmod(folder / "probe.txt", 0o644)
            else:
                os.chmod(folder, 0o700 if index % 2 else 0o755)
        (writable if is_writable else readable).append(folder)
    yield top, readable, writable
    subprocess.run(["rm", "-rf", str(top)], check=False)


def _policy(readable: list[Path], writable: list[Path], egress: bool) -> CapabilityDeclaration:
    return CapabilityDeclaration.model_validate({
        "filesystem_config": {"mode": "read_write" if writable else "read_only",
                              "writable_paths": [str(p) for p in writable],
                              "readable_paths": [str(p) for p in readable]},
        "network_egress_rules": [{"domain": "example.com"}] if egress else [],
    })


PROBE = """
import os, sys
paths = sys.argv[1:] if len(sys.argv) > 1 else PATHS
bad = []
for folder in paths:
    try:
        open(os.path.join(folder, 'probe.txt')).read()
    except OSError as exc:
        bad.append(f'read {folder}: {exc}')
for folder in WRITABLE:
    try:
        with open(os.path.join(folder, 'made.txt'), 'w') as made:
            made.write(MARK)
    except OSError as exc:
        bad.append(f'write {folder}: {exc}')
print('BAD', len(bad), bad[:3])
"""


def _code(readable: list[Path], writable: list[Path], mark: str) -> str:
    return (f"PATHS = {[str(p) for p in readable + writable]!r}\n"
            f"WRITABLE = {[str(p) for p in writable]!r}\nMARK = {mark!r}\n" + PROBE)


def _check_written(writable: list[Path], mark: str) -> None:
    for folder in writable:
        assert (folder / "made.txt").read_text() == mark, folder
        (folder / "made.txt").unlink()


@pytest.mark.parametrize("egress", [False, True], ids=["no-egress", "egress"])
@pytest.mark.parametrize("interface", RUNNERS)
def test_hundreds_of_folders_of_several_owners_all_work(many_folders, interface: str,
                                                          egress: bool) -> None:
    _, readable, writable = many_folders
    mark = f"{interface}-{egress}"
    code = _code(readable, writable, mark)
    with SandboxManager() as manager:
        sid = manager.create_sandbox(_policy(readable, writable, egress))
        result = run_code(manager, sid, interface, code, timeout=120)
    assert "BAD 0 []" in result.stdout, (result.stdout, result.stderr)
    _check_written(writable, mark)



@pytest.mark.parametrize("readable", [["/tmp"], ["/"], None], ids=["tmp", "root", "everywhere"])
def test_a_grant_over_the_sandboxes_homes_still_runs(readable: list[str] | None) -> None:
    """`readable_paths: [/tmp]` (the folder that holds every sandbox's home) once made every
    run fail on the sandbox's own home; "read everywhere" could not list `/`. Each sandbox
    sees its own home and no other's."""
    with SandboxManager() as manager:
        other = manager.create_sandbox(CapabilityDeclaration())
        manager.run_python(other, "open('mine.txt', 'w').write('other')")
        sid = manager.create_sandbox(CapabilityDeclaration.model_validate(
            {"filesystem_config": {"mode": "read_only", "readable_paths": readable}}))
        result = manager.run_python(sid, """
import os
home = os.environ['HOME']
open(os.path.join(home, 'x'), 'w').write('1')
try:
    print('homes', os.listdir(os.path.dirname(home)))
except OSError as exc:  # without mounts the folder of the homes is not listed at all
    print('homes', type(exc).__name__)
try:
    print('tmp', len(os.listdir('/tmp')) > 0)
except OSError as exc:  # without mounts: rules for /tmp's other entries, not /tmp itself
    print('tmp', type(exc).__name__)
try:
    print('root', sorted(os.listdir('/'))[:2] != [])
except OSError as exc:
    print('root', type(exc).__name__)
""")
        other_home = manager._get(other).home
        mine = manager._get(sid).home
    assert result.exit_code == 0, result
    assert (f"homes {[os.path.basename(mine)]}" in result.stdout
            or (not hidden_by_mounts() and "homes PermissionError" in result.stdout)), result.stdout
    assert os.path.basename(other_home) not in result.stdout
    assert "tmp True" in result.stdout or (not hidden_by_mounts()
                                           and "tmp PermissionError" in result.stdout)
    expected = "root PermissionError" if readable == ["/tmp"] else "root True"
    if readable != ["/tmp"] and not _lists_everywhere():
        expected = "root PermissionError"  # no private /proc or no mounts: said in the docs
    assert expected in result.stdout, result.stdout


def _lists_everywhere() -> bool:
    from sandbox_kernel_ext.runner.trusted.isolation import private_mounts

    return bool(private_mounts()["proc"] and hidden_by_mounts())


@pytest.mark.skipif(os.geteuid() != 0, reason="a root kernel's folders, another user's files")
def test_another_users_files_in_a_root_folder_keep_their_modes(tmp_path: Path) -> None:
    """The common container volume: a root-owned writable folder holding uid 1000's files.
    Their modes decide, as on the host: 0666 is writable, and the folder's entries can be
    removed (once: EACCES on create and append, EOVERFLOW on delete)."""
    top = Path(tempfile.mkdtemp(prefix="sbx-volume-"))
    try:
        os.chmod(top, 0o755)
        volume = top / "volume"
        volume.mkdir(mode=0o755)
        for name, mode in (("open.txt", 0o666), ("private.txt", 0o600), ("gone.txt", 0o644)):
            (volume / name).write_text("theirs\n")
            os.chown(volume / name, OTHER_UID, OTHER_UID)
            os.chmod(volume / name, mode)
        (volume / "theirs").mkdir(mode=0o777)
        os.chown(volume / "theirs", OTHER_UID, OTHER_UID)
        os.chmod(volume / "theirs", 0o777)
        with SandboxManager() as manager:
            sid = manager.create_sandbox(_policy([], [volume], False))
            result = manager.run_python(sid, f"""
import os
v = {str(volume)!r}
def attempt(label, action):
    try:
        action()
        print(label, 'ok')
    except OSError as exc:
        print(label, type(exc).__name__)
attempt('append-open', lambda: open(os.path.join(v, 'open.txt'), 'a').write('mine\\n'))
attempt('read-private', lambda: open(os.path.join(v, 'private.txt')).read())
attempt('delete', lambda: os.unlink(os.path.join(v, 'gone.txt')))
attempt('create-in-theirs', lambda: open(os.path.join(v, 'theirs', 'new.txt'), 'w').write('x'))
attempt('create', lambda: open(os.path.join(v, 'new.txt'), 'w').write('x'))
""")
        assert result.exit_code == 0, result
        for line in ("append-open ok", "read-private PermissionError", "delete ok",
                     "create-in-theirs ok", "create ok"):
            assert line in result.stdout, result.stdout
        assert (volume / "open.txt").read_text() == "theirs\nmine\n"
        assert not (volume / "gone.txt").exists()
        assert (volume / "new.txt").stat().st_uid == 0  # what it makes in root's folder is root's
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="a root kernel's folders")
def test_a_readable_grant_spelled_through_a_link_is_shown_as_named() -> None:
    """`current -> private` (root's, 0700): the folder named directly worked, the same
    folder through the link got no owner mapping (EACCES)."""
    top = Path(tempfile.mkdtemp(prefix="sbx-link-grant-"))
    try:
        os.chmod(top, 0o755)
        private = top / "private"
        private.mkdir(mode=0o700)
        (private / "data.csv").write_text("a,b\n")
        os.chmod(private / "data.csv", 0o600)
        os.symlink(private, top / "current")
        with SandboxManager() as manager:
            for spelled in (private, top / "current"):
                sid = manager.create_sandbox(_policy([spelled], [], False))
                result = manager.execute(sid, ["cat", str(spelled / "data.csv")])
                assert result.stdout == "a,b\n", (spelled, result)
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="a root kernel's child and another user's folder")
def test_a_grant_behind_another_users_closed_folder_is_refused_by_name() -> None:
    """Root's folder inside uid 1000's 0700 home: accepted, then every run failed with a
    bare `confine: PermissionError`, even a `cat` of an unrelated granted file."""
    top = Path(tempfile.mkdtemp(prefix="sbx-closed-"))
    try:
        os.chmod(top, 0o755)
        theirs = top / "alice"
        (theirs / "shared").mkdir(parents=True)
        os.chown(theirs, OTHER_UID, OTHER_UID)
        os.chmod(theirs, 0o700)
        with SandboxManager() as manager:
            with pytest.raises(SandboxError, match=r"alice .*closed to it.*chmod o\+x"):
                manager.create_sandbox(_policy([theirs / "shared"], [], False))
            os.chmod(theirs, 0o711)  # the way forward the message names
            sid = manager.create_sandbox(_policy([theirs / "shared"], [], False))
            assert manager.execute(sid, ["ls", str(theirs / "shared")]).exit_code == 0
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)
