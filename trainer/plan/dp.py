"""PipeDream's hierarchical DP over antichain states, vectorised with NumPy.

One level of the reference optimizer (``compute_partitioning`` in msr-fiddle/pipedream's
``optimizer_graph_hierarchical.py``) fills ``A[i][j][m]``: the best time per minibatch for the
states i..j (a block that starts after state i-1) on exactly m+1 machines, where the last stage
runs from state k+1 to j on m' replicas and the rest is ``A[i][k][m-m']``. Its pure-Python loops
are cubic in states and quadratic in machines; here the loops over k, m' and (for the levels
below the top) every block start i run as array operations, one state j at a time, pulling from
all of j's predecessor states at once. The arithmetic is the reference's, operation for
operation, so the optimum is the same number, not merely a close one.

Two facts keep the batching simple:
- in row i only predecessors k >= i can start the last stage (the reference's test
  ``k in all_predecessor_ids[i-1]`` can never hold for such k, and for k < i the row is empty),
  so an empty entry (+inf) is the only mask needed;
- with ``m`` outermost in the reference, ``A[i][j][m]`` reads only smaller machine counts, so
  j can be finished for all m at once once every predecessor is finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainer.graph import _bits
from trainer.plan.bitpairs import bits_of, pairs_of
from trainer.plan.blocks import BlockSums, scalar

INF = math.inf
# Relative slack on every bound the pruning compares against: far above the rounding of the
# compute sums, so no state on an optimal plan is ever cut off by it.
SLACK = 1 + 1e-9
# Up to this many states, per-block sums are whole (n+1, n) tables (cheaper to index than to
# form on each read); beyond, ``BlockSums`` forms only what is read.
DENSE_UP_TO = 128
# Up to this many candidate entries (``bymachines.work``) several rows are solved machine count
# outermost, all states at once; beyond, one end state at a time (less memory, bounds prune).
BY_MACHINES_UP_TO = 3e7


@dataclass
class LevelOptions:
    machines: int
    bandwidth: float
    machines_below: int  # workers per machine of this level (the level below's count; 1 at level 1)
    final: bool
    straight: bool = False
    fewer_machines: bool = False
    memory_bytes: float | None = None  # enforce the reference's stash check when set
    activation_compression: float | None = 1.0  # None: activation transfers not counted


@dataclass
class Tables:
    """Per-state sums the DP reads: cumulative over each state's down-set, as the reference."""

    compute: np.ndarray  # (n,) seconds, forward + backward
    activation: np.ndarray  # (n,) bytes
    parameters: np.ndarray  # (n,) bytes
    output_activation: np.ndarray  # (n,) bytes crossing a cut right after the state
    # Per state j, its ancestors as a bitset (bit k: state k precedes j); None for a chain
    # (every earlier state), whose ``_pairs`` are then given.
    ancestor_bits: list[int] | None
    _pairs: tuple[np.ndarray, np.ndarray] | None = None  # ``pairs()``, listed on first use
    _sums: dict | None = None
    _predecessors: list[np.ndarray] | None = None
    _level1: np.ndarray | BlockSums | None = None  # ``level1_values``, formed once

    def block_sums(self) -> tuple[BlockSums, BlockSums]:
        """(activations, parameters) of every block i..j, indexed as (n+1, n) differences."""
        if self._sums is None:
            table = _block_sums if self.size <= DENSE_UP_TO else BlockSums
            self._sums = {"acts": table(self.activation), "params": table(self.parameters)}
        return self._sums["acts"], self._sums["params"]

    def block_sums_for_reads(self) -> tuple[BlockSums, BlockSums]:
        """``block_sums`` for a few reads: the whole tables if formed, else formed on read."""
        if self._sums is not None:
            return self._sums["acts"], self._sums["params"]
        return BlockSums(self.activation), BlockSums(self.parameters)

    def compute_sums(self) -> np.ndarray:
        """Compute of every block i..j as (n+1, n) differences (row 0: cum), computed once."""
        if self._sums is None:
            self.block_sums()
        if "compute" not in self._sums:
            self._sums["compute"] = _block_sums(self.compute)
        return self._sums["compute"]

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (k, j) edge of the state DAG as (pk, pj), grouped by j, k ascending (listed on
        first use: a pruned one-level plan never needs them all)."""
        if self._pairs is None:
            self._pairs = pairs_of(self.ancestor_bits)
        return self._pairs

    def pair_count(self) -> int:
        if self._pairs is not None:
            return len(self._pairs[0])
        return sum(map(int.bit_count, self.ancestor_bits))

    @property
    def predecessors(self) -> list[np.ndarray]:
        """Per state j, the indices of its ancestor states, ascending (views of the pairs)."""
        if self._predecessors is None:
            pk, pj = self.pairs()
            ends = np.searchsorted(pj, np.arange(self.size + 1)).tolist()
            self._predecessors = [pk[a:b] for a, b in zip(ends[:-1], ends[1:])]
        return self._predecessors

    def predecessors_of(self, j: int) -> np.ndarray:
        """``predecessors[j]`` without forming the whole list (for a few reads)."""
        if self._predecessors is not None:
            return self._predecessors[j]
        if self._pairs is None:
            return np.array(_bits(self.ancestor_bits[j]), dtype=np.intp)
        pk, pj = self._pairs
        a, b = np.searchsorted(pj, (j, j + 1)).tolist()
        return pk[a:b]

    def pairs_among(self, ends: np.ndarray, starts: np.ndarray, most: float = math.inf):
        """The pairs (k, j) with ``ends[j]`` and ``starts[k]`` (bool per state), grouped by j,
        k ascending; None if there would be more than ``most`` of them."""
        if self.ancestor_bits is None:  # a chain: every earlier state
            self.ancestor_bits = [(1 << j) - 1 for j in range(self.size)]
        rows = np.flatnonzero(ends).tolist()
        allowed = bits_of(starts)
        anc = self.ancestor_bits
        masks = [anc[j] & allowed for j in rows]
        if sum(map(int.bit_count, masks)) > most:
            return None
        return pairs_of(masks, rows, self.size)

    def is_chain(self) -> bool:
        """Every state precedes every later one (a chain of layers, or a linearised order);
        ancestors are earlier states, so counting the pairs is enough."""
        n = self.size
        return self.pair_count() == n * (n - 1) // 2

    @property
    def size(self) -> int:
        return len(self.compute)

    def block(self, values: np.ndarray, start: int, end: int) -> float:
        """``values`` summed over states start..end as the reference forms it (a difference)."""
        return float(values[end]) if start == 0 else float(values[end] - values[start - 1])


def level1_lazy(t: Tables) -> np.ndarray | BlockSums:
    """``level1_values`` formed on read whatever the size (for paths that read few entries),
    unless the whole table is already there."""
    if t._level1 is None:
        t._level1 = BlockSums(t.compute, empty=INF)
    return t._level1


def level1_values(t: Tables) -> BlockSums:
    """``compute_times[i][j]`` of the reference: (n+1, n), +inf where j < i (formed on read
    past ``DENSE_UP_TO`` states); formed once per ``Tables`` (it is only read)."""
    if t._level1 is None:
        if t.size > DENSE_UP_TO:
            t._level1 = BlockSums(t.compute, empty=INF)
        else:
            v = _block_sums(t.compute)
            v[np.tri(t.size + 1, t.size, -1, dtype=bool)] = INF  # j < i
            t._level1 = v
    return t._level1


def _block_sums(cum: np.ndarray) -> np.ndarray:
    """(n+1, n) differences cum[j] - cum[i-1] (row 0: cum[j]); only j >= i is ever read."""
    n = len(cum)
    out = np.empty((n + 1, n))
    out[0] = cum
    out[1:] = cum[None, :] - cum[:, None]
    return out


def _stash_factor(total, replicas, machines: int):
    # ceil((M - (m+1)) / m') on integers, exactly as math.ceil on the reference's true division.
    return -((-(machines - np.asarray(total))) // np.asarray(replicas))


def single_stage_costs(values, acts, params, opt: LevelOptions, i: int, js, m: int):
    """The reference's single-stage block i..j on m+1 machines (its initial ``A[i][j][m]``)."""
    M, bw = opt.machines, opt.bandwidth
    p = params[i, js]
    dp_comm = (4 * m * p) / (bw * (m + 1))
    dp_comm = dp_comm / opt.machines_below
    val = (values[i, js] + dp_comm) / (m + 1)
    if opt.memory_bytes is not None:
        stash = math.ceil((M - (m + 1)) / (m + 1)) * (acts[i, js] + p)
        val = np.where(stash > opt.memory_bytes, INF, val)
    return val


