"""CPU of children Linux reaps by itself still counts against the budget (issue 13, §2).

A process that ignores SIGCHLD has its children reaped by the kernel, their CPU time added to
no parent, so neither /proc nor getrusage() sees it: a review ran 8.7 CPU-seconds under
`max_cpu_seconds=2` this way, unkilled. Here a cell forks short-lived spinners one after
another, each well under the monitor's interval, each reaped by Linux, and must be killed for
CPU once the tree's total passes the budget.
"""

from __future__ import annotations

import sys

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, ResourceLimits, SandboxManager
from sandbox_kernel_ext.runner.linux.cpu_clock import tree_clock_available

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(not tree_clock_available(),
                       reason="perf_event_open refused here: the report says CPU of auto-reaped "
                              "children is not counted"),
]

SPINNERS = r"""
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # Linux reaps them; nobody waits
for round in range(ROUNDS):
    for _ in range(WIDTH):
        if os.fork() == 0:
            start = time.process_time()
            while time.process_time() - start < 0.15:  # shorter than one monitor interval
                pass
            os._exit(0)
    time.sleep(0.16)
print("finished")
"""


@pytest.mark.parametrize("width", [1, 4], ids=["one at a time", "four at a time"])
def test_auto_reaped_children_are_counted_and_killed(width: int) -> None:
    policy = CapabilityDeclaration(resource_limits=ResourceLimits(
        max_cpu_seconds=1.0, max_processes=64, max_memory_mb=512))
    with SandboxManager() as manager:
        result = manager.run_python(manager.create_sandbox(policy), SPINNERS,
                                    inputs={"ROUNDS": 40, "WIDTH": width}, timeout=60)
    # 40 rounds of 0.15 CPU-seconds per spinner: 6 (or 24) CPU-seconds, far over the budget
    assert result.killed is not None and "cpu" in result.killed.lower(), result
    assert "finished" not in result.stdout
    assert result.resource_usage["cpu_seconds"] >= 1.0, result.resource_usage


def test_the_report_counts_exited_children() -> None:
    """A finished run's CPU includes children reaped by Linux, not only those waited for."""
    with SandboxManager() as manager:
        result = manager.run_python(manager.create_sandbox(CapabilityDeclaration()), SPINNERS,
                                    inputs={"ROUNDS": 4, "WIDTH": 1}, timeout=60)
    assert result.exit_code == 0 and "finished" in result.stdout, result
    assert result.resource_usage["cpu_seconds"] >= 0.5, result.resource_usage  # 4 × 0.15
