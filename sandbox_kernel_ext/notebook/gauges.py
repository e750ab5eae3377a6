"""Live gauges of a sandboxed cell: CPU, memory, elapsed time, tokens and cost against limits.

The monitor thread calls `GaugePanel.update` directly while the cell runs (widget values set
from a background thread reach the frontend; on ipykernel 7.0 that thread is first given the
showing cell as its parent, `adopt_cell_parent`), so the panel is
its only writer: each update is one trait assignment, hence one comm message carrying every
value. `freeze` turns the panel into the run's summary, and its display into a static record
that a saved notebook shows without the kernel. The view is `js/gauges.js`; this module
only shapes and forwards numbers, it decides nothing about the limits.
"""

from __future__ import annotations

import html
import math
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anywidget
import traitlets
from IPython import get_ipython
from IPython.display import DisplayHandle, display

from .assets import js_asset
from ..runner.trusted.display import NO_TYPESETTING
from .kernel_routing import CellParent, adopt_cell_parent
from .widget_tree import close_tree

__all__ = ["CellGauges", "GaugePanel", "GaugeRow", "LIMIT_KEYS", "SNAPSHOT_KEYS", "WAIT_WORDS",
           "gauge_limits", "gauge_rows", "record_bundle", "record_html", "status_line",
           "summarize", "summary_line"]

SNAPSHOT_KEYS = (
    "cpu_seconds",
    "cpu_percent",
    "memory_mb",
    "peak_memory_mb",
    "elapsed_seconds",
    "tokens_used",
    "cost_usd",
    "processes",
    "approval_wait_seconds",
)
# A finished run's resource_usage adds these; the summary line reports them.
_EGRESS_KEYS = ("egress_allowed", "egress_denied")
_SUMMARY_KEYS = ("peak_processes", *_EGRESS_KEYS)
LIMIT_KEYS = ("memory_mb", "cpu_seconds", "timeout_seconds", "tokens", "cost_usd")
THRESHOLDS = {"warn": 0.75, "danger": 0.9}
# After the time a run spent waiting for a person, which its timeout does not count.
WAIT_WORDS = "waiting for your answer, not counted"


def _number(where: str, key: str, value: Any) -> float | int:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value)):
        raise ValueError(f"{where}[{key!r}] must be a finite number, got {value!r}")
    return value


