"""The PipeDream planner: hierarchical DP with stage replication, as the reference optimizer.

``pipedream_plan`` builds the antichain states (or a linearised order when they explode),
solves each level innermost first (each level's best time for a block on all its machines
becomes the next level's compute time for that block), then reads the stages back out level
by level from the top, as the reference prints them, and lays them out on worker ranks.
"""

from __future__ import annotations

import math

import numpy as np

from trainer.graph import StateChain, state_chain
from trainer.plan.cluster import Leaf, build_stages, data_parallel_time, total_workers
from trainer.plan.dp import LevelOptions, LevelSolution, Tables, level1_values, next_level_values, solve
from trainer.plan.errors import PlanError
from trainer.plan.model import Level, LevelStage, Plan
from trainer.profile.schema import Profile


def tables_of(chain: StateChain) -> Tables:
    return Tables(
        compute=chain.compute_s,
        activation=chain.activation,
        parameters=chain.parameters,
        output_activation=chain.output_activation,
        predecessors=[np.nonzero(chain.ancestors[j])[0] for j in range(chain.size)],
    )


def _level_options(levels, idx: int, rows_only_first: bool, **options) -> LevelOptions:
    return LevelOptions(
        machines=levels[idx][0],
        bandwidth=levels[idx][1],
        machines_below=levels[idx - 1][0] if idx > 0 else 1,
        final=rows_only_first or idx == len(levels) - 1,
        straight=options["straight"],
        fewer_machines=options["fewer_workers"],
        memory_bytes=options["memory_bytes"],
        activation_compression=options["activation_compression"],
    )


def _bounds(tables: Tables, levels, **options) -> list[float]:
    """Per level, a value above which no entry can matter to the optimum (+inf: no pruning).

    An upper bound U on the optimum comes from the same DP restricted to blocks that start at
    state 0 on every level (each level's machines all replicate one level-below pipeline), a
    plan the full DP also considers. A level-k entry v enters level k+1 as ``(v + comm)/m'``
    with m' <= M(k+1) and comm >= 0, so beyond ``U * M(k+1)`` (and so on down) it cannot be on
    an optimal path. That needs comm >= 0, which holds for the blocks the top level reads; for
    the blocks deeper levels read it holds when the states form a chain, else those levels are
    left unpruned.
    """
    L = len(levels)
    if L == 1:
        return [math.inf]
    values = level1_values(tables)
    for idx in range(L):
        sol = solve(tables, values, _level_options(levels, idx, True, **options))
        values = next_level_values(sol.F, tables.size)
    upper = sol.best(0, tables.size - 1)
    if not math.isfinite(upper):
        return [math.inf] * L
    chain = all(len(p) == j for j, p in enumerate(tables.predecessors))
    bounds = [math.inf] * L
    bounds[-1] = upper * (1 + 1e-9)
    for idx in range(L - 2, -1, -1):
        if idx < L - 2 and not chain:
            break
        bounds[idx] = bounds[idx + 1] * levels[idx + 1][0] * (1 + 1e-9)
    return bounds


def solve_levels(tables: Tables, levels, *, memory_bytes, straight, fewer_workers,
                 activation_compression, prune: bool = True) -> list[LevelSolution]:
    """Solve every level, innermost first; entries that cannot matter are pruned when ``prune``."""
    options = dict(memory_bytes=memory_bytes, straight=straight, fewer_workers=fewer_workers,
                   activation_compression=activation_compression)
    bounds = _bounds(tables, levels, **options) if prune else [math.inf] * len(levels)
    values = level1_values(tables)
    solutions = []
    for idx in range(len(levels)):
        sol = solve(tables, values, _level_options(levels, idx, False, **options), bounds[idx])
        solutions.append(sol)
        values = next_level_values(sol.F, tables.size)
    return solutions


def _objective(solutions: list[LevelSolution], n: int) -> float:
    return solutions[-1].best(0, n - 1)


def smallest_memory(tables: Tables, levels, **options) -> float | None:
    """The least memory per worker under which a plan exists (None: no memory is enough)."""
    def feasible(mem: float) -> bool:
        return math.isfinite(_objective(solve_levels(tables, levels, memory_bytes=mem, **options), tables.size))

    hi = (float(tables.activation[-1]) + float(tables.parameters[-1])) * max(w for w, _ in levels) + 1.0
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


