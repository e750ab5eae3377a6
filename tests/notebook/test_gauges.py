"""GaugePanel in a real kernel: updates from a background thread reach the client while the
cell is still running, one comm message per update; freeze gives the summary; text repr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel_ext.notebook.gauges import (
    SNAPSHOT_KEYS,
    WAIT_WORDS,
    GaugePanel,
    gauge_limits,
    summarize,
)

# The `kernel` fixture and KernelSession come from tests/notebook/conftest.py: a real kernel
# through jupyter_client, with the test acting as the frontend.

LIMITS = {"memory_mb": 100, "cpu_seconds": 10, "timeout_seconds": 20, "tokens": 1000,
          "cost_usd": None}
WAIT = 60.0  # liveness bound on the cells' own waits; never a measure of speed


def updates_for(comm_id: str, msgs: list[dict]) -> list[dict]:
    """The state of every widget update sent on `comm_id` (whichever thread sent it)."""
    return [m["content"]["data"]["state"] for m in msgs
            if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id
            and m["content"]["data"].get("method") == "update"]


def is_idle(msg_id: str, msg: dict) -> bool:
    return (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
            and msg["parent_header"].get("msg_id") == msg_id)


def show_panel(kernel: Any, name: str) -> str:
    """Create and display a GaugePanel called `name` in the kernel; return its comm id."""
    msg_id = kernel.run(textwrap.dedent(f"""
        from sandbox_kernel_ext.notebook.gauges import GaugePanel
        {name} = GaugePanel(limits={LIMITS!r})
        {name}.show()
        """))
    [comm_id] = kernel.displayed_models(msg_id)
    state = kernel.states[comm_id]
    assert state["_model_name"] == "AnyModel"
    assert state["limits"] == LIMITS and state["outcome"] == ""
    assert "export default" in state["_esm"]
    [shown] = [m["content"] for m in kernel.outputs(msg_id) if m["msg_type"] == "display_data"]
    assert shown["data"]["text/plain"].startswith("Sandbox running")
    assert shown["transient"]["display_id"]
    assert not [m for m in kernel.outputs(msg_id) if m["msg_type"] == "execute_result"]
    return comm_id


def test_thread_updates_arrive_while_the_cell_still_runs(kernel: Any) -> None:
    comm_id = show_panel(kernel, "panel")
    with tempfile.TemporaryDirectory(prefix="gauge-flag-") as folder:
        flag = Path(folder) / "release"
        # The cell cannot end before the test has seen the updates over iopub: if they were
        # held back until the cell finished, this test would fail on its bounded wait.
        msg_id = kernel.execute(textwrap.dedent(f"""
            import pathlib, threading, time
            def feed():
                for i in range(1, 6):
                    panel.update({{"cpu_seconds": i / 2, "cpu_percent": 10.0 * i,
                                   "memory_mb": 18.0 * i, "peak_memory_mb": 18.0 * i,
                                   "elapsed_seconds": float(i), "tokens_used": 100 * i,
                                   "cost_usd": 0.01 * i, "processes": i,
                                   "approval_wait_seconds": 0.0}})
                    time.sleep(0.02)
            feeder = threading.Thread(target=feed)
            feeder.start()
            feeder.join()
            deadline = time.monotonic() + {WAIT}
            while not pathlib.Path({str(flag)!r}).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            print("released")
            """))
        kernel.wait_for(lambda _m: len(updates_for(comm_id, kernel.messages)) >= 5,
                        "five gauge updates while the cell runs")
        assert not any(is_idle(msg_id, m) for m in kernel.messages), "the cell ended first"
        assert kernel.text(msg_id) == ""
        flag.touch()
        kernel.wait_idle(msg_id)
    assert kernel.error(msg_id) is None
    assert kernel.text(msg_id) == "released\n"
    states = updates_for(comm_id, kernel.messages)
    assert [set(s) for s in states] == [{"readings"}] * 5  # one message per update, all values
    assert [s["readings"]["memory_mb"] for s in states] == [18.0, 36.0, 54.0, 72.0, 90.0]
    assert all(set(s["readings"]) == set(SNAPSHOT_KEYS) for s in states)
    assert states[-1]["readings"]["tokens_used"] == 500


def test_real_monitor_thread_drives_the_panel(kernel: Any) -> None:
    """The writer in production: a ResourceMonitor watching a real child, subscribed."""
    comm_id = show_panel(kernel, "watched")
    kernel.run(textwrap.dedent(f"""
        import subprocess, time
        from sandbox_kernel_ext.policy.models import ResourceLimits
        from sandbox_kernel_ext.runner.trusted.monitor import ResourceMonitor
        child = subprocess.Popen(["sleep", "30"])
        monitor = ResourceMonitor(ResourceLimits(max_tokens=1000), interval=0.05, timeout=20)
        unsubscribe = monitor.subscribe(watched.update)
        fed = []  # snapshots the panel was given: a starved monitor thread gives fewer
        unsubscribe_count = monitor.subscribe(fed.append)
        try:
            monitor.start(child.pid)
            monitor.record_tokens(800)
            deadline = time.monotonic() + {WAIT}
            while ((len(fed) < 4 or watched.readings.get("elapsed_seconds", 0) < 0.3
                    or watched.readings.get("tokens_used") != 800)
                   and time.monotonic() < deadline):
                time.sleep(0.02)
        finally:
            unsubscribe()
            unsubscribe_count()
            monitor.stop()
            child.kill()
            child.wait()
        """))
    states = updates_for(comm_id, kernel.messages)
    assert len(states) >= 3, states
    elapsed = [s["readings"]["elapsed_seconds"] for s in states]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 0.3
    assert states[-1]["readings"]["tokens_used"] == 800
    assert any(s["readings"]["processes"] == 1 and s["readings"]["memory_mb"] > 0 for s in states)


def test_freeze_sends_one_summary_and_ignores_later_updates(kernel: Any) -> None:
    comm_id = show_panel(kernel, "done")
    usage = {"cpu_seconds": 1.5, "cpu_percent": 0.0, "memory_mb": 0.0, "peak_memory_mb": 91.0,
             "elapsed_seconds": 20.4, "tokens_used": 10, "cost_usd": 0.002, "processes": 0,
             "peak_processes": 2, "egress_allowed": 3, "egress_denied": 1}
    before = len(kernel.messages)
    msg_id = kernel.run(f"done.freeze({usage!r}, outcome='killed: timeout after 20 s')")
    states = updates_for(comm_id, kernel.messages[before:])
    assert len(states) == 1 and set(states[0]) == {"readings", "outcome"}, states
    assert states[0]["outcome"] == "killed: timeout after 20 s"
    assert states[0]["readings"] == usage
    [refreshed] = [m["content"] for m in kernel.outputs(msg_id)
                   if m["msg_type"] == "update_display_data"]
    # The display becomes the panel's record, which a saved notebook shows without the
    # kernel; the widget is closed.
    assert set(refreshed["data"]) == {"text/plain", "text/html"}, refreshed["data"]
    record = refreshed["data"]["text/html"]
    assert 'data-frozen="true"' in record and "near limit" in record
    assert 'aria-label="Memory"' in record and 'aria-valuenow="91"' in record
    assert any(m["msg_type"] == "comm_close" and m["content"]["comm_id"] == comm_id
               for m in kernel.messages[before:])
    text = refreshed["data"]["text/plain"]
    assert text == (
        "Sandbox killed: timeout after 20 s · 2 process(es) at peak · egress 3 allowed, 1 denied"
        " · CPU 1.5 s of 10.0 s (15%) · Memory peak 91 MB of 100 MB (91%) near limit"
        " · Elapsed 20.4 s of 20.0 s (102%) at limit · Tokens 10 of 1,000 (1%) · Cost $0.0020")
    before = len(kernel.messages)
    late = kernel.run("done.update({'memory_mb': 5.0, 'elapsed_seconds': 30.0})\n"
                      "print(done.outcome, done.readings['elapsed_seconds'])")
    assert updates_for(comm_id, kernel.messages[before:]) == []
    assert kernel.text(late) == "killed: timeout after 20 s 20.4\n"
    shown = kernel.run("done")
    [result] = [m["content"]["data"] for m in kernel.outputs(shown)
                if m["msg_type"] == "execute_result"]
    assert result["text/plain"].splitlines()[0] == text.split(" · CPU")[0]


# -- in-process: input checks and thread safety (no frontend needed) ------------------------

def test_bad_limits_and_snapshots_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['memory'\]"):
        GaugePanel(limits={"memory": 10})
    with pytest.raises(ValueError, match=r"limits\['cpu_seconds'\] must be positive"):
        GaugePanel(limits={"cpu_seconds": 0})
    with pytest.raises(ValueError, match=r"limits\['tokens'\] must be a finite number"):
        GaugePanel(limits={"tokens": "many"})
    panel = GaugePanel(limits={})
    assert panel.limits == dict.fromkeys(LIMITS)
    with pytest.raises(ValueError, match=r"limits\['memory_mb'\] must be positive"):
        panel.limits = {"memory_mb": -1}
    assert panel.limits == dict.fromkeys(LIMITS)
    with pytest.raises(ValueError,
                       match=r"snapshot\['memory_mb'\] must be a finite number, got True"):
        panel.update({"memory_mb": True})
    with pytest.raises(ValueError, match=r"resource_usage\['cost_usd'\] must be a finite number"):
        panel.freeze({"cost_usd": float("nan")}, outcome="finished")
    with pytest.raises(ValueError, match="outcome must be a non-empty string"):
        panel.freeze({}, outcome=" ")
    with pytest.raises(TypeError, match="snapshot must be a dict"):
        panel.update([1, 2])  # type: ignore[arg-type]
    assert not panel.frozen and panel.readings == {}


def test_concurrent_updates_never_overwrite_the_frozen_summary() -> None:
    panel = GaugePanel(limits=LIMITS)
    sent: list[dict[str, Any]] = []
    panel.observe(lambda change: sent.append(change["new"]), names="readings")
    stop = threading.Event()

    def hammer(offset: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            panel.update({"elapsed_seconds": float(offset + i), "memory_mb": 1.0})

    writers = [threading.Thread(target=hammer, args=(k * 10**6,)) for k in range(3)]
    for w in writers:
        w.start()
    try:
        while len(sent) < 50:
            time.sleep(0.001)
        panel.freeze({"elapsed_seconds": -1.0}, outcome="finished")
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert panel.readings == {"elapsed_seconds": -1.0}
    assert sent[-1] == {"elapsed_seconds": -1.0}
    assert panel.outcome == "finished"


def test_summary_text_of_a_run_that_waited_for_a_person() -> None:
    readings = {"cpu_seconds": 0.5, "cpu_percent": 40.0, "memory_mb": 30.0,
                "peak_memory_mb": 50.0, "elapsed_seconds": 2.0, "approval_wait_seconds": 7.25}
    running = summarize(readings, LIMITS).splitlines()
    assert running[1:4] == [
        "  CPU 0.50 s of 10.0 s (5%) · 40% now",
        "  Memory 30 MB of 100 MB (30%) · peak 50 MB",
        f"  Elapsed 2.0 s of 20.0 s (10%) · 7.2 s {WAIT_WORDS}",
    ]
    frozen = summarize({**readings, "peak_processes": 1}, LIMITS, "finished").splitlines()
    assert frozen[:4] == [
        "Sandbox finished · 1 process(es) at peak",
        "  CPU 0.50 s of 10.0 s (5%)",
        "  Memory peak 50 MB of 100 MB (50%)",
        f"  Elapsed 2.0 s of 20.0 s (10%) · 7.2 s {WAIT_WORDS}",
    ]


def test_gauge_limits_maps_the_policy_budgets() -> None:
    from sandbox_kernel_ext.policy.models import ResourceLimits

    limits = gauge_limits(ResourceLimits(max_memory_mb=256, max_cpu_seconds=5), 12.5)
    assert limits == {"memory_mb": 256, "cpu_seconds": 5.0, "timeout_seconds": 12.5,
                      "tokens": 100_000, "cost_usd": 0.10}
    assert GaugePanel(limits=limits).limits == limits
    assert json.loads(json.dumps(gauge_limits(ResourceLimits(), None)))["timeout_seconds"] is None


def test_terminal_ipython_prints_one_summary_line(tmp_path: Path) -> None:
    """Where nothing can update a view, no placeholders: one line after the cell's output."""
    script = tmp_path / "cell.ipy"
    script.write_text("%load_ext sandbox_kernel_ext\n"
                      "get_ipython().run_cell_magic('sandbox', '', \"print('hello from inside')\")\n")
    done = subprocess.run(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--colors=NoColor",
         str(script)], capture_output=True, text=True, timeout=WAIT, cwd=tmp_path,
        env=dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython")))
    assert done.returncode == 0, done.stderr
    *_, said, summary = done.stdout.splitlines()
    assert said == "hello from inside", done.stdout
    assert summary.startswith("Sandbox finished · "), done.stdout
    assert " · CPU " in summary and " · Memory peak " in summary and " · Elapsed " in summary
    assert "—" not in done.stdout and "Tokens" not in done.stdout, done.stdout


