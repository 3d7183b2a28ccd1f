"""The top level on a chain, restricted to the entries an optimal plan can use.

On a chain every stage costs at least its compute over its workers, so with an upper bound U
on the optimum, the states 0..j on m+1 top machines (W workers each) can only be part of an
optimal plan if their compute is at most U*(m+1)*W and the rest of the model fits on the
other M-1-m machines: compute(j+1..) <= U*(M-1-m)*W. For each m the usable end states form
a band about (U*M*W - total) wide, and a last stage on m' machines runs from the band of
m-m' to the band of m. Solving only those entries, machine count outermost as the reference
does, is exact for every entry an optimal plan uses (each is computed from all candidates
within the bands) and costs the square of the band width instead of the square of the chain.
"""

from __future__ import annotations

import numpy as np

from trainer.plan.dp import INF, SLACK, LevelOptions, Tables, _groups, _stash_factor, single_stage_costs
from trainer.plan.paircosts import pair_stage_costs, pair_sums


def grid_upper_bound(t: Tables, values: np.ndarray, opt: LevelOptions, count: int = 64) -> float:
    """The same top level with last stages starting only at ~count grid states: a plan the
    full DP also considers, so its value bounds the optimum from above."""
    n, M = t.size, opt.machines
    cum = t.compute
    order = np.argsort(cum, kind="stable")
    grid = np.unique(order[np.minimum(np.searchsorted(cum[order], cum[-1] * np.arange(1, count) / count), n - 1)])
    on_grid = np.zeros(n, dtype=bool)
    on_grid[grid] = True
    on_grid[n - 1] = False
    F = _fresh_table(t, values, opt)
    reps = np.arange(1, (1 if opt.straight else M - 1) + 1, dtype=float)
    pk, pj = t.pairs()
    keep = on_grid[pk]
    pk, pj = pk[keep], pj[keep]
    _sweep(F, t, values, opt, pk, pj, reps)
    return float(F[n - 1, M - 1])


def _fresh_table(t: Tables, values: np.ndarray, opt: LevelOptions) -> np.ndarray:
    n, M = t.size, opt.machines
    acts, params = t.block_sums()
    F = np.full((n, M), INF)
    for m in range(1 if opt.straight else M):
        F[:, m] = single_stage_costs(values, acts, params, opt, 0, slice(0, n), m)
    return F


def _sweep(F, t: Tables, values, opt: LevelOptions, pk, pj, reps) -> None:
    """Machine count outermost over the given (k, j) pairs (sorted by j)."""
    M = opt.machines
    sums = pair_sums(t, pk, pj)
    cost = pair_stage_costs(t, values, opt, pk, pj, reps, sums) if len(pk) else np.zeros((0, len(reps)))
    stash = sums.stash() if opt.memory_bytes is not None else None
    ends, starts = _groups(pj)  # the same for every machine count
    for m in range(1, M):
        if opt.fewer_machines:
            np.minimum(F[1:, m], F[1:, m - 1], out=F[1:, m])
        if len(pk) == 0:
            continue
        r_max = min(len(reps), m)
        prefix = F[pk][:, m - np.arange(1, r_max + 1)]
        c = cost[:, :r_max]
        if stash is not None:
            factor = _stash_factor(m + 1, np.arange(1, r_max + 1), M)
            c = np.where(stash[:, None] * factor[None, :] > opt.memory_bytes, INF, c)
        best = np.minimum.reduceat(np.maximum(prefix, c).min(axis=1), starts)
        F[ends, m] = np.minimum(F[ends, m], best)


def solve_top_of_chain(t: Tables, values: np.ndarray, opt: LevelOptions, upper: float,
                       workers_per_machine: int) -> np.ndarray:
    """F (n, M, 1) for row 0 of a final level, exact wherever an optimal plan goes.

    Needs a chain: there every stage costs at least its compute over its workers, at any level.
    """
    M = opt.machines
    cum = t.compute
    total = float(cum[-1])
    cap = upper * SLACK * workers_per_machine
    tol = 1e-12 * total
    F = _fresh_table(t, values, opt)
    F[F > upper * SLACK] = INF
    # Band of m: states j whose compute fits m+1 machines and whose rest fits the other M-1-m.
    bands = [np.nonzero((cum <= cap * (m + 1) + tol) & (total - cum <= cap * (M - 1 - m) + tol))[0] for m in range(M)]
    R = 1 if opt.straight else M - 1
    for m in range(1, M):
        if opt.fewer_machines:
            np.minimum(F[1:, m], F[1:, m - 1], out=F[1:, m])
        js = bands[m][bands[m] > 0]
        if len(js) == 0:
            continue
        best = np.full(len(js), INF)
        for r in range(1, min(R, m) + 1):
            ks = bands[m - r]
            ks = ks[ks < js[-1]]
            if len(ks) == 0:
                continue
            valid = ks[:, None] < js[None, :]  # on a chain every earlier state precedes
            kk, jj = np.nonzero(valid)
            pk, pj = ks[kk], js[jj]
            sums = pair_sums(t, pk, pj)
            cost = pair_stage_costs(t, values, opt, pk, pj, np.array([float(r)]), sums)[:, 0]
            if opt.memory_bytes is not None:
                stash = sums.stash() * _stash_factor(m + 1, r, M)
                cost = np.where(stash > opt.memory_bytes, INF, cost)
            cand = np.full(valid.shape, INF)
            cand[kk, jj] = np.maximum(F[pk, m - r], cost)
            np.minimum(best, cand.min(axis=0), out=best)
        F[js, m] = np.minimum(F[js, m], best)
    return F[:, :, None]
