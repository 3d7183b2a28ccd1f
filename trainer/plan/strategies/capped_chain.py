"""Strategy "capped chain", its solver: capped levels stored as bands, with a compiled inner loop.

Row i of a capped chain level keeps only its entries i..cap(i) (``chain_caps``), stored at
``band[i, m, j - i]`` instead of a dense (n, M, n+1) table: tens of megabytes rather than
gigabytes, and each row contiguous for the loop below. That loop (``pull_rows_windowed``) adds
each end state's candidates, but only those that can win. On a chain, for A[i][j][m] with the
last stage k+1..j on m' replicas, the candidate is max(A[i][k][m-m'], cost) with

- the prefix at least its compute over its workers: A[i][k][m''] >= c(i..k) / (w (m''+1)),
- the last stage at least its compute over its workers: cost >= c(k+1..j) / (w m'),

w being the workers per machine of this level (1 at level 1; above, every value is a full
block of the level below, itself at least its compute over its workers). So with b the best
candidate so far (or the row's bound, when smaller), only the states k with c(i..k) <= b w
(m''+1) and c(k+1..j) <= b w m' can improve it: a window found by binary search and closed as
k descends (none at all when c(i..j) > b w (m+1)). Everything kept is compared exactly as the
plain recurrence does (max, then min), so entries within the bounds are the same numbers; the
windows only skip candidates that are provably larger (slack 1e-9, far above the rounding).
The loop is plain Python, compiled by numba when it is installed (imported on first use only).
"""

from __future__ import annotations

import importlib.util

import numpy as np

from pipeboard.trainer.plan.strategies.arrays import ArrayTable, ChainArrays
from pipeboard.trainer.plan.strategies.chain_caps import SLACK
from pipeboard.trainer.plan.formulas import INF, LevelSpec, over_memory, stash_factor

_compiled = None


def available() -> bool:
    """Whether numba is installed to compile the loop."""
    return importlib.util.find_spec("numba") is not None


def _kernel(compiled: bool):
    global _compiled
    if not compiled:
        return pull_rows_windowed
    if _compiled is None:
        from numba import njit

        _compiled = njit(cache=True, nogil=True)(pull_rows_windowed)
    return _compiled


def solve_level(a: ChainArrays, spec: LevelSpec, values, bound, caps: np.ndarray, end_bounds: np.ndarray,
                workers: int, compiled: bool = True) -> ArrayTable:
    """Every row of a capped chain level: entries within a row's cap and bounds are exact.

    ``bound``: per row (or one number); ``end_bounds``: per block (n+1, n); ``workers``: the
    workers per machine of this level."""
    n, M = a.size, spec.machines
    rows = np.arange(n + 1)
    bound = np.broadcast_to(np.asarray(bound, dtype=float), rows.shape)
    by_end = np.ascontiguousarray(np.asarray(end_bounds, dtype=float).T)  # (n, rows)
    caps = np.minimum(np.asarray(caps, dtype=np.intp), n - 1)
    width = max(1, int((caps - rows).max()) + 1)
    band = np.full((n + 1, M, width), INF)
    single = np.arange(1, (1 if spec.straight else M) + 1, dtype=float)[:, None]
    for i in range(n):
        end = int(caps[i]) + 1
        if end > i:
            costs = a.first_stages(spec, values, i, np.arange(i, end)[None, :], single)
            band[i, :len(single), :end - i] = np.where(costs > np.minimum(bound[i], by_end[i:end, i]), INF, costs)
    R = len(spec.replica_counts(M))
    if R:
        _pull_all(a, spec, values, band, bound, by_end, caps, R, workers, _kernel(compiled))
    return ArrayTable(a, spec, values, {}, lambda i: dense_row(band, i, n), full_values(band, n))


def _pull_all(a: ChainArrays, spec: LevelSpec, values, band, bound, by_end, caps, R: int, workers: int, kernel):
    n, M = a.size, spec.machines
    rows = np.arange(n + 1)
    first_row = np.searchsorted(np.maximum.accumulate(caps), np.arange(n))  # rows before it stop short of j
    compute = a.compute.dense()
    compute_t = np.ascontiguousarray(compute.T)
    reps = np.arange(1, R + 1, dtype=float)[None, :]
    factors = stash_factor(M, np.arange(1, M + 1)[:, None, None], np.arange(1, R + 1)[None, :, None])  # (M, R, 1)
    for j in range(1, n):
        lo = int(first_row[j])
        if lo >= j:
            continue
        preds = a.predecessors(j)
        preds = np.ascontiguousarray(preds[preds >= lo])
        j_bound = np.ascontiguousarray(np.minimum(bound, by_end[j]))
        cost = a.stage_costs(spec, values, preds[:, None], np.full((len(preds), 1), j), reps)  # (K, R)
        keep = cost.min(axis=1) <= j_bound[lo:j].max()
        preds, cost = preds[keep], cost[keep]
        if spec.memory is not None:  # (M, R, K): the stash check depends on the target m
            over = over_memory(a.stashes(preds, j)[None, None, :], factors, spec.memory)
            costs = np.ascontiguousarray(np.where(over, INF, cost.T[None]))
        else:
            costs = np.ascontiguousarray(cost.T)[None]  # (1, R, K): the same for every target
        kernel(band, j, lo, j, rows, caps, preds, costs, R, j_bound, compute, compute_t, float(workers), SLACK,
               bool(spec.fewer))


