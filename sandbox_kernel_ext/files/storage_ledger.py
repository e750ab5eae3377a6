"""The aggregate storage quota of a tree, kept without walking the tree on each write."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..policy.errors import QuotaExceededError


class StorageLedger:
    """Bytes stored under one root: measured by one walk on first use, then moved by the
    deltas of writes that go through a toolset. Reservations happen under a lock, so
    concurrent writers cannot together pass the limit. Changes made behind the toolset's
    back are seen after `refresh()`."""

    def __init__(self, measure: Callable[[], int]) -> None:
        self._measure = measure
        self._lock = threading.Lock()
        self._used: int | None = None

    @property
    def used(self) -> int:
        with self._lock:
            return self._ensure()

    def _ensure(self) -> int:
        if self._used is None:
            self._used = self._measure()
        return self._used

    def reserve(self, delta: int, limit: int | None, what: str) -> None:
        """Add `delta` bytes (negative frees), refusing growth that would pass `limit`."""
        with self._lock:
            used = self._ensure()
            if delta > 0 and limit is not None and used + delta > limit:
                raise QuotaExceededError(
                    f"{what} needs {delta:,} more bytes, but this root holds {used:,} of its "
                    f"{limit:,}-byte storage quota. Delete files you no longer need first.",
                    actual=used + delta,
                    limit=limit,
                )
            self._used = used + delta

    def refresh(self) -> None:
        with self._lock:
            self._used = None


_host_ledgers: dict[str, StorageLedger] = {}
_host_lock = threading.Lock()


def ledger_for_host_root(root: str, measure: Callable[[], int]) -> StorageLedger:
    """One ledger per host root in this process, shared by every toolset on it."""
    with _host_lock:
        ledger = _host_ledgers.get(root)
        if ledger is None:
            ledger = _host_ledgers[root] = StorageLedger(measure)
        return ledger
