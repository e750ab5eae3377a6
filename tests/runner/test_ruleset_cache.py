"""The launcher's cache of prepared Landlock rules holds a bounded number of descriptors and
never leaks one, whatever the plans (run in this process: the cache is plain data around
`LandlockRuleset`, whose prepared rules are open O_PATH descriptors)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from sandbox_kernel_ext.runner.launcher.rulesets import RulesetCache
from sandbox_kernel_ext.runner.linux import landlock
from sandbox_kernel_ext.runner.wire import ChildPlan

pytestmark = pytest.mark.skipif(landlock.landlock_abi() < 1, reason="needs Landlock")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def plan(folder: Path, name: str, count: int) -> ChildPlan:
    """A plan that reads `count` files of its own."""
    (folder / name).mkdir(exist_ok=True)
    paths = []
    for i in range(count):
        (folder / name / f"f{i}").touch()
        paths.append(str(folder / name / f"f{i}"))
    return ChildPlan(kind="exec", argv=["/bin/true"], env={}, cwd="/", read_paths=paths,
                     write_paths=[], rlimits={}, uid=None, gid=None)


def test_what_it_holds_stays_within_its_descriptor_budget(tmp_path: Path) -> None:
    before = open_fds()
    cache = RulesetCache(fd_budget=100)
    for i in range(12):
        assert cache.get(plan(tmp_path, f"p{i}", 40)) is not None
        assert cache.held <= 100
        assert open_fds() - before <= 100
    cache.clear()
    assert cache.held == 0 and open_fds() == before


def test_a_plan_larger_than_the_budget_is_not_prepared_but_still_has_its_rules(
    tmp_path: Path
) -> None:
    before = open_fds()
    cache = RulesetCache(fd_budget=10)
    rules = cache.get(plan(tmp_path, "big", 50))
    assert rules is not None and cache.held == 0 and open_fds() == before
    assert len(rules._read_paths) == 50  # opened one at a time when a fork builds them


def test_forget_and_expiry_release_descriptors(tmp_path: Path) -> None:
    before = open_fds()
    cache = RulesetCache(fd_budget=1000)
    first, second = plan(tmp_path, "a", 30), plan(tmp_path, "b", 30)
    cache.get(first)
    cache.get(second)
    assert open_fds() == before + 60
    cache.forget(first.rules_key())
    assert open_fds() == before + 30
    cache.forget(first.rules_key())  # twice is harmless
    cache.ttl = 0.0  # everything is stale at the next request
    cache.get(first)
    assert cache.held == 30 and open_fds() == before + 30
    cache.clear()
    assert open_fds() == before


def test_running_out_of_descriptors_while_preparing_leaks_nothing(tmp_path: Path) -> None:
    """A prepare that fails half-way releases what it opened and falls back to rules the
    fork opens itself."""
    big = plan(tmp_path, "big", 200)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = open_fds()
    cache = RulesetCache(fd_budget=10_000)
    taken = {int(fd) for fd in os.listdir("/proc/self/fd")}
    limit = 0
    while limit - len([fd for fd in taken if fd < limit]) < 50:  # room for 50 more, no more
        limit += 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        rules = cache.get(big)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert rules is not None and cache.held == 0
    assert open_fds() == before
    assert len(rules._read_paths) == 200
