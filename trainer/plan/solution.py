"""A solved DP level, and reading its stages back out.

``_split`` re-derives each choice by recomputing its candidates with the DP's own arithmetic,
so equality with the stored optimum is exact and nothing but the table needs keeping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.plan import banded, chainkernel
from trainer.plan.dp import (INF, LevelOptions, Tables, _stash_factor, all_rows, next_level_values, single_stage_value,
                             solve_level)
from trainer.plan.paircosts import pair_stage_costs_t, pair_sums


@dataclass
class LevelSolution:
    """A solved level: its inputs and its table, enough to read stages back out.

    Rows not solved up front (a shortcut may fill only some) are solved on first use.
    """

    tables: Tables
    values: np.ndarray
    options: LevelOptions
    rows: np.ndarray
    F: np.ndarray
    next_override: np.ndarray | None = None
    _extra: dict | None = None
    band: np.ndarray | None = None  # (n+1, M, width) when stored as bands (see ``banded``); F unused

    def row_table(self, i: int) -> np.ndarray:
        """(n, M): A[i][j][m][0] for every j and m."""
        if self._extra is None:
            self._extra = {}
        if self.band is not None:
            if i not in self._extra:
                self._extra[i] = banded.dense_row(self.band, i, self.tables.size)
            return self._extra[i]
        c = int(np.searchsorted(self.rows, i))
        if c < len(self.rows) and self.rows[c] == i:
            return self.F[:, :, c]
        if i not in self._extra:
            row = np.array([i], dtype=np.intp)
            self._extra[i] = solve_level(self.tables, self.values, self.options, row)[:, :, 0]
        return self._extra[i]

    def best(self, i: int, j: int) -> float:
        return float(self.row_table(i)[j, -1])

    def next_values(self) -> np.ndarray:
        if self.next_override is not None:
            return self.next_override
        if self.band is not None:
            return banded.full_values(self.band, self.tables.size)
        return next_level_values(self.F, self.rows, self.tables.size)

    def split(self, i: int, j: int) -> list[tuple[int, int, int]]:
        """Stages (start, end, replicas), half-open state ranges, of block i..j on all machines."""
        return _split(self, i, j, self.options.machines - 1)


def solve(tables: Tables, values: np.ndarray, opt: LevelOptions, rows: np.ndarray | None = None,
          bound: np.ndarray | float = INF, caps: np.ndarray | None = None,
          end_bounds: np.ndarray | None = None, chain_workers: int | None = None) -> LevelSolution:
    rows = all_rows(opt, tables.size) if rows is None else np.asarray(rows, dtype=np.intp)
    if (chain_workers is not None and caps is not None and end_bounds is not None and len(rows) == tables.size + 1
            and tables.size >= banded.FROM_STATES and chainkernel.available()):
        band = banded.solve_banded(tables, values, opt, bound, caps, end_bounds, chain_workers)
        return LevelSolution(tables, values, opt, rows, np.zeros((tables.size, opt.machines, 0)), band=band)
    return LevelSolution(tables, values, opt, rows,
                         solve_level(tables, values, opt, rows, bound, caps, end_bounds))


def _split(sol: LevelSolution, i: int, j: int, m: int) -> list[tuple[int, int, int]]:
    # Re-derive the choice behind A[i][j][m] by recomputing its candidates with the same
    # arithmetic (so equality is exact), in the reference's order of preference: the single
    # stage, then fewer machines, then the last-stage splits.
    t, opt = sol.tables, sol.options
    table = sol.row_table(i)
    target = table[j, m]
    if not np.isfinite(target):
        raise ValueError(f"no feasible split for states {i}..{j} on {m + 1} machines")
    acts, params = t.block_sums_for_reads()
    if m == 0 or not opt.straight:
        if single_stage_value(sol.values, acts, params, opt, i, j, m) == target:
            return [(i, j + 1, m + 1)]
    if opt.fewer_machines and m > 0 and j > i and table[j, m - 1] == target:
        return _split(sol, i, j, m - 1)
    preds = t.predecessors_of(j)
    preds = preds[preds >= i]
    max_rep = 1 if opt.straight else m
    reps = np.arange(1, max_rep + 1, dtype=float)
    ends = np.full(len(preds), j, dtype=np.intp)
    sums = pair_sums(t, preds, ends)
    last = pair_stage_costs_t(t, sol.values, opt, preds, ends, reps, sums)  # (m', k)
    stash = sums.stash() if opt.memory_bytes is not None else None
    for r in range(1, max_rep + 1):
        cost = last[r - 1]
        if stash is not None:
            cost = np.where(stash * _stash_factor(m + 1, r, opt.machines) > opt.memory_bytes, INF, cost)
        cand = np.maximum(table[preds, m - r], cost)
        hits = np.flatnonzero(cand == target)
        if len(hits):
            k = int(preds[hits[0]])
            return _split(sol, i, k, m - r) + [(k + 1, j + 1, r)]
    raise ValueError(f"internal: could not re-derive the split of states {i}..{j} on {m + 1} machines")
