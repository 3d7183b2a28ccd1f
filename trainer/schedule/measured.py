"""The measured time per training step: the one definition the summary, the dashboard and the
benchmarks share.

A step's completion time is when its last worker finished it. The steady-state time per step is
the least-squares slope of completion time against step number over the second half of the run:
the first half holds the pipeline's fill, first allocations and the allocator warming up, and a
slope (not the mean gap) stays right for an asynchronous schedule (pipedream), whose steps overlap
so that single gaps between completions can be near zero or doubled.
"""

from __future__ import annotations

from collections.abc import Mapping


def steady_step_s(completed_at: Mapping[int, float]) -> float | None:
    """Seconds per step from ``{step: completion time}``; None with fewer than two steps or
    times that do not advance."""
    steps = sorted(completed_at)
    n = len(steps)
    if n < 2:
        return None
    tail = steps[min(n // 2, n - 2):]
    mean_k = sum(tail) / len(tail)
    mean_t = sum(completed_at[k] for k in tail) / len(tail)
    var = sum((k - mean_k) ** 2 for k in tail)
    cov = sum((k - mean_k) * (completed_at[k] - mean_t) for k in tail)
    slope = cov / var
    return slope if slope > 0 else None
