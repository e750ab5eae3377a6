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

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager

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
        "filesystem_config": {"mode": "read_write", "writable_paths": [str(p) for p in writable],
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
@pytest.mark.parametrize("interface", ["execute", "run_python", "session"])
def test_hundreds_of_folders_of_several_owners_all_work(many_folders, interface: str,
                                                          egress: bool) -> None:
    _, readable, writable = many_folders
    mark = f"{interface}-{egress}"
    code = _code(readable, writable, mark)
    with SandboxManager() as manager:
        sid = manager.create_sandbox(_policy(readable, writable, egress))
        if interface == "execute":
            result = manager.execute(sid, [sys.executable, "-c", code], timeout=120)
        elif interface == "run_python":
            result = manager.run_python(sid, code, timeout=120)
        else:
            session = manager.start_session(sid)
            try:
                result = session.run_cell(code, timeout=120)
            finally:
                session.close()
    assert "BAD 0 []" in result.stdout, (result.stdout, result.stderr)
    _check_written(writable, mark)

