"""Utilisation and bubbles of a timeline, predicted or measured (the same TimelineEvent list).

- busy: a worker computes (F, B, BI, W), steps or all-reduces; transfers run beside compute
  and do not count;
- utilization: the share of the makespan a worker spends in F/B/BI/W;
- bubble_fraction: the idle (not busy) share of worker-time within the makespan, averaged over
  workers; for equal stages and free communication this is (p-1)/(m+p-1) for GPipe and 1F1B;
- steady_bubble_fraction: the same within the steady state, from the moment the last worker
  starts its first backward to the moment the first worker ends its last forward (None if the
  schedule has no such window, like GPipe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from pipeboard.trainer.schedule.actions import TimelineEvent

COMPUTE = {"F", "B", "BI", "W"}
BUSY = COMPUTE | {"step", "allreduce"}
BACKWARD = {"B", "BI"}


@dataclass
class TimelineStats:
    makespan_s: float
    utilization: list[float]
    bubble_fraction: float
    steady_bubble_fraction: float | None


def summarize(events: Iterable[TimelineEvent], num_workers: int | None = None) -> TimelineStats:
    events = list(events)
    if not events:
        return TimelineStats(0.0, [], 0.0, None)
    n = num_workers if num_workers is not None else 1 + max(e.worker for e in events)
    t_min = min(e.start for e in events)
    t_max = max(e.end for e in events)
    span = t_max - t_min
    compute = [0.0] * n
    busy = [0.0] * n
    first_b: list[float | None] = [None] * n
    last_f: list[float | None] = [None] * n
    for e in events:
        if e.kind not in BUSY:
            continue
        d = e.end - e.start
        busy[e.worker] += d
        if e.kind in COMPUTE:
            compute[e.worker] += d
            if e.kind in BACKWARD and (first_b[e.worker] is None or e.start < first_b[e.worker]):
                first_b[e.worker] = e.start
            if e.kind == "F" and (last_f[e.worker] is None or e.end > last_f[e.worker]):
                last_f[e.worker] = e.end
    if span <= 0:
        return TimelineStats(0.0, [0.0] * n, 0.0, None)
    utilization = [c / span for c in compute]
    bubble = 1.0 - sum(min(b, span) for b in busy) / (span * n)
    return TimelineStats(span, utilization, max(bubble, 0.0), _steady(events, n, first_b, last_f))


def _steady(events: list[TimelineEvent], n: int, first_b: list, last_f: list) -> float | None:
    active = [w for w in range(n) if first_b[w] is not None and last_f[w] is not None]
    if not active:
        return None
    t0 = max(first_b[w] for w in active)
    t1 = min(last_f[w] for w in active)
    if t1 <= t0:
        return None
    busy = dict.fromkeys(active, 0.0)
    for e in events:
        if e.kind in BUSY and e.worker in busy:
            overlap = min(e.end, t1) - max(e.start, t0)
            if overlap > 0:
                busy[e.worker] += overlap
    return max(0.0, 1.0 - sum(busy.values()) / ((t1 - t0) * len(active)))
