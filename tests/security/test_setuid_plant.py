"""A cell never leaves a program on the host that runs as someone else (found in review of an
idmapped-mount design, whose files landed as root's): whatever a cell creates in a writable
root, with whatever mode, a setuid or setgid bit never makes it run as root or as another
user than the cell's own."""

from __future__ import annotations

import stat
from pathlib import Path

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager


def test_a_setuid_program_a_cell_makes_never_runs_as_root(
    manager: SandboxManager, shared_dir: Path
) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_write", writable_paths=[str(shared_dir)], readable_paths=None)))
    try:
        result = manager.run_python(sid, f"""
import os, shutil
target = {str(shared_dir / 'planted')!r}
shutil.copy('/bin/true', target)
for mode in (0o6755, 0o4755, 0o2755):
    try:
        os.chmod(target, mode)
    except OSError:
        pass
""")
    finally:
        manager.destroy(sid)
    assert result.exit_code == 0, result.stderr
    planted = (shared_dir / "planted").stat()
    special = planted.st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert not (special and (planted.st_uid == 0 or planted.st_gid == 0)), (
        oct(planted.st_mode), planted.st_uid, planted.st_gid)
    assert planted.st_uid != 0  # the cell's files are its own uid's, never root's
    (shared_dir / "planted").unlink()