# -- a cell's gauges: a line, the panel once the run is long enough to watch, the record --------

CELL_GAUGES = """
import threading, time
from sandbox_kernel_ext.notebook.gauges import CellGauges
gauges = CellGauges(limits={limits!r}, show_after={show_after!r})
gauges.show()
def feed():
    for elapsed in {elapsed!r}:
        gauges.update({{"elapsed_seconds": elapsed, "memory_mb": 10.0}})
        time.sleep(0.05)
worker = threading.Thread(target=feed)
worker.start(); worker.join()
gauges.freeze({{"elapsed_seconds": {last!r}, "peak_memory_mb": 12.0}}, outcome="finished")
"""


def _cell_gauges(kernel: Any, elapsed: list[float],
                 show_after: float) -> tuple[list[dict], list[str]]:
    msg_id = kernel.run(CELL_GAUGES.format(limits=LIMITS, elapsed=elapsed, last=elapsed[-1],
                                           show_after=show_after))
    assert kernel.error(msg_id) is None, kernel.error(msg_id)
    shown = [m for m in kernel.outputs(msg_id)
             if m["msg_type"] in ("display_data", "update_display_data")]
    return shown, kernel.displayed_models(msg_id)


def test_a_quick_cell_makes_no_widget_only_its_line_and_record(kernel: Any) -> None:
    shown, models = _cell_gauges(kernel, [0.1, 0.2, 0.3], show_after=3600)
    assert models == [] and not [m for m in kernel.messages if m["msg_type"] == "comm_open"
                                 and m["parent_header"].get("msg_id") in
                                 {s["parent_header"]["msg_id"] for s in shown}]
    [first, record] = shown
    ids = {m["content"]["transient"]["display_id"] for m in shown}
    assert len(ids) == 1  # the record takes the line's place
    assert first["content"]["data"]["text/plain"] == "Sandbox running…"
    assert record["msg_type"] == "update_display_data"
    assert record["content"]["data"]["text/plain"].startswith("Sandbox finished · CPU — of 10.0 s")
    assert "Memory peak 12 MB of 100 MB (12%)" in record["content"]["data"]["text/plain"]
    assert 'data-frozen="true"' in record["content"]["data"]["text/html"]


