"""Planning: split a profiled model across a cluster (PipeDream's planner, or a baseline).

``plan(profile, levels=[(workers, bandwidth), ...])`` returns a ``Plan`` (plain data, JSON via
``to_dict``/``save``). No torch import anywhere below here, and NumPy only once a plan is large
enough to need it: ``pipeboard plan`` starts fast. How the planner works: docs/planner.md.
"""

from __future__ import annotations

import math

from pipeboard.trainer.plan.cluster import levels_from_lists, validate_levels
from pipeboard.trainer.plan.plan_error import PlanError
from pipeboard.trainer.plan.plan_format import Level, LevelStage, Plan, Stage
from pipeboard.trainer.profile.schema import Profile

METHODS = ("pipedream", "uniform", "time", "params", "dp")

__all__ = ["METHODS", "Level", "LevelStage", "Plan", "PlanError", "Stage", "compare", "levels_from_lists", "plan"]


def plan(profile: Profile, levels, memory_bytes: float | None = None, memory_constraint: bool = False,
         straight: bool = False, fewer_workers: bool = False, activation_compression: float | None = 1.0,
         method: str = "pipedream", max_states: int = 2000, linearise: bool | None = None) -> Plan:
    """Plan ``profile`` on ``levels`` = [(workers, bandwidth bytes/s), ...], innermost first.

    ``activation_compression`` divides activation transfer times (None: transfers not counted,
    the reference's default). A profile measured at several lengths (``Profile.lengths``) is
    planned on its layers' expected costs over its data's lengths; the plan's ``options["lengths"]``
    says which. ``memory_constraint`` enforces the reference's stash check against
    ``memory_bytes`` per worker (16e9 when not given). Exact antichain states are used when they
    number at most ``max_states``, else a linearised topological order (``plan.state_graph``).
    """
    levels = validate_levels(levels)
    if method not in METHODS:
        raise PlanError(f"method: must be one of {', '.join(METHODS)}, got {method!r}")
    if activation_compression is not None:
        if not (isinstance(activation_compression, (int, float)) and math.isfinite(activation_compression)
                and activation_compression > 0):
            raise PlanError(f"activation_compression: must be a positive ratio, got {activation_compression!r}")
    if memory_bytes is not None and not (math.isfinite(memory_bytes) and memory_bytes > 0):
        raise PlanError(f"memory: must be a positive number of bytes per worker, got {memory_bytes!r}")
    if not isinstance(max_states, int) or max_states < 1:
        raise PlanError(f"max_states: must be a positive integer, got {max_states!r}")
    if method == "pipedream":
        from pipeboard.trainer.plan.pipedream_plan import pipedream_plan

        made = pipedream_plan(profile, levels, memory_bytes=memory_bytes, memory_constraint=memory_constraint,
                              straight=straight, fewer_workers=fewer_workers,
                              activation_compression=activation_compression, max_states=max_states,
                              linearise=linearise)
    else:
        from pipeboard.trainer.plan.baselines import baseline_plan

        made = baseline_plan(profile, levels, method, activation_compression=activation_compression)
    if profile.lengths is not None:  # planned on the expected costs over these lengths
        made.options = {**made.options, "lengths": profile.lengths.assumed()}
    return made


def compare(profile: Profile, levels, **options) -> list[Plan]:
    """One plan per method, PipeDream first, for a side-by-side table of predicted throughput."""
    base_options = {k: v for k, v in options.items() if k == "activation_compression"}
    return [plan(profile, levels, **options)] + [
        plan(profile, levels, method=m, **base_options) for m in METHODS if m != "pipedream"
    ]
