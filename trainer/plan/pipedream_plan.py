"""The PipeDream planner: the reference's hierarchical recurrence, read out as a Plan.

``pipedream_plan`` builds the antichain states (or a linearised order when they explode),
solves each level innermost first with the strategy ``pipeboard.trainer.plan.solve`` picks for it, reads
the stages back out level by level from the top (as the reference prints them), and lays them
out on worker ranks with their costs.
"""

from __future__ import annotations

import math

from pipeboard.trainer.plan.cluster import total_workers
from pipeboard.trainer.plan.formulas import data_parallel_s, level_specs
from pipeboard.trainer.plan.plan_error import PlanError
from pipeboard.trainer.plan.flat_stages import build_stages
from pipeboard.trainer.plan.plan_format import Level, LevelStage, Plan, timing_fields
from pipeboard.trainer.plan.readout import leaves, read_levels
from pipeboard.trainer.plan.solve import solve_levels
from pipeboard.trainer.plan.states import StateChain, block, state_chain
from pipeboard.trainer.profile.schema import Profile


def solve(chain: StateChain, levels, *, memory_bytes=None, straight=False, fewer_workers=False,
          activation_compression=1.0, strategies=None) -> tuple[list, float]:
    """(solved tables, optimum) for ``levels`` under the options; +inf when nothing fits."""
    specs = level_specs(levels, straight, fewer_workers, memory_bytes, activation_compression)
    tables = solve_levels(chain, specs, strategies)
    return tables, tables[-1].entry(0, chain.size - 1, specs[-1].machines - 1)


def smallest_memory(chain: StateChain, levels, **options) -> float | None:
    """The least memory per worker under which a plan exists (None: no memory is enough)."""
    def feasible(mem: float) -> bool:
        return math.isfinite(solve(chain, levels, memory_bytes=mem, **options)[1])

    hi = (chain.activation[-1] + chain.parameters[-1]) * max(w for w, _ in levels) + 1.0
    if not feasible(hi):
        return None
    lo = 0.0
    for _ in range(48):
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi


def pipedream_plan(profile: Profile, levels, *, memory_bytes=None, memory_constraint=False, straight=False,
                   fewer_workers=False, activation_compression=1.0, max_states=2000, linearise=None,
                   strategies=None) -> Plan:
    """The plan; ``strategies`` (one name per level, see ``pipeboard.trainer.plan.solve``) overrides the
    choice of strategy, for tests that compare them."""
    chain = state_chain(profile, max_states=max_states, linearise=linearise)
    n = chain.size
    options = dict(straight=straight, fewer_workers=fewer_workers, activation_compression=activation_compression)
    mem = (memory_bytes if memory_bytes is not None else 16e9) if memory_constraint else None
    tables, best = solve(chain, levels, memory_bytes=mem, strategies=strategies, **options)
    if not math.isfinite(best):
        if straight and total_workers(levels) > n:
            raise PlanError(f"workers: a straight pipeline needs one stage per worker, but the model has only {n} "
                            f"states for {total_workers(levels)} workers; use fewer workers or --fewer-workers")
        need = smallest_memory(chain, levels, **options) if mem is not None else None
        if need is None:
            raise PlanError("no feasible plan for this cluster (even without a memory limit)")
        raise PlanError(f"memory: no plan fits in {mem:.6g} bytes per worker; the smallest memory per worker "
                        f"that fits is {math.ceil(need)} bytes ({need / 1e9:.3f} GB)")
    per_level = read_levels(tables, n)
    stages = build_stages(chain, leaves(per_level, n), levels, profile, activation_compression)
    single = chain.compute_s[-1]
    dp_time = data_parallel_s(single, chain.parameters[-1], levels)
    used = sum(st.replicas for st in stages)
    # A level's stage holds the flat stages inside its state range.
    layers_in = lambda s, e: [name for st in stages if s <= st.start_state < e for name in st.layers]  # noqa: E731
    level_out = [
        Level(level=lvl + 1, workers=levels[lvl][0], bandwidth=levels[lvl][1],
              stages=[LevelStage(s, e, r, block(chain.compute_s, s, e - 1), layers_in(s, e)) for s, e, r, _ in found])
        for lvl, found in enumerate(per_level)
    ]
    return Plan(
        method="pipedream",
        model=profile.model,
        state_graph=chain.kind,
        states=n,
        cluster=list(levels),
        total_workers=total_workers(levels),
        workers_used=used,
        **timing_fields(best, single, dp_time),
        noam=math.ceil(used / stages[0].replicas),
        levels=level_out,
        stages=stages,
        options={**options, "memory_bytes": memory_bytes, "memory_constraint": memory_constraint,
                 "max_states": max_states},
    )
