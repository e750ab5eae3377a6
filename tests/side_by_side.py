"""Long jobs of one test module started together, each awaited by the test that checks it.

A container's security suite mostly waits (for children, timeouts), so on two cores three
side by side take less than half the time of three in a row; so do the installs of the
ipykernel versions' environments. Each job must be independent of the others: its own
folders, namespaces, uids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def side_by_side(jobs: Mapping[str, Callable[[], T]]) -> Iterator[dict[str, Future[T]]]:
    """Start every job at once, on a thread each; their futures by name. Leaving waits for
    them all (each job bounds its own time, as `subprocess.run(timeout=...)` does)."""
    with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
        yield {name: pool.submit(job) for name, job in jobs.items()}
