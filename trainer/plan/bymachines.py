"""A level's table with the machine count outermost, as the reference loops: few NumPy calls.

``dp.solve_level`` walks the end states j one at a time (a dozen NumPy calls per state and per
slab of predecessors). On small and medium state graphs those calls, not the arithmetic,
take the time. Here, as in the reference's loop order, the machine count m is outermost:
``A[i][j][m]`` reads only ``A[i][k][m - m']`` with m' >= 1, so for one m every (k, j) pair
of the state DAG and every block start i are done at once:

    cand[(k, j), i] = max(A[i][k][m - m'], cost(k, j, m'))     (a gather, then a max)
    A[i][j][m] = min(A[i][j][m], min over m' and k of cand)    (a min, then ``reduceat`` by j)

Entries with k < i read an empty ``A[i][k]`` (+inf), so they never win: the block starts are
taken in a few bands, each with only the pairs whose k can follow its first start. Every entry
is formed with the reference's arithmetic (the same terms as ``dp``), so the table is the same
numbers as ``dp.solve_level`` gives without bounds. ``solve_one_row`` does the same for a
single block start (the top level), end states in slabs.
"""

from __future__ import annotations

import numpy as np

from trainer.plan.dp import INF, LevelOptions, Tables, _groups, _stash_factor, single_stage_table
from trainer.plan.paircosts import pair_stage_costs_t, pair_sums

# Bands of block starts: each band only pairs up with predecessors k at or after its first start.
_BANDS = 4
_BAND_ENTRIES = 8_000  # (pairs x starts) per band below which one band does (fewer NumPy calls)


def work(t: Tables, rows: np.ndarray, machines: int) -> float:
    """About how many candidate entries ``solve_rows`` forms (to choose it over ``dp``)."""
    n_pairs = t.pair_count()
    return float(n_pairs) * len(rows) * machines * (machines - 1) / 2 * 0.5


