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

from trainer.plan.dp import INF, LevelOptions, Tables, _stash_factor, pair_stage_costs, single_stage_costs


def is_chain(t: Tables) -> bool:
    return all(len(p) == j for j, p in enumerate(t.predecessors))


def grid_upper_bound(t: Tables, values: np.ndarray, opt: LevelOptions, count: int = 64) -> float:
    """The same top level with last stages starting only at ~count grid states: a plan the
    full DP also considers, so its value bounds the optimum from above."""
    n, M = t.size, opt.machines
    cum = t.compute
    grid = np.unique(np.searchsorted(cum, cum[-1] * np.arange(1, count) / count))
    grid = grid[grid < n - 1]
    F = _fresh_table(t, values, opt)
    reps = np.arange(1, (1 if opt.straight else M - 1) + 1, dtype=float)
    pk = np.concatenate([grid[grid < j] for j in range(n)]).astype(np.intp)
    pj = np.concatenate([np.full(int((grid < j).sum()), j, dtype=np.intp) for j in range(n)])
    _sweep(F, t, values, opt, pk, pj, reps, lambda m: slice(0, n))
    return float(F[n - 1, M - 1])


def _fresh_table(t: Tables, values: np.ndarray, opt: LevelOptions) -> np.ndarray:
    n, M = t.size, opt.machines
    acts, params = t.block_sums()
    F = np.full((n, M), INF)
    for m in range(1 if opt.straight else M):
        F[:, m] = single_stage_costs(values, acts, params, opt, 0, slice(0, n), m)
    return F


def _sweep(F, t: Tables, values, opt: LevelOptions, pk, pj, reps, ends_for) -> None:
    """Machine count outermost over the given (k, j) pairs (sorted by j)."""
    n, M = t.size, opt.machines
    acts, params = t.block_sums()
    cost = pair_stage_costs(t, values, params, opt, pk, pj, reps) if len(pk) else np.zeros((0, len(reps)))
    stash = acts[pk + 1, pj] + params[pk + 1, pj] if opt.memory_bytes is not None else None
    for m in range(1, M):
        if opt.fewer_machines:
            np.minimum(F[1:, m], F[1:, m - 1], out=F[1:, m])
        window = ends_for(m)
        sel = (pj >= window.start) & (pj < window.stop) if len(pk) else np.zeros(0, dtype=bool)
        if not sel.any():
            continue
        k, j, c = pk[sel], pj[sel], cost[sel]
        r_max = min(len(reps), m)
        prefix = F[k][:, m - np.arange(1, r_max + 1)]
        c = c[:, :r_max]
        if stash is not None:
            factor = _stash_factor(m + 1, np.arange(1, r_max + 1), M)
            c = np.where(stash[sel][:, None] * factor[None, :] > opt.memory_bytes, INF, c)
        ends, starts = np.unique(j, return_index=True)
        best = np.minimum.reduceat(np.maximum(prefix, c).min(axis=1), starts)
        F[ends, m] = np.minimum(F[ends, m], best)


def solve_top_of_chain(t: Tables, values: np.ndarray, opt: LevelOptions, upper: float,
                       workers_per_machine: int) -> np.ndarray:
    """F (n, M, 1) for row 0 of a final level on a chain, exact wherever an optimal plan goes."""
    n, M = t.size, opt.machines
    cum = t.compute
    total = float(cum[-1])
    cap = upper * (1 + 1e-9) * workers_per_machine
    F = _fresh_table(t, values, opt)
    F[F > upper * (1 + 1e-9)] = INF
    # Band of m: states j with cum[j] <= cap*(m+1) and total - cum[j] <= cap*(M-1-m).
    lo = [int(np.searchsorted(cum, total - cap * (M - 1 - m) - 1e-12 * total, side="left")) for m in range(M)]
    hi = [int(np.searchsorted(cum, cap * (m + 1) + 1e-12 * total, side="right")) for m in range(M)]
    R = 1 if opt.straight else M - 1
    for m in range(1, M):
        if opt.fewer_machines:
            np.minimum(F[1:, m], F[1:, m - 1], out=F[1:, m])
        j_lo, j_hi = max(lo[m], 1), min(hi[m], n)
        if j_lo >= j_hi:
            continue
        js = np.arange(j_lo, j_hi)
        best = np.full(len(js), INF)
        for r in range(1, min(R, m) + 1):
            k_lo, k_hi = lo[m - r], min(hi[m - r], j_hi - 1)
            if k_lo >= k_hi:
                continue
            ks = np.arange(k_lo, k_hi)
            kk, jj = np.meshgrid(ks, js, indexing="ij")
            valid = kk < jj
            pk, pj = kk[valid], jj[valid]
            cost = pair_stage_costs(t, values, t.block_sums()[1], opt, pk, pj, np.array([float(r)]))[:, 0]
            if opt.memory_bytes is not None:
                acts, params = t.block_sums()
                stash = (acts[pk + 1, pj] + params[pk + 1, pj]) * _stash_factor(m + 1, r, M)
                cost = np.where(stash > opt.memory_bytes, INF, cost)
            cand = np.full(kk.shape, INF)
            cand[valid] = np.maximum(F[pk, m - r], cost)
            np.minimum(best, cand.min(axis=0), out=best)
        F[j_lo:j_hi, m] = np.minimum(F[j_lo:j_hi, m], best)
    return F[:, :, None]
