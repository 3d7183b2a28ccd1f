"""The NumPy views the vectorised strategies read (trainer/plan/strategies/arrays.py) against
plain forms.

Block sums formed on read must be exactly the reference's (n+1, n) table (one subtraction,
row 0 the sums themselves); the state DAG's pairs from bitsets must be ``nonzero`` of the
dense ancestor matrix; a solved table's read-out must find the plain recurrence's choices.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.trainer.test_plan_exact import random_profile
from pipeboard.trainer.plan import recurrence
from pipeboard.trainer.plan.strategies import top_row
from pipeboard.trainer.plan.strategies.arrays import ArrayTable, Blocks, ChainArrays, Dense, chain_pairs, groups, pairs_of
from pipeboard.trainer.plan.formulas import LevelSpec
from pipeboard.trainer.plan.readout import split
from pipeboard.trainer.plan.states import block, state_chain


def dense(cum: np.ndarray, empty: bool) -> np.ndarray:
    n = len(cum)
    table = np.empty((n + 1, n))
    table[0] = cum
    for i in range(1, n + 1):
        table[i] = cum - cum[i - 1]
        if empty:
            table[i, :i] = np.inf
    return table


@pytest.mark.parametrize("empty", [False, True])
def test_block_reads_equal_the_dense_table(empty):
    rng = np.random.default_rng(3)
    cum = np.cumsum(rng.uniform(0, 5, 9))
    lazy, full = Blocks(cum, empty), dense(cum, empty)
    assert np.array_equal(lazy.dense(), full)
    ks, js = np.array([0, 2, 1, 7]), np.array([4, 5, 3, 8])  # (k < j: blocks after k)
    assert np.array_equal(lazy.after(ks, js), full[ks + 1, js])
    assert np.array_equal(lazy.rows(ks[:, None], np.arange(9)[None, :]), full[ks[:, None], np.arange(9)[None, :]])
    assert all(np.array_equal(lazy.row(i), full[i]) for i in range(10))
    assert all(lazy.at(i, j) == full[i, j] for i in range(10) for j in range(9))
    # and the plain recurrence's scalar form of the same block
    assert all(lazy.at(i, j) == block(list(cum), i, j) for i in range(10) for j in range(i, 9))
    table = Dense(full)
    assert np.array_equal(table.after(ks, js), full[ks + 1, js]) and table.at(3, 5) == full[3, 5]


def test_pairs_of_bitsets_equal_nonzero():
    rng = random.Random(3)
    for n in (0, 1, 2, 7, 8, 9, 63, 64, 65, 200):
        masks = [rng.getrandbits(j) if j else 0 for j in range(n)]  # state j: bits below j only
        matrix = np.array([[(m >> k) & 1 for k in range(n)] for m in masks], dtype=bool).reshape(n, n)
        rows, cols = np.nonzero(matrix)
        pk, pj = pairs_of(masks)
        assert np.array_equal(pk, cols) and np.array_equal(pj, rows)
        assert pk.dtype == pj.dtype == np.intp


@pytest.mark.parametrize("n", [0, 1, 2, 5, 40])
def test_chain_pairs_are_every_earlier_state(n):
    rows, cols = np.nonzero(np.tri(n, n, -1, dtype=bool))
    pk, pj = chain_pairs(n)
    assert np.array_equal(pk, cols) and np.array_equal(pj, rows)
    ends, starts = groups(pj)
    assert np.array_equal(ends, np.unique(pj)) and np.array_equal(starts, np.searchsorted(pj, ends))


@pytest.mark.parametrize("seed", range(8))
def test_chain_arrays_list_the_chains_predecessors(seed):
    chain = state_chain(random_profile(random.Random(seed), random.Random(seed).randrange(3, 14), 0.4))
    a = ChainArrays(chain)
    assert [a.predecessors(j).tolist() for j in range(chain.size)] == [chain.predecessors(j) for j in range(chain.size)]
    assert len(a.pairs()[0]) == chain.pair_count()


@pytest.mark.parametrize("seed", range(12))
def test_array_tables_read_out_the_plain_recurrences_choices(seed):
    # The read-out re-derives each choice from the table; both kinds of table must agree on it.
    rng = random.Random(40 + seed)
    chain = state_chain(random_profile(rng, rng.randrange(3, 12), rng.uniform(0.0, 0.6)))
    spec = LevelSpec(rng.randrange(1, 7), rng.choice([1e9, 1e10]), fewer=seed % 3 == 0, straight=seed % 5 == 0,
                     memory=[None, 1e9][seed % 2], compression=[1.0, None][seed % 4 == 3])
    plain = recurrence.solve_level(chain, spec, recurrence.level1_value(chain))
    a = ChainArrays(chain)
    table = ArrayTable(a, spec, a.compute, {}, lambda i: top_row.solve_row(a, spec, a.compute, i))
    n, last = chain.size, spec.machines - 1
    if np.isfinite(plain.entry(0, n - 1, last)):
        assert split(table, 0, n - 1, last) == split(plain, 0, n - 1, last)
    else:
        with pytest.raises(ValueError, match="no feasible split"):
            split(table, 0, n - 1, last)
