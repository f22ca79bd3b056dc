"""Interval arithmetic on [start, end) pairs of integer nanoseconds.

GPU busy time is the measure of the *union* of the op intervals, never their
sum: two kernels on two streams that overlap for 5 us make the GPU busy for
5 us, not 10. Everything here is exact integer arithmetic, so a partition of a
window into busy and idle pieces adds up to the window to the nanosecond.
"""
from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, merged intervals; empty and inverted ones are dropped."""
    merged: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals if b > a):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def measure(merged: Iterable[Interval]) -> int:
    return sum(b - a for a, b in merged)


def clip(intervals: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def gaps(lo: int, hi: int, merged: list[Interval]) -> list[Interval]:
    """The parts of [lo, hi) that no interval of ``merged`` (sorted, disjoint) covers."""
    out, cursor = [], lo
    for a, b in merged:
        if b <= cursor:
            continue
        if a >= hi:
            break
        if a > cursor:
            out.append((cursor, min(a, hi)))
        cursor = max(cursor, b)
        if cursor >= hi:
            break
    if cursor < hi:
        out.append((cursor, hi))
    return out


def covered_at_least(intervals: Iterable[Interval], k: int, lo: int, hi: int) -> int:
    """Time inside [lo, hi) during which at least ``k`` of the intervals are in flight."""
    events = []
    for a, b in clip(intervals, lo, hi):
        events.append((a, 1))
        events.append((b, -1))
    events.sort(key=lambda e: (e[0], e[1]))     # at a tie an end closes before a start opens
    depth, last, total = 0, lo, 0
    for t, d in events:
        if depth >= k:
            total += t - last
        depth += d
        last = t
    return total
