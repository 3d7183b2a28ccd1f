"""A capped chain level stored as bands: row i keeps only its entries i..cap(i).

Below the top level of a long chain every block start is a row, and ``chaincap`` bounds how
far each row can usefully reach (a few hundred states of 2,000). Storing row i's entries
A[i][j][m] at ``band[i, m, j - i]`` instead of a dense (n, M, n+1) table keeps the level in tens
of megabytes rather than gigabytes, and lets the compiled loop of ``chainkernel`` walk each row
contiguously. The values are those of ``dp.solve_level`` under the same caps and bounds.
"""

from __future__ import annotations

import numpy as np

from trainer.plan import chainkernel
from trainer.plan.dp import INF, SLACK, LevelOptions, Tables, _target_costs, last_stage_costs, single_stage_costs

# Below this many states the NumPy DP under the same caps is quicker than importing numba (and,
# after a change to chainkernel, compiling it).
FROM_STATES = 300


def solve_banded(t: Tables, values: np.ndarray, opt: LevelOptions, bound, caps: np.ndarray,
                 end_bounds: np.ndarray, workers: int) -> np.ndarray:
    """(n+1, M, width): band[i, m, d] = A[i][i+d][m] for d <= caps[i] - i (+inf elsewhere, or an
    entry that cannot matter). ``workers``: the workers per machine of this level."""
    n, M = t.size, opt.machines
    rows = np.arange(n + 1)
    bound = np.broadcast_to(np.asarray(bound, dtype=float), rows.shape)
    by_end = np.ascontiguousarray(np.asarray(end_bounds, dtype=float).T)  # (n, rows)
    caps = np.minimum(np.asarray(caps, dtype=np.intp), n - 1)
    width = max(1, int((caps - rows).max()) + 1)
    acts, params = t.block_sums()
    band = np.full((n + 1, M, width), INF)
    init_m = 1 if opt.straight else M
    for i in range(n):
        end = int(caps[i]) + 1
        if end <= i:
            continue
        limit = np.minimum(bound[i], by_end[i:end, i])
        for m in range(init_m):
            costs = single_stage_costs(values, acts, params, opt, i, slice(i, end), m)
            band[i, m, :end - i] = np.where(costs > limit, INF, costs)
    if M == 1:
        return band
    first_row = np.searchsorted(np.maximum.accumulate(caps), np.arange(n))  # rows before it stop short of j
    compute = t.compute_sums()
    compute_t = np.ascontiguousarray(compute.T)
    R = 1 if opt.straight else M - 1
    reps = np.arange(1, R + 1, dtype=float)
    for j in range(1, n):
        lo = int(first_row[j])
        if lo >= j:
            continue
        preds = t.predecessors[j]
        preds = np.ascontiguousarray(preds[preds >= lo])
        j_bound = np.ascontiguousarray(np.minimum(bound, by_end[j]))
        cost = last_stage_costs(t, values, params, opt, preds, j, reps)  # (K, R)
        stash = acts[preds + 1, j] + params[preds + 1, j] if opt.memory_bytes is not None else None
        keep = cost.min(axis=1) <= j_bound[lo:j].max()
        preds, cost = preds[keep], cost[keep]
        if stash is not None:
            costs = np.ascontiguousarray(_target_costs(cost, stash[keep], opt).transpose(2, 1, 0))
        else:
            costs = np.ascontiguousarray(cost.T)[None]  # (1, R, K): the same for every target
        chainkernel.pull_rows_windowed(band, j, lo, j, rows, caps, preds, costs, R, j_bound, compute, compute_t,
                                       float(workers), SLACK, bool(opt.fewer_machines))
    return band


def dense_row(band: np.ndarray, i: int, n: int) -> np.ndarray:
    """(n, M): row i's entries as ``dp.solve_level`` lays out one row (+inf off the band)."""
    M, width = band.shape[1], band.shape[2]
    table = np.full((n, M), INF)
    w = min(width, n - i)
    table[i:i + w] = band[i, :, :w].T
    return table


def full_values(band: np.ndarray, n: int) -> np.ndarray:
    """The next level's ``compute_times`` ((n+1, n)): each block's entry on all machines."""
    width = band.shape[2]
    v = np.full((n + 1, n), INF)
    i = np.repeat(np.arange(n), width)
    d = np.tile(np.arange(width), n)
    inside = i + d < n
    v[i[inside], i[inside] + d[inside]] = band[i[inside], -1, d[inside]]
    return v
