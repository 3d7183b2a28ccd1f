"""Lazily formed block sums read exactly as the dense (n+1, n) table they stand for."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.plan.blocks import BlockSums, after


def dense(cum: np.ndarray, empty: float | None) -> np.ndarray:
    n = len(cum)
    table = np.empty((n + 1, n))
    table[0] = cum
    for i in range(1, n + 1):
        table[i] = cum - cum[i - 1]
        if empty is not None:
            table[i, :i] = empty
    return table


@pytest.mark.parametrize("empty", [None, np.inf])
def test_every_kind_of_read_equals_the_dense_table(empty):
    rng = np.random.default_rng(3)
    cum = np.cumsum(rng.uniform(0, 5, 9))
    lazy, full = BlockSums(cum, empty), dense(cum, empty)
    assert lazy.shape == full.shape
    ks = np.array([0, 2, 3, 7])
    js = np.array([4, 5, 3, 8])
    reads = [
        (3, 5), (0, 4), (6, 2), (ks + 1, js), (ks, 8), (2, slice(2, 9)), (0, slice(None)), (slice(1, 9), 8),
        (ks[:, None], np.arange(9)[None, :]), 4, slice(1, None), 9,
    ]
    for index in reads:
        got, want = lazy[index], full[index]
        assert np.shape(got) == np.shape(want), index
        assert np.array_equal(np.asarray(got), np.asarray(want)), index


@pytest.mark.parametrize("empty", [None, np.inf])
def test_blocks_after_a_state_read_the_same_from_either_form(empty):
    rng = np.random.default_rng(5)
    cum = np.cumsum(rng.uniform(0, 5, 12))
    k = rng.integers(0, 12, 40)
    j = rng.integers(0, 12, 40)
    lazy, full = BlockSums(cum, empty), dense(cum, empty)
    assert np.array_equal(after(lazy, k, j), full[k + 1, j])
    assert np.array_equal(after(full, k, j), full[k + 1, j])


def test_scalar_reads_equal_the_indexed_ones():
    from trainer.plan.blocks import scalar

    rng = np.random.default_rng(4)
    cum = np.cumsum(rng.uniform(0, 3, 9))
    for empty in (None, np.inf):
        table = BlockSums(cum, empty=empty)
        for i in range(10):
            for j in range(9):
                expected = float(table[i, j])
                assert table.scalar(i, j) == expected and scalar(table, i, j) == expected
        dense = np.asarray(table[np.arange(10)[:, None], np.arange(9)[None, :]])
        assert all(scalar(dense, i, j) == float(dense[i, j]) for i in range(10) for j in range(9))
