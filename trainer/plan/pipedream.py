"""The PipeDream planner: hierarchical DP with stage replication, as the reference optimizer.

``pipedream_plan`` builds the antichain states (or a linearised order when they explode),
solves each level innermost first (each level's best time for a block on all its machines
becomes the next level's compute time for that block), then reads the stages back out level
by level from the top, as the reference prints them, and lays them out on worker ranks.

Where the time goes, and what keeps it small without changing the optimum:
- ``dp``: the reference's recurrence as array operations (all predecessors, replica counts
  and block starts at once);
- ``_bounds``: a cheap restricted solve gives an upper bound, and entries that provably
  cannot be on an optimal path are dropped (``dp.solve_level``'s ``bound``);
- ``suffix``: below a two-machine top level only blocks ending at the last state matter;
- ``band``: on chains, the top level only visits the states an optimal plan can reach;
- ``onelevel``: a one-level plan only takes last stages between states that can end a
  stage of a plan within an upper bound (by their compute and their outputs).
"""

from __future__ import annotations

import math

import numpy as np

from trainer.plan.states import StateChain, state_chain
from trainer.plan.cluster import Leaf, build_stages, data_parallel_time, total_workers
from trainer.plan.dp import SLACK, LevelOptions, Tables, level1_values
from trainer.plan.solution import LevelSolution, solve
from trainer.plan import band, bymachines, chaincap, dp, onelevel, suffix
from trainer.plan.errors import PlanError
from trainer.plan.model import Level, LevelStage, Plan, timing_fields
from trainer.profile.schema import Profile


def tables_of(chain: StateChain) -> Tables:
    return Tables(
        compute=chain.compute_s,
        activation=chain.activation,
        parameters=chain.parameters,
        output_activation=chain.output_activation,
        ancestor_bits=chain.ancestor_bits,
        _pairs=chain.pairs if chain.ancestor_bits is None else None,  # (a chain's are quick to list)
    )


# Below this much work (states^3 x machines^2) solving directly beats computing bounds first;
# so does solving the levels below the top machine count outermost (``bymachines``), which
# uses no bounds, where it is chosen.
DIRECT_BELOW = 3e6
# Above this much work (``bymachines.work``) below the top, the two-machine shortcut pays off.
SHORTCUT_ABOVE = 1e6
# Above this much top-level work (states^2 x machines^2) a chain's top level is solved in bands.
BAND_ABOVE = 2e7
# A chain on three or more levels first tries this multiple of its compute over its workers as
# the upper bound on the optimum (chaincap.solve_within corrects a wrong guess).
GUESS_ABOVE_COMPUTE = 1.25


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


def _grid_rows(tables: Tables, count: int = 32) -> np.ndarray:
    """Row 0 and the block starts nearest to ``count`` evenly spaced shares of the compute."""
    cum = tables.compute
    marks = np.searchsorted(cum, cum[-1] * np.arange(1, count) / count)
    return np.unique(np.concatenate([[0], np.clip(marks + 1, 1, tables.size - 1)]))


def _bounds(tables: Tables, levels, **options) -> list[np.ndarray | float]:
    """Per level, per block start, a value above which no entry can matter (+inf: no pruning).

    The upper bound U on the optimum is the same DP restricted to blocks starting at a few
    grid states: it only drops candidates, so the optimum is at most U. The top level reads a
    block i..j of the level below as ``(v + comm)/m'``, with comm >= 0 and m' <= M for i = 0,
    m' <= M - 1 otherwise (a later stage leaves a machine to the first), so entries above
    ``U*M`` (resp. ``U*(M-1)``) cannot be on an optimal path. Deeper levels are bounded the
    same way when the states form a chain; otherwise a block's comm can be negative there (the
    reference subtracts the sums of states that are not ancestors) and they stay unpruned.
    """
    L = len(levels)
    if L == 1:
        return [math.inf]
    grid = _grid_rows(tables)
    values = level1_values(tables)
    for idx in range(L):
        opt = _level_options(levels, idx, False, **options)
        sol = solve(tables, values, opt, rows=None if opt.final else grid)
        values = sol.next_values()
    return _bounds_from_upper(tables, levels, sol.best(0, tables.size - 1))


def _bounds_from_upper(tables: Tables, levels, upper: float) -> list[np.ndarray | float]:
    """``_bounds`` for a given upper bound on the optimum."""
    L = len(levels)
    if not math.isfinite(upper):
        return [math.inf] * L
    chain = tables.is_chain()
    bounds: list[np.ndarray | float] = [math.inf] * L
    bounds[-1] = upper * SLACK
    machines_above = levels[-1][0]
    below_top = np.full(tables.size + 1, upper * (machines_above - 1) * SLACK)
    below_top[0] = upper * machines_above * SLACK
    if chain:
        # Every stage of a chain costs at least its compute over its workers, so the states
        # before block i need ceil(compute / (U * workers per top machine)) top machines, and
        # the block can only have the rest.
        per_machine = total_workers(levels[:-1])
        before = np.concatenate([[0.0], tables.compute])  # compute of states 0..i-1, per row i
        needed = np.ceil(before / (upper * SLACK * per_machine) - 1e-9)
        room = np.maximum(machines_above - np.maximum(needed, 1), 0)
        below_top[1:] = np.minimum(below_top[1:], upper * room[1:] * SLACK)
    bounds[-2] = below_top
    if chain:
        for idx in range(L - 3, -1, -1):
            bounds[idx] = np.maximum.accumulate(bounds[idx + 1]) * levels[idx + 1][0] * SLACK
    return bounds


