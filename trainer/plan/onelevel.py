"""A one-level plan (a single level of machines): the top row on the pairs that can matter.

The top row A[0][j][m] reads every (k, j) pair of the state DAG for every machine count, but
only few pairs can be on an optimal path. With an upper bound U on the optimum, a pair is
kept if its two ends can both be on a plan within U by their compute and their outputs
(below), and (in the slabs of ``bymachines.solve_one_row``) if its last stage costs at most
U on some replica count. U is the value of a real plan, so U >= optimum: the single stage
on every machine (free: it is the table's first entry for the last state), or on large
graphs the best plan whose stages all end at a few grid states (per compute bucket, the
state with the smallest output, a cheap cut, and the one with the most compute), the same
DP on the pairs among them.

Why the kept pairs give the reference's numbers where it matters. An entry on an optimal
path is at most U. Its best candidate is also on an optimal path (swapping it in keeps the
plan's value), so by induction each such entry is formed from kept pairs and entries that
are exact; an entry off every optimal path may come out larger (never smaller: dropping
candidates only raises a minimum). Reading the plan back re-derives each choice by equality
with the stored optimum; a candidate equal to it is itself on an optimal path, so the same
first one is found.

Compute bands. At level 1 every stage costs at least its compute over its replicas (the
all-reduce and transfer terms only add), so the states 0..j on m+1 machines, within U, have
compute cum[j] <= U (m+1), and the states after j, on the other M-1-m machines, have
total - cum[j] <= U (M-1-m). Each state thus has an interval of machine counts it can end
on, and a pair (k, j) with m' replicas needs k's interval to reach m - m' when j's reaches m.
The bounds get a relative slack of about 2e-9 (``SLACK`` on U, and again on the division)
and an absolute one of 1e-12 of the total compute, far above the rounding of the cumulative
sums.

Cheap cuts. A cut after state k is followed by a stage that sends k's output in (at least
2 out[k] / (B m') with m' <= R replicas, when transfers are counted), so a cut on a plan
within U is one whose output can be sent within U; both ends of a kept pair (but the last
state, after which nothing is sent) must be such cuts.
"""

from __future__ import annotations

import math

import numpy as np

from trainer.plan import bymachines
from trainer.plan.dp import INF, SLACK, LevelOptions, Tables, level1_lazy, single_stage_table

# Below this many candidates (pairs x machine-count pairs) the plain DP is quicker than
# bounding it first; below this many pairs the bound from the grid is not worth its solve.
PRUNE_FROM_WORK = 24_000
GRID_FROM_PAIRS = 10_000
# Compute buckets of the grid that bounds the optimum.
GRID_BUCKETS = 16
# Filter the pairs by their ends only when the possible end states leave at most this share,
# and take the free bound alone when it leaves at most the second.
FILTER_BELOW = 0.8
FEW = 0.3


def solve_top_row(t: Tables, opt: LevelOptions, prune: bool = True) -> np.ndarray:
    """F (n, M, 1): the reference's A[0][j][m] for a one-level plan on level-1 values, exact on
    every optimal path (everywhere without ``prune``)."""
    n, M = t.size, opt.machines
    values = level1_lazy(t)  # (this path reads only pairs and row 0: no whole table needed)
    F = np.full((n, M, 1), INF)
    init_m = 1 if opt.straight else M
    # Row 0 of the block sums is the cumulative sums themselves.
    row0 = (t.compute[None, :], t.activation[None, :], t.parameters[None, :])
    F[:, :init_m, 0] = single_stage_table(*row0, opt, 0, slice(0, n), init_m).T
    if M == 1:
        return F
    reps = np.arange(1, (1 if opt.straight else M - 1) + 1, dtype=float)
    bound, pairs = INF, None
    count = t.pair_count()  # (a pass over the ancestor bitsets: counted once here)
    work = count * M * (M - 1) / 2  # candidates of the plain solve, about
    if prune and work >= PRUNE_FROM_WORK:
        # The single stage on every machine is a plan: a free bound, often close on models
        # with few parameters; on larger work one from the grid, often tighter, pays off.
        upper = float(F[n - 1, M - 1, 0])
        if math.isfinite(upper):
            pairs = _useful_pairs(t, opt, upper, len(reps), FEW * count)
        if pairs is None and count >= GRID_FROM_PAIRS:  # (its solve costs as a few machine counts)
            upper = min(upper, _grid_bound(t, values, opt, F, reps))
            if math.isfinite(upper):
                pairs = _useful_pairs(t, opt, upper, len(reps), FILTER_BELOW * count)
        # Where the ends rule out few pairs, the bound would rule out few last stages too.
        if pairs is not None:
            bound = upper * SLACK
    bymachines.solve_one_row(F, t, values, opt, 0, reps, bound, pairs)
    return F