def single_stage_value(values, acts, params, opt: LevelOptions, i: int, j: int, m: int) -> float:
    """``single_stage_costs`` for one block as a Python float: the same operations on the
    same doubles (IEEE arithmetic, as NumPy's), without array calls."""
    p = scalar(params, i, j)
    dp_comm = (4 * m * p) / (opt.bandwidth * (m + 1))
    dp_comm = dp_comm / opt.machines_below
    val = (scalar(values, i, j) + dp_comm) / (m + 1)
    if opt.memory_bytes is not None:
        stash = math.ceil((opt.machines - (m + 1)) / (m + 1)) * (scalar(acts, i, j) + p)
        if stash > opt.memory_bytes:
            return INF
    return val


def single_stage_table(values, acts, params, opt: LevelOptions, i, js, count: int) -> np.ndarray:
    """``single_stage_costs`` for m = 0..count-1 at once, (count, *shape): the same terms."""
    M, bw = opt.machines, opt.bandwidth
    p = np.asarray(params[i, js])
    m = np.arange(count).reshape((count,) + (1,) * p.ndim)
    dp_comm = (4 * m * p) / (bw * (m + 1))
    dp_comm = dp_comm / opt.machines_below
    val = (values[i, js] + dp_comm) / (m + 1)
    if opt.memory_bytes is not None:
        stash = _stash_factor(m + 1, m + 1, M) * (acts[i, js] + p)  # ceil((M - (m+1)) / (m+1))
        val = np.where(stash > opt.memory_bytes, INF, val)
    return val


