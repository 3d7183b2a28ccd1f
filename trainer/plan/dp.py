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

INF = math.inf


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
    predecessors: list[np.ndarray]  # per state j, the indices of its ancestor states

    @property
    def size(self) -> int:
        return len(self.compute)

    def block(self, values: np.ndarray, start: int, end: int) -> float:
        """``values`` summed over states start..end as the reference forms it (a difference)."""
        return float(values[end]) if start == 0 else float(values[end] - values[start - 1])


def level1_values(t: Tables) -> np.ndarray:
    """``compute_times[i][j]`` of the reference: (n+1, n), +inf where j < i."""
    n = t.size
    v = np.full((n + 1, n), INF)
    v[0] = t.compute
    for i in range(1, n + 1):
        v[i, i:] = t.compute[i:] - t.compute[i - 1]
    return v


def _block_sums(cum: np.ndarray) -> np.ndarray:
    """(n+1, n) differences cum[j] - cum[i-1] (row 0: cum[j]); only j >= i is ever read."""
    n = len(cum)
    out = np.empty((n + 1, n))
    out[0] = cum
    out[1:] = cum[None, :] - cum[:, None]
    return out


def _stash_factor(total: np.ndarray | int, replicas: np.ndarray | int, machines: int) -> np.ndarray:
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


def solve_level(t: Tables, values: np.ndarray, opt: LevelOptions) -> np.ndarray:
    """Fill the level's table; returns F with F[j, i, m] = the reference's A[i][j][m][0].

    ``values`` is this level's ``compute_times`` ((n+1, n), +inf for empty). At the final level
    only row i = 0 is filled (the reference's ``max_i = 1``), the other rows stay +inf.
    """
    n, M = t.size, opt.machines
    rows = 1 if opt.final else n + 1
    acts = _block_sums(t.activation)
    params = _block_sums(t.parameters)
    F = np.full((n, rows, M), INF)

    # Single-stage blocks: the whole of i..j on m+1 machines, all-reduce over the machines below.
    init_m = 1 if opt.straight else M
    for i in range(rows):
        for m in range(init_m):
            F[i:, i, m] = single_stage_costs(values, acts, params, opt, i, slice(i, n), m)

    max_rep = 1 if opt.straight else M - 1
    reps = np.arange(1, max_rep + 1, dtype=float)  # m'
    for j in range(n):
        preds = t.predecessors[j]
        if j > 0 and opt.fewer_machines:
            # A[i][j][m] may keep A[i][j][m-1] (the reference's use_fewer_machines), rows i < j.
            top = min(j, rows)
            F[j, :top] = np.minimum.accumulate(F[j, :top], axis=1)
        if len(preds) == 0 or M == 1:
            continue
        last = last_stage_costs(t, values, params, opt, preds, j, reps)  # (K, m')
        top = min(j, rows)  # rows i <= k < j
        prefix = F[preds, :top, :]  # (K, rows, M): A[i][k][m'']
        best = np.full((top, M), INF)
        stash_base = acts[preds + 1, j] + params[preds + 1, j] if opt.memory_bytes is not None else None
        for r in range(1, max_rep + 1):
            cost = last[:, r - 1]  # (K,)
            if stash_base is not None:
                totals = np.arange(r, M)  # m = m'' + m' for m'' = 0..M-1-m'
                factor = _stash_factor(totals + 1, r, M)
                bad = stash_base[:, None] * factor[None, :] > opt.memory_bytes
                cost_m = np.where(bad, INF, cost[:, None])  # (K, M - m')
                cand = np.maximum(prefix[:, :, : M - r], cost_m[:, None, :])
            else:
                cand = np.maximum(prefix[:, :, : M - r], cost[:, None, None])
            np.minimum(best[:, r:], cand.min(axis=0), out=best[:, r:])
        # Transitions apply to m >= 1 only; m = 0 keeps its single-stage value.
        np.minimum(F[j, :top, 1:], best[:, 1:], out=F[j, :top, 1:])
        if opt.fewer_machines:
            F[j, :top] = np.minimum.accumulate(F[j, :top], axis=1)
    return F


def next_level_values(F: np.ndarray, n: int) -> np.ndarray:
    """The next level's ``compute_times``: this level's best on all its machines, per block."""
    v = np.full((n + 1, n), INF)
    v[: F.shape[1]] = F[:, :, -1].T
    return v


@dataclass
class LevelSolution:
    """A solved level: its inputs and its table, enough to read stages back out."""

    tables: Tables
    values: np.ndarray
    options: LevelOptions
    F: np.ndarray

    def best(self, i: int, j: int) -> float:
        return float(self.F[j, i, -1])

    def split(self, i: int, j: int) -> list[tuple[int, int, int]]:
        """Stages (start, end, replicas), half-open state ranges, of block i..j on all machines."""
        return _split(self, i, j, self.options.machines - 1)


def solve(tables: Tables, values: np.ndarray, opt: LevelOptions) -> LevelSolution:
    return LevelSolution(tables, values, opt, solve_level(tables, values, opt))


def _split(sol: LevelSolution, i: int, j: int, m: int) -> list[tuple[int, int, int]]:
    # Re-derive the choice behind F[j, i, m] by recomputing its candidates with the same
    # arithmetic (so equality is exact), in the reference's order of preference: the single
    # stage, then fewer machines, then the last-stage splits.
    t, opt, F = sol.tables, sol.options, sol.F
    target = F[j, i, m]
    if not np.isfinite(target):
        raise ValueError(f"no feasible split for states {i}..{j} on {m + 1} machines")
    acts = _block_sums(t.activation)
    params = _block_sums(t.parameters)
    if m == 0 or not opt.straight:
        single = float(single_stage_costs(sol.values, acts, params, opt, i, slice(j, j + 1), m)[0])
        if single == target:
            return [(i, j + 1, m + 1)]
    if opt.fewer_machines and m > 0 and j > i and F[j, i, m - 1] == target:
        return _split(sol, i, j, m - 1)
    preds = t.predecessors[j]
    preds = preds[preds >= i]
    max_rep = 1 if opt.straight else m
    reps = np.arange(1, max_rep + 1, dtype=float)
    last = last_stage_costs(t, sol.values, params, opt, preds, j, reps)
    M = opt.machines
    for col, r in enumerate(range(1, max_rep + 1)):
        if opt.memory_bytes is not None:
            factor = _stash_factor(m + 1, r, M)
            stash = (acts[preds + 1, j] + params[preds + 1, j]) * factor
            cost = np.where(stash > opt.memory_bytes, INF, last[:, col])
        else:
            cost = last[:, col]
        cand = np.maximum(F[preds, i, m - r], cost)
        hits = np.nonzero(cand == target)[0]
        if len(hits):
            k = int(preds[hits[0]])
            return _split(sol, i, k, m - r) + [(k + 1, j + 1, r)]
    raise ValueError(f"internal: could not re-derive the split of states {i}..{j} on {m + 1} machines")
