"""Gauge update rate actually delivered to a client, against the requested interval.

A real kernel (jupyter_client, the venv's ipykernel) displays a `GaugePanel`; a cell then runs
a `ResourceMonitor` at the requested interval over a real child (`sleep`) for a fixed window,
with `panel.update` subscribed: the production path (monitor thread -> one trait assignment ->
one comm message). The client counts the panel's `comm_msg` updates as they arrive on iopub
*while the cell runs* and reports updates/s against 1/interval, plus the gaps between arrivals.
A last row pushes updates from a thread with no sleep at all: the ceiling of the path.

Run: `python benchmarks/bench_gauges.py [--seconds 4] [--intervals 0.25 0.1 0.05]`. Prints only.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

try:
    import sandbox_kernel_ext  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import fmt_ns

WAIT = 120.0

SETUP = """
from sandbox_kernel_ext.notebook.gauges import GaugePanel
panel = GaugePanel(limits={"memory_mb": 512, "cpu_seconds": 30, "timeout_seconds": 60,
                           "tokens": None, "cost_usd": None})
panel.show()
"""
MONITORED = """
import subprocess, time
from sandbox_kernel_ext.policy.models import ResourceLimits
from sandbox_kernel_ext.runner.trusted.monitor import ResourceMonitor
child = subprocess.Popen(["sleep", "600"])
monitor = ResourceMonitor(ResourceLimits(), interval={interval})
unsubscribe = monitor.subscribe(panel.update)
try:
    monitor.start(child.pid)
    time.sleep({seconds})
finally:
    unsubscribe()
    monitor.stop()
    child.kill()
    child.wait()
"""
FLOOD = """
import threading, time
def flood():
    end = time.monotonic() + {seconds}
    i = 0
    while time.monotonic() < end:
        i += 1
        panel.update({{"elapsed_seconds": float(i)}})
writer = threading.Thread(target=flood)
writer.start()
writer.join()
"""


def run_cell(kc: BlockingKernelClient, code: str, comm_id: str | None) -> tuple[list, list]:
    """Run a cell; return (iopub messages, client arrival times of `comm_id` updates that
    came before the cell's idle status)."""
    msg_id = kc.execute(textwrap.dedent(code))
    msgs, arrivals = [], []
    deadline = time.monotonic() + WAIT
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise SystemExit(f"no idle status within {WAIT} s") from None
        now = time.perf_counter_ns()
        msgs.append(msg)
        content = msg["content"]
        if (msg["msg_type"] == "comm_msg" and content.get("comm_id") == comm_id
                and content["data"].get("method") == "update"):
            arrivals.append(now)
        if (msg["msg_type"] == "error" and msg["parent_header"].get("msg_id") == msg_id):
            raise SystemExit("\n".join(content["traceback"]))
        if (msg["msg_type"] == "status" and content["execution_state"] == "idle"
                and msg["parent_header"].get("msg_id") == msg_id):
            return msgs, arrivals


def report(label: str, requested: float | None, arrivals: list[int], seconds: float) -> None:
    if len(arrivals) < 2:
        print(f"{label:<22} {len(arrivals)} update(s) arrived: too few to measure")
        return
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    rate = (len(arrivals) - 1) / ((arrivals[-1] - arrivals[0]) / 1e9)
    wanted = "as fast as possible" if requested is None else f"{1 / requested:6.1f}/s requested"
    print(f"{label:<22} {len(arrivals):6d} updates in ~{seconds:g} s: {rate:8.1f}/s delivered "
          f"({wanted}); gap median {fmt_ns(statistics.median(gaps))}, "
          f"max {fmt_ns(max(gaps))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="window per interval")
    parser.add_argument("--intervals", type=float, nargs="+", default=[0.25, 0.1, 0.05])
    args = parser.parse_args()

    km = KernelManager(kernel_name="python3")
    with tempfile.TemporaryDirectory(prefix="bench-gauges-") as cwd:
        km.start_kernel(cwd=cwd, stderr=subprocess.DEVNULL)  # its TCP warning is noise here
        kc = km.client()
        try:
            kc.start_channels()
            kc.wait_for_ready(timeout=WAIT)
            msgs, _ = run_cell(kc, SETUP, None)
            comm_id = next(m["content"]["comm_id"] for m in msgs
                           if m["msg_type"] == "comm_open"
                           and m["content"]["data"]["state"].get("_model_name") == "AnyModel")
            print(f"kernel: {km.kernel_spec.display_name}; window {args.seconds:g} s per row; "
                  "rate counted at the client, from the first to the last update")
            for interval in args.intervals:
                code = MONITORED.format(interval=interval, seconds=args.seconds)
                _, arrivals = run_cell(kc, code, comm_id)
                report(f"monitor every {interval:g} s", interval, arrivals, args.seconds)
            _, arrivals = run_cell(kc, FLOOD.format(seconds=args.seconds), comm_id)
            report("thread, no sleep", None, arrivals, args.seconds)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
