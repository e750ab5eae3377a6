"""Landlock rules prepared in the launcher, so that a fork only adds them to its ruleset."""

from __future__ import annotations

import resource
import time

from ..linux import landlock
from ..wire import ChildPlan

__all__ = ["RulesetCache", "rule_count", "rules_for"]


def rules_for(plan: ChildPlan) -> landlock.LandlockRuleset | None:
    """The plan's Landlock rules, paths not yet opened (a fork opens them one at a time as
    it builds its ruleset). None where Landlock is unavailable (the isolation report names
    that layer as missing)."""
    rules = landlock.LandlockRuleset()
    if rules.abi < 1:
        return None
    for path in plan.read_paths:
        rules.allow_read(path)
    for path in plan.write_paths:
        rules.allow_write(path)
    if plan.proxy_port is not None:
        rules.allow_tcp_connect(plan.proxy_port)  # the proxy is the one TCP port it may reach
    rules.scope_signals().scope_abstract_unix()
    return rules


def rule_count(plan: ChildPlan) -> int:
    """Descriptors the plan's prepared rules hold: one per path."""
    return len(plan.read_paths) + len(plan.write_paths)


class RulesetCache:
    """Prepared Landlock rules by the plan's `rules_key()`: opening ~250 paths costs about
    1.5 ms, adding an opened one to a child's ruleset a syscall.

    What it holds is bounded by descriptors, not entries (`fd_budget`, a quarter of the
    open-file limit by default): a ruleset larger than the budget is not prepared at all
    (the fork opens its paths one by one), older ones are released to make room, an entry
    past `ttl` seconds is released at the next request (an opened path keeps the inode it
    named then), `forget(key)` releases one when its sandbox is destroyed, and a `prepare`
    that fails half-way (out of descriptors) releases what it opened and falls back to the
    unprepared rules. So no number of sandboxes can exhaust the launcher's descriptors.
    """

    def __init__(self, ttl: float = 30.0, fd_budget: int | None = None) -> None:
        self.ttl = ttl
        if fd_budget is None:
            fd_budget = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4
        self.fd_budget = max(0, fd_budget)
        self._entries: dict[str, tuple[float, int, landlock.LandlockRuleset | None]] = {}

    @property
    def held(self) -> int:
        """Descriptors the cached rulesets hold."""
        return sum(count for _, count, _ in self._entries.values())

    def get(self, plan: ChildPlan) -> landlock.LandlockRuleset | None:
        now = time.monotonic()
        self._expire(now)
        key = plan.rules_key()
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._entries[key] = entry  # most recently used last
            return entry[2]
        rules = rules_for(plan)
        count = rule_count(plan)
        if rules is None or count > self.fd_budget:
            return rules
        while self._entries and self.held + count > self.fd_budget:
            self._release(next(iter(self._entries)))  # dicts keep order: the first is the oldest
        try:
            rules.prepare()
        except OSError:  # out of descriptors after all: the fork opens the paths itself
            rules.release()
            return rules_for(plan)
        self._entries[key] = (now, count, rules)
        return rules

    def forget(self, key: str) -> None:
        """Release the rules prepared under `key` (its sandbox is gone)."""
        if key in self._entries:
            self._release(key)

    def clear(self) -> None:
        for key in list(self._entries):
            self._release(key)

    def _expire(self, now: float) -> None:
        for key in [k for k, (made, _, _) in self._entries.items() if now - made >= self.ttl]:
            self._release(key)

    def _release(self, key: str) -> None:
        _, _, rules = self._entries.pop(key)
        if rules is not None:
            rules.release()