def _read_levels(solutions: list[LevelSolution], n: int):
    """Per level (innermost first): stages (start, end, replicas, first machine in its block)."""
    per_level: list[list[tuple[int, int, int, int]]] = [[] for _ in solutions]
    blocks = [(0, n)]
    for lvl in range(len(solutions) - 1, -1, -1):
        found = []
        for start, end in blocks:
            first = 0
            for s, e, r in solutions[lvl].split(start, end - 1):
                found.append((s, e, r, first))
                first += r
        per_level[lvl] = found
        blocks = [(s, e) for s, e, _, _ in found]
    return per_level


def _leaves(per_level, n: int) -> list[Leaf]:
    ends = [{e for _, e, _, _ in stages} for stages in per_level]
    leaves = []
    for s0, e0, _, _ in per_level[0]:
        replicas, first = [], []
        for stages in per_level:
            s, e, r, f = next(st for st in stages if st[0] <= s0 < st[1])
            replicas.append(r)
            first.append(f)
        cut = -1 if e0 == n else max(lvl for lvl, es in enumerate(ends) if e0 in es)
        leaves.append(Leaf(s0, e0, replicas, first, cut))
    return leaves


def pipedream_plan(profile: Profile, levels, *, memory_bytes=None, memory_constraint=False, straight=False,
                   fewer_workers=False, activation_compression=1.0, max_states=2000,
                   linearise=None) -> Plan:
    chain = state_chain(profile, max_states=max_states, linearise=linearise)
    tables = tables_of(chain)
    n = tables.size
    options = dict(straight=straight, fewer_workers=fewer_workers, activation_compression=activation_compression)
    mem = (memory_bytes if memory_bytes is not None else 16e9) if memory_constraint else None
    solutions = solve_levels(tables, levels, memory_bytes=mem, **options)
    best = _objective(solutions, n)
    if not math.isfinite(best):
        if straight and total_workers(levels) > n:
            raise PlanError(f"workers: a straight pipeline needs one stage per worker, but the model has only {n} "
                            f"states for {total_workers(levels)} workers; use fewer workers or --fewer-workers")
        need = smallest_memory(tables, levels, **options) if mem is not None else None
        if need is None:
            raise PlanError("no feasible plan for this cluster (even without a memory limit)")
        raise PlanError(f"memory: no plan fits in {mem:.6g} bytes per worker; the smallest memory per worker "
                        f"that fits is {math.ceil(need)} bytes ({need / 1e9:.3f} GB)")
    per_level = _read_levels(solutions, n)
    leaves = _leaves(per_level, n)
    stages = build_stages(chain, leaves, levels, profile, activation_compression)
    single = float(tables.compute[-1])
    dp_time = data_parallel_time(single, float(tables.parameters[-1]), levels)
    used = sum(st.replicas for st in stages)
    level_out = [
        Level(
            level=lvl + 1,
            workers=levels[lvl][0],
            bandwidth=levels[lvl][1],
            stages=[LevelStage(s, e, r, Tables.block(tables, tables.compute, s, e - 1)) for s, e, r, _ in stages_]
        )
        for lvl, stages_ in enumerate(per_level)
    ]
    return Plan(
        method="pipedream",
        model=profile.model,
        state_graph=chain.kind,
        states=n,
        cluster=list(levels),
        total_workers=total_workers(levels),
        workers_used=used,
        predicted_time_s=best,
        single_worker_time_s=single,
        data_parallel_time_s=dp_time,
        speedup_vs_single=single / best if best > 0 else math.inf,
        speedup_vs_data_parallel=dp_time / best if best > 0 else math.inf,
        data_parallel_speedup_vs_single=single / dp_time if dp_time > 0 else math.inf,
        noam=math.ceil(used / stages[0].replicas),
        levels=level_out,
        stages=stages,
        options={**options, "memory_bytes": memory_bytes, "memory_constraint": memory_constraint,
                 "max_states": max_states},
    )