def test_a_long_cell_shows_the_live_panel_in_its_place_then_the_record(kernel: Any) -> None:
    shown, models = _cell_gauges(kernel, [0.2, 0.6, 0.9], show_after=0)
    [panel] = models
    kinds = [(m["msg_type"], sorted(m["content"]["data"])) for m in shown]
    assert kinds == [
        ("display_data", ["text/html", "text/plain"]),
        ("update_display_data", ["application/vnd.jupyter.widget-view+json", "text/plain"]),
        ("update_display_data", ["text/html", "text/plain"]),
    ], kinds
    assert len({m["content"]["transient"]["display_id"] for m in shown}) == 1
    readings = [s["readings"] for s in updates_for(panel, kernel.messages)]
    assert [r["elapsed_seconds"] for r in readings] == [0.2, 0.6, 0.9]
    closed = {m["content"]["comm_id"] for m in kernel.messages if m["msg_type"] == "comm_close"}
    layout = kernel.states[panel]["layout"].removeprefix("IPY_MODEL_")
    assert {panel, layout} <= closed  # the panel and its layout: nothing left open


def test_a_bad_snapshot_makes_no_panel(kernel: Any) -> None:
    msg_id = kernel.run(textwrap.dedent(f"""
        from sandbox_kernel_ext.notebook.gauges import CellGauges
        gauges = CellGauges(limits={LIMITS!r}, show_after=0)
        gauges.show()
        try:
            gauges.update({{"elapsed_seconds": 2.0, "memory_mb": float("nan")}})
        except ValueError as exc:
            print("refused:", exc)
        print(gauges.panel)
        """))
    assert kernel.text(msg_id, "stdout").splitlines() == [
        "refused: snapshot['memory_mb'] must be a finite number, got nan", "None"]


