"""A compiled inner loop for chain levels: each entry's candidates, only those that can win.

``dp._pull_rows`` evaluates every (k, m'', row) candidate of a target state j as whole-array
NumPy operations. On a chain most of them cannot win: a candidate for A[i][j][m] with the last
stage k+1..j on m' replicas is max(A[i][k][m-m'], cost) and on a chain

- the prefix is at least its compute over its workers: A[i][k][m''] >= c(i..k) / (w (m''+1)),
- the last stage is at least its compute over its workers: cost >= c(k+1..j) / (w m'),

where w is the workers per machine of this level (1 at level 1; below it every value is a
full block's entry of the level below, itself at least its compute over its workers, and the
all-reduce and transfer terms only add). So with b the best candidate so far (or the row's
bound, when smaller), only states k with c(i..k) <= b w (m''+1) and c(k+1..j) <= b w m' can
improve it: a window found by binary search on the first and closed by the second as k
descends (and none at all when c(i..j) > b w (m+1), as the two parts share the block). An
entry above its row's bound may thus stay larger than the reference's, as in ``dp``; every
entry within it is exact. Everything kept is compared exactly as the NumPy path does (max, then min), so
entries are the same numbers; the windows only skip candidates that are provably larger
(with a relative slack of 1e-9, far above the rounding of the compute sums).
"""

from __future__ import annotations

import importlib.util

_compiled = None


def available() -> bool:
    """Whether numba is installed (the planner falls back to the NumPy DP without it)."""
    return importlib.util.find_spec("numba") is not None


def pull_rows_windowed(*args) -> None:
    """``_pull_rows_windowed`` compiled on first use (numba is imported only when a long chain
    needs it, so ``pipeboard plan`` keeps starting fast; the machine code is cached on disk)."""
    global _compiled
    if _compiled is None:
        from numba import njit

        _compiled = njit(cache=True, nogil=True)(_pull_rows_windowed)
    _compiled(*args)


def _pull_rows_windowed(G, j, first, top, rows, caps, preds, costs, R, row_bound, compute, compute_t, workers,
                        slack, fewer):
    """For each row column c in first..top-1 whose cap reaches j (row i = rows[c]):
    A[i][j][m] = min(A[i][j][m], min over k in preds, m' of max(A[i][k][m - m'], cost)), then,
    with ``fewer``, A[i][j][m] = min(A[i][j][m], A[i][j][m-1]) (the reference's fewer machines).

    A row's entries live in a band: A[i][j][m] = G[c, m, j - i], so every walk over k is
    contiguous. ``costs[t, m' - 1, p]`` is the last stage's cost from ``preds[p]`` on m'
    replicas for the target m = t (one t for every m when no memory check makes it depend on
    m). ``compute[i, k]`` is the compute of states i..k, ``compute_t`` its transpose."""
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
