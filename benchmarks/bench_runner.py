"""Benchmarks of the confined runner against bare subprocesses started from this process.

Measured (medians, after warming the launcher up; candidate and baseline interleaved in
ABBA order so that noise hits both alike, each call after a 20 ms pause, `PAUSE_S`):

1. `SandboxManager.run_python(sid, "print(1)")`: time from the call to the first
   `on_output` callback carrying stdout text, and the total time of the call, against a
   bare `Popen([python, "-I", "-S", "-c", "print(1)"])` (the interpreter's realpath, so no
   shim is timed): time from the call to the first byte read from its stdout pipe, and to
   the end of `communicate()` (what `subprocess.run(..., capture_output=True)` does).
2. `SandboxManager.execute(sid, ["/bin/true"])` to completion against
   `subprocess.run(["/bin/true"])`; where bubblewrap is installed, `execute` of `/bin/true`
   and of `python -I -S -c 'print(1)'` against `bwrap --ro-bind / / --dev /dev --proc /proc
   --unshare-all` running the same; and `run_python(..., "print(1)")` in a sandbox with egress
   rules (its child makes a listener for the kernel's proxy) against one without.
3. CPU overhead of a `ResourceMonitor(ResourceLimits(), interval=0.25)` with the default
   10 MB disk quota over a small folder (a run's own) watching a sleeping `sleep 30` child: this process's CPU time (`time.process_time()`) over a
   window of ~5 s, as a percent of one core, against the same window without a monitor.
   The monitor thread's own CPU clock (pthread_getcpuclockid) is reported alongside.
4. Kill latency. Memory: a sandbox with `max_memory_mb=100` runs a cell that allocates and
   touches memory until killed; it prints "over" (flushed) as soon as its own RSS exceeds
   the limit, and the latency is the time from that marker reaching `on_output` to
   `run_python` returning. Baseline: the same cell as a bare subprocess that this process
   SIGKILLs and reaps the moment it reads "over" (the floor: pipe, signal, reap). Timeout:
   `time.sleep(100)` with `timeout=0.5`, reported as `duration_ms - 500 ms`, against
   `subprocess.run(..., timeout=0.5)` on a bare interpreter (wall time - 0.5 s).

Why ratios: absolute timings depend on the machine and the kernel, so each figure is
reported against a baseline measured in the same run. Only rows 1 and 2 carry a goal
("sandboxed faster than bare"); the others are information.

Run: `python benchmarks/bench_runner.py [--json] [-n 30]`. Needs a host where the runner
can confine (it runs as root here; the child runs as an unprivileged uid of its own). Every sandbox is
destroyed and every helper process killed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import psutil

try:
    import sandbox_kernel_ext  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import fmt_ns
from sandbox_kernel_ext.policy.models import CapabilityDeclaration, ResourceLimits
from sandbox_kernel_ext.runner.trusted.isolation import missing_layers
from sandbox_kernel_ext.runner.trusted.disk_quota import DiskQuota
from sandbox_kernel_ext.runner.trusted.manager import SandboxManager
from sandbox_kernel_ext.runner.trusted.monitor import ResourceMonitor

now = time.perf_counter_ns

PYTHON = os.path.realpath(sys.executable)
MONITOR_INTERVAL = 0.25
MEMORY_LIMIT_MB = 100
TIMEOUT_S = 0.5

# Allocates 4 MiB chunks filled by memset (so every page is touched), prints "over" once its
# own RSS exceeds the limit, then keeps allocating a little more and re-touching what it has
# until it is killed. Growth stops at limit + 96 MiB to stay well under the runner's
# RLIMIT_AS (limit + 256 MiB): the kill must come from the monitor, not from MemoryError.
MEMORY_CELL = """\
import os, sys, time
LIMIT = {limit_mb} * 1024 * 1024
CAP = LIMIT + 96 * 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE
chunks, held, over, i = [], 0, False, 0
while True:
    if held < CAP:
        chunks.append(bytearray(b"x") * (4 << 20))
        held += 4 << 20
    else:
        chunk = chunks[i % len(chunks)]
        chunk[::PAGE] = b"y" * len(range(0, len(chunk), PAGE))
        i += 1
        time.sleep(0.001)
    if not over and rss() > LIMIT:
        over = True
        sys.stdout.write("over\\n")
        sys.stdout.flush()
