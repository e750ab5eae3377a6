"""The whole test suite as three pytest runs side by side, each printed whole as it ends.

Most of the suite waits (for kernels and browsers to start, sandboxes to time out, packages
to install, containers' suites), so on two cores three runs side by side end well before one
run of everything. The groups share nothing a test relies on: each has its own pytest
folder, and the tests already hold with other sandboxes, kernels and busy processes beside
them (they are run under load). A group that collects no test counts as failed.

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


def commands(folder: Path) -> dict[str, list[str]]:
    """Each group's pytest command line, with a pytest folder of its own under `folder`."""
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    grouped = [path for paths in GROUPS.values() for path in paths]
    lines = {name: [*pytest, *paths] for name, paths in GROUPS.items()}
    lines[REST] = [*pytest, "tests", *(f"--ignore={path}" for path in grouped)]
    for number, line in enumerate(lines.values()):
        line.append(f"--basetemp={folder / f'group-{number}'}")
    return lines


def _run(name: str, line: list[str], log: Path, ended: queue.Queue) -> subprocess.Popen:
    with log.open("wb") as out:
        process = subprocess.Popen(line, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT)
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
    ended: queue.Queue = queue.Queue()
    running: dict[str, subprocess.Popen] = {}
    results: dict[str, tuple[int, float, str]] = {}
    try:
        for name, line in commands(folder).items():
            log = folder / f"{name}.log"
            running[name] = _run(name, line, log, ended)
            print(f"[groups] started: {name} ({' '.join(line[5:-1])})", flush=True)
        while len(results) < len(running):
            name, seconds = ended.get()
            code = running[name].returncode
            results[name] = (code, seconds, _outcome(folder / f"{name}.log"))
            print(f"\n{'#' * 30} {name}: exit status {code}, {seconds:.0f} s {'#' * 30}",
                  flush=True)
            sys.stdout.write((folder / f"{name}.log").read_text(errors="replace"))
            sys.stdout.flush()
    except KeyboardInterrupt:  # a Ctrl-C at the terminal reached the groups too
        _stop(running, grace=30)
        raise
    finally:
        _stop(running, grace=0)
        shutil.rmtree(folder, ignore_errors=True)
    print("\n[groups] summary:")
    for name, (code, seconds, outcome) in results.items():
        verdict = "passed" if code == 0 else f"FAILED (exit status {code})"
        print(f"  {name}: {verdict} in {seconds:.0f} s: {outcome}", flush=True)
    return 0 if all(code == 0 for code, _, _ in results.values()) else 1


def _stop(running: dict[str, subprocess.Popen], grace: float) -> None:
    """Interrupt any group still running after `grace` seconds (pytest then runs its
    clean-ups; a second interrupt would cut them short), then end it if it has not stopped
    a minute later."""
    deadline = time.monotonic() + grace
    for process in running.values():
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            pass
    alive = [p for p in running.values() if p.poll() is None]
    for process in alive:
        process.send_signal(signal.SIGINT)
    for process in alive:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _terminated(signum: int, frame: object) -> None:
    sys.exit(128 + signum)  # the clean-ups in main() still run


if __name__ == "__main__":
    os.chdir(ROOT)
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())
