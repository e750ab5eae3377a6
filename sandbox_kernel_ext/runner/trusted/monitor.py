"""aumai-sandbox's `ResourceMonitor`: watch a process tree and the agent's spend.

A daemon thread samples the whole tree rooted at the sandboxed process with psutil,
because a cell that forks (pip, a shell, multiprocessing) must not escape the budget
by moving its work into children. Tokens and cost are reported by the caller and are
checked at once, so an over-budget model call is caught before the next poll. The
limit decision itself stays in the pure `policy.limits.check_limits`.

Only the first breach is reported (`on_breach` is called once); what to do about it,
usually killing the tree, is the caller's business.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from ...policy.limits import check_limits as _check_limits
from ...policy.models import ResourceLimits
from ..linux.cpu_clock import read_seconds
from .disk_quota import DiskQuota

__all__ = ["ResourceMonitor", "sample_tree"]

logger = logging.getLogger(__name__)

_THREAD_NAME = "sandbox-monitor"
_MIB = 1024 * 1024
# How long stop() waits for a poll stuck in a slow callback. The thread is a daemon and
# polls no more once stopped, so giving up here leaks nothing that outlives the process.
_JOIN_TIMEOUT = 10.0
_FIRST_POLL_DELAY = 0.05
# How often a run's disk is looked at between polls (a statfs per filesystem): every 20 ms
# while its free space moves, every 100 ms while it holds still (most cells write nothing,
# and each look wakes the monitor's thread).
DISK_CHECK_INTERVAL = 0.02
DISK_QUIET_CHECK_INTERVAL = 0.1
# A run or a cell that ends sooner is never sampled (its usage is what the launcher and the
# tree's CPU clock report at its end) and shows no gauges; the monitor's thread is running
# from its first instant all the same. Memory has the address-space rlimit as a backstop
# until the first sample.
QUICK_RUN_SECONDS = 0.05


class ResourceMonitor:
    """Track CPU, memory and process count of a process tree, plus tokens, cost and
    elapsed time, against `ResourceLimits` (and an optional wall-clock `timeout`)."""

    def __init__(
        self,
        limits: ResourceLimits,
        *,
        interval: float = 0.25,
        on_breach: Callable[[str], None] | None = None,
        timeout: float | None = None,
        max_paused: float | None = None,
        cpu_baseline: float = 0.0,
        disk: DiskQuota | None = None,
        started_at: float | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self._limits = limits
        self._interval = float(interval)
        self._on_breach = on_breach
        self._timeout = timeout

        # `_lock` guards the numbers; `_notify_lock` is held while a subscriber runs so
        # that unsubscribe() returning means "no further calls" (re-entrant, so a
        # subscriber may unsubscribe itself).
        self._lock = threading.Lock()
        self._notify_lock = threading.RLock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._root: psutil.Process | None = None
        self._cpu_clock = -1
        self._first_poll_at = 0.0

        # When the elapsed clock began (a `time.monotonic()` value): a run's timeout counts
        # from the call, its start included, and runs on while the thread waits to start.
        self._started_at = time.monotonic() if started_at is None else started_at
        self._stopped_at: float | None = None
        self._paused_seconds = 0.0  # time spent waiting for a person does not count...
        self._max_paused = max_paused  # ...up to this much in all
        self._paused_since: float | None = None
        self._pauses = 0
        self._cpu_seconds = 0.0
        # CPU the tree had spent before this watch began (a session's earlier cells): a
        # budget per cell counts only what is spent from here on.
        self._cpu_baseline = cpu_baseline
        self._disk = disk  # the sandbox's folders on disk, walked now and then
        self._disk_bytes = 0
        self._memory_mb = 0.0
        self._peak_memory_mb = 0.0
        self._processes = 0
        self._peak_processes = 0
        self._cpu_percent = 0.0
        self._last_sample: tuple[float, float] | None = None  # (monotonic, cpu_seconds)
        self._tokens_used = 0
        self._cost_usd = 0.0
        self._exceeded: str | None = None

        self._subscribers: dict[int, Callable[[dict[str, Any]], None]] = {}
        self._ids = itertools.count()

    # -- lifecycle ---------------------------------------------------------------

    def start(self, pid: int | None = None, *, started_at: float | None = None,
              cpu_clock: int = -1, first_poll_at: float | None = None) -> None:
        """Start polling; with `pid`, also sample that process and all its descendants
        (`cpu_clock`: the tree's CPU clock descriptor, which the caller keeps open).

        A pid that is already gone is not an error: the run may have ended first.
        `started_at` (a `time.monotonic()` value) is when the elapsed clock began, if
        earlier than now (a run's timeout counts from the call, spawning included).
        `first_poll_at` (a `time.monotonic()` value): when the first sample is taken (by
        default a moment after `started_at`).
        """
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("ResourceMonitor.start() may be called only once")
            if pid is not None:
                try:
                    self._root = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    logger.debug("process %d is gone before monitoring started", pid)
                except psutil.AccessDenied:
                    logger.warning("cannot monitor process %d: access denied", pid)
            self._cpu_clock = cpu_clock
            self._started_at = time.monotonic() if started_at is None else started_at
            self._first_poll_at = (self._started_at + min(self._interval, _FIRST_POLL_DELAY)
                                   if first_poll_at is None else first_poll_at)
            self._thread = threading.Thread(target=self._run, name=_THREAD_NAME, daemon=True)
        try:
            self._thread.start()
        except BaseException:  # no thread to be had (the host out of processes): nothing to stop
            with self._lock:
                self._thread = None
            raise

    def stop(self) -> None:
        """Stop polling and join the thread. Idempotent; safe from `on_breach` itself."""
        with self._lock:
            if self._stopped_at is None:
                self._stopped_at = time.monotonic()
            thread = self._thread
        self._stop_event.set()
        if thread is None or thread is threading.current_thread():
            return
        thread.join(_JOIN_TIMEOUT)
        if thread.is_alive():
            logger.warning("resource monitor thread still busy in a callback after stop()")

    # -- reports from the caller --------------------------------------------------

    def record_tokens(self, count: int) -> None:
        """Add model tokens; checked at once so a breach need not wait for a poll."""
        if count < 0:
            raise ValueError(f"token count must not be negative, got {count!r}")
        with self._lock:
            self._tokens_used += int(count)
        self._evaluate()

    def record_cost(self, amount_usd: float) -> None:
        """Add spend in USD; checked at once like tokens."""
        if math.isnan(amount_usd) or amount_usd < 0:
            raise ValueError(f"cost must be a non-negative number, got {amount_usd!r}")
        with self._lock:
            self._cost_usd += float(amount_usd)
        self._evaluate()

    def record_memory(self, memory_mb: float) -> None:
        """Report memory measured elsewhere (e.g. inside a VM); raises the peak only."""
        if math.isnan(memory_mb) or memory_mb < 0:
            raise ValueError(f"memory must be a non-negative number, got {memory_mb!r}")
        with self._lock:
            self._peak_memory_mb = max(self._peak_memory_mb, float(memory_mb))
        self._evaluate()

    # -- queries ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Usage so far; the first five keys are aumai-sandbox's, the rest are current values."""
        with self._lock:
            return self._snapshot_locked()

    def check_limits(self) -> tuple[bool, str | None]:
        """`(True, None)` or `(False, reason)` for the current usage. No side effects."""
        with self._lock:
            return self._check_locked(self._snapshot_locked())

    def exceeded(self) -> str | None:
        """The first breach reason seen, or None."""
        with self._lock:
            return self._exceeded

    def subscribe(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call `callback(snapshot)` after every poll, from the monitor thread.

        Returns an unsubscribe function; once it returns, the callback is not called
        again. A callback that raises is logged and dropped.
        """
        key = next(self._ids)
        with self._notify_lock:
            self._subscribers[key] = callback

        def unsubscribe() -> None:
            with self._notify_lock:
                self._subscribers.pop(key, None)

        return unsubscribe

    # -- internals ------------------------------------------------------------------

    def pause_clock(self) -> None:
        """Stop counting elapsed time (while the run waits for an approval); nests."""
        with self._lock:
            self._pauses += 1
            if self._pauses == 1:
                self._paused_since = time.monotonic()

    def resume_clock(self) -> None:
        with self._lock:
            if self._pauses == 0:
                return
            self._pauses -= 1
            if self._pauses == 0 and self._paused_since is not None:
                self._paused_seconds += time.monotonic() - self._paused_since
                self._paused_since = None

    def elapsed(self) -> float:
        """Seconds the run has counted against its timeout."""
        with self._lock:
            return self._elapsed_locked()

    def _end_locked(self) -> float:
        return self._stopped_at if self._stopped_at is not None else time.monotonic()

    def _elapsed_locked(self, end: float | None = None) -> float:
        end = self._end_locked() if end is None else end
        return max(0.0, end - self._started_at - self._paused_locked(end))

    def _paused_locked(self, end: float) -> float:
        """Seconds of waiting for a person that do not count against the timeout (so far)."""
        paused = self._paused_seconds
        if self._paused_since is not None:
            paused += max(0.0, end - self._paused_since)
        if self._max_paused is not None:
            paused = min(paused, self._max_paused)
        return paused

    def _snapshot_locked(self) -> dict[str, Any]:
        end = self._end_locked()  # one instant for both clocks: they add up to the wall time
        return {
            "cpu_seconds": self._cpu_seconds,
            "peak_memory_mb": self._peak_memory_mb,
            "tokens_used": self._tokens_used,
            "cost_usd": self._cost_usd,
            "elapsed_seconds": self._elapsed_locked(end),
            "approval_wait_seconds": self._paused_locked(end),
            "memory_mb": self._memory_mb,
            "processes": self._processes,
            "peak_processes": self._peak_processes,
            "cpu_percent": self._cpu_percent,
            "disk_bytes": self._disk_bytes,
        }

    def _check_locked(self, snap: dict[str, Any]) -> tuple[bool, str | None]:
        ok, reason = _check_limits(snap, self._limits)
        if not ok:
            return ok, reason
        if self._timeout is not None and snap["elapsed_seconds"] > self._timeout:
            return False, f"timeout after {self._timeout:g} s"
        if self._disk is not None and (reason := self._disk.exceeded(snap["disk_bytes"])):
            return False, reason
        max_processes = getattr(self._limits, "max_processes", None)
        if max_processes is not None and snap["processes"] > max_processes:
            return False, (
                f"process limit exceeded: {snap['processes']} processes, limit is {max_processes}"
            )
        return True, None

    def _evaluate(self) -> dict[str, Any]:
        """Check limits and fire `on_breach` on the first breach (outside the lock, so a
        slow handler never blocks record_*() or snapshot())."""
        with self._lock:
            snap = self._snapshot_locked()
            ok, reason = self._check_locked(snap)
            first = not ok and self._exceeded is None
            if first:
                self._exceeded = reason
        if first and reason is not None:
            logger.info("resource limit breached: %s", reason)
            if self._on_breach is not None:
                try:
                    self._on_breach(reason)
                except Exception:
                    logger.exception("on_breach handler failed")
        return snap

    def _run(self) -> None:
        # The first sample waits a moment: a child's first milliseconds (its first output) are
        # when the caller is busiest, and a scan of /proc then would only compete with it; a
        # run that ends sooner is never sampled (its usage is what its end reports).
        with self._lock:
            first = self._first_poll_at
        self._wait_until(first)
        while not self._stop_event.is_set():
            try:
                self._poll()
                snap = self._evaluate()
                self._notify(snap)
            except Exception:  # never let one bad poll end the watch
                logger.exception("resource monitor poll failed")
            self._wait_until(time.monotonic() + self._interval)

    def _wait_until(self, deadline: float) -> None:
        """Wait for the next poll (or stop()); with a disk quota, look every
        `DISK_CHECK_INTERVAL` (`DISK_QUIET_CHECK_INTERVAL` while nothing moves) meanwhile whether the disk lost more than the quota has left,
        and start a walk at once if so (`DiskQuota.walk_now`): a burst of writes is stopped
        within that time and one walk, not the poll interval and the walks' pacing."""
        while not self._stop_event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._disk is None:
                self._stop_event.wait(remaining)
                continue
            pause = DISK_CHECK_INTERVAL if self._disk.moving else DISK_QUIET_CHECK_INTERVAL
            if self._stop_event.wait(min(remaining, pause)):
                return
            try:
                if self._disk.burst_seen():  # walked on the walk thread: polls go on meanwhile
                    self._disk.walk_now(lambda: tree_open_files(self._root), self._disk_measured)
            except Exception:  # never let one bad look end the watch
                logger.exception("resource monitor disk check failed")

    def _disk_measured(self, added: int) -> None:
        """A walk a burst asked for is done: its figure is judged at once."""
        with self._lock:
            self._disk_bytes = added
        self._evaluate()

    def _poll(self) -> None:
        if self._disk is not None:
            added = self._disk.walk_if_due(self._interval, lambda: tree_open_files(self._root))
            with self._lock:
                self._disk_bytes = added
        sample = sample_tree(self._root, self._cpu_clock)
        if sample is None:
            return  # no tree, or the root is gone: keep the last values
        cpu_seconds, memory_mb, processes = sample
        cpu_seconds = max(0.0, cpu_seconds - self._cpu_baseline)
        now = time.monotonic()
        with self._lock:
            # Children that exit without being reaped inside the tree take their CPU
            # time with them, so the sum can drop; usage already spent still counts.
            self._cpu_seconds = max(self._cpu_seconds, cpu_seconds)
            self._memory_mb = memory_mb
            self._peak_memory_mb = max(self._peak_memory_mb, memory_mb)
            self._processes = processes
            self._peak_processes = max(self._peak_processes, processes)
            if self._last_sample is not None:
                then, cpu_then = self._last_sample
                if now > then:
                    used = self._cpu_seconds - cpu_then
                    self._cpu_percent = max(0.0, used / (now - then) * 100)
            self._last_sample = (now, self._cpu_seconds)

    def _notify(self, snap: dict[str, Any]) -> None:
        with self._notify_lock:
            keys = list(self._subscribers)
        for key in keys:
            with self._notify_lock:
                callback = self._subscribers.get(key)
                if callback is None:
                    continue  # unsubscribed meanwhile
                try:
                    callback(dict(snap))
                except Exception:
                    logger.exception("resource monitor subscriber %r failed; dropped", callback)
                    self._subscribers.pop(key, None)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def sample_tree(root: psutil.Process | None, cpu_clock: int = -1
                ) -> tuple[float, float, int] | None:
    """`(cpu_seconds, memory_mb, processes)` of the tree, or None if the root is gone.

    Each process contributes its own CPU time plus that of the children it reaped
    (`children_user/system`): a reaped process's time moves into its parent's
    counters, so every second is counted exactly once, whoever reaped it. Children Linux
    reaps itself (their parent ignores SIGCHLD) move nowhere: the tree's `cpu_clock`
    (`linux/cpu_clock.py`), where the host gives one, counts them, and the larger wins.
    Read straight from /proc where Linux lists each thread's children (a scan of every
    process on the host, psutil's way, costs a millisecond or more per sample); psutil
    elsewhere.
    """
    if root is None:
        return None
    try:
        if not root.is_running():  # also false when the pid was reused
            return None
    except psutil.Error:
        return None
    pids = _tree_pids(root.pid)
    sample = _sample_with_psutil(root) if pids is None else _sample_proc(root, pids)
    if sample is None or cpu_clock < 0:
        return sample
    clock = read_seconds(cpu_clock)
    return (sample[0] if clock is None else max(sample[0], clock)), sample[1], sample[2]


_PF_EXITING = 0x4  # /proc/PID/stat's flags: the process is tearing itself down


def _sample_proc(root: psutil.Process, pids: list[int]) -> tuple[float, float, int] | None:
    """The tree's sample from /proc; None when none of it lives any more (every process
    exited, its memory being freed or gone): the last live values stand, not a zero."""
    cpu_ticks = rss_pages = processes = live = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat_file:
                fields = stat_file.read().rsplit(b")", 1)[1].split()
        except OSError:
            if pid == root.pid:
                return None
            continue
        processes += 1
        if fields[0] == b"Z":
            continue  # exited but unreaped: still holds a process slot
        cpu_ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        if int(fields[6]) & _PF_EXITING:
            continue  # its memory is on its way out: no reading of the tree's
        live += 1
        rss_pages += int(fields[21])
    if live == 0:
        return None
    return cpu_ticks / _TICKS, rss_pages * _PAGE / _MIB, processes


def tree_open_files(root: psutil.Process | None) -> list[str]:
    """/proc/PID/fd/N and /proc/PID/map_files/RANGE of everything the tree holds open or
    mapped (the disk quota counts the files among them that no longer have a name; a
    mapping's file can be read only with CAP_SYS_ADMIN, which a root kernel has)."""
    links = []
    for pid in (_tree_pids(root.pid) or []) if root is not None else []:
        for kind in ("fd", "map_files"):
            try:
                links += [f"/proc/{pid}/{kind}/{entry}"
                          for entry in os.listdir(f"/proc/{pid}/{kind}")]
            except OSError:
                continue
    return links


def _tree_pids(root: int) -> list[int] | None:
    """`root` and its descendants from /proc/PID/task/TID/children; None where Linux keeps no
    such file (built without CONFIG_PROC_CHILDREN) or /proc cannot tell."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return None
    pids = [root]
    index = 0
    while index < len(pids):
        pid = pids[index]
        index += 1
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile
        for tid in threads:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as children:
                    pids.extend(int(child) for child in children.read().split())
            except OSError:
                continue
    return pids


def _sample_with_psutil(root: psutil.Process) -> tuple[float, float, int] | None:
    try:
        tree = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None

    cpu_seconds = 0.0
    rss = 0
    processes = live = 0
    for proc in tree:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                rss_bytes = proc.memory_info().rss
        except psutil.ZombieProcess:
            processes += 1  # exited but unreaped: still holds a process slot
            continue
        except psutil.NoSuchProcess:
            if proc is root:
                return None
            continue
        except psutil.AccessDenied:
            processes += 1
            continue
        processes += 1
        live += 1
        rss += rss_bytes
        cpu_seconds += times.user + times.system
        cpu_seconds += getattr(times, "children_user", 0.0)
        cpu_seconds += getattr(times, "children_system", 0.0)
    if live == 0:  # every process exited: the last live values stand
        return None
    return cpu_seconds, rss / _MIB, processes