def solve_rows(t: Tables, values: np.ndarray, opt: LevelOptions, rows: np.ndarray) -> np.ndarray:
    """F[j, m, c] = the reference's A[rows[c]][j][m], for sorted block starts ``rows``."""
    n, M = t.size, opt.machines
    C = len(rows)
    acts, params = t.block_sums()
    # Single-stage blocks (+inf where j < i: ``values`` is +inf there).
    table = np.full((M, n, C), INF)
    ii = rows[:, None]
    jj = np.arange(n)[None, :]
    init_m = 1 if opt.straight else M
    table[:init_m] = single_stage_table(values, acts, params, opt, ii, jj, init_m).transpose(0, 2, 1)
    if M == 1:
        return np.ascontiguousarray(table.transpose(1, 0, 2))
    R = 1 if opt.straight else M - 1
    reps = np.arange(1, R + 1, dtype=float)
    later = (jj > ii).T if opt.fewer_machines else None  # (n, C): the reference's j > i
    pk, pj = t.pairs()
    if len(pk):
        sums = pair_sums(t, pk, pj)
        cost = pair_stage_costs_t(t, values, opt, pk, pj, reps, sums)  # (R, P)
        stash = sums.stash() if opt.memory_bytes is not None else None
        count = min(_BANDS, C, max(1, len(pk) * C // _BAND_ENTRIES))
        bands = np.unique(np.linspace(0, C, count + 1).astype(np.intp))
        for lo, hi in zip(bands[:-1], bands[1:]):
            keep = pk >= rows[lo]
            if not keep.any():
                continue
            ends, starts = _groups(pj[keep])
            _fill_band(table, pk[keep], ends, starts, cost[:, keep], stash[keep] if stash is not None else None,
                       opt, lo, hi, R, later)
    if later is not None:  # (again for bands without pairs: taking fewer machines is idempotent)
        for m in range(1, M):
            np.minimum(table[m], np.where(later, table[m - 1], INF), out=table[m])
    return np.ascontiguousarray(table.transpose(1, 0, 2))


def _fill_band(table, pk, ends, starts, cost, stash, opt: LevelOptions, lo: int, hi: int, R: int,
               later: np.ndarray | None) -> None:
    """Candidates for the block starts ``lo..hi-1``, machine count outermost."""
    M = opt.machines
    band = np.ascontiguousarray(table[:, :, lo:hi])  # (M, n, w): one contiguous row per state
    band_later = np.ascontiguousarray(later[:, lo:hi]) if later is not None else None
    prefix = [band[0].take(pk, axis=0)]  # prefix[m''][p, c] = A[i][k_p][m''], once m'' is final
    acc = np.empty_like(prefix[0])
    scratch = np.empty_like(prefix[0])
    for m in range(1, M):
        for r in range(1, min(R, m) + 1):
            c = cost[r - 1]
            factor = _stash_factor(m + 1, r, M) if stash is not None else 0
            if factor:  # (a zero factor stashes nothing: no stage is ruled out)
                c = np.where(stash * factor > opt.memory_bytes, INF, c)
            if r == 1:
                np.maximum(prefix[m - r], c[:, None], out=acc)
            else:
                np.maximum(prefix[m - r], c[:, None], out=scratch)
                np.minimum(acc, scratch, out=acc)
        target = band[m]
        target[ends] = np.minimum(target[ends], np.minimum.reduceat(acc, starts, axis=0))
        if band_later is not None:
            # A[i][j][m] may keep A[i][j][m-1] (j > i), before m + 1 reads it.
            np.minimum(target, np.where(band_later, band[m - 1], INF), out=target)
        if m < M - 1:
            prefix.append(target.take(pk, axis=0))
    table[:, :, lo:hi] = band


def solve_one_row(F: np.ndarray, t: Tables, values: np.ndarray, opt: LevelOptions, row: int,
                  reps: np.ndarray, bound: float, pairs: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One row, in the reference's loop order: machine count outermost, every (k, j) pair of
    the state DAG at once (A[i][j][m] reads only A[i][k][m - m'] with m' >= 1).

    The end states go in slabs of about ``_SLAB_ENTRIES`` (pair, m') entries, each slab over
    every machine count before the next: a slab reads only earlier states, finished on every
    machine count, or its own at smaller counts. Slabs keep the temporaries small enough to
    be reused instead of freshly mapped (the page faults cost more than the arithmetic).
    Within a slab, A[i][k][m''] is gathered once per m'' (as soon as it is final) and the
    memory check's mask once per stash factor, not once per target m. ``pairs``, when given,
    are the state-DAG pairs to take candidates from (grouped by j, k ascending) instead of
    all of them: entries may then come out larger than the reference's, as under a
    ``bound`` (``onelevel`` says when that is exact)."""
    n, M = t.size, opt.machines
    pk, pj = t.pairs() if pairs is None else pairs
    if row > 0:
        keep = pk >= row
        pk, pj = pk[keep], pj[keep]
    table = np.ascontiguousarray(F[:, :, 0].T)  # (M, n): one row per machine count
    R = len(reps)
    slab = max(1, _SLAB_ENTRIES // R)
    # Slabs (end states lo..hi-1, pairs a..b-1); every pair ends after the row (k >= row, j > k).
    if row + 1 >= n:
        slabs = []
    elif len(pk) <= slab:
        slabs = [(row + 1, n, 0, len(pk))]
    else:
        first_pair = np.searchsorted(pj, np.arange(n + 1))  # pairs of end state j: first_pair[j]..[j+1]
        cuts = (np.flatnonzero(np.diff(first_pair[row + 1:n] // slab)) + row + 2).tolist()
        slabs = [(lo, hi, int(first_pair[lo]), int(first_pair[hi])) for lo, hi in zip([row + 1] + cuts, cuts + [n])]
    # The memory check's factor ceil((M - (m+1)) / m') per target m and replica count m'.
    factors = ([[int(f) for f in _stash_factor(m + 1, np.arange(1, R + 1), M)] for m in range(M)]
               if opt.memory_bytes is not None else None)
    for lo, hi, a, b in slabs:
        ck, cj = pk[a:b], pj[a:b]
        sums = pair_sums(t, ck, cj)
        cost_t = pair_stage_costs_t(t, values, opt, ck, cj, reps, sums)  # (R, P): one row per m'
        stash = sums.stash() if opt.memory_bytes is not None else None
        if bound < INF:
            keep = cost_t.min(axis=0) <= bound
            ck, cj, cost_t = ck[keep], cj[keep], cost_t[:, keep]
            stash = stash[keep] if stash is not None else None
        if opt.fewer_machines:  # the reference's j > i, for m = 1 (later m: after their own pass)
            np.minimum(table[1, lo:hi], table[0, lo:hi], out=table[1, lo:hi])
        if len(ck) == 0:
            for m in range(2, M if opt.fewer_machines else 0):
                np.minimum(table[m, lo:hi], table[m - 1, lo:hi], out=table[m, lo:hi])
            continue
        ends, starts = _groups(cj)
        masked = _memory_masked(stash, opt, cost_t, factors)
        prefix = [table[0].take(ck)]  # prefix[m''][p] = A[i][k_p][m''], gathered once m'' is final
        acc = np.empty(len(ck))
        for m in range(1, M):
            for r in range(1, min(R, m) + 1):
                c = masked.get((r, factors[m][r - 1]), cost_t[r - 1]) if masked else cost_t[r - 1]
                if r == 1:
                    np.maximum(prefix[m - 1], c, out=acc)
                else:
                    np.minimum(acc, np.maximum(prefix[m - r], c), out=acc)
            best = np.minimum.reduceat(acc, starts)
            target = table[m]
            np.minimum(target[ends], best, out=best)
            target[ends] = best
            if opt.fewer_machines and m + 1 < M:  # (before m + 1 reads row m)
                np.minimum(table[m + 1, lo:hi], target[lo:hi], out=table[m + 1, lo:hi])
            if m + 1 < M:
                prefix.append(target.take(ck))
    F[:, :, 0] = table.T


def _memory_masked(stash: np.ndarray | None, opt: LevelOptions, cost_t, factors) -> dict:
    """{(m', factor): cost row m' with +inf where the stash check fails}, for the factors that
    rule out some stage; rows whose every stage fits are left out (read unmasked)."""
    if stash is None:
        return {}
    largest = float(stash.max()) if len(stash) else 0.0
    out = {}
    for row in factors:
        for r, f in enumerate(row, start=1):
            # (multiplying by f >= 0 is monotone, rounding too: if the largest stash fits, all do)
            if f and (r, f) not in out and largest * f > opt.memory_bytes:
                out[(r, f)] = np.where(stash * f > opt.memory_bytes, INF, cost_t[r - 1])
    return out


_SLAB_ENTRIES = 16_384  # (pair, m') entries per slab of end states: 128 KiB temporaries
