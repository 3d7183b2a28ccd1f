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
descends. Everything kept is compared exactly as the NumPy path does (max, then min), so
entries are the same numbers; the windows only skip candidates that are provably larger
(with a relative slack of 1e-9, far above the rounding of the compute sums).
"""

from __future__ import annotations

import numpy as np

try:  # the planner works without it (NumPy path); numba makes long chains fast
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; this keeps a broken install usable
    njit = None

SLACK = 1 + 1e-9


def available() -> bool:
    return njit is not None


def _pull_rows_windowed(F, j, first, top, rows, preds, costs, R, row_bound, compute, compute_t, workers, slack):
    """F[j, m, c] = min(F[j, m, c], min over k in preds, m' of max(F[k, m - m', c], cost)),
    for the row columns first..top-1, skipping candidates the compute bounds rule out.
    ``costs[t, m' - 1, p]`` is the last stage's cost from ``preds[p]`` on m' replicas for the
    target m = t (one t for every m when no memory check makes it depend on m). ``compute[i, k]``
    is the compute of states i..k, and ``compute_t`` its transpose. Every walk over k reads
    contiguous memory (F is best stored [c, m, j] underneath)."""
    M = F.shape[1]
    K = preds.shape[0]
    per_target = costs.shape[0] > 1
    for c in range(first, top):
        i = rows[c]
        # preds[start:] are the states k >= i (row i's prefix must hold at least state i).
        lo, hi = 0, K
        while lo < hi:
            mid = (lo + hi) // 2
            if preds[mid] < i:
                lo = mid + 1
            else:
                hi = mid
        start = lo
        if start >= K:
            continue
        for m in range(1, M):
            b = F[j, m, c]
            for r in range(1, min(R, m) + 1):
                mm = m - r
                limit = min(b, row_bound[c]) * slack
                if not limit < np.inf:
                    limit = np.inf
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
                    v = F[k, mm, c]
                    if v < cost:
                        v = cost
                    if v < b:
                        b = v
            F[j, m, c] = b


pull_rows_windowed = njit(cache=True, nogil=True)(_pull_rows_windowed) if njit is not None else None
