"""ResourceMonitor against real child processes (no psutil mocks).

Waits use generous deadlines only so a broken monitor fails instead of hanging; no test
asserts how fast anything happens.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import pytest

from sandbox_kernel_ext.policy.models import ResourceLimits
from sandbox_kernel_ext.runner.trusted.monitor import ResourceMonitor, sample_tree

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses POSIX process groups")

DEADLINE = 20.0
INTERVAL = 0.05

ALLOCATE_150MB = (
    "import sys, time\n"
    "data = b'x' * (150 * 1024 * 1024)\n"  # filled, so every page is resident
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def wait_for(
    predicate: Callable[[], bool], what: str, state: Callable[[], object] | None = None
) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            seen = f" (last seen: {state()})" if state is not None else ""
            pytest.fail(f"gave up waiting for {what}{seen}")
        time.sleep(0.02)


@contextmanager
def child(code: str) -> Iterator[subprocess.Popen[str]]:
    """A Python child in its own process group, so cleanup reaches grandchildren too."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextmanager
def monitoring(monitor: ResourceMonitor, pid: int | None = None) -> Iterator[ResourceMonitor]:
    monitor.start(pid)
    try:
        yield monitor
    finally:
        monitor.stop()


def _stat_times(pid: int) -> str:
    """utime, stime, cutime, cstime in ticks, for a failure message."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return " ".join(stat.read().decode().rsplit(")", 1)[1].split()[11:15])
    except OSError as exc:
        return repr(exc)


def wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"


class Breaches:
    """An on_breach handler that records every call."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.threads: list[str] = []
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.threads.append(threading.current_thread().name)
        self.event.set()

    def wait(self) -> str:
        assert self.event.wait(DEADLINE), "no breach reported"
        return self.reasons[0]


def no_monitor_threads() -> bool:
    return not any(t.name == "sandbox-monitor" for t in threading.enumerate())


# -- memory and the process tree -------------------------------------------------------


def test_memory_of_a_child_is_measured_and_breaches() -> None:
    breaches = Breaches()
    monitor = ResourceMonitor(
        ResourceLimits(max_memory_mb=100), interval=INTERVAL, on_breach=breaches
    )
    with child(ALLOCATE_150MB) as proc, monitoring(monitor, proc.pid):
        wait_ready(proc)
        reason = breaches.wait()
        assert "Memory limit" in reason
        wait_for(lambda: monitor.snapshot()["peak_memory_mb"] >= 140, "peak >= 140 MB")
        snap = monitor.snapshot()
        assert snap["memory_mb"] >= 140
        assert snap["processes"] == 1
        assert monitor.exceeded() == reason
        assert breaches.threads == ["sandbox-monitor"]
    assert breaches.reasons == [reason]  # once, though every later poll is over too


def test_grandchild_memory_counts_toward_the_tree() -> None:
    code = (
        "import subprocess, sys, time\n"
        f"g = subprocess.Popen([sys.executable, '-c', {ALLOCATE_150MB!r}],\n"
        "                      stdout=subprocess.PIPE, text=True)\n"
        "print(g.stdout.readline().strip(), flush=True)\n"
        "time.sleep(60)\n"
    )
    breaches = Breaches()
    monitor = ResourceMonitor(
        ResourceLimits(max_memory_mb=100), interval=INTERVAL, on_breach=breaches
    )
    with child(code) as proc, monitoring(monitor, proc.pid):
        wait_ready(proc)
        wait_for(lambda: monitor.snapshot()["peak_memory_mb"] >= 140, "peak >= 140 MB")
        wait_for(lambda: monitor.snapshot()["processes"] >= 2, "two processes in the tree")
        assert "Memory limit" in breaches.wait()


def test_last_values_are_kept_when_the_root_is_gone() -> None:
    monitor = ResourceMonitor(ResourceLimits(), interval=INTERVAL)
    with child(ALLOCATE_150MB) as proc, monitoring(monitor, proc.pid):
        wait_ready(proc)
        wait_for(lambda: monitor.snapshot()["memory_mb"] >= 140, "memory >= 140 MB")
        proc.kill()
        proc.wait()
        seen: list[dict[str, Any]] = []
        monitor.subscribe(seen.append)
        wait_for(lambda: len(seen) >= 3, "polls after the root exited")
        assert seen[-1]["peak_memory_mb"] >= 140
        assert seen[-1]["memory_mb"] >= 140
        assert monitor.exceeded() is None