def _readings(where: str, snapshot: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The known numeric keys of a snapshot; absent ones stay absent (the view shows a dash)."""
    if not isinstance(snapshot, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(snapshot).__name__}")
    return {k: _number(where, k, snapshot[k]) for k in keys if snapshot.get(k) is not None}


def _checked_outcome(outcome: Any) -> str:
    """How a run ended, as the summary line says it."""
    if not isinstance(outcome, str) or not outcome.strip():
        raise ValueError(f"outcome must be a non-empty string, got {outcome!r}")
    return outcome.strip()


def _limits(limits: Mapping[str, Any]) -> dict[str, float | None]:
    if not isinstance(limits, Mapping):
        raise TypeError(f"limits must be a dict, got {type(limits).__name__}")
    unknown = sorted(set(limits) - set(LIMIT_KEYS))
    if unknown:
        raise ValueError(f"limits has unknown key(s) {unknown}; known: {list(LIMIT_KEYS)}")
    out: dict[str, float | None] = {}
    for key in LIMIT_KEYS:
        value = limits.get(key)
        if value is not None:
            value = _number("limits", key, value)
            if value <= 0 or math.isinf(value):
                raise ValueError(f"limits[{key!r}] must be positive and finite or None, "
                                 f"got {value!r}")
        out[key] = value
    return out


def gauge_limits(resource_limits: Any, timeout_seconds: float | None) -> dict[str, Any]:
    """The panel's limits from a policy's `ResourceLimits` and the run's timeout."""
    return {
        "memory_mb": getattr(resource_limits, "max_memory_mb", None),
        "cpu_seconds": getattr(resource_limits, "max_cpu_seconds", None),
        "timeout_seconds": timeout_seconds,
        "tokens": getattr(resource_limits, "max_tokens", None),
        "cost_usd": getattr(resource_limits, "max_cost_usd", None),
    }


# -- text: the same numbers the view shows, for saved notebooks and nbconvert -------------

def _seconds(s: float) -> str:
    if s < 1:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    minutes, rest = divmod(int(s), 60)
    return f"{minutes} min {rest:02d} s"


def _megabytes(mb: float) -> str:
    return f"{mb / 1024:.2f} GB" if mb >= 1024 else f"{mb:.{1 if mb < 10 else 0}f} MB"


def _count(n: float) -> str:
    return f"{round(n):,}"


def _cost(usd: float) -> str:
    return f"${usd:.{4 if usd < 1 else 2}f}"


@dataclass(frozen=True)
class GaugeRow:
    """One gauge as the view shows it: `value` against `limit` (None: no bar), the text
    after the label, and the badge's words ("high", "near limit", "at limit")."""

    label: str
    value: float | None
    limit: float | None
    text: str
    words: str = ""

    @property
    def state(self) -> str:
        """The view's colour: "none" without a limit, else "ok", "warn" or "danger"."""
        if self.limit is None:
            return "none"
        return {"": "ok", "high": "warn"}.get(self.words, "danger")

    def line(self) -> str:
        return f"{self.label} {self.text}" + (f" {self.words}" if self.words else "")


def _row(label: str, value: float | None, limit: float | None, fmt: Any, *,
         prefix: str = "", suffix: str = "") -> GaugeRow:
    text = f"{prefix}{'—' if value is None else fmt(value)}"
    words = ""
    if limit is not None:
        text += f" of {fmt(limit)}"
        if value is not None:
            ratio = max(value, 0) / limit
            text += f" ({round(ratio * 100)}%)"
            if ratio >= THRESHOLDS["danger"]:
                words = "at limit" if ratio >= 1 else "near limit"
            elif ratio >= THRESHOLDS["warn"]:
                words = "high"
    return GaugeRow(label, value, limit, text + suffix, words)


def status_line(readings: Mapping[str, Any], outcome: str = "") -> str:
    """The line above the gauges: running, or the outcome, processes and egress after it."""
    r = readings
    frozen = bool(outcome)
    parts = [f"Sandbox {outcome}" if frozen else "Sandbox running"]
    if frozen and r.get("peak_processes") is not None:
        parts.append(f"{_count(r['peak_processes'])} process(es) at peak")
    elif r.get("processes") is not None:
        parts.append(f"{_count(r['processes'])} process(es)")
    if frozen and any(r.get(k) is not None for k in _EGRESS_KEYS):
        parts.append(f"egress {_count(r.get('egress_allowed') or 0)} allowed, "
                     f"{_count(r.get('egress_denied') or 0)} denied")
    return " · ".join(parts)


def gauge_rows(readings: Mapping[str, Any], limits: Mapping[str, Any],
               outcome: str = "") -> list[GaugeRow]:
    """The five gauges; after the run (`outcome`) memory is its peak and CPU has no rate."""
    r, lim = readings, limits
    frozen = bool(outcome)
    cpu_percent = r.get("cpu_percent")
    cpu = _row("CPU", r.get("cpu_seconds"), lim.get("cpu_seconds"), _seconds,
               suffix="" if frozen or cpu_percent is None else f" · {round(cpu_percent)}% now")
    if frozen:
        memory = _row("Memory", r.get("peak_memory_mb"), lim.get("memory_mb"), _megabytes,
                      prefix="peak ")
    else:
        peak = r.get("peak_memory_mb")
        memory = _row("Memory", r.get("memory_mb"), lim.get("memory_mb"), _megabytes,
                      suffix="" if peak is None else f" · peak {_megabytes(peak)}")
    waited = r.get("approval_wait_seconds")
    elapsed = _row("Elapsed", r.get("elapsed_seconds"), lim.get("timeout_seconds"), _seconds,
                   suffix=f" · {_seconds(waited)} {WAIT_WORDS}" if waited else "")
    return [cpu, memory, elapsed,
            _row("Tokens", r.get("tokens_used"), lim.get("tokens"), _count),
            _row("Cost", r.get("cost_usd"), lim.get("cost_usd"), _cost)]


def summarize(readings: Mapping[str, Any], limits: Mapping[str, Any], outcome: str = "") -> str:
    """One line per gauge, headed by the state of the run."""
    lines = [status_line(readings, outcome),
             *(row.line() for row in gauge_rows(readings, limits, outcome))]
    return "\n  ".join(lines)


def _used(row: GaugeRow) -> bool:
    """Tokens and cost show in one line only once something reported them (as the view)."""
    return row.label not in ("Tokens", "Cost") or bool(row.value)


def summary_line(readings: Mapping[str, Any], limits: Mapping[str, Any], outcome: str) -> str:
    """A run in one line: its state, then time, CPU, memory (tokens and cost if used)."""
    rows = [row.line() for row in gauge_rows(readings, limits, outcome) if _used(row)]
    return " · ".join([status_line(readings, outcome), *rows])


# -- the record a saved notebook keeps: static HTML, no widget manager needed -------------
_COLOURS = {"ok": "var(--jp-success-color1,#2e7d32)", "warn": "var(--jp-warn-color1,#ef6c00)",
            "danger": "var(--jp-error-color1,#c62828)"}


def _number_text(value: float) -> str:
    """A number as the view's `String(n)` writes it (aria-valuenow)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _meter_html(row: GaugeRow) -> str:
    if row.limit is None:
        return ""
    value = 0 if row.value is None else min(max(row.value, 0), row.limit)
    percent = 100 * value / row.limit
    aria = html.escape(f"{row.text}, {row.words}" if row.words else row.text, quote=True)
    return (f'<span role="meter" aria-label="{row.label}" aria-valuemin="0" '
            f'aria-valuemax="{_number_text(row.limit)}" aria-valuenow="{_number_text(value)}" '
            f'aria-valuetext="{aria}" style="display:inline-block;width:5em;height:0.8em;'
            f'border-radius:3px;overflow:hidden;background:var(--jp-layout-color3,#ddd)">'
            f'<span style="display:block;height:100%;width:{percent:.1f}%;'
            f'background:{_COLOURS[row.state]}"></span></span>')


def record_html(readings: Mapping[str, Any], limits: Mapping[str, Any], outcome: str) -> str:
    """The finished run as one line of static HTML, as the view's compact line shows it: what
    the saved notebook shows, trusted or not (a widget's saved output is a reference to a
    model that ends with the kernel)."""
    items = "".join(
        f'<span data-gauge="{row.label.lower()}" data-state="{row.state}" '
        'style="display:inline-flex;align-items:center;gap:4px">'
        f"{row.label} {_meter_html(row)} {html.escape(row.text)}"
        + (f" <b>{row.words}</b>" if row.words else "") + "</span>"
        for row in gauge_rows(readings, limits, outcome) if _used(row))
    return (f'<div class="skx-gauges {NO_TYPESETTING}" data-frozen="true" '
            'style="font-size:13px;padding:4px 0;'
            'display:flex;flex-wrap:wrap;align-items:center;gap:2px 12px">'
            f'<span role="status" style="font-weight:600">'
            f"{html.escape(status_line(readings, outcome))}</span>{items}</div>")


def record_bundle(readings: Mapping[str, Any], limits: Mapping[str, Any],
                  outcome: str) -> dict[str, str]:
    """A finished run's gauges as static HTML and text, with no widget in it."""
    return {"text/plain": summary_line(readings, limits, outcome),
            "text/html": record_html(readings, limits, outcome)}


class GaugePanel(anywidget.AnyWidget):  # type: ignore[misc]
    """Gauges of one sandboxed run; one writer (the monitor thread), then frozen by the caller."""

    _esm = js_asset("gauges.js")

    limits = traitlets.Dict().tag(sync=True)
    readings = traitlets.Dict().tag(sync=True)
    outcome = traitlets.Unicode("").tag(sync=True)
    # The view colours by these; the text repr marks the same fractions (THRESHOLDS).
    thresholds = traitlets.Dict(THRESHOLDS, read_only=True).tag(sync=True)

    def __init__(self, *, limits: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(limits=limits, **kwargs)
        # Serialises update() (monitor thread) against freeze() (the cell's thread), so a
        # late poll can never overwrite the summary and ipywidgets' sync state is never
        # touched by two threads at once.
        self._write_lock = threading.Lock()
        self._handle: DisplayHandle | None = None
        self._cell: tuple[Any, CellParent] | None = None  # (kernel, the cell that showed it)

    @traitlets.validate("limits")
    def _check_limits(self, proposal: dict[str, Any]) -> dict[str, float | None]:
        return _limits(proposal["value"])

    @property
    def frozen(self) -> bool:
        return bool(self.outcome)

    def show(self) -> None:
        """Display the panel with a display id, so `freeze` can also refresh its saved text;
        the showing cell is where later updates from other threads belong."""
        kernel = getattr(get_ipython(), "kernel", None)
        if kernel is not None:
            self._cell = (kernel, CellParent.of_current_context(kernel))
        self._handle = display(self, display_id=True)

    def _adopt_cell(self) -> None:
        if self._cell is not None:
            adopt_cell_parent(*self._cell)

    def update(self, snapshot: Mapping[str, Any]) -> None:
        """Show a monitor snapshot; safe from any thread, ignored once frozen or closed."""
        readings = _readings("snapshot", snapshot, SNAPSHOT_KEYS)
        self._adopt_cell()
        with self._write_lock:
            if self.frozen or self.comm is None or readings == self.readings:
                return
            self.readings = readings

    def freeze(self, resource_usage: Mapping[str, Any], *, outcome: str) -> None:
        """Turn the panel into the run's summary: final usage and how the run ended, in one
        message. A displayed panel is then replaced by its record (`record_bundle`), which a
        saved notebook shows without the kernel, and closed."""
        outcome = _checked_outcome(outcome)
        readings = _readings("resource_usage", resource_usage, SNAPSHOT_KEYS + _SUMMARY_KEYS)
        self._adopt_cell()
        with self._write_lock:
            if self.comm is None:
                return
            with self.hold_sync():
                self.readings = readings
                self.outcome = outcome
        if self._handle is not None:
            self._handle.update(record_bundle(self.readings, self.limits, self.outcome),
                                raw=True)
            self.retire()

    def retire(self) -> None:
        """Close the panel and its layout once a record has taken its place; an update
        racing with it (on the monitor thread) finds it closed."""
        with self._write_lock:
            close_tree(self)

    def text(self) -> str:
        """The plain-text summary shown where widgets do not render."""
        return summarize(self.readings, self.limits, self.outcome)

    def __repr__(self) -> str:
        # anywidget's _repr_mimebundle_ uses repr() as the bundle's text/plain.
        return self.text()


# Until a cell has run this long its gauges are one line of text: a quicker cell never makes
# a widget, whose messages would cost it more than the cell itself.
SHOW_AFTER = 0.5
_RUNNING = {"text/plain": "Sandbox running…",
            "text/html": '<div class="skx-gauges" data-frozen="false" style="font-size:13px;'
                         'padding:4px 0;font-weight:600" role="status">Sandbox running…</div>'}


class _SendFromTheIOThread:
    """The display publisher's socket, whose message is handed to the kernel's I/O thread
    through that thread's queue: a flush the thread is carrying out (its streams' text
    taken, their flag already down, the text not yet queued) finishes first, so the text
    goes ahead of the display."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket

    def send_multipart(self, *args: Any, **kwargs: Any) -> None:
        self._socket.io_thread.schedule(lambda: self._socket.send_multipart(*args, **kwargs))


class _PublisherWithoutWaiting:
    """The kernel's display publisher, except that it does not wait on the I/O thread for
    the streams' flush (twice per display: most of what the gauges cost a quick cell)."""

    def __init__(self, publisher: Any) -> None:
        self._publisher = publisher
        self.pub_socket = _SendFromTheIOThread(publisher.pub_socket)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._publisher, name)

    def _flush_streams(self) -> None:
        pass


def _streams_hold_text(io_thread: Any) -> bool:
    """Whether text written to the kernel's streams may not be with their I/O thread yet
    (ipykernel's streams raise a flag when they schedule a flush; any other stream, or one
    of another thread, counts as holding)."""
    from ipykernel.iostream import OutStream

    return not all(isinstance(stream, OutStream) and stream.pub_thread is io_thread
                   and getattr(stream, "_flush_pending", True) is False
                   for stream in (sys.stdout, sys.stderr))


def _publish(bundle: Mapping[str, Any], handle: DisplayHandle, *, update: bool) -> None:
    """Show `bundle` as `handle`'s display (raw), or update it in place. The kernel's
    publisher first waits for the streams' flush, so that a display comes after the text
    printed before it; that wait is skipped where it can change nothing: for an update in
    place (it has no position to keep) and when no text is held (the display then reaches
    the I/O thread through its queue, behind any flush under way). Under `%%capture` or
    outside ipykernel the display goes the ordinary way."""
    from ipykernel.zmqshell import ZMQDisplayPublisher

    publisher = getattr(get_ipython(), "display_pub", None)
    io_thread = getattr(getattr(publisher, "pub_socket", None), "io_thread", None)
    if (type(publisher) is not ZMQDisplayPublisher or io_thread is None
            or (not update and _streams_hold_text(io_thread))):
        if update:
            handle.update(bundle, raw=True)
        else:
            handle.display(bundle, raw=True)
        return
    ZMQDisplayPublisher.publish(_PublisherWithoutWaiting(publisher), data=dict(bundle),
                                metadata={}, transient={"display_id": handle.display_id},
                                update=update)


class CellGauges:
    """A `%%sandbox` cell's gauges, in one place of its output from start to end: a line saying
    it runs, the live panel once the cell has run for `show_after` seconds (a wait for a
    person included), and the run's record when it ends (`record_bundle`). In terminal
    IPython: one summary line at the end. `update` is called on the monitor's thread, `show`
    and `freeze` on the cell's."""

    def __init__(self, *, limits: Mapping[str, Any], show_after: float | None = None) -> None:
        self.limits = _limits(limits)
        self.show_after = SHOW_AFTER if show_after is None else show_after
        self.panel: GaugePanel | None = None
        self._lock = threading.Lock()
        self._handle: DisplayHandle | None = None
        self._cell: tuple[Any, CellParent] | None = None
        self._started: float | None = None  # when it was first shown
        self._in_terminal = False
        self._done = False

    def show(self) -> None:
        """Show the gauges at this point of the cell's output (again after a clear)."""
        kernel = getattr(get_ipython(), "kernel", None)
        if kernel is None:
            self._in_terminal = True
            return
        self._cell = (kernel, CellParent.of_current_context(kernel))
        with self._lock:
            if self._started is None:
                self._started = time.monotonic()
            if self.panel is None:
                self._handle = DisplayHandle()
                _publish(_RUNNING, self._handle, update=False)
            else:
                self._handle = display(self.panel, display_id=True)

    def update(self, snapshot: Mapping[str, Any]) -> None:
        """A monitor snapshot (checked first): the live panel takes the line's place once the
        cell is long enough to watch, then shows each snapshot."""
        _readings("snapshot", snapshot, SNAPSHOT_KEYS)
        with self._lock:
            if (self._done or self._handle is None or self._cell is None
                    or self._started is None):
                return
            if self.panel is None:
                if time.monotonic() - self._started < self.show_after:
                    return
                adopt_cell_parent(*self._cell)
                self.panel = GaugePanel(limits=self.limits)
                self.panel._cell = self._cell
                self._handle.update(self.panel)
            panel = self.panel
        panel.update(snapshot)

    def freeze(self, resource_usage: Mapping[str, Any], *, outcome: str) -> None:
        """Replace whatever shows by the run's record; later snapshots are ignored."""
        outcome = _checked_outcome(outcome)
        readings = _readings("resource_usage", resource_usage, SNAPSHOT_KEYS + _SUMMARY_KEYS)
        with self._lock:
            if self._done:
                return
            self._done = True
            panel, handle = self.panel, self._handle
        try:
            if self._in_terminal:
                print(summary_line(readings, self.limits, outcome), flush=True)
            elif handle is not None and self._cell is not None:
                adopt_cell_parent(*self._cell)
                _publish(record_bundle(readings, self.limits, outcome), handle, update=True)
        finally:
            if panel is not None:
                panel.retire()
