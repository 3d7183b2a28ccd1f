"""NumPy views of a state chain, for the vectorised strategies: block sums, pairs, solved tables.

The plain recurrence reads Python lists; a vectorised strategy reads the same numbers as
arrays. ``Blocks`` stands for the reference's (n+1, n) table of block sums, ``cum[j] -
cum[i-1]`` (row 0: ``cum[j]``), formed on read with that one subtraction (``cum[j] - 0.0`` is
``cum[j]``), so every entry is the number the plain recurrence forms; ``Dense`` is a table
handed up from the level below. ``ArrayTable`` is a solved level, read back out exactly as
the plain recurrence's table is (``pipeboard.trainer.plan.readout``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pipeboard.trainer.plan.formulas import (INF, LevelSpec, first_stage_s, larger, last_stage_s, over_memory,
                                             stage_bytes, stash_factor)
from pipeboard.trainer.plan.states import StateChain


class Blocks:
    """Sums over blocks of states of a cumulative array; +inf where j < i if ``empty``."""

    def __init__(self, cum: np.ndarray, empty: bool = False):
        self.cum = cum
        self.prev = np.concatenate([[0.0], cum])  # prev[i] = cum[i-1], prev[0] = 0.0
        self.empty = empty

    def at(self, i: int, j: int) -> float:
        return INF if self.empty and j < i else float(self.cum[j] - self.prev[i])

    def after(self, k, j):
        """The blocks k+1..j (k < j: never empty)."""
        return self.cum[j] - self.cum[k]

    def rows(self, i, j):
        """Blocks i..j for index arrays (broadcast)."""
        out = self.cum[j] - self.prev[i]
        return np.where(j < i, INF, out) if self.empty else out

    def row(self, i: int) -> np.ndarray:
        return self.rows(i, np.arange(len(self.cum)))

    def dense(self) -> np.ndarray:
        n = len(self.cum)
        return self.rows(np.arange(n + 1)[:, None], np.arange(n)[None, :])


class Dense:
    """A level's compute times handed up from the level below: an (n+1, n) table."""

    def __init__(self, table: np.ndarray):
        self.table = table

    def at(self, i: int, j: int) -> float:
        return float(self.table[i, j])

    def after(self, k, j):
        return self.table[k + 1, j]

    def rows(self, i, j):
        return self.table[i, j]

    def row(self, i: int) -> np.ndarray:
        return self.table[i]

    def dense(self) -> np.ndarray:
        return self.table


