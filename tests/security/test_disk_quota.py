"""What a sandbox writes to disk counts against the policy's total quota (issue 13, §2).

`file_limits.max_total_bytes` used to bind only the in-kernel file toolset: a review wrote
150 MB into a writable root and 150 MB into the sandbox's home under a 10 MB quota. Here a
cell writes past a 2 MB quota by every shape: one big file (stopped by RLIMIT_FSIZE, capped at
what the quota has left), many small files in the writable root, many in its home. Each is
stopped near the quota, and the sandbox's next run is refused until files are deleted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandbox_kernel_ext import (
    CapabilityDeclaration,
    FilesystemConfig,
    ResourceLimits,
    SandboxError,
    SandboxManager,
    SandboxResult,
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


def _run_writing_in(folder: Path, code: str) -> SandboxResult:
    """`code` run once, with FOLDER naming `folder`, in a sandbox under the quota that may
    write there, watched every 50 ms."""
    with SandboxManager(monitor_interval=0.05) as manager:
        sid = manager.create_sandbox(_policy(folder))
        return manager.run_python(sid, code, inputs={"FOLDER": str(folder)}, timeout=60)


def _stored(folder: str) -> int:
    return sum(os.lstat(os.path.join(root, name)).st_blocks * 512
               for root, _, files in os.walk(folder) for name in files)


def test_many_files_are_stopped_at_the_quota(shared_dir: Path) -> None:
    with SandboxManager(monitor_interval=0.05) as manager:
        sid = manager.create_sandbox(_policy(shared_dir))
        folder = str(shared_dir)
        result = manager.run_python(sid, MANY_FILES, inputs={"FOLDER": folder}, timeout=60)
        assert result.killed is not None and "disk quota" in result.killed, result
        assert "all written" not in result.stdout
        written = _stored(folder)
        assert QUOTA < written < QUOTA + 4 * 1024 * 1024, written  # stopped near the quota
        with pytest.raises(SandboxError, match="disk quota exceeded.*delete files"):
            manager.run_python(sid, "print('again')")
        for name in os.listdir(folder):  # deleting makes room again
            os.unlink(os.path.join(folder, name))
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


DEEP = r"""
import os
os.chdir(FOLDER)
for level in range(20):                 # a path far past PATH_MAX (4,096 bytes)
    name = f"d{level}" + "x" * 246
    os.mkdir(name)
    os.chdir(name)
for index in range(30):                 # 30 × 512 KiB, by relative path: 15 MB
    with open(f"f{index}", "wb") as handle:
        handle.write(b"x" * 524288)
    import time; time.sleep(0.02)
print("all written")
"""


def test_files_below_path_max_are_counted(shared_dir: Path) -> None:
    """Found in review: the walk went by full path and skipped what lies past PATH_MAX, so a
    cell stored 271 MB under a 10 MB quota there. It goes by folder descriptor now."""
    with SandboxManager(monitor_interval=0.05) as manager:
        sid = manager.create_sandbox(_policy(shared_dir))
        result = manager.run_python(sid, DEEP, inputs={"FOLDER": str(shared_dir)}, timeout=60)
        assert result.killed is not None and "disk quota" in result.killed, result
        with pytest.raises(SandboxError, match="disk quota exceeded"):
            manager.run_python(sid, "print('again')")


KEEP_SIZE = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(os.path.join(FOLDER, "reserved"), os.O_CREAT | os.O_WRONLY, 0o644)
result = libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(1 << 30))  # KEEP_SIZE, 1 GiB
print("reserved" if result == 0 else errno.errorcode[ctypes.get_errno()])
os.close(fd)
"""


def test_blocks_beyond_the_size_cannot_be_reserved(shared_dir: Path) -> None:
    """Found in review: fallocate(FALLOC_FL_KEEP_SIZE) allocates past RLIMIT_FSIZE (3 GB in
    one call under a 10 MB quota); it is refused as not supported, and nothing is kept."""
    with SandboxManager() as manager:
        sid = manager.create_sandbox(_policy(shared_dir))
        result = manager.run_python(sid, KEEP_SIZE, inputs={"FOLDER": str(shared_dir)})
    assert result.stdout.strip() in ("EOPNOTSUPP", "ENOTSUP"), result  # one number on Linux
    assert os.lstat(shared_dir / "reserved").st_blocks == 0


def test_a_writable_file_is_counted(shared_dir: Path) -> None:
    """Found in review: a writable root that is one file was never counted."""
    target = shared_dir / "data.bin"
    target.write_bytes(b"")
    target.chmod(0o666)
    policy = CapabilityDeclaration(
        filesystem_config=FilesystemConfig(mode="read_write", writable_paths=[str(target)]),
        file_limits=FileLimits(max_total_bytes=QUOTA))
    with SandboxManager(monitor_interval=0.05) as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, f"""
import time
with open({str(target)!r}, 'ab') as handle:
    for _ in range(40):
        handle.write(b'x' * 262144)
        handle.flush()
        time.sleep(0.02)
""", timeout=60)
    # stopped at the quota's edge by RLIMIT_FSIZE, or killed past it: never more stored
    assert (result.killed is not None and "disk quota" in result.killed) or (
        "File too large" in result.stderr), result
    assert target.stat().st_size <= QUOTA


UNNAMED = r"""
import os, time
held = []
for index in range(30):                 # 30 × 512 KiB that never had a name
    fd = os.open(FOLDER, os.O_TMPFILE | os.O_WRONLY, 0o600)
    os.write(fd, b"x" * 524288)
    held.append(fd)
    time.sleep(0.02)
for _ in range(60): time.sleep(0.1)  # past the longest pause between walks (5 s)
print("all held")
"""


