"""How far past its disk quota a burst of writes gets before the kill.

The quota over a sandbox's writable folders is measured by walks, not enforced by the
filesystem, so writes made between two walks land first; its home is a tmpfs of the quota's
size where the host allows (the isolation report's `home_space`), where a burst fails with
ENOSPC instead (an overshoot of 0 or less, "not killed"). This measures the overshoot a cell
reaches with the default monitor (what a user gets), for the two shapes that hurt most: files
of 1 MB written as fast as the disk takes them, and empty files (inodes). One file alone stops
at the quota (RLIMIT_FSIZE), so it is not measured.

Run: `python benchmarks/bench_disk_burst.py [-n 5] [--quota-mb 10]`. Prints the median and the
largest overshoot of `-n` runs, in bytes stored (blocks) and in files, for the writable root
and for the home. Every folder made is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import warnings

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager
from sandbox_kernel_ext.runner.trusted.disk_quota import measure, mounts_used

BURSTS = {
    "1 MB files": (
        "import os\nchunk = b'x' * 1048576\ni = 0\n"
        "while True:\n"
        "    with open(os.path.join(FOLDER, f'f{i}'), 'wb') as out:\n"
        "        out.write(chunk)\n"
        "    i += 1\n"),
    "empty files": (
        "import os\ni = 0\n"
        "while True:\n"
        "    os.close(os.open(os.path.join(FOLDER, f'e{i}'), os.O_CREAT | os.O_WRONLY, 0o600))\n"
        "    i += 1\n"),
}

COUNT_FILES = "import os\nprint(sum(len(names) for _, _, names in os.walk(os.environ['HOME'])))"


def _stored(folder: str) -> tuple[int, int]:
    """(bytes as the quota counts them, files) below `folder`: blocks, and at least an
    inode's `INODE_BYTES` for each file (so a flood of empty files counts too)."""
    files = sum(len(names) for _, _, names in os.walk(folder))
    return measure([folder]).bytes, files


def _burst(code: str, where: str, quota: int) -> tuple[int, int, str]:
    """One burst in a fresh sandbox: (bytes past the quota, files, the kill reason)."""
    shared = tempfile.mkdtemp(prefix="sbx-burst-")
    os.chmod(shared, 0o777)
    try:
        policy = CapabilityDeclaration.model_validate({
            "filesystem_config": {"mode": "read_write", "writable_paths": [shared]},
            "file_limits": {"max_total_bytes": quota},
            "resource_limits": {"max_file_size_mb": 100, "max_open_files": 256}})
        with SandboxManager() as manager:
            sid = manager.create_sandbox(policy)
            sandbox = manager._get(sid)
            folder = shared if where == "writable root" else sandbox.home
            result = manager.run_python(sid, code, inputs={"FOLDER": folder}, timeout=120)
            if where == "home" and sandbox.home_mount is not None:  # seen only by its runs
                size = mounts_used([sandbox.home_mount])
                files = int(manager.run_python(sid, COUNT_FILES).stdout)
            else:
                size, files = _stored(folder)
            manager.destroy(sid)
        return size - quota, files, result.killed or "not killed"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--quota-mb", type=float, default=10.0)
    args = parser.parse_args()
    quota = int(args.quota_mb * 1024 * 1024)
    warnings.simplefilter("ignore")
    print(f"quota {args.quota_mb:g} MB, default monitor; overshoot past the quota at the kill")
    for name, code in BURSTS.items():
        for where in ("writable root", "home"):
            runs = [_burst(code, where, quota) for _ in range(args.n)]
            over = [run[0] for run in runs]
            files = [run[1] for run in runs]
            reasons = {run[2].split(":")[0] for run in runs}
            print(f"{name:12} {where:14} overshoot median {statistics.median(over) / 2**20:7.1f} MB"
                  f" (max {max(over) / 2**20:.1f}), files median {statistics.median(files):8.0f}"
                  f" (max {max(files)}); killed for: {', '.join(sorted(reasons))}")


if __name__ == "__main__":
    main()
