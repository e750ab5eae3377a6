"""aumai-sandbox's pure check of a usage snapshot against `ResourceLimits`.

The monitor (runner layer) samples the process tree and calls this; keeping it free
of psutil and clocks makes the kill decision easy to test. Limits are checked in a
fixed order, CPU, memory, tokens, cost, and only the first breach is reported.
A value equal to its limit is still within it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .models import ResourceLimits

__all__ = ["check_limits"]


def check_limits(current: Mapping[str, Any], limits: ResourceLimits) -> tuple[bool, str | None]:
    """`(True, None)`, or `(False, reason)` for the first limit exceeded.

    `current` has the monitor's snapshot keys `cpu_seconds`, `peak_memory_mb`,
    `tokens_used` and `cost_usd`; a missing (or None) key counts as 0.
    """
    cpu_seconds = float(current.get("cpu_seconds") or 0)
    memory_mb = float(current.get("peak_memory_mb") or 0)
    tokens = int(current.get("tokens_used") or 0)
    cost_usd = float(current.get("cost_usd") or 0)

    if cpu_seconds > limits.max_cpu_seconds:
        return False, (
            f"CPU limit exceeded: {cpu_seconds:.2f}s used, limit is {limits.max_cpu_seconds:.2f}s"
        )
    if memory_mb > limits.max_memory_mb:
        return False, (
            f"Memory limit exceeded: {memory_mb:.1f} MB used, limit is {limits.max_memory_mb} MB"
        )
    if tokens > limits.max_tokens:
        return False, f"Token limit exceeded: {tokens} tokens used, limit is {limits.max_tokens}"
    if cost_usd > limits.max_cost_usd:
        return False, (
            f"Cost limit exceeded: ${cost_usd:.4f} used, limit is ${limits.max_cost_usd:.4f}"
        )
    return True, None