def test_a_tree_that_has_only_exited_processes_gives_no_reading() -> None:
    """An exited root not yet reaped (or one freeing its memory) reads 0 MB: the monitor
    took that for the tree's last value when a poll came in that window (a loaded machine
    widened it). Now such a tree gives no sample, so the last live values stand."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        root = psutil.Process(proc.pid)
        deadline = time.monotonic() + 60  # liveness only
        while root.status() != psutil.STATUS_ZOMBIE:  # exited; not reaped until wait()
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        assert sample_tree(root) is None
    finally:
        proc.wait()


def test_process_limit() -> None:
    code = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
        " for _ in range(3)]\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    breaches = Breaches()
    monitor = ResourceMonitor(
        ResourceLimits(max_processes=2), interval=INTERVAL, on_breach=breaches
    )
    with child(code) as proc, monitoring(monitor, proc.pid):
        wait_ready(proc)
        reason = breaches.wait()
        assert reason.startswith("process limit exceeded: ")
        assert reason.endswith("processes, limit is 2")


# -- CPU -------------------------------------------------------------------------------


def test_cpu_spin_breaches() -> None:
    breaches = Breaches()
    monitor = ResourceMonitor(
        ResourceLimits(max_cpu_seconds=0.5), interval=INTERVAL, on_breach=breaches
    )
    with child("while True:\n    pass\n") as proc, monitoring(monitor, proc.pid):
        assert "CPU limit" in breaches.wait()
        assert monitor.snapshot()["cpu_seconds"] > 0.5


def test_cpu_of_reaped_and_exited_children_still_counts() -> None:
    # The grandchild burns CPU and is reaped by the root; its time must survive as the
    # root's children_user/system, and the total must never go down. It spins for 0.8 s and
    # the check asks for 0.6: /proc reports whole clock ticks, each of the four counters
    # rounded down, and a loaded machine's accounting is coarse.
    spin = "import time\\nend = time.process_time() + 0.8\\nwhile time.process_time() < end: pass"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', '{spin}'])\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    monitor = ResourceMonitor(ResourceLimits(), interval=INTERVAL)
    seen: list[float] = []
    monitor.subscribe(lambda snap: seen.append(snap["cpu_seconds"]))
    with child(code) as proc, monitoring(monitor, proc.pid):
        wait_ready(proc)
        wait_for(
            lambda: monitor.snapshot()["cpu_seconds"] >= 0.6,
            "reaped CPU time",
            lambda: (monitor.snapshot(), _stat_times(proc.pid)),
        )
        wait_for(lambda: monitor.snapshot()["processes"] == 1, "grandchild gone")
        count = len(seen)
        wait_for(lambda: len(seen) >= count + 3, "more polls")
    assert seen == sorted(seen)
    snap = monitor.snapshot()
    assert snap["cpu_seconds"] >= 0.6
    assert snap["cpu_percent"] >= 0


# -- tokens, cost, timeout ---------------------------------------------------------------


def test_record_tokens_breaches_immediately() -> None:
    breaches = Breaches()
    monitor = ResourceMonitor(ResourceLimits(max_tokens=100), on_breach=breaches)
    monitor.record_tokens(60)
    assert breaches.reasons == []
    monitor.record_tokens(41)  # no thread, no poll: the check is synchronous
    assert breaches.reasons == ["Token limit exceeded: 101 tokens used, limit is 100"]
    assert monitor.exceeded() == breaches.reasons[0]
    assert monitor.check_limits() == (False, breaches.reasons[0])
    monitor.record_cost(1.0)  # a second breach is not reported again
    assert len(breaches.reasons) == 1
    assert monitor.exceeded() == breaches.reasons[0]


def test_record_cost_breaches_immediately_while_running() -> None:
    breaches = Breaches()
    monitor = ResourceMonitor(ResourceLimits(max_cost_usd=0.10), interval=60, on_breach=breaches)
    with monitoring(monitor):
        monitor.record_cost(0.05)
        assert monitor.check_limits() == (True, None)
        monitor.record_cost(0.06)
        assert breaches.reasons and breaches.reasons[0].startswith("Cost limit exceeded")
        assert breaches.threads == [threading.current_thread().name]


def test_invalid_records_are_rejected() -> None:
    monitor = ResourceMonitor(ResourceLimits())
    with pytest.raises(ValueError):
        monitor.record_tokens(-1)
    with pytest.raises(ValueError):
        monitor.record_cost(-0.01)
    with pytest.raises(ValueError):
        monitor.record_cost(math.nan)
    snap = monitor.snapshot()
    assert snap["tokens_used"] == 0
    assert snap["cost_usd"] == 0.0


def test_record_memory_raises_the_peak_only() -> None:
    monitor = ResourceMonitor(ResourceLimits(max_memory_mb=512))
    monitor.record_memory(300)
    monitor.record_memory(200)
    assert monitor.snapshot()["peak_memory_mb"] == 300
    assert monitor.check_limits() == (True, None)
    monitor.record_memory(600)
    assert monitor.exceeded() == "Memory limit exceeded: 600.0 MB used, limit is 512 MB"


def test_snapshot_keys() -> None:
    monitor = ResourceMonitor(ResourceLimits())
    assert set(monitor.snapshot()) == {
        "cpu_seconds", "peak_memory_mb", "tokens_used", "cost_usd", "elapsed_seconds",
        "memory_mb", "processes", "peak_processes", "cpu_percent", "approval_wait_seconds",
        "disk_bytes",
    }


def test_timeout_breach_without_pid() -> None:
    breaches = Breaches()
    monitor = ResourceMonitor(
        ResourceLimits(), interval=INTERVAL, on_breach=breaches, timeout=0.2
    )
    with monitoring(monitor):
        assert breaches.wait() == "timeout after 0.2 s"
        assert monitor.snapshot()["elapsed_seconds"] > 0.2
        assert breaches.threads == ["sandbox-monitor"]


# -- subscribers --------------------------------------------------------------------------


def test_subscribe_and_unsubscribe() -> None:
    monitor = ResourceMonitor(ResourceLimits(), interval=INTERVAL)
    mine: list[dict[str, Any]] = []
    ticks: list[dict[str, Any]] = []
    unsubscribe = monitor.subscribe(mine.append)
    monitor.subscribe(ticks.append)
    with monitoring(monitor):
        monitor.record_tokens(7)
        wait_for(lambda: len(mine) >= 3, "three snapshots")
        assert mine[-1]["tokens_used"] == 7
        assert set(mine[-1]) >= {"cpu_seconds", "elapsed_seconds", "processes"}
        unsubscribe()
        unsubscribe()  # idempotent
        count, ticks_then = len(mine), len(ticks)
        wait_for(lambda: len(ticks) >= ticks_then + 3, "more polls")
        assert len(mine) == count


def test_raising_subscriber_is_dropped_and_polling_continues(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = []

    def broken(snap: dict[str, Any]) -> None:
        calls.append(snap)
        raise RuntimeError("subscriber bug")

    monitor = ResourceMonitor(ResourceLimits(), interval=INTERVAL)
    good: list[dict[str, Any]] = []
    monitor.subscribe(broken)
    monitor.subscribe(good.append)
    with caplog.at_level(logging.ERROR), monitoring(monitor):
        wait_for(lambda: len(good) >= 3, "polls after a failing subscriber")
        assert any(t.name == "sandbox-monitor" for t in threading.enumerate())
    assert len(calls) == 1
    assert "subscriber bug" in caplog.text


# -- stop ---------------------------------------------------------------------------------


def test_stop_is_idempotent_and_joins() -> None:
    monitor = ResourceMonitor(ResourceLimits(), interval=INTERVAL)
    monitor.stop()  # before start: harmless
    monitor = ResourceMonitor(ResourceLimits(), interval=60)
    monitor.start()
    assert not no_monitor_threads()
    monitor.stop()  # interrupts the 60 s sleep
    monitor.stop()
    assert no_monitor_threads()
    elapsed = monitor.snapshot()["elapsed_seconds"]
    assert monitor.snapshot()["elapsed_seconds"] == elapsed  # frozen once stopped


def test_stop_from_on_breach_and_from_outside() -> None:
    monitor: ResourceMonitor
    stopped = threading.Event()

    def on_breach(reason: str) -> None:
        monitor.stop()  # from the monitor thread itself: must not try to join itself
        stopped.set()

    monitor = ResourceMonitor(
        ResourceLimits(), interval=INTERVAL, on_breach=on_breach, timeout=0.1
    )
    with monitoring(monitor):
        assert stopped.wait(DEADLINE)
    assert no_monitor_threads()


def test_start_on_a_vanished_pid_still_tracks_the_rest() -> None:
    with child("pass") as proc:
        proc.wait()
        pid = proc.pid
    monitor = ResourceMonitor(ResourceLimits(max_tokens=10), interval=INTERVAL)
    seen: list[dict[str, Any]] = []
    monitor.subscribe(seen.append)
    with monitoring(monitor, pid):
        wait_for(lambda: len(seen) >= 2, "polls")
        monitor.record_tokens(11)
    assert seen[-1]["processes"] == 0
    assert monitor.exceeded() is not None and monitor.exceeded().startswith("Token limit")
