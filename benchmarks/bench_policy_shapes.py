"""What a policy of realistic size costs a run: `run_python(sid, "print(1)")`, whole call,
in a sandbox whose policy grants 200 readable and 100 writable folders (two in three of
them root's when run as root, so each is an owner-mapped copy handed to the child), against
the same call in a sandbox granting one folder. Medians of interleaved rounds (ABBA), each
call after a 20 ms pause, as calls from a person or an agent come.

Also: the same call in a sandbox whose writable folder is the kernel's working directory
holding N modules (each a read-only mount for the run: the write protection), F data files
and S subfolders (the folder takes no new names: a Landlock rule for each subfolder, listed
at each run), against the one-folder sandbox.

Run: `python benchmarks/bench_policy_shapes.py [-n 30] [--modules 200] [--files 5000]
[--subfolders 100]`. Every folder made is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from _common import fmt_ns

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager

PAUSE_S = 0.02


def _folders(top: Path, count: int, prefix: str) -> list[str]:
    paths = []
    for index in range(count):
        folder = top / f"{prefix} {index:03d}"
        folder.mkdir()
        if os.geteuid() == 0 and index % 3 == 2:
            os.chown(folder, 1000, 1000)
            os.chmod(folder, 0o777)
        else:
            os.chmod(folder, 0o700 if index % 2 else 0o755)
        paths.append(str(folder))
    return paths


def _policy(readable: list[str], writable: list[str]) -> CapabilityDeclaration:
    return CapabilityDeclaration.model_validate({"filesystem_config": {
        "mode": "read_write", "writable_paths": writable, "readable_paths": readable}})


def _timed(manager: SandboxManager, sid: str) -> int:
    time.sleep(PAUSE_S)
    start = time.perf_counter_ns()
    result = manager.run_python(sid, "print(1)")
    elapsed = time.perf_counter_ns() - start
    assert result.stdout == "1\n", result
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=30, help="interleaved rounds (default 30)")
    parser.add_argument("--modules", type=int, default=200,
                        help="modules in the working directory for the last row (default 200)")
    parser.add_argument("--files", type=int, default=5000,
                        help="data files beside them (default 5000)")
    parser.add_argument("--subfolders", type=int, default=100,
                        help="subfolders beside them (default 100)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", UserWarning)
    top = Path(tempfile.mkdtemp(prefix="bench-shapes-"))
    here = os.getcwd()
    try:
        os.chmod(top, 0o755)
        readable = _folders(top, 200, "r")
        writable = _folders(top, 100, "w")
        one = _folders(top, 1, "one")
        project = top / "project"
        project.mkdir(mode=0o777)
        os.chmod(project, 0o777)
        for index in range(args.modules):
            (project / f"module_{index}.py").write_text("x = 1\n")
        for index in range(args.files):
            (project / f"rows_{index}.csv").write_text("a,b\n")
        for index in range(args.subfolders):
            (project / f"part_{index}").mkdir()
        with SandboxManager() as manager:
            small = manager.create_sandbox(_policy([], one))
            large = manager.create_sandbox(_policy(readable, writable))
            os.chdir(project)  # the kernel's working directory: its modules are protected
            modules = manager.create_sandbox(_policy([], [str(project)]))
            samples: dict[str, list[int]] = {"small": [], "large": [], "modules": []}
            for sid in (small, large, modules):
                for _ in range(3):
                    _timed(manager, sid)  # warm: launcher, spares, prepared views
            for round_index in range(args.n):
                order = ("small", "large", "modules")
                for name in order if round_index % 2 == 0 else reversed(order):
                    sid = {"small": small, "large": large, "modules": modules}[name]
                    samples[name].append(_timed(manager, sid))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        print(f"run_python('print(1)'), whole call, medians of {args.n} interleaved rounds:")
        print(f"  one writable folder:                          {fmt_ns(medians['small'])}")
        print(f"  200 readable + 100 writable folders:          {fmt_ns(medians['large'])}"
              f"  ({medians['large'] / medians['small']:.2f}x)")
        print(f"  writable working directory, {args.modules} modules, {args.files} files, "
              f"{args.subfolders} subfolders: {fmt_ns(medians['modules'])}  "
              f"({medians['modules'] / medians['small']:.2f}x)")
    finally:
        os.chdir(here)
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