def _solve_top_of_chain(tables: Tables, values, opt: LevelOptions, upper: float, per_machine: int) -> LevelSolution:
    """The top level of a chain, solved only within the bands an optimal plan can reach."""
    if not math.isfinite(upper):
        upper = band.grid_upper_bound(tables, values, opt)
    if not math.isfinite(upper):
        return solve(tables, values, opt)
    F = band.solve_top_of_chain(tables, values, opt, upper, per_machine)
    return LevelSolution(tables, values, opt, np.zeros(1, dtype=np.intp), F)


def solve_levels(tables: Tables, levels, *, memory_bytes, straight, fewer_workers,
                 activation_compression, prune: bool = True, shortcuts: bool = True) -> list[LevelSolution]:
    """Solve every level, innermost first; entries that cannot matter are pruned when ``prune``."""
    options = dict(memory_bytes=memory_bytes, straight=straight, fewer_workers=fewer_workers,
                   activation_compression=activation_compression)
    L = len(levels)
    n = tables.size
    # Levels below the top whose rows are all solved at once (``bymachines``) need no bounds;
    # on small work they need no two-machine shortcut either (its own overhead is larger).
    work = bymachines.work(tables, np.arange(n + 1), max(w for w, _ in levels[:-1])) if L >= 2 else math.inf
    at_once = work <= dp.BY_MACHINES_UP_TO
    shortcut_below_top = shortcuts and L >= 2 and work > SHORTCUT_ABOVE and suffix.applies(
        _level_options(levels, L - 2, False, **options), levels[-1][0], True)
    # The bounds only pay off where full rows are solved; the shortcut leaves just the top.
    small = n * n * n * max(w for w, _ in levels) ** 2 < DIRECT_BELOW or at_once
    wanted = prune and not small and not (shortcut_below_top and L == 2)
    chain = tables.is_chain()
    if wanted and chain and L >= 3:
        # Long chains on many levels: block caps from a guessed upper bound (chaincap), which
        # also spares the grid solve that ``_bounds`` would spend on finding one. The guess:
        # a little above compute over workers, the least any plan can take.
        guess = float(tables.compute[-1]) / total_workers(levels) * GUESS_ABOVE_COMPUTE
        if guess > 0:
            solutions = chaincap.solve_within(
                lambda upper: solve_chain_within(tables, levels, options, upper, shortcut_below_top), guess, n)
            if solutions is not None:
                return solutions
    bounds = _bounds(tables, levels, **options) if wanted else [math.inf] * L
    return _solve_in_order(tables, levels, options, bounds, [None] * L, shortcut_below_top, prune)


def solve_chain_within(tables: Tables, levels, options: dict, upper: float,
                       shortcut_below_top: bool) -> list[LevelSolution]:
    """A chain's levels, exact if the optimum is at most ``upper`` (else a real plan's value
    above it, or +inf): per-level bounds and chaincap's block limits, all derived from it."""
    return _solve_in_order(tables, levels, options, _bounds_from_upper(tables, levels, upper),
                           chaincap.limits(tables, levels, upper), shortcut_below_top, True)


def _solve_in_order(tables: Tables, levels, options: dict, bounds, limits, shortcut_below_top: bool,
                    prune: bool) -> list[LevelSolution]:
    """Every level, innermost first, under the given per-level bounds and (caps, block bounds)."""
    L, n = len(levels), tables.size
    chain = tables.is_chain()
    # (one level reads few entries of its values: formed on read, not as a whole table)
    values = dp.level1_lazy(tables) if L == 1 else level1_values(tables)
    solutions = []
    for idx in range(L):
        opt = _level_options(levels, idx, False, **options)
        if shortcut_below_top and idx == L - 2:
            sol = suffix.solve_two_machine_below(tables, values, opt)
        elif idx == L - 1 and chain and prune and n * n * opt.machines ** 2 > BAND_ABOVE:
            sol = _solve_top_of_chain(tables, values, opt, bounds[-1], total_workers(levels[:-1]))
        elif L == 1:
            sol = LevelSolution(tables, values, opt, np.zeros(1, dtype=np.intp), onelevel.solve_top_row(tables, opt, prune))
        else:
            caps, end_bounds = limits[idx] if limits[idx] is not None else (None, None)
            # Capped chain levels also skip, in compiled code, candidates their compute rules out.
            workers = total_workers(levels[:idx]) if caps is not None else None
            sol = solve(tables, values, opt, bound=bounds[idx], caps=caps, end_bounds=end_bounds,
                        chain_workers=workers)
        solutions.append(sol)
        values = sol.next_values()
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
            _, _, r, f = next(st for st in stages if st[0] <= s0 < st[1])
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
    # A level's stage holds the flat stages inside its state range.
    layers_in = lambda s, e: [name for st in stages if s <= st.start_state < e for name in st.layers]  # noqa: E731
    level_out = [
        Level(
            level=lvl + 1,
            workers=levels[lvl][0],
            bandwidth=levels[lvl][1],
            stages=[LevelStage(s, e, r, Tables.block(tables, tables.compute, s, e - 1), layers_in(s, e))
                    for s, e, r, _ in stages_],
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
        **timing_fields(best, single, dp_time),
        noam=math.ceil(used / stages[0].replicas),
        levels=level_out,
        stages=stages,
        options={**options, "memory_bytes": memory_bytes, "memory_constraint": memory_constraint,
                 "max_states": max_states},
    )