# -- where the gauges' messages go: after the text printed before them, into a capture ----------

SHOW_AND_FREEZE = """
from sandbox_kernel_ext.notebook.gauges import CellGauges
gauges = CellGauges(limits={limits!r}, show_after=3600)
{before}
gauges.show()
print("during", flush={flush!r})
gauges.freeze({{"elapsed_seconds": 0.1, "peak_memory_mb": 12.0}}, outcome="finished")
"""


def _visible(kernel: Any, msg_id: str) -> list[tuple[str, str]]:
    return [(m["msg_type"], m["content"].get("text", "").strip() or
             m["content"].get("data", {}).get("text/plain", "")[:16])
            for m in kernel.outputs(msg_id)
            if m["msg_type"] in ("stream", "display_data", "update_display_data")]


@pytest.mark.parametrize("before", ["", "print('before')", "import sys; sys.stderr.write('b')"])
@pytest.mark.parametrize("flush", [False, True])
def test_the_gauges_line_comes_after_the_text_printed_before_it(kernel: Any, before: str,
                                                                flush: bool) -> None:
    """The line is shown without waiting on the kernel's I/O thread only when no text is
    held; the record updates it in place, wherever its message falls among the streams."""
    msg_id = kernel.run(SHOW_AND_FREEZE.format(limits=LIMITS, before=before, flush=flush))
    assert kernel.error(msg_id) is None, kernel.error(msg_id)
    shown = _visible(kernel, msg_id)
    line = shown.index(("display_data", "Sandbox running…"))
    assert [kind for kind, _ in shown[:line]] == (["stream"] if before else []), shown
    [record] = [i for i, (kind, _) in enumerate(shown) if kind == "update_display_data"]
    assert record > line and shown[record][1].startswith("Sandbox finished"), shown
    assert sorted(text for kind, text in shown if kind == "stream") == sorted(
        ["during"] + (["before" if "print" in before else "b"] if before else [])), shown


