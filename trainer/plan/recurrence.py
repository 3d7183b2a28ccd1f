"""The plain recurrence: PipeDream's hierarchical dynamic program, written as the reference loops.

This is the planner's definition of the optimum; every faster strategy is tested against it.
One level of the reference optimizer (``compute_partitioning`` in msr-fiddle/pipedream's
``optimizer_graph_hierarchical.py``) fills ``A[i][j][m]``: the best time per minibatch of the
block of states i..j (starting after state i-1) on exactly m+1 machines of the level. Either
the block is one stage replicated m+1 times, or (with ``fewer``) it leaves a machine idle, or
a last stage k+1..j on m' replicas follows the best plan of i..k on the other m+1-m' machines,
for a state k that precedes j in the state DAG:

    A[i][j][m] = min(first stage of i..j on m+1,  A[i][j][m-1] if fewer,
                     min over k, m' of max(A[i][k][m-m'], last stage k+1..j on m'))

Each level's best time for a block on all its machines becomes the next level's compute time
for that block (``value``); the outermost level only solves the block starting at state 0. The
loops are the reference's (machine count outside the end state, predecessors in order), the
costs ``pipeboard.trainer.plan.formulas``'s, so the numbers are the reference's. Pure Python: it is also how
small plans are solved, with no NumPy to load.
"""

from __future__ import annotations

from typing import Callable

from pipeboard.trainer.plan.formulas import (INF, LevelSpec, first_stage_s, last_stage_s, over_memory, stage_bytes,
                                             stash_factor)
from pipeboard.trainer.plan.states import StateChain, block

Value = Callable[[int, int], float]  # value(i, j): the level's compute time of block i..j (+inf: none)


def level1_value(chain: StateChain) -> Value:
    """The innermost level's compute times: forward+backward of states i..j, +inf where j < i."""
    cum = chain.compute_s
    return lambda i, j: block(cum, i, j) if j >= i else INF


class PlainTable:
    """A solved level: ``rows[i][j][m]`` = A[i][j][m] for the block starts it solved, and the
    level's last stages (``last_stages``) to re-derive its choices from."""

    strategy = "plain"

    def __init__(self, chain: StateChain, spec: LevelSpec, value: Value, rows: dict[int, list[list[float]]],
                 stages: list[list[tuple[int, list[float], float]]]):
        self.chain, self.spec, self.value, self.rows, self.stages = chain, spec, value, rows, stages

    def entry(self, i: int, j: int, m: int) -> float:
        return self.rows[i][j][m] if i in self.rows else INF

    def next_value(self) -> Value:
        """The level above's compute times: each block's best time on all of this level's machines."""
        last = self.spec.machines - 1
        return lambda i, j: self.entry(i, j, last)

    def first_stage(self, i: int, j: int, m: int) -> float:
        return first_stage(self.chain, self.spec, self.value, i, j, m + 1)

    def first_equal(self, i: int, j: int, m: int, target: float):
        """The first (k, m') in the reference's order whose candidate for A[i][j][m] is ``target``."""
        row = self.rows[i]
        for k, times, stash in self.stages[j]:
            if k >= i:
                for r in self.spec.replica_counts(m + 1):
                    if max(row[k][m - r], fitting(self.spec, times[r - 1], stash, r, m + 1)) == target:
                        return k, r
        return None


def first_stage(chain: StateChain, spec: LevelSpec, value: Value, i: int, j: int, replicas: int) -> float:
    """The block i..j as a single stage on ``replicas`` machines."""
    return first_stage_s(spec, value(i, j), block(chain.parameters, i, j), block(chain.activation, i, j), replicas)


def last_stages(chain: StateChain, spec: LevelSpec, value: Value) -> list[list[tuple[int, list[float], float]]]:
    """Per end state j, per predecessor k: (k, the stage k+1..j's time on each replica count
    1..R before the memory check, its stash bytes), formed once per level (every row reads them)."""
    R = len(spec.replica_counts(spec.machines))
    acts, params, sent = chain.activation, chain.parameters, chain.sent_after
    out = []
    for j in range(chain.size):
        per_k = []
        for k in chain.predecessors(j):
            p = params[j] - params[k]
            times = [last_stage_s(spec, value(k + 1, j), p, r, sent[k], sent[j]) for r in range(1, R + 1)]
            per_k.append((k, times, stage_bytes(acts[j] - acts[k], p)))
        out.append(per_k)
    return out


def fitting(spec: LevelSpec, time: float, stash: float, replicas: int, used: int) -> float:
    """A last stage's ``time``, or +inf when its stash does not fit in memory with ``used``
    machines of the block taken up to and including it."""
    if spec.memory is not None and over_memory(stash, stash_factor(spec.machines, used, replicas), spec.memory):
        return INF
    return time


def solve_row(chain: StateChain, spec: LevelSpec, value: Value, i: int, stages=None) -> list[list[float]]:
    """A[i][j][m] for one block start i, every end state j and machine count m."""
    n, M = chain.size, spec.machines
    stages = last_stages(chain, spec, value) if stages is None else stages
    A = [[INF] * M for _ in range(n)]
    for j in range(i, n):
        for m in range(1 if spec.straight else M):
            A[j][m] = first_stage(chain, spec, value, i, j, m + 1)
    for m in range(1, M):
        for j in range(i + 1, n):
            best = A[j][m]
            if spec.fewer and A[j][m - 1] < best:
                best = A[j][m - 1]
            for k, times, stash in stages[j]:
                if k < i:  # A[i][k] is empty (the reference's test against i-1's predecessors)
                    continue
                for r in spec.replica_counts(m + 1):
                    candidate = max(A[k][m - r], fitting(spec, times[r - 1], stash, r, m + 1))
                    if candidate < best:
                        best = candidate
            A[j][m] = best
    return A


def solve_level(chain: StateChain, spec: LevelSpec, value: Value, rows=None) -> PlainTable:
    """One level: every block start 0..n, or only 0 on the final level (default ``rows``)."""
    rows = ([0] if spec.final else range(chain.size + 1)) if rows is None else rows
    stages = last_stages(chain, spec, value)
    return PlainTable(chain, spec, value, {i: solve_row(chain, spec, value, i, stages) for i in rows}, stages)


def solve_levels(chain: StateChain, specs: list[LevelSpec]) -> list[PlainTable]:
    """Every level, innermost first; the last table's A[0][n-1][M-1] is the optimum."""
    value, tables = level1_value(chain), []
    for spec in specs:
        tables.append(solve_level(chain, spec, value))
        value = tables[-1].next_value()
    return tables


def work(chain: StateChain, specs: list[LevelSpec]) -> int:
    """About how long the plain recurrence takes, in candidates: each (pair, m') last stage it
    forms counts as three (a few cost-model calls), each candidate max/min as one."""
    pairs, total = chain.pair_count(), 0
    for spec in specs:
        rows = 1 if spec.final else (chain.size + 1) // 2  # (a row i reads only the pairs after i)
        per_pair = sum(len(spec.replica_counts(m + 1)) for m in range(1, spec.machines))
        total += 3 * pairs * len(spec.replica_counts(spec.machines)) + pairs * rows * per_pair
    return total
