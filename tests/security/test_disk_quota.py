"""What a sandbox writes to disk counts against the policy's total quota (issue 13, §2).

`file_limits.max_total_bytes` used to bind only the in-kernel file toolset: a review wrote
150 MB into a writable root and 150 MB into the sandbox's home under a 10 MB quota. Here a
cell writes past a 2 MB quota by every shape: one big file (stopped by RLIMIT_FSIZE, capped at
what the quota has left), many small files in the writable root, many in its home. Each is
stopped near the quota, and the sandbox's next run is refused until files are deleted.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_kernel_ext import (
    CapabilityDeclaration,
    FilesystemConfig,
    ResourceLimits,
    SandboxError,
    SandboxManager,
)
from sandbox_kernel_ext.policy.file_limits import FileLimits

QUOTA = 2 * 1024 * 1024

MANY_FILES = r"""
import os, time
folder = FOLDER if FOLDER else os.environ["HOME"]
chunk = b"x" * 65536
for index in range(400):           # 400 files of 64 KiB: 25 MB, twelve times the quota
    with open(os.path.join(folder, f"part-{index}"), "wb") as handle:
        handle.write(chunk)
    time.sleep(0.01)
print("all written")
"""

ONE_FILE = r"""
import os
try:
    with open(os.path.join(FOLDER, "big"), "wb") as handle:
        for _ in range(100):
            handle.write(b"x" * 1048576)
    print("all written")
except OSError as exc:
    print("refused", exc.errno)
"""


def _policy(folder: Path) -> CapabilityDeclaration:
    return CapabilityDeclaration(
        filesystem_config=FilesystemConfig(mode="read_write", writable_paths=[str(folder)]),
        file_limits=FileLimits(max_total_bytes=QUOTA),
        resource_limits=ResourceLimits(max_file_size_mb=100),
    )


def _stored(folder: str) -> int:
    return sum(os.lstat(os.path.join(root, name)).st_blocks * 512
               for root, _, files in os.walk(folder) for name in files)


@pytest.mark.parametrize("where", ["writable root", "home"])
def test_many_files_are_stopped_at_the_quota(shared_dir: Path, where: str) -> None:
    with SandboxManager(monitor_interval=0.05) as manager:
        sid = manager.create_sandbox(_policy(shared_dir))
        home = manager._get(sid).home
        folder = str(shared_dir) if where == "writable root" else ""
        result = manager.run_python(sid, MANY_FILES, inputs={"FOLDER": folder}, timeout=60)
        assert result.killed is not None and "disk quota" in result.killed, result
        assert "all written" not in result.stdout
        written = _stored(folder or home)
        assert QUOTA < written < QUOTA + 4 * 1024 * 1024, written  # stopped near the quota
        with pytest.raises(SandboxError, match="disk quota exceeded.*delete files"):
            manager.run_python(sid, "print('again')")
        for name in os.listdir(folder or home):  # deleting makes room again
            os.unlink(os.path.join(folder or home, name))
        again = manager.run_python(sid, "print('again')")
        assert again.exit_code == 0 and again.stdout == "again\n", again


def test_one_big_file_stops_at_the_quota_in_linux(shared_dir: Path) -> None:
    with SandboxManager() as manager:
        sid = manager.create_sandbox(_policy(shared_dir))
        result = manager.run_python(sid, ONE_FILE, inputs={"FOLDER": str(shared_dir)},
                                    timeout=60)
    assert result.stdout.startswith("refused"), result  # EFBIG at the quota's edge
    assert os.path.getsize(shared_dir / "big") <= QUOTA


def test_what_was_there_before_does_not_count(shared_dir: Path) -> None:
    """The quota is what a sandbox adds: a root that already holds more still runs."""
    (shared_dir / "existing").write_bytes(b"y" * (3 * QUOTA))
    with SandboxManager() as manager:
        sid = manager.create_sandbox(_policy(shared_dir))
        result = manager.run_python(sid, f"open({str(shared_dir / 'small')!r}, 'w').write('ok')")
        assert result.exit_code == 0 and result.killed is None, result
        assert result.resource_usage["disk_bytes"] < QUOTA
