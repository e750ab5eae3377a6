"""Counts as people read them: "1 byte", "2 bytes", "1,024 bytes"."""

from __future__ import annotations

__all__ = ["byte_count"]


def byte_count(size: int) -> str:
    """`size` bytes in words, the count grouped by thousands."""
    return f"{size:,} byte{'' if size == 1 else 's'}"
