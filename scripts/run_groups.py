"""The whole test suite as three pytest runs side by side, each printed whole as it ends,
then the tests marked `alone` by themselves.

Most of the suite waits (for kernels and browsers to start, sandboxes to time out, packages
to install, containers' suites), so on two cores three runs side by side end well before one
run of everything. The groups share nothing a test relies on: each has its own pytest
folder, and the tests hold with other sandboxes, kernels and busy processes beside them
(they are run under load), except those marked `alone` (whether a run takes the view
prepared for it depends on no other sandbox being made meanwhile), which run last, by
themselves. A group that collects no test counts as failed.

    python scripts/run_groups.py     # every group; exit status 0 only if each passed
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The two groups that are mostly waiting on other processes; the third is everything else.
GROUPS = {
    "containers and installs": ["tests/containers", "tests/test_kernel_versions.py",
                                "tests/test_wheel.py"],
    "browsers and JupyterHub": ["tests/browser", "tests/hub"],
}
REST = "everything else"
ALONE = "tests that need a quiet host"  # marked `alone`: run last, by themselves
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]  # each command's start


def commands(folder: Path) -> dict[str, list[str]]:
    """Each group's pytest command line, with a pytest folder of its own under `folder`;
    the last one (`ALONE`) runs after the others have ended."""
    grouped = [path for paths in GROUPS.values() for path in paths]
    lines = {name: [*PYTEST, *paths, "-m", "not alone"] for name, paths in GROUPS.items()}
    lines[REST] = [*PYTEST, "tests", *(f"--ignore={path}" for path in grouped),
                   "-m", "not alone"]
    lines[ALONE] = [*PYTEST, "tests", "-m", "alone"]
    for number, line in enumerate(lines.values()):
        line.append(f"--basetemp={folder / f'group-{number}'}")
    return lines


# Each group's pytest starts through this: in a session of its own (the runner alone decides
# when a group is interrupted, once), told by Linux with SIGINT when the runner dies however
# it dies (pytest then runs its clean-ups), unless the runner was gone before it started.
_START = ("import ctypes, os, signal, sys\n"
          "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG\n"
          "if os.getppid() != int(sys.argv[1]):\n"
          "    sys.exit('the test runner is gone')\n"
          "os.execv(sys.argv[2], sys.argv[2:])\n")


def _run(name: str, line: list[str], log: Path, ended: queue.Queue) -> subprocess.Popen:
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-c", _START, str(os.getpid()), *line],
                                   cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()

    def wait() -> None:
        process.wait()
        ended.put((name, time.monotonic() - started))

    threading.Thread(target=wait, daemon=True).start()
    return process


def _outcome(log: Path) -> str:
    """pytest's closing line (how many passed, failed, ...), or the log's last line."""
    lines = log.read_text(errors="replace").strip().splitlines() or ["(printed nothing)"]
    return lines[-1].strip("= ")


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="sbx-test-groups-"))
    lines = commands(folder)
    running: dict[str, subprocess.Popen] = {}
    results: dict[str, tuple[int, float, str]] = {}
    try:
        for phase in ([name for name in lines if name != ALONE], [ALONE]):
            ended: queue.Queue = queue.Queue()
            for name in phase:
                running[name] = _run(name, lines[name], folder / f"{name}.log", ended)
                print(f"[groups] started: {name} ({' '.join(lines[name][len(PYTEST):-1])})", flush=True)
            for _ in phase:
                name, seconds = ended.get()
                code = running[name].returncode
                results[name] = (code, seconds, _outcome(folder / f"{name}.log"))
                _show(name, f"exit status {code}, {seconds:.0f} s", folder / f"{name}.log")
    finally:
        _stop(running)
        for name in running.keys() - results.keys():  # interrupted: what it printed so far
            _show(name, "interrupted", folder / f"{name}.log")
        shutil.rmtree(folder, ignore_errors=True)
    print("\n[groups] summary:")
    for name, (code, seconds, outcome) in results.items():
        verdict = "passed" if code == 0 else f"FAILED (exit status {code})"
        print(f"  {name}: {verdict} in {seconds:.0f} s: {outcome}", flush=True)
    return 0 if all(code == 0 for code, _, _ in results.values()) else 1


def _show(name: str, how: str, log: Path) -> None:
    print(f"\n{'#' * 30} {name}: {how} {'#' * 30}", flush=True)
    sys.stdout.write(log.read_text(errors="replace") if log.exists() else "")
    sys.stdout.flush()


def _stop(running: dict[str, subprocess.Popen]) -> None:
    """Interrupt every group still running, its whole process group once (pytest then runs
    its clean-ups, which a second interrupt would cut short), and end the process group if
    it has not stopped two minutes later."""
    alive = [p for p in running.values() if p.poll() is None]
    for process in alive:
        _signal_group(process, signal.SIGINT)
    for process in alive:
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def _terminated(signum: int, frame: object) -> None:
    sys.exit(128 + signum)  # the clean-ups in main() still run


if __name__ == "__main__":
    os.chdir(ROOT)
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())