def _grid_bound(t: Tables, values, opt: LevelOptions, F: np.ndarray, reps: np.ndarray) -> float:
    """The best plan whose stages all end at grid states (or the last): the same DP on the
    pairs among them, so a real plan's value, at or above the optimum."""
    n, M = t.size, opt.machines
    on_grid = np.zeros(n, dtype=bool)
    on_grid[_grid(t)] = True
    ends = on_grid.copy()
    ends[n - 1] = True
    bounded = F.copy()
    bymachines.solve_one_row(bounded, t, values, opt, 0, reps, INF, t.pairs_among(ends, on_grid))
    return float(bounded[n - 1, M - 1, 0])


def _grid(t: Tables) -> np.ndarray:
    """Grid states for the bound: per compute bucket the state with the smallest output (a
    cheap cut) and the one with the most compute; never the last state."""
    n = t.size
    cum = t.compute
    total = float(cum[-1])
    if not total > 0:
        return np.arange(n - 1)
    bucket = np.minimum((cum * (GRID_BUCKETS / total)).astype(np.intp), GRID_BUCKETS - 1)
    states = np.arange(n - 1)  # (a last stage after the last state would be empty)
    out = []
    for key in (t.output_activation[:-1], -cum[:-1]):
        order = np.lexsort((key, bucket[:-1]))
        first = np.ones(len(order), dtype=bool)
        first[1:] = bucket[:-1][order][1:] != bucket[:-1][order][:-1]
        out.append(states[order[first]])
    return np.union1d(*out)


def _useful_pairs(t: Tables, opt: LevelOptions, upper: float, R: int,
                  most: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The pairs (k, j) that can be on a plan within ``upper`` by what their ends alone say:
    some machine count m of j's and m'' of k's with 1 <= m - m'' <= R (compute bands), and
    both ends cheap enough cuts (module doc). None when the ends leave more than ``most``
    pairs."""
    if not upper > 0:  # (a plan of no time at all: the bands would divide by zero)
        return None
    lowest, highest = _machine_counts(t, opt, upper)
    in_band = lowest <= highest
    can_start = in_band & _affordable_cuts(t, opt, upper, R)
    can_end = can_start.copy()
    can_end[-1] = in_band[-1]  # (nothing is sent after the last state)
    found = t.pairs_among(can_end, can_start, most=most)
    if found is None:
        return None
    pk, pj = found
    keep = (highest[pj] - lowest[pk] >= 1) & (lowest[pj] - highest[pk] <= R)
    return pk[keep], pj[keep]


def _affordable_cuts(t: Tables, opt: LevelOptions, upper: float, R: int) -> np.ndarray:
    """Per state k, whether a cut after it can be on a plan within ``upper``: the stage after
    the cut costs at least sending k's output, 2 out[k] / (B m') / ratio with m' <= R
    replicas (the same divisions as the stage costs, smallest at m' = R; all True when
    transfers are not counted)."""
    if opt.activation_compression is None:
        return np.ones(t.size, dtype=bool)
    least = (2.0 * t.output_activation) / (opt.bandwidth * float(R))
    if opt.activation_compression != 1.0:
        least = least / opt.activation_compression
    return least <= upper * SLACK


def _machine_counts(t: Tables, opt: LevelOptions, upper: float) -> tuple[np.ndarray, np.ndarray]:
    """Per state, the least and the most machine counts m (0-based) it can end on in a plan
    within ``upper``: cum <= U (m+1) and total - cum <= U (M-1-m) (module doc)."""
    M = opt.machines
    cum = t.compute
    total = float(cum[-1])
    cap = upper * SLACK
    tol = 1e-12 * abs(total)
    lowest = np.maximum(np.ceil((cum - tol) / cap / SLACK) - 1, 0)
    highest = np.minimum(M - 1 - np.ceil((total - cum - tol) / cap / SLACK), M - 1)
    return lowest, highest