def pairs_of(masks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(k, j) for every bit k of ``masks[j]``, grouped by j, k ascending. The bitsets are
    unpacked to a byte per bit and picked by a mask (``nonzero`` on the same matrix is several
    times slower)."""
    n = width = len(masks)
    nbytes = (width + 7) // 8
    raw = b"".join([m.to_bytes(nbytes, "little") for m in masks])
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8).reshape(n, nbytes), axis=1, bitorder="little")[:, :width]
    pk = np.broadcast_to(np.arange(width, dtype=np.intp), (n, width))[bits.view(bool)]
    counts = np.fromiter(map(int.bit_count, masks), dtype=np.intp, count=n)
    return pk, np.repeat(np.arange(n, dtype=np.intp), counts)


def chain_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``pairs_of`` for a chain: every k < j."""
    counts = np.arange(n, dtype=np.intp)
    pj = np.repeat(counts, counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(len(pj), dtype=np.intp) - starts, pj


def groups(pj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values of the sorted ``pj``, where each starts): ``np.unique`` without its sort."""
    if len(pj) == 0:
        return pj, pj
    starts = np.flatnonzero(np.concatenate(([True], pj[1:] != pj[:-1])))
    return pj[starts], starts


class ChainArrays:
    """A ``StateChain`` as arrays: cumulative sums as ``Blocks``, the state DAG's (k, j) pairs."""

    def __init__(self, chain: StateChain):
        self.chain = chain
        self.size = chain.size
        self.compute = Blocks(np.array(chain.compute_s, dtype=float), empty=True)  # level 1's values
        self.activation = Blocks(np.array(chain.activation, dtype=float))
        self.parameters = Blocks(np.array(chain.parameters, dtype=float))
        self.sent = np.array(chain.sent_after, dtype=float)
        self._pairs: tuple[np.ndarray, np.ndarray] | None = None
        self._predecessors: list[np.ndarray] | None = None

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (k, j) with k preceding j, as (pk, pj), grouped by j, k ascending."""
        if self._pairs is None:
            bits = self.chain.ancestor_bits
            self._pairs = chain_pairs(self.size) if bits is None else pairs_of(bits)
        return self._pairs

    def predecessors(self, j: int) -> np.ndarray:
        if self._predecessors is None:
            pk, pj = self.pairs()
            ends = np.searchsorted(pj, np.arange(self.size + 1)).tolist()
            self._predecessors = [pk[a:b] for a, b in zip(ends[:-1], ends[1:])]
        return self._predecessors[j]

    def stage_costs(self, spec: LevelSpec, values, pk, pj, reps) -> np.ndarray:
        """Last stages k+1..j on each replica count: (R, P) for (k, j) pairs and (R, 1) ``reps``
        (or any shapes that broadcast), before the memory check."""
        return last_stage_s(spec, values.after(pk, pj), self.parameters.after(pk, pj), reps,
                            self.sent[pk], self.sent[pj])

    def stashes(self, pk, pj) -> np.ndarray:
        """Activations plus parameters of the blocks k+1..j (what a stage stashes per minibatch)."""
        return stage_bytes(self.activation.after(pk, pj), self.parameters.after(pk, pj))

    def first_stages(self, spec: LevelSpec, values, i, j, reps) -> np.ndarray:
        """Blocks i..j as single stages on ``reps`` machines (broadcast)."""
        return first_stage_s(spec, values.rows(i, j), self.parameters.rows(i, j), self.activation.rows(i, j), reps)


class ArrayTable:
    """A level solved by a vectorised strategy: ``row(i)`` is (n, M), A[i][j][m] for block start
    i (rows not stored are solved on first use by ``solve_row``); ``next_values`` is what the
    level above reads as its compute times. ``strategy``: the name of the strategy that solved it."""

    strategy = ""

    def __init__(self, arrays: ChainArrays, spec: LevelSpec, values, rows: dict[int, np.ndarray],
                 solve_row: Callable[[int], np.ndarray], next_values: np.ndarray | None = None):
        self.arrays, self.spec, self.values = arrays, spec, values
        self._rows, self._solve_row, self._next = rows, solve_row, next_values

    def row(self, i: int) -> np.ndarray:
        if i not in self._rows:
            self._rows[i] = self._solve_row(i)
        return self._rows[i]

    def entry(self, i: int, j: int, m: int) -> float:
        return float(self.row(i)[j, m])

    def next_values(self) -> Dense:
        return Dense(self._next)

    def first_stage(self, i: int, j: int, m: int) -> float:
        a = self.arrays
        return float(first_stage_s(self.spec, self.values.at(i, j), a.parameters.at(i, j), a.activation.at(i, j),
                                   m + 1))

    def first_equal(self, i: int, j: int, m: int, target: float):
        """The first (k, m') in the reference's order (k, then m') whose candidate is ``target``."""
        spec, a = self.spec, self.arrays
        ks = a.predecessors(j)
        ks = ks[ks >= i]
        counts = np.array(list(spec.replica_counts(m + 1)), dtype=np.intp)
        if len(ks) == 0 or len(counts) == 0:
            return None
        reps = counts.astype(float)[None, :]
        cost = a.stage_costs(spec, self.values, ks[:, None], np.full((len(ks), 1), j), reps)
        if spec.memory is not None:
            over = over_memory(a.stashes(ks, j)[:, None], stash_factor(spec.machines, m + 1, reps), spec.memory)
            cost = np.where(over, INF, cost)
        cand = larger(self.row(i)[ks][:, m - counts], cost)
        hits = np.flatnonzero(cand == target)
        if len(hits) == 0:
            return None
        return int(ks[hits[0] // len(counts)]), int(counts[hits[0] % len(counts)])
