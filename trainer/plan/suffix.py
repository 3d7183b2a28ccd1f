"""A shortcut for the level just below a two-machine top level (8 workers x 2 servers, ...).

With two machines at the top, the top level either replicates one block over both or splits
the model once: block 0..k on one machine, block k+1..n-1 on the other. So from the level
below it reads row 0 for every end state, but every other row i only for the block that ends
at the last state. Those blocks share their tails: a block i..n-1 is a first stage i..k1 (the
only part that depends on i) followed by a chain of stages k1+1..n-1 on the remaining
machines, and the best such chain is one backward DP over k1 for all rows at once. The
arithmetic is the forward DP's, term for term, so the values are the reference's.

Not used with both a memory limit and ``fewer_machines`` (the stash check then depends on how
many machines the whole block ends up using).
"""

from __future__ import annotations

import numpy as np

from trainer.plan.dp import INF, LevelOptions, Tables, _stash_factor
from trainer.plan.solution import LevelSolution, solve


def applies(opt: LevelOptions, machines_above: int, above_is_final: bool) -> bool:
    return (above_is_final and machines_above == 2 and opt.machines > 1 and not opt.final
            and not (opt.memory_bytes is not None and opt.fewer_machines))


def _stage_costs_from(t: Tables, values, params, opt: LevelOptions, k: int, ends: np.ndarray, reps: np.ndarray):
    """(len(ends), R): stage k+1..k2 on m' replicas, for every k2 in ``ends``; the same terms as
    ``dp.last_stage_costs`` (which varies k for one end instead)."""
    bw, n = opt.bandwidth, t.size
    v = values[k + 1, ends][:, None]
    p = params[k + 1, ends][:, None]
    cost = (v + (4 * (reps - 1) * p) / (bw * reps)) / reps
    if opt.activation_compression is not None:
        t_in = (2.0 * t.output_activation[k]) / (bw * reps) / opt.activation_compression
        cost = np.maximum(cost, t_in[None, :])
        t_out = (2.0 * t.output_activation[ends])[:, None] / (bw * reps) / opt.activation_compression
        t_out[ends == n - 1] = -INF  # the reference sends nothing after the last state
        cost = np.maximum(cost, t_out)
    return cost


def tail_table(t: Tables, values: np.ndarray, opt: LevelOptions) -> np.ndarray:
    """T[k, r]: the best chain of stages from state k+1 to the last state on exactly r
    machines (at most r with ``fewer_machines``); T[last, 0] = -inf (nothing left to run)."""
    n, M = t.size, opt.machines
    acts, params = t.block_sums()
    last = n - 1
    R = 1 if opt.straight else M - 1
    reps = np.arange(1, R + 1, dtype=float)
    T = np.full((n, M), INF)
    T[last, 0] = -INF
    if opt.fewer_machines:
        T[last, :] = -INF
    reaches = np.zeros(n, dtype=bool)
    reaches[t.predecessors_of(last)] = True
    reaches[last] = True
    successors: list[list[int]] = [[] for _ in range(n)]
    for k2 in np.nonzero(reaches)[0]:
        for k in t.predecessors[k2]:
            successors[k].append(int(k2))
    totals = np.arange(M)  # machines for the chain after k
    r_idx = np.arange(1, R + 1)
    remaining = totals[None, :] - r_idx[:, None]  # (R, M): machines left after the stage
    valid = remaining >= 0
    rem_clip = np.where(valid, remaining, 0)
    factor = _stash_factor(M - remaining, r_idx[:, None], M) if opt.memory_bytes is not None else None
    for k in range(last - 1, -1, -1):
        if not reaches[k] or not successors[k]:
            continue
        ends = np.array(successors[k], dtype=np.intp)
        cost = _stage_costs_from(t, values, params, opt, k, ends, reps)  # (E, R)
        cand = np.broadcast_to(cost[:, :, None], (len(ends), R, M)).copy()
        if factor is not None:
            stash = acts[k + 1, ends] + params[k + 1, ends]
            cand[stash[:, None, None] * factor[None] > opt.memory_bytes] = INF
        rest = T[ends][:, rem_clip]  # (E, R, M): the chain after k2 on the machines left
        np.maximum(cand, rest, out=cand)
        cand[:, ~valid] = INF
        T[k] = cand.min(axis=(0, 1))
        T[k, 0] = INF
        if opt.fewer_machines:
            T[k, 1:] = np.minimum.accumulate(T[k, 1:])
    return T


def solve_two_machine_below(t: Tables, values: np.ndarray, opt: LevelOptions) -> LevelSolution:
    """Row 0 in full, and for every other row only its block ending at the last state."""
    n, M = t.size, opt.machines
    acts, params = t.block_sums()
    sol = solve(t, values, opt, rows=np.zeros(1, dtype=np.intp))
    T = tail_table(t, values, opt)
    init_m = 1 if opt.straight else M
    i = slice(1, n)  # rows 1..n-1 (row n is empty)
    best = np.full(n - 1, INF)
    for m in range(init_m):
        # First stage i..k1 on m+1 machines, for every row and k1 at once (as single_stage_costs).
        p = params[i]
        dp_comm = (4 * m * p) / (opt.bandwidth * (m + 1))
        dp_comm = dp_comm / opt.machines_below
        first = (values[i] + dp_comm) / (m + 1)
        if opt.memory_bytes is not None:
            stash = -(-(M - (m + 1)) // (m + 1)) * (acts[i] + p)
            first = np.where(stash > opt.memory_bytes, INF, first)
        first = np.where(np.isnan(first), INF, first)
        cand = np.maximum(first, T[:, M - 1 - m][None, :])
        np.minimum(best, cand.min(axis=1), out=best)
    override = np.full((n + 1, n), INF)
    override[0] = sol.F[:, -1, 0]
    override[1:n, n - 1] = best
    sol.next_override = override
    return sol
