"""What every benchmark script here shares: how a duration is printed."""

from __future__ import annotations


def fmt_ns(ns: float) -> str:
    """A duration in nanoseconds, in the unit that reads best."""
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"