"""


# ------------------------------------------------------------------ timing helpers
# Every timed call starts after this pause, whichever side it is: calls come from a person
# or an agent, not back to back, and the launcher makes the next run's child (its "spare")
# in the quiet after a run; without the pause that work would land in the next baseline's
# time. Back-to-back calls, where it lands in ours, are rows of their own.
PAUSE_S = 0.02


def interleave(
    candidate: Callable[[], None],
    baseline: Callable[[], None],
    *,
    rounds: int,
    warmup: int = 0,
) -> None:
    """Run candidate and baseline alternately in ABBA order (neither always goes first),
    each after `PAUSE_S`. Each callable appends its own samples."""
    def paused(call: Callable[[], None]) -> None:
        time.sleep(PAUSE_S)
        call()

    for _ in range(warmup):
        paused(candidate)
        paused(baseline)
    for i in range(rounds):
        if i % 2 == 0:
            paused(candidate)
            paused(baseline)
        else:
            paused(baseline)
            paused(candidate)


def back_to_back(call: Callable[[], None], calls: int) -> float:
    """Nanoseconds per call over `calls` calls made one right after another."""
    time.sleep(PAUSE_S)
    t0 = now()
    for _ in range(calls):
        call()
    return (now() - t0) / calls


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{value:.2f} % core"
    return fmt_ns(value)


def row(
    measure: str,
    ours: float,
    base: float | None,
    goal: str,
    met: bool | None,
    samples: int,
    unit: str = "ns",
) -> dict:
    key = "ns" if unit == "ns" else "pct_core"
    return {
        "measure": measure,
        "unit": unit,
        f"ours_{key}": round(ours) if unit == "ns" else round(ours, 3),
        f"baseline_{key}": None if base is None else (round(base) if unit == "ns" else round(base, 3)),
        "ratio": round(ours / base, 2) if base else None,
        "goal": goal,
        "met": met,
        "samples": samples,
    }


def spread(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "median": round(statistics.median(ordered), 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
        "n": len(ordered),
    }


def kill_and_reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()


class Helpers:
    """Every helper Popen this script starts, so `main` can kill what an error left behind."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(argv, **kwargs)
        self.procs.append(proc)
        return proc

    def done(self, proc: subprocess.Popen) -> None:
        kill_and_reap(proc)
        with contextlib.suppress(ValueError):
            self.procs.remove(proc)

    def kill_all(self) -> None:
        for proc in list(self.procs):
            self.done(proc)


