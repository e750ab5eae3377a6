from __future__ import annotations

import pytest

from sandbox_kernel_ext.policy.limits import check_limits
from sandbox_kernel_ext.policy.models import ResourceLimits

LIMITS = ResourceLimits(max_cpu_seconds=10.0, max_memory_mb=512, max_tokens=1000, max_cost_usd=0.10)


def test_seed_examples() -> None:
    limits = ResourceLimits(max_cpu_seconds=10.0, max_memory_mb=512)
    assert check_limits({"cpu_seconds": 5.0, "peak_memory_mb": 400}, limits) == (True, None)
    assert check_limits({"cpu_seconds": 15.0, "peak_memory_mb": 400}, limits) == (
        False,
        "CPU limit exceeded: 15.00s used, limit is 10.00s",
    )


def test_missing_and_none_values_count_as_zero() -> None:
    assert check_limits({}, LIMITS) == (True, None)
    assert check_limits({"cpu_seconds": None, "cost_usd": None}, LIMITS) == (True, None)


@pytest.mark.parametrize(
    ("current", "message"),
    [
        ({"peak_memory_mb": 600}, "Memory limit exceeded: 600.0 MB used, limit is 512 MB"),
        ({"tokens_used": 1001}, "Token limit exceeded: 1001 tokens used, limit is 1000"),
        ({"cost_usd": 0.12}, "Cost limit exceeded: $0.1200 used, limit is $0.1000"),
        ({"cpu_seconds": 10.001}, "CPU limit exceeded: 10.00s used, limit is 10.00s"),
    ],
)
def test_each_limit_and_its_message(current: dict[str, float], message: str) -> None:
    assert check_limits(current, LIMITS) == (False, message)


def test_values_equal_to_limits_are_within() -> None:
    at_limit = {"cpu_seconds": 10.0, "peak_memory_mb": 512, "tokens_used": 1000, "cost_usd": 0.10}
    assert check_limits(at_limit, LIMITS) == (True, None)


def test_first_breach_in_order_cpu_memory_tokens_cost() -> None:
    over = {"cpu_seconds": 11, "peak_memory_mb": 600, "tokens_used": 2000, "cost_usd": 1.0}
    order = ["CPU", "Memory", "Token", "Cost"]
    for key, name in zip(["cpu_seconds", "peak_memory_mb", "tokens_used", "cost_usd"], order):
        ok, message = check_limits(over, LIMITS)
        assert not ok and message is not None and message.startswith(name), message
        over[key] = 0
    assert check_limits(over, LIMITS) == (True, None)


def test_extra_keys_are_ignored() -> None:
    assert check_limits({"elapsed_seconds": 1e9, "cpu_seconds": 1}, LIMITS) == (True, None)