HELD_BY_THE_IO_THREAD = """
import sys, threading, time
from ipykernel.iostream import OutStream
from sandbox_kernel_ext.notebook.gauges import CellGauges
name = "_flush_buffers" if hasattr(OutStream, "_flush_buffers") else "_flush_buffer"
original, inside = getattr(OutStream, name), threading.Event()
def slow(self):  # the I/O thread has the text, its flag says nothing is held
    inside.set()
    time.sleep(0.5)
    return original(self)
setattr(OutStream, name, slow)
try:
    gauges = CellGauges(limits={limits!r}, show_after=3600)
    print("before")
    assert inside.wait(30)
    gauges.show()
finally:
    setattr(OutStream, name, original)
gauges.freeze({{"elapsed_seconds": 0.1}}, outcome="finished")
"""


def test_the_line_comes_after_text_the_io_thread_is_sending(kernel: Any) -> None:
    """The moment a flush is under way on the I/O thread (its text taken, not yet sent):
    the line still comes after that text (it once went ahead of it)."""
    msg_id = kernel.run(HELD_BY_THE_IO_THREAD.format(limits=LIMITS))
    assert kernel.error(msg_id) is None, kernel.error(msg_id)
    shown = _visible(kernel, msg_id)
    assert shown.index(("stream", "before")) < shown.index(("display_data", "Sandbox running…"))


def test_captured_gauges_stay_in_the_capture(kernel: Any) -> None:
    msg_id = kernel.run("%%capture captured\n" + SHOW_AND_FREEZE.format(
        limits=LIMITS, before="", flush=False))
    assert kernel.error(msg_id) is None, kernel.error(msg_id)
    assert _visible(kernel, msg_id) == [], _visible(kernel, msg_id)
    seen = kernel.text(kernel.run(
        "print([(o.update, o.data['text/plain'][:16]) for o in captured.outputs])"),
        "stdout")
    assert seen.strip() == "[(False, 'Sandbox running…'), (True, 'Sandbox finished')]", seen