def last_stage_costs(t: Tables, values, params, opt: LevelOptions, preds: np.ndarray, j: int, reps: np.ndarray):
    """Time of a last stage k+1..j on m' replicas for every k in ``preds`` and m' in ``reps``.

    Compute plus the all-reduce over its replicas, divided among them, and (when activations
    are counted) never below sending its input or its output: the reference's arithmetic.
    """
    bw, n = opt.bandwidth, t.size
    v_last = values[preds + 1, j][:, None]
    p_last = params[preds + 1, j][:, None]
    last = (v_last + (4 * (reps - 1) * p_last) / (bw * reps)) / reps
    if opt.activation_compression is not None:
        t_in = (2.0 * t.output_activation[preds])[:, None] / (bw * reps) / opt.activation_compression
        last = np.maximum(last, t_in)
        if j < n - 1:
            t_out = (2.0 * t.output_activation[j]) / (bw * reps) / opt.activation_compression
            last = np.maximum(last, t_out[None, :])
    return last


def _target_costs(cost: np.ndarray, stash: np.ndarray | None, opt: LevelOptions) -> np.ndarray:
    """(K, R, M): the last stage's cost for each target machine count m (the memory check
    depends on m: the reference's stash is ceil((M - (m+1)) / m') times the stage's bytes)."""
    K, R = cost.shape
    M = opt.machines
    out = np.broadcast_to(cost[:, :, None], (K, R, M))  # a read-only view unless masked below
    if stash is not None:
        out = out.copy()
        r = np.arange(1, R + 1)[:, None]
        m = np.arange(M)[None, :]
        factor = _stash_factor(m + 1, r, M)  # (R, M)
        out[stash[:, None, None] * factor[None] > opt.memory_bytes] = INF
    return out


def _diagonal_plan(M: int, R: int):
    """Flat (m'', m'-1) pairs sorted by target m = m'' + m', with the start of each target."""
    pairs = [(m - r, r - 1) for m in range(1, M) for r in range(1, min(R, m) + 1)]
    mm = np.array([p[0] for p in pairs], dtype=np.intp)
    rr = np.array([p[1] for p in pairs], dtype=np.intp)
    targets = mm + rr + 1
    starts = np.searchsorted(targets, np.arange(1, M))
    return mm, rr, targets, starts


def all_rows(opt: LevelOptions, n: int) -> np.ndarray:
    """The block starts a level fills: row 0 at the final level (the reference's ``max_i = 1``)."""
    return np.zeros(1, dtype=np.intp) if opt.final else np.arange(n + 1)