# --------------------------------------------------------- 1. first output of print(1)
def bench_print(m: SandboxManager, sid: str, helpers: Helpers, n: int) -> tuple[list[dict], dict]:
    first_ours: list[int] = []
    total_ours: list[int] = []
    duration_ours: list[float] = []
    first_base: list[int] = []
    total_base: list[int] = []

    def candidate() -> None:
        seen: list[int] = []

        def on_output(stream: str, text: str) -> None:
            if not seen and stream == "stdout" and text:
                seen.append(now())

        t0 = now()
        r = m.run_python(sid, "print(1)", on_output=on_output)
        t1 = now()
        if r.exit_code != 0 or r.stdout != "1\n" or not seen:
            raise RuntimeError(f"sandboxed print(1) failed: {r!r}")
        first_ours.append(seen[0] - t0)
        total_ours.append(t1 - t0)
        duration_ours.append(r.duration_ms)

    def baseline() -> None:
        t0 = now()
        proc = helpers.popen([PYTHON, "-I", "-S", "-c", "print(1)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        first = os.read(proc.stdout.fileno(), 1)
        t1 = now()
        rest, _ = proc.communicate()
        t2 = now()
        helpers.done(proc)
        if first + rest != b"1\n" or proc.returncode != 0:
            raise RuntimeError(f"bare print(1) failed: {first + rest!r}, rc {proc.returncode}")
        first_base.append(t1 - t0)
        total_base.append(t2 - t0)

    interleave(candidate, baseline, rounds=n)
    fo, fb = statistics.median(first_ours), statistics.median(first_base)
    to, tb = statistics.median(total_ours), statistics.median(total_base)
    rows = [
        row("print(1): time to first stdout", fo, fb, "sandboxed faster than bare", fo < fb, n),
        row("print(1): total time of the call", to, tb, "info", None, n),
    ]
    detail = {
        "first_output_ms": {"ours": spread([x / 1e6 for x in first_ours]),
                            "baseline": spread([x / 1e6 for x in first_base])},
        "total_ms": {"ours": spread([x / 1e6 for x in total_ours]),
                     "baseline": spread([x / 1e6 for x in total_base])},
        "ours_result_duration_ms": spread(duration_ours),
        "baseline_python": PYTHON,
    }
    return rows, detail


# ------------------------------------------------------------------ 2. /bin/true
def bench_true(m: SandboxManager, sid: str, n: int) -> tuple[list[dict], dict]:
    ours: list[int] = []
    base: list[int] = []

    def candidate() -> None:
        t0 = now()
        r = m.execute(sid, ["/bin/true"], timeout=30.0, on_output=lambda s, t: None)
        ours.append(now() - t0)
        if r.exit_code != 0 or r.killed:
            raise RuntimeError(f"sandboxed /bin/true failed: {r!r}")

    def baseline() -> None:
        t0 = now()
        subprocess.run(["/bin/true"], check=True)
        base.append(now() - t0)

    interleave(candidate, baseline, rounds=n)
    c, b = statistics.median(ours), statistics.median(base)
    rows = [row("/bin/true: time to completion", c, b, "sandboxed faster than bare", c < b, n)]
    detail = {"ours_ms": spread([x / 1e6 for x in ours]), "baseline_ms": spread([x / 1e6 for x in base])}
    return rows, detail


# ---------------------------------------------------- 2b. against bubblewrap, if installed
BWRAP_ARGS = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
              "--die-with-parent", "--new-session"]


def bench_bwrap(m: SandboxManager, sid: str, n: int) -> tuple[list[dict], dict]:
    """Ours against bubblewrap (Debian's `bwrap`), the confinement peers build on: the host
    bound read-only, every namespace new. Whole calls, output captured on both sides."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return [], {"bubblewrap": "not installed: rows left out"}
    commands = {
        "/bin/true": ["/bin/true"],
        "python print(1) as a command": [PYTHON, "-I", "-S", "-c", "print(1)"],
    }
    rows, detail = [], {"bubblewrap": subprocess.run([bwrap, "--version"], capture_output=True,
                                                     text=True).stdout.strip()}
    for label, argv in commands.items():
        ours: list[int] = []
        base: list[int] = []

        def candidate(argv: list[str] = argv, ours: list[int] = ours) -> None:
            t0 = now()
            r = m.execute(sid, argv, timeout=30.0)
            ours.append(now() - t0)
            if r.exit_code != 0 or r.killed:
                raise RuntimeError(f"sandboxed {argv} failed: {r!r}")

        def baseline(argv: list[str] = argv, base: list[int] = base) -> None:
            t0 = now()
            subprocess.run([bwrap, *BWRAP_ARGS, *argv], check=True, capture_output=True)
            base.append(now() - t0)

        interleave(candidate, baseline, rounds=n, warmup=2)
        c, b = statistics.median(ours), statistics.median(base)
        rows.append(row(f"{label}: execute vs bubblewrap", c, b, "no slower than bubblewrap",
                        c <= b, n))
        detail[label] = {"ours_ms": spread([x / 1e6 for x in ours]),
                         "bwrap_ms": spread([x / 1e6 for x in base])}
        # Back to back (medians of 5 batches of n calls, ABBA): a run's spare is then made
        # while the next call waits, so this is what a tight loop of calls gets.
        batches_ours: list[float] = []
        batches_base: list[float] = []
        interleave(lambda: batches_ours.append(back_to_back(candidate, n)),
                   lambda: batches_base.append(back_to_back(baseline, n)), rounds=5)
        cb, bb = statistics.median(batches_ours), statistics.median(batches_base)
        rows.append(row(f"{label}: execute vs bubblewrap, back to back", cb, bb, "info",
                        None, 5 * n))
        detail[label].update(back_to_back_ours_ms=spread([x / 1e6 for x in batches_ours]),
                             back_to_back_bwrap_ms=spread([x / 1e6 for x in batches_base]))
    return rows, detail


def bench_egress_start(m: SandboxManager, sid: str, n: int) -> tuple[list[dict], dict]:
    """What egress rules add to a run: the child's listener in its own network namespace,
    handed to the kernel's proxy (baseline: the same cell in a sandbox without rules)."""
    net = m.create_sandbox(CapabilityDeclaration.model_validate(
        {"network_egress_rules": [{"domain": "example.com"}]}))
    ours: list[int] = []
    base: list[int] = []

    def timed(target: str, samples: list[int]) -> None:
        t0 = now()
        r = m.run_python(target, "print(1)", timeout=30.0)
        samples.append(now() - t0)
        if r.exit_code != 0 or r.killed:
            raise RuntimeError(f"sandboxed print(1) failed: {r!r}")

    interleave(lambda: timed(net, ours), lambda: timed(sid, base), rounds=n, warmup=2)
    m.destroy(net)
    c, b = statistics.median(ours), statistics.median(base)
    rows = [row("print(1) with egress rules: whole call", c, b, "info", None, n)]
    return rows, {"ours_ms": spread([x / 1e6 for x in ours]), "baseline_ms": spread([x / 1e6 for x in base])}


# ------------------------------------------------------------- 3. monitor overhead
def bench_monitor(helpers: Helpers, window: float, rounds: int) -> tuple[list[dict], dict]:
    ours: list[float] = []
    base: list[float] = []
    thread_pct: list[float] = []
    polls: list[int] = []

    def thread_cpu(ident: int | None) -> float:
        """The thread's CPU clock (precise, unlike /proc's tick-sampled per-thread times)."""
        if ident is None:
            return 0.0
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (OSError, AttributeError):
            return 0.0

    quota_folder = tempfile.mkdtemp(prefix="sbx-bench-quota-")

    def measure(with_monitor: bool) -> None:
        sleeper = helpers.popen(["sleep", "30"])
        monitor = None
        try:
            count = [0]
            ident = None
            if with_monitor:
                # With the default 10 MB disk quota over a small folder, as a run has it
                # (its statfs look between polls every DISK_CHECK_INTERVAL included).
                monitor = ResourceMonitor(ResourceLimits(), interval=MONITOR_INTERVAL,
                                          disk=DiskQuota([quota_folder], 10 * 1024 * 1024))
                monitor.subscribe(lambda snap: count.__setitem__(0, count[0] + 1))
                monitor.start(sleeper.pid)
                ident = next((t.ident for t in threading.enumerate() if t.name == "sandbox-monitor"), None)
            th0 = thread_cpu(ident)
            c0, w0 = time.process_time(), time.perf_counter()
            time.sleep(window)
            c1, w1 = time.process_time(), time.perf_counter()
            th1 = thread_cpu(ident)
            pct = (c1 - c0) / (w1 - w0) * 100
            if with_monitor:
                ours.append(pct)
                thread_pct.append((th1 - th0) / (w1 - w0) * 100)
                polls.append(count[0])
            else:
                base.append(pct)
        finally:
            if monitor is not None:
                monitor.stop()
            helpers.done(sleeper)

    try:
        interleave(lambda: measure(True), lambda: measure(False), rounds=rounds)
    finally:
        shutil.rmtree(quota_folder, ignore_errors=True)
    c, b = statistics.median(ours), statistics.median(base)
    rows = [
        row(f"monitor CPU, {MONITOR_INTERVAL * 1000:.0f} ms interval, {window:g} s window",
            c, b, "info", None, rounds, unit="%"),
    ]
    detail = {
        "process_pct_core": {"ours": spread(ours), "baseline": spread(base)},
        "monitor_thread_pct_core": spread(thread_pct),
        "overhead_pct_core": round(c - b, 3),
        "polls_per_window": polls,
        "system_processes": len(psutil.pids()),
    }
    return rows, detail


# ---------------------------------------------------------------- 4. kill latency
def bench_kill(helpers: Helpers, n: int) -> tuple[list[dict], dict]:
    cell = MEMORY_CELL.format(limit_mb=MEMORY_LIMIT_MB)
    m = SandboxManager(monitor_interval=MONITOR_INTERVAL)
    mem_ours: list[int] = []
    mem_base: list[int] = []
    mem_reasons: list[str | None] = []
    killed_first = 0  # rounds the monitor ended before the cell saw itself over
    to_ours: list[float] = []
    to_wall_ours: list[float] = []
    to_base: list[float] = []
    to_reasons: list[str | None] = []
    try:
        mem_sid = m.create_sandbox(
            CapabilityDeclaration(resource_limits=ResourceLimits(max_memory_mb=MEMORY_LIMIT_MB))
        )
        to_sid = m.create_sandbox(CapabilityDeclaration())
        m.run_python(mem_sid, "pass")  # warm this manager's launcher
        m.run_python(to_sid, "pass")

        def mem_candidate() -> None:
            nonlocal killed_first
            # The monitor may see the limit passed before the cell's own check prints its
            # marker: then there is no latency to measure, and the round is run again.
            for _ in range(10):
                marker: list[int] = []

                def on_output(stream: str, text: str) -> None:
                    if not marker and stream == "stdout" and "over" in text:
                        marker.append(now())

                r = m.run_python(mem_sid, cell, timeout=60.0, on_output=on_output)
                t1 = now()
                mem_reasons.append(r.killed)
                if not r.killed or "memory" not in r.killed.lower():
                    raise RuntimeError(f"the memory cell was not killed for memory: {r.killed!r} {r.stderr[-500:]!r}")
                if marker:
                    mem_ours.append(t1 - marker[0])
                    return
                killed_first += 1
            raise RuntimeError("the monitor killed the memory cell before its marker ten times")

        def mem_baseline() -> None:
            proc = helpers.popen([PYTHON, "-I", "-S", "-c", cell], stdout=subprocess.PIPE, bufsize=0)
            try:
                line = proc.stdout.readline()
                if line != b"over\n":
                    raise RuntimeError(f"bare memory cell printed {line!r}")
                t0 = now()
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                mem_base.append(now() - t0)
            finally:
                helpers.done(proc)

        def to_candidate() -> None:
            t0 = now()
            r = m.run_python(to_sid, "import time; time.sleep(100)", timeout=TIMEOUT_S)
            t1 = now()
            to_reasons.append(r.killed)
            if not r.killed or "timeout" not in r.killed:
                raise RuntimeError(f"the sleeping cell was not killed for its timeout: {r!r}")
            to_ours.append(r.duration_ms * 1e6 - TIMEOUT_S * 1e9)
            to_wall_ours.append((t1 - t0) - TIMEOUT_S * 1e9)

        def to_baseline() -> None:
            t0 = now()
            try:
                subprocess.run([PYTHON, "-I", "-S", "-c", "import time; time.sleep(100)"], timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                raise RuntimeError("the bare sleeper ended by itself")
            to_base.append((now() - t0) - TIMEOUT_S * 1e9)

        interleave(mem_candidate, mem_baseline, rounds=n)
        interleave(to_candidate, to_baseline, rounds=n)
    finally:
        m.close()

    mc, mb = statistics.median(mem_ours), statistics.median(mem_base)
    tc, tb = statistics.median(to_ours), statistics.median(to_base)
    rows = [
        row(f"kill after memory breach ({MEMORY_LIMIT_MB} MB): 'over' -> return", mc, mb, "info", None, n),
        row(f"kill after timeout ({TIMEOUT_S:g} s): duration - timeout", tc, tb, "info", None, n),
    ]
    detail = {
        "memory_ms": {"ours": spread([x / 1e6 for x in mem_ours]), "baseline": spread([x / 1e6 for x in mem_base])},
        "memory_kill_reasons": sorted(set(map(str, mem_reasons))),
        "memory_killed_before_marker": killed_first,
        "timeout_overshoot_ms": {"ours_duration_ms": spread([x / 1e6 for x in to_ours]),
                                 "ours_wall": spread([x / 1e6 for x in to_wall_ours]),
                                 "baseline": spread([x / 1e6 for x in to_base])},
        "timeout_kill_reasons": sorted(set(map(str, to_reasons))),
    }
    return rows, detail


# ------------------------------------------------------------------------ main
def print_table(rows: list[dict]) -> None:
    headers = ("measure", "ours", "baseline", "ratio", "goal", "met")
    lines = []
    for r in rows:
        key = "ns" if r["unit"] == "ns" else "pct_core"
        lines.append((
            r["measure"],
            fmt(r[f"ours_{key}"], r["unit"]),
            fmt(r[f"baseline_{key}"], r["unit"]),
            f"{r['ratio']:,.2f}×" if r["ratio"] is not None else "-",
            r["goal"],
            "-" if r["met"] is None else ("yes" if r["met"] else "NO"),
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    cells = lambda values: "| " + " | ".join(  # noqa: E731
        f"{v:<{w}}" if i == 0 or i == 4 else f"{v:>{w}}" for i, (v, w) in enumerate(zip(values, widths))
    ) + " |"
    print(cells(headers))
    print("|" + "|".join(("-" * (w + 1) + ":") if 0 < i < 4 or i == 5 else ("-" * (w + 2))
                         for i, w in enumerate(widths)) + "|")
    for line in lines:
        print(cells(line))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("-n", "--runs", type=int, default=30,
                        help="interleaved rounds for the start-up measures (default 30)")
    parser.add_argument("--kill-runs", type=int, default=5, help="rounds for the kill latencies (default 5)")
    parser.add_argument("--monitor-window", type=float, default=5.0, help="seconds per monitor window (default 5)")
    parser.add_argument("--monitor-rounds", type=int, default=2,
                        help="monitor windows of each kind (default 2)")
    args = parser.parse_args()
    started = time.monotonic()
    warnings.simplefilter("ignore", UserWarning)  # missing layers are reported below instead
    helpers = Helpers()
    m = SandboxManager(monitor_interval=MONITOR_INTERVAL)
    try:
        sid = m.create_sandbox(CapabilityDeclaration())
        # Warm-up: the launcher's first fork pays for its start and imports.
        for _ in range(3):
            m.run_python(sid, "print(1)")
            m.execute(sid, ["/bin/true"])
            subprocess.run([PYTHON, "-I", "-S", "-c", "print(1)"], capture_output=True)
            subprocess.run(["/bin/true"])
        rows, detail = bench_print(m, sid, helpers, args.runs)
        true_rows, true_detail = bench_true(m, sid, args.runs)
        rows += true_rows
        bwrap_rows, bwrap_detail = bench_bwrap(m, sid, args.runs)
        rows += bwrap_rows
        egress_rows, egress_detail = bench_egress_start(m, sid, args.runs)
        rows += egress_rows
        launcher_pid = m.launcher_pid
    finally:
        m.close()
        helpers.kill_all()
    try:
        mon_rows, mon_detail = bench_monitor(helpers, args.monitor_window, args.monitor_rounds)
        rows += mon_rows
        kill_rows, kill_detail = bench_kill(helpers, args.kill_runs)
        rows += kill_rows
    finally:
        helpers.kill_all()
    result = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "euid": os.geteuid(),
        "missing_layers": missing_layers(),
        "launcher_pid": launcher_pid,
        "rows": rows,
        "detail": {"print": detail, "true": true_detail, "bubblewrap": bwrap_detail,
                   "egress_start": egress_detail,
                   "monitor": mon_detail, "kill": kill_detail},
        "runtime_s": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    missing = result["missing_layers"]
    print(f"Python {result['python']} on {result['platform']}, {result['cpus']} CPUs, euid {result['euid']}, "
          f"missing layers: {', '.join(missing) if missing else 'none'}")
    print()
    print_table(rows)
    print()
    p = detail
    print(f"print(1) first output ms (min/median/max): ours {p['first_output_ms']['ours']}, "
          f"bare {p['first_output_ms']['baseline']}; SandboxResult.duration_ms median "
          f"{p['ours_result_duration_ms']['median']}")
    print(f"monitor: thread alone {mon_detail['monitor_thread_pct_core']['median']:.2f} % core, "
          f"overhead over baseline {mon_detail['overhead_pct_core']:.2f} % core, "
          f"polls per window {mon_detail['polls_per_window']}, {mon_detail['system_processes']} processes on host")
    k = kill_detail
    print(f"memory kill ms: ours {k['memory_ms']['ours']}, bare SIGKILL floor {k['memory_ms']['baseline']}; "
          f"reasons {k['memory_kill_reasons']}; killed before the cell saw itself over "
          f"(round run again): {k['memory_killed_before_marker']}")
    print(f"timeout overshoot ms: ours (duration_ms) {k['timeout_overshoot_ms']['ours_duration_ms']}, "
          f"ours (wall) {k['timeout_overshoot_ms']['ours_wall']}, bare {k['timeout_overshoot_ms']['baseline']}; "
          f"reasons {k['timeout_kill_reasons']}")
    print(f"runtime {result['runtime_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
