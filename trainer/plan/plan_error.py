"""The planner's one error type: bad input or an infeasible request, with a message naming why."""

from __future__ import annotations


class PlanError(ValueError):
    """Raised for zero workers, non-positive bandwidth, mismatched level lists, no feasible plan."""