def dense_row(band: np.ndarray, i: int, n: int) -> np.ndarray:
    """(n, M): row i's entries as a dense row (+inf off the band)."""
    M, width = band.shape[1], band.shape[2]
    table = np.full((n, M), INF)
    w = min(width, n - i)
    table[i:i + w] = band[i, :, :w].T
    return table


def full_values(band: np.ndarray, n: int) -> np.ndarray:
    """The next level's compute times ((n+1, n)): each block's entry on all machines."""
    width = band.shape[2]
    v = np.full((n + 1, n), INF)
    i = np.repeat(np.arange(n), width)
    d = np.tile(np.arange(width), n)
    inside = i + d < n
    v[i[inside], i[inside] + d[inside]] = band[i[inside], -1, d[inside]]
    return v


def pull_rows_windowed(G, j, first, top, rows, caps, preds, costs, R, row_bound, compute, compute_t, workers,
                       slack, fewer):
    """For each row column c in first..top-1 whose cap reaches j (row i = rows[c]):
    A[i][j][m] = min(A[i][j][m], min over k in preds, m' of max(A[i][k][m - m'], cost)), then,
    with ``fewer``, A[i][j][m] = min(A[i][j][m], A[i][j][m-1]) (the reference's fewer machines).

    A row's entries live in a band: A[i][j][m] = G[c, m, j - i]. ``costs[t, m' - 1, p]`` is the
    last stage's cost from ``preds[p]`` on m' replicas for the target m = t (one t for every m
    when no memory check makes it depend on m). ``compute[i, k]`` is the compute of states
    i..k, ``compute_t`` its transpose."""
    M = G.shape[1]
    K = preds.shape[0]
    per_target = costs.shape[0] > 1
    for c in range(first, top):
        i = rows[c]
        if caps[c] < j:
            continue  # nothing of row i ending at j matters
        d = j - i
        # preds[start:] are the states k >= i (row i's prefix must hold at least state i).
        lo, hi = 0, K
        while lo < hi:
            mid = (lo + hi) // 2
            if preds[mid] < i:
                lo = mid + 1
            else:
                hi = mid
        start = lo
        for m in range(1, M):
            if start >= K:
                break
            b = G[c, m, d]
            # Prefix and last stage together hold the whole block on m+1 machines: if its compute
            # exceeds that many machines' worth at the limit, no split can come in under it.
            if compute[i, j] > min(b, row_bound[c]) * slack * workers * (m + 1) * slack:
                continue
            for r in range(1, min(R, m) + 1):
                mm = m - r
                limit = min(b, row_bound[c]) * slack
                # The last k whose prefix can fit: c(i..k) <= limit * w * (mm+1) (a bit of slack
                # on top, so sums a few ulps off monotone cannot hide a state from the search).
                cap = limit * workers * (mm + 1) * slack
                lo, hi = start, K
                while lo < hi:
                    mid = (lo + hi) // 2
                    if compute[i, preds[mid]] <= cap:
                        lo = mid + 1
                    else:
                        hi = mid
                for idx in range(lo - 1, start - 1, -1):
                    k = preds[idx]
                    limit = min(b, row_bound[c]) * slack
                    if compute_t[j, k + 1] > limit * workers * r:
                        break  # earlier states only make the last stage bigger
                    if compute[i, k] > limit * workers * (mm + 1):
                        continue
                    cost = costs[m if per_target else 0, r - 1, idx]
                    if cost >= b:
                        continue
                    v = G[c, mm, k - i]
                    if v < cost:
                        v = cost
                    if v < b:
                        b = v
            G[c, m, d] = b
        if fewer:
            for m in range(1, M):
                if G[c, m - 1, d] < G[c, m, d]:
                    G[c, m, d] = G[c, m - 1, d]
