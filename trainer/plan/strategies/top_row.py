"""Strategy "top row": one block start's row, machine count outermost over every state pair.

The outermost level only needs row 0 (A[0][j][m] for every end state j), and reading a plan
back out needs single rows of the levels below. In the reference's loop order the machine
count m is outermost: A[i][j][m] reads only A[i][k][m - m'] with m' >= 1, so for one m every
(k, j) pair of the state DAG is done at once (a gather, a max, a min over m', then a minimum
per end state). Its candidates are exactly the plain recurrence's, formed with the same cost
functions, so the row is the same numbers.

The end states go in slabs of about ``slab_entries`` (pair, m') entries, each slab over every
machine count before the next: a slab reads only earlier states (finished) or its own at
smaller counts. Slabs keep the temporaries in cache, and NumPy calls few enough per slab that
call overhead stays small.
"""

from __future__ import annotations

import numpy as np

from pipeboard.trainer.plan.strategies.arrays import ArrayTable, ChainArrays, groups
from pipeboard.trainer.plan.formulas import INF, LevelSpec, over_memory, stash_factor

SLAB_ENTRIES = 1 << 16  # (pair, m') entries per slab: its cost table (512 KiB) stays in a core's L2 cache


def solve_level(a: ChainArrays, spec: LevelSpec, values, pairs=None) -> ArrayTable:
    """The final level: its row 0 (other rows, should a read-out want them, on first use)."""
    row0 = solve_row(a, spec, values, 0, pairs=pairs)
    return ArrayTable(a, spec, values, {0: row0}, lambda i: solve_row(a, spec, values, i))


def pairs_within(a: ChainArrays, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (k, j) whose last stage k+1..j is within the level below's caps (its value
    elsewhere is +inf, so no other pair has a candidate that can win)."""
    pk, pj = a.pairs()
    keep = pj <= caps[pk + 1]
    return pk[keep], pj[keep]


def solve_row(a: ChainArrays, spec: LevelSpec, values, row: int, slab_entries: int = SLAB_ENTRIES,
              pairs: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """(n, M): A[row][j][m] for every end state j and machine count m (+inf for j < row).

    ``pairs``: only these (k, j) pairs (grouped by j, k ascending) instead of all, when the
    others are known to have no finite candidate."""
    n, M = a.size, spec.machines
    table = np.full((M, n), INF)  # one row per machine count
    if row >= n:
        return table.T.copy()
    single = 1 if spec.straight else M
    ends = np.arange(row, n)
    table[:single, row:] = a.first_stages(spec, values, row, ends[None, :], np.arange(1, single + 1.0)[:, None])
    R = len(spec.replica_counts(M))
    if R == 0:
        return np.ascontiguousarray(table.T)
    reps = np.arange(1, R + 1, dtype=float)[:, None]
    pk, pj = a.pairs() if pairs is None else pairs
    if row > 0:
        keep = pk >= row  # (k < row: A[row][k] is empty)
        pk, pj = pk[keep], pj[keep]
    factors = None
    if spec.memory is not None:  # ceil((M - (m+1)) / m') per target m and replica count m'
        factors = [[int(stash_factor(M, m + 1, r)) for r in range(1, R + 1)] for m in range(M)]
    for lo, hi, first, last in _slabs(pj, row, n, max(1, slab_entries // R)):
        ck, cj = pk[first:last], pj[first:last]
        if spec.fewer:  # the reference's A[i][j][m-1], for m = 1 (later m: after their own pass)
            np.minimum(table[1, lo:hi], table[0, lo:hi], out=table[1, lo:hi])
        if len(ck) == 0:
            for m in range(2, M if spec.fewer else 0):
                np.minimum(table[m, lo:hi], table[m - 1, lo:hi], out=table[m, lo:hi])
            continue
        cost = a.stage_costs(spec, values, ck, cj, reps)  # (R, P): one row per m'
        masked = _memory_masked(spec, a.stashes(ck, cj), cost, factors) if factors else {}
        ends_j, starts = groups(cj)
        prefix = [table[0].take(ck)]  # prefix[m''][p] = A[row][k_p][m''], gathered once final
        acc = np.empty(len(ck))
        scratch = np.empty(len(ck))
        for m in range(1, M):
            for r in range(1, min(R, m) + 1):
                c = masked.get((r, factors[m][r - 1]), cost[r - 1]) if masked else cost[r - 1]
                if r == 1:
                    np.maximum(prefix[m - 1], c, out=acc)
                else:
                    np.maximum(prefix[m - r], c, out=scratch)
                    np.minimum(acc, scratch, out=acc)
            best = np.minimum.reduceat(acc, starts)
            target = table[m]
            np.minimum(target[ends_j], best, out=best)
            target[ends_j] = best
            if spec.fewer and m + 1 < M:  # (before m + 1 reads row m)
                np.minimum(table[m + 1, lo:hi], target[lo:hi], out=table[m + 1, lo:hi])
            if m + 1 < M:
                prefix.append(target.take(ck))
    return np.ascontiguousarray(table.T)


def _slabs(pj: np.ndarray, row: int, n: int, per_slab: int):
    """(first end state, end, first pair, end pair) of slabs of about ``per_slab`` pairs."""
    if row + 1 >= n:
        return []
    if len(pj) <= per_slab:
        return [(row + 1, n, 0, len(pj))]
    first_pair = np.searchsorted(pj, np.arange(n + 1))  # pairs of end state j: first_pair[j]..[j+1]
    cuts = (np.flatnonzero(np.diff(first_pair[row + 1:n] // per_slab)) + row + 2).tolist()
    bounds = list(zip([row + 1] + cuts, cuts + [n]))
    return [(lo, hi, int(first_pair[lo]), int(first_pair[hi])) for lo, hi in bounds]


def _memory_masked(spec: LevelSpec, stash: np.ndarray, cost: np.ndarray, factors) -> dict:
    """{(m', factor): cost row m' with +inf where the stash check fails}, for the factors that
    rule out some stage; rows whose every stage fits are read unmasked."""
    largest = float(stash.max()) if len(stash) else 0.0
    out = {}
    for row in factors:
        for r, f in enumerate(row, start=1):
            # (multiplying by f >= 0 is monotone, rounding too: if the largest stash fits, all do)
            if f and (r, f) not in out and over_memory(largest, f, spec.memory):
                out[(r, f)] = np.where(over_memory(stash, f, spec.memory), INF, cost[r - 1])
    return out
