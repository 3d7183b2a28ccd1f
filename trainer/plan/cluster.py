"""The cluster a plan targets: its levels, checked and normalised.

A cluster is a list of levels, innermost first: ``[(4, 10e9), (4, 1.25e9)]`` is 4 servers of
4 workers, 10 GB/s inside a server and 1.25 GB/s between servers. Imported by every caller
of the planner (and the web app), so it imports nothing heavy.
"""

from __future__ import annotations

import math

from pipeboard.trainer.plan.plan_error import PlanError


def validate_levels(levels) -> list[tuple[int, float]]:
    """Check and normalise ``[(workers, bandwidth), ...]``; one clear PlanError per problem."""
    if levels is None or len(levels) == 0:
        raise PlanError("levels: give at least one (workers, bandwidth) level")
    out = []
    for idx, level in enumerate(levels, start=1):
        try:
            workers, bandwidth = level
        except (TypeError, ValueError):
            raise PlanError(f"levels[{idx}]: expected a (workers, bandwidth) pair, got {level!r}") from None
        whole = isinstance(workers, int) or (isinstance(workers, float) and workers.is_integer())
        if isinstance(workers, bool) or not whole:
            raise PlanError(f"workers (level {idx}): must be a whole number, got {workers!r}")
        workers = int(workers)
        if workers < 1:
            raise PlanError(f"workers (level {idx}): must be at least 1, got {workers}")
        try:
            bandwidth = float(bandwidth)
        except (TypeError, ValueError):
            raise PlanError(f"bandwidth (level {idx}): must be a number of bytes/s, got {bandwidth!r}") from None
        if not math.isfinite(bandwidth) or bandwidth <= 0:
            raise PlanError(f"bandwidth (level {idx}): must be positive bytes/s, got {bandwidth:g}")
        out.append((workers, bandwidth))
    return out


def levels_from_lists(workers: list[int], bandwidths: list[float]) -> list[tuple[int, float]]:
    """Pair ``--workers`` with ``--bandwidth`` values; their counts must match."""
    if len(workers) != len(bandwidths):
        raise PlanError(
            f"levels: --workers has {len(workers)} value(s) but --bandwidth has {len(bandwidths)}; "
            "give one bandwidth per level"
        )
    return validate_levels(list(zip(workers, bandwidths)))


def total_workers(levels: list[tuple[int, float]]) -> int:
    return math.prod(w for w, _ in levels)