def solve_level(t: Tables, values: np.ndarray, opt: LevelOptions, rows: np.ndarray | None = None,
                bound: np.ndarray | float = INF, caps: np.ndarray | None = None,
                end_bounds: np.ndarray | None = None) -> np.ndarray:
    """Fill the level's table: F[j, m, c] = the reference's A[rows[c]][j][m][0].

    ``values`` is this level's ``compute_times`` ((n+1, n), +inf for empty); ``rows`` the
    sorted block starts to fill (default ``all_rows``). With a finite ``bound`` (per row, or
    one number), an entry above its row's bound may come out larger than the reference's (or
    +inf), and every entry at or below it is exact: a candidate is the max of its parts, so a
    part above the bound only ever yields a candidate above it. With ``caps`` (per row, the
    last end state that matters, see ``chaincap``), entries of row ``rows[c]`` past
    ``caps[c]`` are left +inf or larger than the reference's; every entry up to it is exact,
    as it only reads entries of its own row that end earlier. ``end_bounds`` (len(rows), n), a
    bound per block rather than per row, prunes the same way (an entry of a block above it and
    any candidate above it are dropped); each must be at least the block's true bound.
    """
    n, M = t.size, opt.machines
    rows = all_rows(opt, n) if rows is None else np.asarray(rows, dtype=np.intp)
    if caps is None and end_bounds is None and len(rows) > 1 and M > 1:
        from trainer.plan import bymachines

        if bymachines.work(t, rows, M) <= BY_MACHINES_UP_TO:
            # Every entry exact (bounds allow, never require, dropping entries above them).
            return bymachines.solve_rows(t, values, opt, rows)
    bound = np.broadcast_to(np.asarray(bound, dtype=float), rows.shape)
    pruning = bool(np.isfinite(bound).any()) or end_bounds is not None
    by_end = np.ascontiguousarray(np.asarray(end_bounds, dtype=float).T) if end_bounds is not None else None
    acts, params = t.block_sums()
    F = np.full((n, M, len(rows)), INF)
    # first_col[j]: the first row whose cap reaches j (rows before it need nothing ending at j).
    first_col = (np.searchsorted(np.maximum.accumulate(caps), np.arange(n)) if caps is not None
                 else np.zeros(n, dtype=np.intp))

    # Single-stage blocks: the whole of i..j on m+1 machines, all-reduce over the machines below.
    init_m = 1 if opt.straight else M
    for c, i in enumerate(rows):
        if i >= n:
            continue
        end = n if caps is None else min(n, int(caps[c]) + 1)
        if end <= i:
            continue
        limit = bound[c] if by_end is None else np.minimum(bound[c], by_end[i:end, c])
        costs = single_stage_table(values, acts, params, opt, i, slice(i, end), init_m)
        if pruning:  # (only this row's entries are finite yet: no pass over the whole table)
            costs = np.where(costs > limit, INF, costs)
        F[i:end, :init_m, c] = costs.T

    R = 1 if opt.straight else M - 1
    reps = np.arange(1, R + 1, dtype=float)  # m'
    pairs = t.pair_count()
    if len(rows) == 1 and M > 1 and pairs * M <= 20_000_000 and caps is None:
        # Few enough (k, j) pairs to hold them all: machine count outermost, as the reference.
        from trainer.plan import bymachines

        bymachines.solve_one_row(F, t, values, opt, int(rows[0]), reps, float(bound[0]))
        return F
    diag = _diagonal_plan(M, R) if M > 1 else None
    for j in range(1, n):
        top = int(np.searchsorted(rows, j))  # columns of rows i < j (i <= k < j)
        lo = int(first_col[j])
        # Bounds of the blocks ending at j (a candidate for a block only matters within it).
        j_bound = bound if by_end is None else np.minimum(bound, by_end[j])
        preds = t.predecessors[j]
        if top > lo and len(preds) and M > 1:
            preds = preds[preds >= rows[lo]]
            cost = last_stage_costs(t, values, params, opt, preds, j, reps)  # (K, R)
            stash = acts[preds + 1, j] + params[preds + 1, j] if opt.memory_bytes is not None else None
            if pruning:
                keep = cost.min(axis=1) <= j_bound[lo:top].max()
                preds, cost = preds[keep], cost[keep]
                stash = stash[keep] if stash is not None else None
            if len(preds):
                target_cost = _target_costs(cost, stash, opt)  # (K, R, M)
                if len(rows) == 1:
                    _pull_single_row(F, j, preds, target_cost, diag)
                else:
                    _pull_rows(F, j, top, rows, preds, target_cost, R, j_bound if pruning else None, lo)
        if opt.fewer_machines and top:
            # A[i][j][m] may keep A[i][j][m-1] (the reference's use_fewer_machines), rows i < j.
            F[j, :, :top] = np.minimum.accumulate(F[j, :, :top], axis=0)
    return F


