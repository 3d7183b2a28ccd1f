"""Strategy "all rows": a level below the top, every block start at once, one end state at a time.

A level below the top is read by the level above for any block i..j, so it needs every block
start i (a row of the reference's A[i][j][m]). Its pure-Python loops are cubic in the states
and quadratic in the machines; here, for one end state j, the loops over the predecessors k,
the replica counts m' and every row i run as array operations, pulling from all of j's
predecessors at once (with the machine count inside: A[i][j][m] reads only other end states,
all finished before j). Two facts keep it simple:

- in row i only predecessors k >= i can start the last stage (for k < i the row is empty), so
  an empty entry (+inf) is the only mask needed;
- predecessors come in ascending slabs, and a slab whose last state is k only reads rows
  i <= k, so each slab touches only the rows it can change.

The candidates are the plain recurrence's, formed by the same cost functions: the same table.
"""

from __future__ import annotations

import numpy as np

from pipeboard.trainer.plan.strategies.arrays import ArrayTable, ChainArrays
from pipeboard.trainer.plan.formulas import INF, LevelSpec, over_memory, stash_factor
from pipeboard.trainer.plan.strategies.top_row import solve_row

CHUNK = 32  # predecessors per slab: keeps the temporaries in cache


def solve_level(a: ChainArrays, spec: LevelSpec, values) -> ArrayTable:
    """Every row 0..n of a level below the top; its full blocks become the next level's values."""
    F = solve_rows(a, spec, values)
    n = a.size
    rows = {i: F[:, :, i] for i in range(n + 1)}
    return ArrayTable(a, spec, values, rows, lambda i: solve_row(a, spec, values, i),
                      np.ascontiguousarray(F[:, -1, :].T))


def solve_rows(a: ChainArrays, spec: LevelSpec, values) -> np.ndarray:
    """F[j, m, i] = A[i][j][m] for every block start i = 0..n."""
    n, M = a.size, spec.machines
    F = np.full((n, M, n + 1), INF)
    single = 1 if spec.straight else M
    i = np.arange(n + 1)[:, None]
    j = np.arange(n)[None, :]
    for r in range(1, single + 1):  # single-stage blocks (+inf where j < i)
        F[:, r - 1, :] = a.first_stages(spec, values, i, j, float(r)).T
    R = len(spec.replica_counts(M))
    if R == 0:
        return F
    reps = np.arange(1, R + 1, dtype=float)[None, :]
    # stash factors ceil((M - (m+1)) / m') per replica count m' (rows) and target m (columns)
    factors = stash_factor(M, np.arange(1, M + 1)[None, :], np.arange(1, R + 1)[:, None])
    scratch = np.empty(CHUNK * M * (n + 1))  # reused: fresh large temporaries would page-fault
    reduced = np.empty(M * (n + 1))
    for end in range(1, n):
        preds = a.predecessors(end)
        if len(preds) == 0:
            continue
        cost = a.stage_costs(spec, values, preds[:, None], np.full((len(preds), 1), end), reps)  # (K, R)
        target = np.broadcast_to(cost[:, :, None], cost.shape + (M,))  # (K, R, M): per target m
        if spec.memory is not None:
            over = over_memory(a.stashes(preds, end)[:, None, None], factors[None], spec.memory)
            target = np.where(over, INF, target)
        _pull(F, end, preds, target, R, scratch, reduced)
        if spec.fewer:
            # A[i][j][m] may keep A[i][j][m-1] (the reference's fewer machines), rows i < j.
            F[end, :, :end] = np.minimum.accumulate(F[end, :, :end], axis=0)
    return F


def _pull(F: np.ndarray, end: int, preds: np.ndarray, target: np.ndarray, R: int, scratch, reduced) -> None:
    """Rows i < end: A[i][end][m] = min over k, m' of max(A[i][k][m - m'], cost(k, end, m'))."""
    M = F.shape[1]
    best = np.full((M, end), INF)
    for lo in range(0, len(preds), CHUNK):
        ks = preds[lo:lo + CHUNK]
        width = int(ks[-1]) + 1  # rows i <= the slab's last k (row i is empty before state i)
        if int(ks[-1]) - int(ks[0]) + 1 == len(ks):  # contiguous (chains): a view, no copy
            part = F[int(ks[0]):width, :, :width]
        else:
            part = F[ks, :, :width]  # (k, M, rows)
        for r in range(1, R + 1):
            span = M - r
            if span <= 0:
                break
            cost_r = target[lo:lo + CHUNK, r - 1, r:]  # (k, span): for target m = m'' + r
            cand = scratch[: len(ks) * span * width].reshape(len(ks), span, width)
            np.maximum(part[:, :span], cost_r[:, :, None], out=cand)
            red = reduced[: span * width].reshape(span, width)
            np.minimum.reduce(cand, axis=0, out=red)
            np.minimum(best[r:, :width], red, out=best[r:, :width])
    np.minimum(F[end, 1:, :end], best[1:], out=F[end, 1:, :end])
