"""Strategy "two machines at the top": the level just below a two-machine outermost level.

With two machines at the top, the top level either keeps the model as one block (on one or
both machines) or splits it once: block 0..k on one machine, block k+1..n-1 on the other. So
from the level below it reads row 0 (every end state) and, of every other row i, only the
block that ends at the last state. Those blocks share their tails: block i..n-1 is a first
stage i..k1 (the only part that depends on i) followed by a chain of stages k1+1..n-1 on the
remaining machines, and the best such chain, for every k1 and machine count, is one backward
recurrence for all rows at once (``tail``). Both directions take the min over the same
decompositions of the max of the same stage costs (min and max round nothing), so the values
are the forward recurrence's, bit for bit.

Not used with both a memory limit and ``fewer`` (the stash check then depends on how many
machines the whole block ends up using, which the backward recurrence does not know).
"""

from __future__ import annotations

import numpy as np

from pipeboard.trainer.plan.strategies.arrays import ArrayTable, ChainArrays
from pipeboard.trainer.plan.formulas import INF, LevelSpec, over_memory, stash_factor
from pipeboard.trainer.plan.strategies.top_row import solve_row


def applies(spec: LevelSpec, top: LevelSpec) -> bool:
    """Whether the level ``spec``, just below the final level ``top``, can be solved this way."""
    return (top.final and top.machines == 2 and not spec.final and spec.machines > 1
            and not (spec.memory is not None and spec.fewer))


def tail(a: ChainArrays, spec: LevelSpec, values) -> np.ndarray:
    """T[k, r]: the best chain of stages from state k+1 to the last state on exactly r machines
    (at most r with ``fewer``); T[last, 0] = -inf (nothing left to run)."""
    n, M = a.size, spec.machines
    last = n - 1
    R = len(spec.replica_counts(M))
    reps = np.arange(1, R + 1, dtype=float)[None, :]
    T = np.full((n, M), INF)
    T[last, 0] = -INF
    if spec.fewer:
        T[last, :] = -INF
    reaches = np.zeros(n, dtype=bool)  # states from which the last state can be reached
    reaches[a.predecessors(last)] = True
    reaches[last] = True
    successors: list[list[int]] = [[] for _ in range(n)]
    for k2 in np.flatnonzero(reaches).tolist():
        for k in a.predecessors(k2).tolist():
            successors[k].append(k2)
    r_idx = np.arange(1, R + 1)[:, None]
    remaining = np.arange(M)[None, :] - r_idx  # (R, M): machines left after the stage
    valid = remaining >= 0
    rem_clip = np.where(valid, remaining, 0)
    factor = stash_factor(M, M - remaining, r_idx) if spec.memory is not None else None
    for k in range(last - 1, -1, -1):
        if not reaches[k] or not successors[k]:
            continue
        ends = np.array(successors[k], dtype=np.intp)[:, None]
        cost = a.stage_costs(spec, values, np.full(ends.shape, k), ends, reps)  # (E, R)
        cand = np.broadcast_to(cost[:, :, None], cost.shape + (M,)).copy()
        if factor is not None:
            cand[over_memory(a.stashes(k, ends[:, 0])[:, None, None], factor[None], spec.memory)] = INF
        np.maximum(cand, T[ends[:, 0]][:, rem_clip], out=cand)  # the chain after k2 on the machines left
        cand[:, ~valid] = INF
        T[k] = cand.min(axis=(0, 1))
        T[k, 0] = INF
        if spec.fewer:
            T[k, 1:] = np.minimum.accumulate(T[k, 1:])
    return T


def solve_level(a: ChainArrays, spec: LevelSpec, values) -> ArrayTable:
    """Row 0 in full, and of every other row only its block ending at the last state."""
    n, M = a.size, spec.machines
    row0 = solve_row(a, spec, values, 0)
    T = tail(a, spec, values)
    rows = np.arange(1, n)[:, None]
    first_ends = np.arange(n)[None, :]
    best = np.full(n - 1, INF)
    for m in range(1 if spec.straight else M):
        # First stage i..k1 on m+1 machines for every row and k1 at once, then the tail.
        first = a.first_stages(spec, values, rows, first_ends, float(m + 1))
        np.minimum(best, np.maximum(first, T[:, M - 1 - m][None, :]).min(axis=1), out=best)
    if spec.fewer and n >= 2:
        # The block of the last state alone is only its single stage on all machines (the
        # reference offers fewer machines only to blocks of two or more states).
        best[-1] = a.first_stages(spec, values, n - 1, n - 1, float(M)) if M == 1 or not spec.straight else INF
    top_values = np.full((n + 1, n), INF)
    top_values[0] = row0[:, -1]
    top_values[1:n, n - 1] = best
    return ArrayTable(a, spec, values, {0: row0}, lambda i: solve_row(a, spec, values, i), top_values)
