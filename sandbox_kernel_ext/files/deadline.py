"""A per-operation time budget that the I/O loops check between chunks."""

from __future__ import annotations

import time

from ..policy.errors import FilesystemTimeoutError


class Deadline:
    """Checked between chunks and directories, so an operation over budget stops where
    it is instead of leaving a worker thread writing after the caller gave up."""

    __slots__ = ("what", "budget", "_end")

    def __init__(self, budget: float, what: str) -> None:
        self.what = what
        self.budget = budget
        self._end = time.monotonic() + budget

    def check(self) -> None:
        if time.monotonic() > self._end:
            raise FilesystemTimeoutError(
                f"{self.what} took longer than its {self.budget:g} s budget and was stopped; "
                "nothing was changed. Try a smaller file, a narrower pattern or a slice."
            )