def _groups(pj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values of the sorted ``pj``, where each starts): ``np.unique`` without its sort."""
    if len(pj) == 0:
        return pj, pj
    starts = np.flatnonzero(np.concatenate(([True], pj[1:] != pj[:-1])))
    return pj[starts], starts


def _pull_single_row(F: np.ndarray, j: int, preds: np.ndarray, target_cost: np.ndarray, diag) -> None:
    """One row: every (k, m'', m') at once, then the best per target m = m'' + m'."""
    mm, rr, targets, starts = diag
    prefix = F[preds, :, 0]  # (K, M): A[i][k][m'']
    cand = np.maximum(prefix[:, mm], target_cost[:, rr, targets])  # (K, pairs)
    best = np.minimum.reduceat(cand.min(axis=0), starts)  # per m = 1..M-1
    np.minimum(F[j, 1:, 0], best, out=F[j, 1:, 0])


_CHUNK = 32  # predecessors per slab: keeps the temporaries in cache


def _pull_rows(F: np.ndarray, j: int, top: int, rows: np.ndarray, preds: np.ndarray, target_cost: np.ndarray,
               R: int, bound: np.ndarray | None, first: int = 0) -> None:
    """Rows i < j at once: A[i][j][m] = min over k, m' of max(A[i][k][m-m'], cost(k, j, m')).

    Only the row columns ``first..top-1`` are filled (earlier rows need nothing ending at j).
    Predecessors come in ascending slabs, and a slab whose last state is k only reads rows
    i <= k (row i is empty before state i). Under a bound, a slab keeps only the rows with an
    entry within it, and per m' only the states whose last stage is affordable for some row.
    """
    M = F.shape[1]
    span_rows = top - first
    best = np.full((M, span_rows), INF)
    scratch = np.empty(_CHUNK * M * span_rows)  # reused: fresh large temporaries would page-fault
    reduced = np.empty(M * span_rows)
    row_bound = bound[first:top] if bound is not None else None
    for lo in range(0, len(preds), _CHUNK):
        ks = preds[lo:lo + _CHUNK]
        width = int(np.searchsorted(rows, ks[-1], side="right")) - first  # columns first..(last k)
        if int(ks[-1]) - int(ks[0]) + 1 == len(ks):  # contiguous (chains): a view, no copy
            part = F[int(ks[0]):int(ks[-1]) + 1, :, first:first + width]
        else:
            part = F[ks, :, first:first + width]  # (k, M, rows <= last k)
        tc = target_cost[lo:lo + _CHUNK]
        cols = None
        limit = np.inf
        m_lo = 0  # the fewest machines m'' with an entry within the bound (fewer: all +inf)
        if row_bound is not None:
            per_m = part.min(axis=0)  # (M, rows)
            live = np.nonzero(per_m.min(axis=0) <= row_bound[:width])[0]
            if len(live) == 0:
                continue
            limit = float(row_bound[live].max())
            m_lo = int(np.argmax(per_m[:, live].min(axis=1) <= limit))
            if len(live) * 3 < width * 2:
                cols, part = live, part[:, :, live]
            elif live[0] > 0:
                cols = np.arange(live[0], width)
                part = part[:, :, live[0]:]
        w = part.shape[2]
        for r in range(1, R + 1):
            span = M - r - m_lo
            if span <= 0:
                break
            cost_r = tc[:, r - 1, r + m_lo:]  # (k, span): cost for target m = m'' + r
            sub = part[:, m_lo:]
            if bound is not None:
                ok = cost_r.min(axis=1) <= limit
                n_ok = int(np.count_nonzero(ok))
                if n_ok == 0:
                    continue
                if n_ok < len(ok):
                    sub, cost_r = sub[ok], cost_r[ok]
            cand = scratch[: len(sub) * span * w].reshape(len(sub), span, w)
            np.maximum(sub[:, :span], cost_r[:, :, None], out=cand)
            red = reduced[: span * w].reshape(span, w)
            np.minimum.reduce(cand, axis=0, out=red)
            out_m = slice(r + m_lo, M)
            if cols is None:
                np.minimum(best[out_m, :width], red, out=best[out_m, :width])
            else:
                best[out_m, cols] = np.minimum(best[out_m, cols], red)
    np.minimum(F[j, 1:, first:top], best[1:], out=F[j, 1:, first:top])


def next_level_values(F: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """The next level's ``compute_times``: this level's best on all its machines, per block."""
    v = np.full((n + 1, n), INF)
    v[rows] = F[:, -1, :].T
    return v