def test_files_held_open_without_a_name_are_counted(shared_dir: Path) -> None:
    """Found in review: 270 MB in O_TMPFILE files (or unlinked while open) showed as 0."""
    result = _run_writing_in(shared_dir, UNNAMED)
    assert result.killed is not None and "disk quota" in result.killed, result


MAPPED = r"""
import mmap, os, time
held = []
for index in range(30):                 # 30 × 512 KiB kept only by a shared mapping
    path = os.path.join(FOLDER, f"m{index}")
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.write(fd, b"x" * 524288)
    held.append(mmap.mmap(fd, 524288, mmap.MAP_SHARED))
    os.close(fd)
    os.unlink(path)
    time.sleep(0.02)
for _ in range(60): time.sleep(0.1)  # past the longest pause between walks (5 s)
print("all held")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a mapping's file is read through map_files as root")
def test_files_held_by_a_mapping_are_counted(shared_dir: Path) -> None:
    """Found in review: files unlinked while mapped held 540 MB, counted as 0."""
    result = _run_writing_in(shared_dir, MAPPED)
    assert result.killed is not None and "disk quota" in result.killed, result


def test_a_flood_of_empty_files_counts(shared_dir: Path) -> None:
    """Found in review: 250,000 empty files cost no block, fit any quota and slowed every walk
    to a second, buying long unwatched stretches. Each costs an inode's worth now."""
    result = _run_writing_in(shared_dir, """
import os
for index in range(20000):          # 20,000 × 256 bytes: 5 MB against a 2 MB quota
    open(os.path.join(FOLDER, f"e{index}"), "w").close()
import time
for _ in range(60): time.sleep(0.1)  # past the longest pause between walks (5 s)
print("all made")
""")
    assert result.killed is not None and "disk quota" in result.killed, result


def test_a_walk_of_a_folder_that_just_went_away_is_quiet(tmp_path) -> None:
    """A sandbox destroyed while its quota's walk ran: the walk thread once died with a
    FileNotFoundError (fwalk opens its top outside `onerror`'s reach), seen in a long
    differential run."""
    from sandbox_kernel_ext.runner.trusted.disk_quota import Usage, _walk

    usage = Usage()
    _walk(str(tmp_path / "gone"), 0, usage)
    assert usage.unlisted == set()


def test_a_burst_is_walked_at_once_not_at_the_next_poll(tmp_path) -> None:
    """A burst of writes landed first, for as long as the poll interval and the walks' pacing
    (a review stored 360 MB, and 86,515 empty files, under a 10 MB quota). The monitor looks
    at the filesystem's free space between polls and walks at once when it fell by more than
    the quota has left: here no poll comes for an hour, and the breach comes all the same."""
    import threading

    from sandbox_kernel_ext.runner.trusted.disk_quota import DiskQuota
    from sandbox_kernel_ext.runner.trusted.monitor import ResourceMonitor

    quota = DiskQuota([str(tmp_path)], 1024 * 1024)
    breached = threading.Event()
    monitor = ResourceMonitor(ResourceLimits(), interval=3600, disk=quota,
                              on_breach=lambda reason: breached.set())
    monitor.start(first_poll_at=time.monotonic() + 3600)
    try:
        for index in range(8):  # 8 MB, written and on disk (a statfs sees it once synced)
            with open(tmp_path / f"f{index}", "wb") as out:
                out.write(b"x" * 1048576)
                out.flush()
                os.fsync(out.fileno())
        assert breached.wait(30), monitor.snapshot()
    finally:
        monitor.stop()
    assert "disk quota exceeded" in (monitor.exceeded() or "")


LEFT_WRITING = r"""
import os, threading, time
def write():
    for index in range(200):                 # 200 MB, a file every 20 ms
        with open(os.path.join(FOLDER, f"later{index}"), "wb") as out:
            out.write(b"x" * 1048576)
        time.sleep(0.02)
threading.Thread(target=write, daemon=True).start()
"""


def test_a_session_left_writing_between_cells_is_ended_at_its_quota(shared_dir: Path) -> None:
    """Found in review: a cell left a thread writing, and while the session sat between
    cells its home grew to 381 MB under a 10 MB quota (between cells only CPU, memory and
    processes were watched). A home is a sized tmpfs now where the host allows
    (`test_home_space.py`); a writable folder on disk is still walked between cells."""
    with SandboxManager() as manager:
        sid = manager.create_sandbox(_policy(shared_dir))
        session = manager.start_session(sid)
        try:
            result = session.run_cell(LEFT_WRITING.replace("FOLDER", repr(str(shared_dir))))
            assert result.killed is None, result
            deadline = time.monotonic() + 60
            while session.end_reason is None and time.monotonic() < deadline:
                time.sleep(0.1)
            reason = session.end_reason
        finally:
            session.close()
            manager.destroy(sid)
    assert reason is not None and "disk quota exceeded" in reason, reason


SUBVOLUME = r"""
import errno, fcntl, os
fd = os.open(FOLDER, os.O_RDONLY | os.O_DIRECTORY)
outcomes = []
for request in (0x50009401, 0x5000940E, 0x50009417, 0x50009418):
    try:
        fcntl.ioctl(fd, request, bytearray(4096))
        outcomes.append("made")
    except OSError as exc:
        outcomes.append(errno.errorcode.get(exc.errno, str(exc.errno)))
print(outcomes)
"""


def test_no_btrfs_subvolume_escapes_the_walk(shared_dir: Path) -> None:
    """Found in review: on btrfs a cell made a subvolume in its writable folder (a device of
    its own, which the walk does not enter) and wrote 96 MB under a 10 MB quota. The
    requests are refused before the filesystem sees them: EPERM here, where ext4 itself
    would answer ENOTTY."""
    result = _run_writing_in(shared_dir, SUBVOLUME)
    assert result.stdout.strip() == str(["EPERM"] * 4), result
