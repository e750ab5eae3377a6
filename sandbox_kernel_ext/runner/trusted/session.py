"""A stateful code interpreter under confinement: one long-lived confined Python process whose
cells share their variables, imports, functions and open files.

`SandboxManager.start_session(sandbox_id)` starts one; `PythonSession.run_cell(code)` runs a
cell and returns a `SandboxResult` with its streams, displays (`outputs`), error and usage.
Budgets: memory is the session's (the process tree's resident memory, checked while a cell
runs); CPU and wall time count per cell. A breach ends the session: its process tree is
killed, and the result says so (`killed` starts with "session ended"). `interrupt()` raises
KeyboardInterrupt in the running cell, which keeps the session; a cell that does not stop
within `interrupt_grace` seconds ends the session.
"""

from __future__ import annotations

import base64
import logging
import pickle
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from ...policy.errors import SandboxError
from ...policy.limits import check_limits
from ...policy.models import SandboxResult
from .control import CellEvents, ControlChannel, InputCallback
from .display import DisplayOutput
from .launcher_client import SpawnedChild
from .monitor import ResourceMonitor, sample_tree, tree_open_files
from .plumbing import OutputCallback, OutputStream, Plumbing, drain

if TYPE_CHECKING:
    import socket

    from .manager import SandboxManager, StartCallback, _Sandbox

__all__ = ["PythonSession", "SessionEnded", "DisplayCallback", "IdleWatch"]

logger = logging.getLogger(__name__)
DisplayCallback = Callable[[DisplayOutput], None]
INTERRUPT_GRACE = 3.0  # seconds a cell has to stop after an interrupt before the session ends


class SessionEnded(SandboxError):
    """The session's process is gone (a breach, a kill, `close()`): start a new one."""


