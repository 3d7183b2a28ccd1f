"""Windowing and downsampling of long timelines and metric series, so a browser gets a few
thousand points however long the run was.

Timeline events are not averaged (a bar is a bar): a long window keeps every event of evenly
spaced steps, so what is drawn is real, just sparser. Metric series keep evenly spaced points
plus the last one, so the latest value is always shown.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def pick_steps(steps: Sequence[int], budget_events: int, events_per_step: float) -> set[int]:
    """Which steps to keep so that about ``budget_events`` events remain."""
    distinct = sorted(set(steps))
    if not distinct or events_per_step <= 0:
        return set(distinct)
    keep = max(1, int(budget_events // max(events_per_step, 1.0)))
    # evenly() always keeps the last: the newest step is what a live view follows.
    return set(evenly(distinct, keep))


def evenly(items: Sequence[T], limit: int) -> list[T]:
    """At most ``limit`` items, evenly spaced, always including the last."""
    n = len(items)
    if limit <= 0:
        return []
    if n <= limit:
        return list(items)
    if limit == 1:
        return [items[-1]]
    step = (n - 1) / (limit - 1)
    return [items[round(i * step)] for i in range(limit)]
