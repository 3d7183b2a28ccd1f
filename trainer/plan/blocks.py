"""Per-block sums read on demand: ``BlockSums(cum)[i, j]`` is the (n+1, n) table of differences.

The DP reads sums over blocks i..j (states i to j) as the reference forms them: ``cum[j]``
for i = 0, else ``cum[j] - cum[i-1]``. Building the whole (n+1, n) table costs as much as a
single-level plan reads from it (it only reads the pairs of the state DAG and row 0), so the
table is indexed lazily: each read forms exactly the entries asked for, with the same single
subtraction, so the numbers are the table's.
"""

from __future__ import annotations

import numpy as np


class BlockSums:
    """``self[i, j]`` = cum[j] - cum[i-1] (row 0: cum[j]); ``empty`` where j < i, if given.

    Indexes as the dense table would: ``[i, j]`` with integers, integer arrays (broadcast)
    or slices, and ``[i]`` / ``[a:b]`` for whole rows.
    """

    def __init__(self, cum: np.ndarray, empty: float | None = None):
        self.cum = cum
        self.empty = empty
        n = len(cum)
        self.shape = (n + 1, n)
        self._cols = np.arange(n)
        self._rows = np.arange(n + 1)

    def __getitem__(self, index):
        if isinstance(index, tuple):
            i, j = index
            if isinstance(i, slice):
                i = self._rows[i][:, None] if not isinstance(j, (int, np.integer)) else self._rows[i]
            if isinstance(j, slice):
                j = self._cols[j]
            return self._at(i, j)
        rows = self._rows[index]
        return self._at(rows[..., None] if np.ndim(rows) else rows, self._cols)

    def scalar(self, i: int, j: int) -> float:
        """``float(self[i, j])`` for integers, without the array paths."""
        if self.empty is not None and j < i:
            return float(self.empty)
        return float(self.cum[j]) if i == 0 else float(self.cum[j] - self.cum[i - 1])

    def after(self, k: np.ndarray, j: np.ndarray) -> np.ndarray:
        """``self[k + 1, j]`` (the blocks k+1..j) for index arrays, without the row-0 case."""
        out = self.cum[j] - self.cum[k]
        if self.empty is not None:
            out[j <= k] = self.empty
        return out

    def _at(self, i, j):
        cum = self.cum
        if np.ndim(i) == 0:
            i = int(i)
            out = cum[j] if i == 0 else cum[j] - cum[i - 1]
            out = np.array(out, dtype=float) if np.ndim(out) else float(out)
            if self.empty is not None:
                if np.ndim(out):
                    out[np.asarray(j) < i] = self.empty
                elif j < i:
                    out = self.empty
            return out
        i = np.asarray(i)
        prev = cum[np.maximum(i - 1, 0)]
        out = cum[j] - np.where(i > 0, prev, 0.0)  # x - 0.0 is x: row 0 is cum itself
        if self.empty is not None:
            out = np.where(np.asarray(j) < i, self.empty, out)
        return out


def after(table, k: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``table[k + 1, j]`` for a dense table or a ``BlockSums``: the sums of blocks k+1..j."""
    return table.after(k, j) if isinstance(table, BlockSums) else table[k + 1, j]


def scalar(table, i: int, j: int) -> float:
    """``float(table[i, j])`` for a dense table or a ``BlockSums``."""
    return table.scalar(i, j) if isinstance(table, BlockSums) else float(table[i, j])