class PythonSession:
    """One confined Python process serving cells in order (not thread-safe for two cells at
    once: a second `run_cell` while one runs raises SandboxError)."""

    interrupt_grace = INTERRUPT_GRACE

    def __init__(self, manager: SandboxManager, sandbox: _Sandbox, child: SpawnedChild,
                 plumbing: Plumbing, listener: socket.socket | None) -> None:
        self.session_id = str(uuid.uuid4())
        self.sandbox_id = sandbox.sandbox_id
        self._manager, self._sandbox, self._child = manager, sandbox, child
        self._plumbing, self._listener = plumbing, listener
        self.started_at = time.time()
        self.cells_run = 0
        self.end_reason: str | None = None
        self._monitor: ResourceMonitor | None = None
        self._lock = threading.Lock()
        self._busy = False
        self._baseline_cpu = 0.0
        self._root = _process(child.pid)  # sampled at each cell's end (the monitor polls)
        started_with = sample_tree(self._root, self._child.cpu_clock)
        # The session's CPU seconds when its last cell ended (or when it started).
        self._session_cpu = started_with[0] if started_with else 0.0
        self._control: ControlChannel = manager.control_channel(
            sandbox, child, plumbing.take_control(), lambda: self._monitor, CellEvents())

    # -- state ------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Not ended, not being killed (a breach between cells: a frame that broke the
        protocol), and its process still there."""
        return (self.end_reason is None and self._sandbox.kill_reason is None
                and not self._child.exited.is_set())

    @property
    def state(self) -> str:
        """"running" (a cell), "idle", or "ended"."""
        if not self.alive:
            return "ended"
        return "running" if self._busy else "idle"

    @property
    def pid(self) -> int:
        return self._child.pid

    def memory_mb(self) -> float:
        """The session's resident memory now (its whole process tree), 0 once ended."""
        sample = sample_tree(self._root, self._child.cpu_clock) if self.alive else None
        return round(sample[1], 1) if sample else 0.0

    def info(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "sandbox_id": self.sandbox_id,
                "state": self.state, "pid": self.pid if self.alive else None,
                "uptime_seconds": round(time.time() - self.started_at, 1),
                "cells_run": self.cells_run, "memory_mb": self.memory_mb(),
                "end_reason": self.end_reason}

    # -- running ----------------------------------------------------------------------------
    def run_cell(
        self,
        code: str,
        *,
        inputs: dict[str, Any] | None = None,
        outputs: Any = (),
        timeout: float = 30.0,
        cell: int | None = None,
        on_output: OutputCallback | None = None,
        on_display: DisplayCallback | None = None,
        on_input: InputCallback | None = None,
        on_start: StartCallback | None = None,
    ) -> SandboxResult:
        """Run `code` in the session; wait for it to finish, be interrupted or end the session.

        `inputs` are pickled in from this side; `outputs` names variables to bring back as
        JSON-safe data (no other name crosses). `cell` is the number tracebacks show
        (`Cell In[n]`; default: the session's count). `on_display(DisplayOutput)` gets each
        display, already made safe (`display.safe_bundle`), as it happens; `on_input(prompt,
        password)` answers `input()` (raise EOFError to refuse, with the reason).
        """
        if not isinstance(code, str):
            raise SandboxError("code must be a string")
        if not timeout > 0:
            raise SandboxError(f"timeout must be positive, got {timeout!r}")
        outputs = list(outputs)
        try:
            packed = base64.b64encode(pickle.dumps(dict(inputs))).decode("ascii") if inputs else ""
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"input variables cannot be sent to the sandbox: {exc}") from None
        if not self.alive:
            self._end(self._sandbox.kill_reason or "its process exited")
        with self._lock:
            if not self.alive:
                raise SessionEnded(f"the session has ended ({self.end_reason or 'its process exited'}); "
                                   "start a new one")
            if self._busy:
                raise SandboxError("the session is running another cell")
            self._busy = True
        number = cell if cell is not None else self.cells_run + 1
        try:
            return self._run(code, packed, outputs, timeout, number, on_output, on_display,
                             on_input, on_start)
        finally:
            self._busy = False

    def _run(self, code: str, packed: str, outputs: list[str], timeout: float, number: int,
             on_output: OutputCallback | None, on_display: DisplayCallback | None,
             on_input: InputCallback | None, on_start: StartCallback | None) -> SandboxResult:
        manager, sandbox, child = self._manager, self._sandbox, self._child
        limits = sandbox.capability.resource_limits
        cap = int(limits.max_output_mb * 1024 * 1024)
        streams = {self._plumbing.stdout: OutputStream("stdout", cap, on_output),
                   self._plumbing.stderr: OutputStream("stderr", cap, on_output)}
        # Displays come in order with the text without draining the pipes here (that could
        # pass on text printed after the display first): the child sends a display once the
        # text before it was read, and prints on once the display was read (child/session.py).
        events = CellEvents(outputs, on_display=on_display,
                            on_input=self._waiting_for(on_input), session=self.session_id,
                            cell=number)
        self._control.events = events
        # CPU counts from the end of the previous cell: work a thread of the session does
        # between cells is charged to the next one (a sample here would cost every cell).
        self._baseline_cpu = self._session_cpu
        monitor = ResourceMonitor(
            limits, interval=manager.monitor_interval, timeout=timeout,
            on_breach=lambda reason: manager._breach(sandbox, child, reason),
            max_paused=manager.broker.timeout or 600.0,
            cpu_baseline=self._baseline_cpu,
            disk=sandbox.disk,
        )
        self._monitor = sandbox.monitor = monitor
        egress_before = dict(sandbox.proxy.counts) if sandbox.proxy is not None else {}
        started = time.monotonic()
        watching = []

        def watch() -> None:  # once the cell is not a quick one: its gauges
            if not watching:
                watching.append(True)
                if on_start is not None:
                    on_start(monitor)

        try:
            # Watched by the monitor's own thread from the first instant, whatever the pump
            # is busy with (an input() or a display the caller renders).
            monitor.start(child.pid, started_at=started, cpu_clock=child.cpu_clock,
                          first_poll_at=started + manager.quick_run_seconds)
            self._control.send_command({"type": "run", "cell": number, "code": code,
                                        "inputs": packed, "outputs": outputs})
            self._pump(streams, monitor, timeout, events, watch,
                       started + manager.quick_run_seconds)
        except TimeoutError:
            manager._breach(sandbox, child, "it stopped reading its control channel")
        except OSError as exc:  # the control socket is gone: so is the session
            manager._breach(sandbox, child, f"its control channel failed ({exc.strerror})")
        except BaseException:
            manager._breach(sandbox, child, "interrupted")
            child.exited.wait(timeout=10)
            self._end("interrupted")
            raise
        finally:
            monitor.stop()
            self._monitor = sandbox.monitor = None
            # Frames between cells find no cell (and the callers' objects are let go).
            self._control.events = CellEvents(session=self.session_id, cell=-1)
        self.cells_run += 1
        # A breach ends the session even when the cell's end came first (the caller was still
        # drawing a display or waiting on a person when the budget ran out).
        if not events.done.is_set() or sandbox.kill_reason is not None:
            if not events.done.is_set():
                drain(streams)
            # Its channels ended without the cell's end: the process may still be running
            # (it closed them), so it is killed before the session is said to have ended.
            reason = (sandbox.kill_reason or monitor.exceeded()
                      or "it closed its output and control channels")
            manager._breach(sandbox, child, reason)
            child.exited.wait(timeout=10)
            self._end(reason)
        return self._result(streams, events, monitor, started, egress_before)

    def _pump(self, streams: dict[int, OutputStream], monitor: ResourceMonitor, timeout: float,
              events: CellEvents, watch: Callable[[], None], watch_at: float) -> None:
        """Until the cell is done or the session gone, watched by the monitor from `watch_at`
        on; an interrupt asks the cell to stop, and ends the session if it does not within
        `interrupt_grace` (or on a second one)."""
        try:
            self._manager._pump(self._child, streams, self._control, monitor, timeout,
                                self._sandbox, until=lambda: events.done.is_set()
                                or time.monotonic() >= watch_at, wake_at=watch_at)
            if not events.done.is_set():
                watch()
                self._manager._pump(self._child, streams, self._control, monitor, timeout,
                                    self._sandbox, until=events.done.is_set)
            return
        except KeyboardInterrupt:
            watch()
            self.interrupt()
        deadline = time.monotonic() + self.interrupt_grace
        try:
            self._manager._pump(self._child, streams, self._control, monitor, timeout,
                                self._sandbox,
                                until=lambda: events.done.is_set() or time.monotonic() > deadline)
        except KeyboardInterrupt:
            pass  # a second interrupt: end it now
        if not events.done.is_set():
            self._manager._breach(self._sandbox, self._child,
                                  f"interrupted, and the cell did not stop within "
                                  f"{self.interrupt_grace:g} s")
            self._manager._pump(self._child, streams, self._control, monitor, timeout,
                                self._sandbox)

    def check_idle(self) -> None:
        """Between cells no monitor runs: end the session if its tree holds more memory or
        processes than its limits, or has spent more CPU since its last cell than a cell may
        (a thread left working, children left running)."""
        with self._lock:
            if self._busy or not self.alive or self._plumbing is None:
                return
            sample = sample_tree(self._root, self._child.cpu_clock)
            if sample is None:
                return
            cpu, memory, processes = sample
            limits = self._sandbox.capability.resource_limits
            ok, reason = check_limits({"cpu_seconds": cpu - self._session_cpu,
                                       "peak_memory_mb": memory}, limits)
            if ok and processes > limits.max_processes:
                ok, reason = False, (f"process limit exceeded: {processes} processes, limit "
                                     f"is {limits.max_processes}")
            if ok and (disk_reason := self._idle_disk()) is not None:
                ok, reason = False, disk_reason
            if ok:
                return
            reason = f"{reason}, while no cell ran"
            self.end_reason = reason  # from here a cell finds the session ended
        self._manager._breach(self._sandbox, self._child, reason)
        self._child.exited.wait(timeout=10)
        self._end(reason)

    def _idle_disk(self) -> str | None:
        """Why the session is over its disk quota between cells (a thread left writing), or
        None. Walks run on the quota's walk thread: when due, and at once when the disk lost
        more than the quota has left since the last; this look judges the last walk's figure."""
        disk = self._sandbox.disk
        if disk is None:
            return None
        open_files = lambda: tree_open_files(self._root)  # noqa: E731
        if disk.burst_seen():
            disk.walk_now(open_files, lambda added: None)
        return disk.exceeded(disk.walk_if_due(self._manager.monitor_interval, open_files))

    def interrupt(self) -> bool:
        """KeyboardInterrupt in the running cell (the session and its variables stay)."""
        return self._child.send_signal(signal.SIGINT)

    def _waiting_for(self, on_input: InputCallback | None) -> InputCallback | None:
        """While a person types an answer, the cell's clock stops (as for an approval)."""
        if on_input is None:
            return None

        def ask(prompt: str, password: bool) -> str:
            monitor = self._monitor
            if monitor is not None:
                monitor.pause_clock()
            try:
                return on_input(prompt, password)
            finally:
                if monitor is not None:
                    monitor.resume_clock()

        return ask

    def _result(self, streams: dict[int, OutputStream], events: CellEvents,
                monitor: ResourceMonitor, started: float,
                egress_before: dict[str, int]) -> SandboxResult:
        usage = monitor.snapshot()
        final = sample_tree(self._root, self._child.cpu_clock) if self.end_reason is None else None
        if final is not None:  # a cell quicker than the monitor's first poll still counts
            cpu, memory, processes = final
            self._session_cpu = cpu
            usage["cpu_seconds"] = max(usage["cpu_seconds"], cpu - self._baseline_cpu)
            usage["memory_mb"] = memory
            usage["peak_memory_mb"] = max(usage["peak_memory_mb"], memory)
            usage["processes"] = processes
            usage["peak_processes"] = max(usage["peak_processes"], processes)
        for key in ("elapsed_seconds", "approval_wait_seconds", "cpu_seconds"):
            usage[key] = round(usage[key], 4)
        usage["session_memory_mb"] = round(usage.get("memory_mb", 0.0), 2)
        if events.dropped_displays:
            usage["displays_dropped"] = events.dropped_displays
        sandbox = self._sandbox
        stdout, stderr = self._manager._count_run(sandbox, usage, started, egress_before, streams)
        killed = None
        error = None
        if self.end_reason is not None:
            killed = f"session ended: {self.end_reason}; its variables are gone"
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + f"[sandbox] {killed}\n"
        elif events.error is not None:
            ename, evalue, traceback = events.error
            error = {"ename": ename, "evalue": evalue, "traceback": traceback}
        exit_code = -1 if killed else (_exit_code(error) if error else 0)
        # Built from checked values of ours: validation would only cost every cell its time.
        return SandboxResult.model_construct(
            exit_code=exit_code, stdout=stdout, stderr=stderr,
            duration_ms=(time.monotonic() - started) * 1000, resource_usage=usage,
            killed=killed, variables={} if killed else (events.variables or {}),
            outputs=[_output_json(output) for output in events.displays], error=error,
        )

    # -- ending -----------------------------------------------------------------------------
    def _end(self, reason: str) -> None:
        """The process is gone (or going): release what the session held, once."""
        with self._lock:
            if self.end_reason is not None and self._plumbing is None:
                return
            self.end_reason = self.end_reason or reason
            plumbing, self._plumbing = self._plumbing, None
        self._manager._session_ended(self, self._child, plumbing, self._control, self._listener)

    def close(self, reason: str = "closed") -> None:
        """End the session: its whole process tree is killed (SIGKILL to PID 1 of its
        namespace: nothing of it runs again, though the launcher may reap it a moment
        later). Idempotent."""
        if self._plumbing is None:
            return
        self._manager._breach(self._sandbox, self._child, reason)
        self._end(reason)

    def __enter__(self) -> PythonSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exit_code(error: dict[str, Any]) -> int:
    """1 for an error; `sys.exit(n)` in a cell gives n (as the process would have)."""
    if error["ename"] == "SystemExit":
        try:
            return int(error["evalue"]) or 1
        except ValueError:
            return 1
    return 1


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _output_json(output: DisplayOutput) -> dict[str, Any]:
    entry: dict[str, Any] = {"kind": output.kind}
    if output.kind == "clear":
        entry["wait"] = output.wait
    else:
        entry.update(data=output.data, metadata=output.metadata)
        if output.display_id is not None:
            entry["display_id"] = output.display_id
    return entry


class IdleWatch:
    """One thread per manager that has every idle session check its budgets each
    `interval()` seconds (`PythonSession.check_idle`); started with the first session."""

    def __init__(self, interval: Callable[[], float]) -> None:
        self._interval = interval
        self._sessions: set[PythonSession] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, session: PythonSession) -> None:
        with self._lock:
            self._sessions.add(session)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sandbox-idle-watch",
                                                daemon=True)
                self._thread.start()

    def discard(self, session: PythonSession) -> None:
        with self._lock:
            self._sessions.discard(session)

    def _run(self) -> None:
        while not self._stop.wait(self._interval()):
            with self._lock:
                sessions = list(self._sessions)
            for session in sessions:
                try:
                    session.check_idle()
                except Exception:  # noqa: BLE001 - one session's trouble is not the others'
                    logger.exception("idle check of session %s failed", session.session_id)

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
